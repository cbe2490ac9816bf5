"""What Lightning's training loop costs over a bare PyTorch loop on the same model and batches.

Both loops train a :class:`MaskedLMModule` (same config, same initial weights, same optimiser and
schedule from its ``configure_optimizers``) on the same pre-generated batches. The bare loop is
``zero_grad → loss → backward → step → scheduler.step``; Lightning runs ``Trainer.fit`` with no
logger, checkpoints, progress bar or validation, so what differs is the loop itself (hooks,
``self.log``, batch transfer, closures). A step's time is the gap between consecutive step ends
after ``warmup`` steps, so start-up (Trainer construction, first-call allocations) is excluded.
Rounds alternate which loop goes first; the overhead is the median over rounds of the paired ratio.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from experiments.benchmarks.measure import median, synchronize
from foundation.configfile import to_container
from lightning_modules.language_model import MaskedLMModule
from training import config as run_config


def _batches(steps: int, batch: int, n: int, vocab: int, device: torch.device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        ids = torch.randint(5, vocab, (batch, n), generator=g)
        labels = torch.where(torch.rand(batch, n, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        labels[:, 0] = ids[:, 0]  # at least one target per batch
        out.append({"input_ids": ids, "labels": labels, "attention_mask": None})  # packed blocks: no padding
    return out


class _StepClock(L.Callback):
    def __init__(self, device: torch.device) -> None:
        self.device, self.ends = device, []

    def on_train_batch_end(self, *args: Any) -> None:
        synchronize(self.device)
        self.ends.append(time.perf_counter())


def _per_step(ends: list[float], warmup: int) -> float:
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


def _module(overrides: list[str], vocab: int, device: torch.device) -> MaskedLMModule:
    cfg = run_config.load(None, overrides)
    torch.manual_seed(0)
    return MaskedLMModule(to_container(cfg), vocab).to(device)


def _lightning_steps(
    module: MaskedLMModule, batches: list[dict], device: torch.device, bf16: bool, warmup: int
) -> float:
    clock = _StepClock(device)
    trainer = L.Trainer(
        max_steps=len(batches),
        accelerator=device.type,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[clock],
        precision="bf16-mixed" if bf16 else "32-true",
    )
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return _per_step(clock.ends, warmup)


def _bare_steps(module: MaskedLMModule, batches: list[dict], device: torch.device, bf16: bool, warmup: int) -> float:
    opt = module.configure_optimizers()
    optimizer, scheduler = opt["optimizer"], opt["lr_scheduler"]["scheduler"]
    module.train()
    ends = []
    for batch in DataLoader(batches, batch_size=None):
        batch = {k: None if v is None else v.to(device) for k, v in batch.items()}
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module._loss(batch)  # the loss of training_step, without its self.log calls
        loss.backward()
        optimizer.step()
        scheduler.step()
        synchronize(device)
        ends.append(time.perf_counter())
    return _per_step(ends, warmup)


def loop_overhead(
    n: int,
    k: int,
    d_model: int,
    n_heads: int,
    n_layers: int,
    d_ff: int,
    batch: int,
    steps: int,
    rounds: int,
    device: torch.device,
    bf16: bool,
    vocab: int = 1000,
) -> dict:
    """Seconds per step of both loops in each round and the median paired ratio Lightning / bare."""
    warmup = max(1, steps // 4)
    overrides = [
        f"model.max_len={n}",
        f"model.d_model={d_model}",
        f"model.n_heads={n_heads}",
        f"model.n_layers={n_layers}",
        f"model.d_ff={d_ff}",
        f"model.attention.options.k={k}",
        "model.dropout=0.0",
        f"trainer.max_steps={steps}",
        "optim.warmup_steps=1",
    ]
    batches = _batches(steps, batch, n, vocab, device)
    lightning_module, bare_module = _module(overrides, vocab, device), _module(overrides, vocab, device)
    lightning_s: list[float] = []
    bare_s: list[float] = []
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # no "GPU available" banners every round
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "few dataloader workers" and friends, every round
            for r in range(rounds):
                runs = [(lightning_s, _lightning_steps, lightning_module), (bare_s, _bare_steps, bare_module)]
                for out, loop, module in runs if r % 2 == 0 else runs[::-1]:
                    out.append(loop(module, batches, device, bf16, warmup))
    finally:
        quiet.setLevel(level)
    ratios = [a / b for a, b in zip(lightning_s, bare_s)]
    return {"lightning_s": lightning_s, "bare_s": bare_s, "ratio": median(ratios), "tokens": batch * n}
