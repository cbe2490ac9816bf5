"""AdamW with linear warm-up, then linear, cosine or no decay (per optimiser step)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at ``step``: step/warmup during warm-up, then
    1 - p (linear), (1 + cos πp)/2 (cosine) or 1 (constant), p the fraction of decay done."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))


def build_optimizer(model: nn.Module, optim: dict, max_steps: int) -> dict[str, Any]:
    """AdamW; no weight decay on biases, LayerNorm weights and E/F (1-d or projection tensors)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or ".bank." in f".{name}" else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=optim["lr"],
        betas=tuple(optim["betas"]),
        eps=optim["eps"],
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, optim["warmup_steps"], max_steps, optim["schedule"])
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
