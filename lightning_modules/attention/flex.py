"""torch's FlexAttention (``torch.nn.attention.flex_attention``) as the kinds use it: compiled once per process, and
the calls it cannot run.

Compiled (``torch.compile(flex_attention)``) on a GPU it is one Triton kernel that visits only the 128 × 128 tiles
its ``BlockMask`` lists (forward and backward); eager it materialises every score (a check, not a speed-up). The
pattern kinds (:mod:`~lightning_modules.attention.patterned`) and causal Linformer
(:mod:`~lightning_modules.attention.linformer.causal`) run on it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_modules import flops

_COMPILED_FLEX = None


def compiled_flex_attention():
    """``torch.compile(flex_attention)``, compiled once per process (about 30 s on 2 CPU cores the first time)."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def flex_cannot_run(q: Tensor, dropout_p: float) -> bool:
    """FlexAttention cannot run this call: attention dropout (Flex drops no probabilities), a backward pass on CPU
    (torch has no CPU FlexAttention backward), or under :func:`~lightning_modules.flops.count_flops` (eager Flex
    cannot run under a ``FlopCounterMode``)."""
    cpu_backward = q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad
    return dropout_p > 0 or cpu_backward or flops.counting()
