"""Floating-point operation counts of any module call, read off the operators it actually runs.

:func:`count_flops` runs a callable under ``torch.utils.flop_counter.FlopCounterMode``, which
counts every matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``, fused attention) as
2·m·n·k flops (one multiply and one add), so a variant added later is counted without a formula
written for it. Element-wise work (softmax, GELU, LayerNorm, bias adds) is not counted: achieved
FLOP/s is then "useful matrix FLOP/s", comparable with a GEMM peak.

Torch registers no formula for the CPU flash-attention kernels that ``scaled_dot_product_attention``
picks on CPU, so they are registered here (importing this module is enough):

* forward  4·B·h·T_q·T_k·d_h (Q Kᵀ and P V),
* backward 10·B·h·T_q·T_k·d_h (recomputed Q Kᵀ, dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q),

each halved under ``is_causal`` because that kernel skips the blocks above the diagonal.

:func:`training_step_flops` counts one training step of a module: the forward pass of its training loss and
the backward pass to every trainable parameter. For a Transformer of N non-embedding parameters on B·T
tokens this is ≈ 6·N·B·T (2 per weight and token forward, 4 backward) plus the attention products.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_flash_forward(query_shape, key_shape, value_shape, dropout_p=0.0, is_causal=False, *args: Any,
                       out_shape=None, **kwargs: Any) -> int:
    flops = sdpa_flop_count(query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, out_shape_=None, lse_shape=None,
                        dropout_p=0.0, is_causal=False, *args: Any, out_shape=None, **kwargs: Any) -> int:
    flops = sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


for _op, _formula in ((_aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_forward),
                      (_aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_backward)):
    if _op not in flop_counter.flop_registry:  # a later torch may ship its own: keep that one
        flop_counter.register_flop_formula(_op)(_formula)


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn()`` once and return (flops of its matrix products, its result)."""
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return counter.get_total_flops(), result


def training_step_flops(module: nn.Module, loss_fn: Callable[[], torch.Tensor],
                        context: Optional[Callable[[], ContextManager]] = None) -> int:
    """Matrix FLOPs of one training step: ``loss_fn()`` (the forward pass of the loss) and its gradients with
    respect to ``module``'s trainable parameters (the backward pass), under ``context()`` when given (e.g. the
    trainer's autocast).

    Leaves no trace: the gradients are returned by ``torch.autograd.grad`` and dropped (no ``.grad`` is
    touched, so no DDP hook fires and no accumulation is disturbed), and the RNG states are restored, so
    dropout and MLM masks draw afterwards exactly what they would have drawn without this count.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    scope = context or contextlib.nullcontext

    def step() -> None:
        with scope():
            loss = loss_fn()
        torch.autograd.grad(loss, params, allow_unused=True)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        flops, _ = count_flops(step)
    return flops
