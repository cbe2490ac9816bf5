"""AdamW with linear warm-up, then linear, cosine or no decay (per optimiser step)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lightning_modules.attention import SelfAttention


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at ``step``: step/warmup during warm-up, then
    1 - p (linear), (1 + cos πp)/2 (cosine) or 1 (constant), p the fraction of decay done."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))


def parameter_groups(model: nn.Module) -> tuple[list[str], list[str]]:
    """The names of the trainable parameters AdamW decays, and of those it does not (1-d tensors: biases and
    LayerNorm weights; and what each attention layer's kind exempts, e.g. Linformer's E/F:
    :meth:`~lightning_modules.attention.base.SelfAttention.no_decay_parameters`), each in ``named_parameters``
    order: the optimiser's order."""
    exempt = {id(p) for m in model.modules() if isinstance(m, SelfAttention) for p in m.no_decay_parameters()}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or id(p) in exempt else decay).append(name)
    return decay, no_decay


def build_optimizer(model: nn.Module, optim: dict, max_steps: int) -> dict[str, Any]:
    """AdamW (multi-tensor); no weight decay on biases, LayerNorm weights and E/F (:func:`parameter_groups`)."""
    params = dict(model.named_parameters())
    decay, no_decay = ([params[name] for name in group] for group in parameter_groups(model))
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=optim["lr"],
        betas=tuple(optim["betas"]),
        eps=optim["eps"],
        # One multi-tensor update (torch's default on CUDA, not on CPU): the same arithmetic, bit for bit, without
        # a Python round per parameter tensor (tests/lightning_modules/test_optim.py).
        foreach=True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, optim["warmup_steps"], max_steps, optim["schedule"])
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
