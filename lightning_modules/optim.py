"""AdamW with linear warm-up, then linear, cosine, no decay, or warmup–stable–decay (per optimiser step)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lightning_modules.attention import SelfAttention


def cooldown_factor(q: float, shape: str) -> float:
    """The learning rate's multiplier at a fraction ``q`` ∈ [0, 1] of a cooldown (Hägele et al. 2024, Sec. 3):
    ``linear`` 1 − q, ``cosine`` (1 + cos πq)/2, ``1-sqrt`` 1 − √q (it stays near the peak longest and drops last)."""
    if shape == "linear":
        return 1.0 - q
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * q))
    return 1.0 - math.sqrt(q)


def cooldown_start(total: int, fraction: float) -> int:
    """The first step of a warmup–stable–decay schedule's cooldown: its last ``fraction`` of ``total`` steps,
    rounded to a whole step (a trunk saves its checkpoint there: :mod:`sweeps.spec.budgets`)."""
    return total - int(round(fraction * total))


def lr_factor(step: int, warmup: int, total: int, schedule: str, cooldown: float = 0.2, shape: str = "linear") -> float:
    """Multiplier of the peak learning rate at ``step``: step/warmup during warm-up, then 1 - p (linear),
    (1 + cos πp)/2 (cosine) or 1 (constant), p the fraction of decay done; ``wsd`` (warmup–stable–decay): 1 until
    :func:`cooldown_start` (the last ``cooldown`` fraction of ``total``), then :func:`cooldown_factor` of the
    fraction of the cooldown done, 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        start = max(cooldown_start(total, cooldown), warmup)
        return 1.0 if step < start else cooldown_factor(min(1.0, (step - start) / max(1, total - start)), shape)
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
    """AdamW (multi-tensor); no weight decay on biases, LayerNorm weights and E/F (:func:`parameter_groups`); E/F
    at ``projection_lr_scale`` times the learning rate (the schedule's factor applies to every group alike)."""
    params = dict(model.named_parameters())
    decay, no_decay = ([params[name] for name in group] for group in parameter_groups(model))
    groups = [{"params": decay, "weight_decay": optim["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    scale = optim.get("projection_lr_scale", 1.0)
    if scale != 1.0:  # E/F in a group of their own at lr × scale (at 1.0 the optimiser is the two groups, unchanged)
        exempt = {id(p) for m in model.modules() if isinstance(m, SelfAttention) for p in m.no_decay_parameters()}
        groups[1]["params"] = [p for p in no_decay if id(p) not in exempt]
        groups.append(
            {"params": [p for p in no_decay if id(p) in exempt], "weight_decay": 0.0, "lr": optim["lr"] * scale}
        )
    opt = torch.optim.AdamW(
        groups,
        lr=optim["lr"],
        betas=tuple(optim["betas"]),
        eps=optim["eps"],
        # One multi-tensor update (torch's default on CUDA, not on CPU): the same arithmetic, bit for bit, without
        # a Python round per parameter tensor (tests/lightning_modules/test_optim.py).
        foreach=True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(
            s,
            optim["warmup_steps"],
            max_steps,
            optim["schedule"],
            optim.get("cooldown_fraction", 0.2),
            optim.get("cooldown_shape", "linear"),
        ),
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
