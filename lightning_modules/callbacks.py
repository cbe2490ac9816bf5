"""Callbacks that measure a run: throughput, step time, peak memory, wall-clock quality curves."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import lightning as L
import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocator peak on GPU, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class RunMetrics(L.Callback):
    """Logs ``perf/tokens_per_sec``, ``perf/step_time_s``, ``perf/peak_mem_mb`` every training step
    and ``val/ppl_vs_wallclock`` (x axis: seconds spent in training steps) after each validation; keeps the
    totals that ``metrics.json`` reports."""

    def __init__(self) -> None:
        self.tokens = 0
        self.train_seconds = 0.0
        self._t0 = 0.0
        self.curve: list[tuple[float, int, float]] = []  # (seconds, tokens, val ppl)

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "train_seconds": self.train_seconds, "curve": self.curve}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.train_seconds = state["tokens"], state["train_seconds"]
        self.curve = [tuple(c) for c in state["curve"]]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        dt = time.perf_counter() - self._t0
        n = batch["input_ids"].numel() * trainer.world_size
        self.tokens += n
        self.train_seconds += dt
        pl_module.log_dict({"perf/tokens_per_sec": n / dt, "perf/step_time_s": dt,
                            "perf/peak_mem_mb": peak_memory_mb(pl_module.device)})

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ppl = trainer.callback_metrics.get("val/ppl")
        if trainer.sanity_checking or ppl is None:
            return
        self.curve.append((self.train_seconds, self.tokens, float(ppl)))
        for logger in trainer.loggers:
            if isinstance(logger, L.pytorch.loggers.TensorBoardLogger) and trainer.is_global_zero:
                logger.experiment.add_scalar("val/ppl_vs_wallclock", float(ppl), int(round(self.train_seconds)))
