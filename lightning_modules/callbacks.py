"""Callbacks that measure a run: throughput, step time, peak memory, wall-clock quality curves, training
FLOPs, and the attention spectrum during training."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_modules import analysis
from lightning_modules.figures import figure_to_array
from lightning_modules.flops import training_step_flops


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocator peak on GPU, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class RunMetrics(L.Callback):
    """Logs ``perf/tokens_per_sec``, ``perf/step_time_s``, ``perf/peak_mem_mb`` every ``log_every_n_steps``
    training steps and ``val/ppl_vs_wallclock`` (x axis: seconds spent in training steps) after each validation;
    keeps the totals that ``metrics.json`` reports.

    Timing without a device synchronisation per step: a stretch of consecutive training steps runs from the
    start of its first batch to the end of its last, which synchronises the device once (a CUDA step returns
    before its kernels finish); a stretch ends at each logging step, before a validation and at the end of
    training. ``perf/*`` are the means over the steps since the last logging step (the time between steps,
    fetching the next batch, included; validation excluded).

    ``peak_mem_mb`` is read on the device the module trains on, while it trains: after ``fit`` Lightning's
    teardown has moved the module back to the CPU, where the figure would be the process's peak RSS instead of
    the CUDA allocator's peak."""

    def __init__(self) -> None:
        self.tokens = 0
        self.train_seconds = 0.0
        self.curve: list[tuple[float, int, float]] = []  # (seconds, tokens, val ppl)
        self.validated_at = -1  # global step of the latest validation during fit
        self.device = torch.device("cpu")  # the device of the latest training step
        self.peak_mem_mb = 0.0  # peak memory during training, on that device (see peak_memory_mb)
        # Whether fit ran in this process: under ddp_spawn / ddp_fork it runs in worker processes, which have
        # copies of this callback, and only the weights and the last metrics come back.
        self.fit_here = False
        self._opened: float | None = None  # perf_counter at the start of the open stretch of steps
        self._logged_at = 0  # global step of the last perf/* log
        self._window = [0.0, 0]  # seconds and tokens since then

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "train_seconds": self.train_seconds,
            "curve": self.curve,
            "validated_at": self.validated_at,
            "peak_mem_mb": self.peak_mem_mb,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.train_seconds = state["tokens"], state["train_seconds"]
        self.curve = [tuple(c) for c in state["curve"]]
        self.validated_at = state.get("validated_at", -1)
        self.peak_mem_mb = state.get("peak_mem_mb", 0.0)  # a resumed run reports the larger of both processes'

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_here = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._logged_at, self._window = trainer.global_step, [0.0, 0]  # (a resumed run starts mid-way)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._opened is None:
            self._opened = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = batch["input_ids"].numel() * trainer.world_size
        self.tokens += n
        self._window[1] += n
        self.device = pl_module.device
        step = trainer.global_step
        if step == self._logged_at or step % max(1, trainer.log_every_n_steps):
            return
        self._close()
        (seconds, tokens), steps = self._window, step - self._logged_at
        # CPU tensors: a Python number would be copied to the device, and wait for it, at every call.
        pl_module.log_dict(
            {
                "perf/tokens_per_sec": torch.tensor(tokens / max(seconds, 1e-9)),
                "perf/step_time_s": torch.tensor(seconds / steps),
                "perf/peak_mem_mb": torch.tensor(self.peak_mem_mb),
            }
        )
        self._logged_at, self._window = step, [0.0, 0]

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._close()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def _close(self) -> None:
        """End the open stretch of training steps: one device synchronisation, its seconds and the peak kept."""
        if self._opened is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self._opened
        self._opened = None
        self.train_seconds += seconds
        self._window[0] += seconds
        self.peak_mem_mb = max(self.peak_mem_mb, peak_memory_mb(self.device))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.validated_at = trainer.global_step
        ppl = trainer.callback_metrics.get("val/ppl")
        if ppl is None:  # tasks without a perplexity (classification)
            return
        self.curve.append((self.train_seconds, self.tokens, float(ppl)))
        for logger in trainer.loggers:
            if isinstance(logger, L.pytorch.loggers.TensorBoardLogger) and trainer.is_global_zero:
                logger.experiment.add_scalar("val/ppl_vs_wallclock", float(ppl), int(round(self.train_seconds)))


class TrainingFlops(L.Callback):
    """The matrix FLOPs a run spends in training (forward and backward; the optimiser's element-wise update is
    not counted): one step's count, taken once on the first batch trained (:func:`training_step_flops` on the
    module's ``training_loss``, under the trainer's precision context, leaving the run's RNG and gradients
    untouched), times the batches trained by every rank:

        train_flops = flops_per_batch · batches · world_size

    The first batch stands for every batch: exact for fixed-shape batches, and for masked LM up to the number
    of masked positions, whose share of the FLOPs is the LM head's. A module without ``training_loss`` is not
    counted (``train_flops`` None). The state is checkpointed, so a resumed run keeps counting."""

    def __init__(self) -> None:
        self.flops_per_batch: int | None = None
        self.batches = 0  # trained by this rank
        self.world_size = 1

    @property
    def train_flops(self) -> int | None:
        return None if self.flops_per_batch is None else self.flops_per_batch * self.batches * self.world_size

    def state_dict(self) -> dict[str, Any]:
        return {"flops_per_batch": self.flops_per_batch, "batches": self.batches, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flops_per_batch, self.batches, self.world_size = (
            state["flops_per_batch"],
            state["batches"],
            state["world_size"],
        )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.world_size = trainer.world_size
        if self.flops_per_batch is None and hasattr(pl_module, "training_loss"):
            self.flops_per_batch = training_step_flops(
                pl_module, lambda: pl_module.training_loss(batch), trainer.precision_plugin.train_step_context
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.batches += 1


class SpectrumMonitor(L.Callback):
    """Every ``every_n_val``-th validation, logs the attention spectrum of the model being trained on a
    fixed sample (the first ``samples`` sequences of the first validation batch), so the evolution of
    rank during training is visible: the image ``spectrum/heatmap`` (layer × head normalised cumulative
    singular value at each layer's index, paper Fig. 1 right; see ``analysis.heatmap_indices``) and the
    scalars ``spectrum/effective_rank/layer_<l>`` at ``energy``, at the global step. Rank zero only."""

    def __init__(self, every_n_val: int, samples: int = 8, energy: float = 0.9) -> None:
        if every_n_val < 1:
            raise ValueError(f"every_n_val must be >= 1, got {every_n_val}")
        self.every_n_val, self.samples, self.energy = every_n_val, samples, energy
        self.validations, self.unavailable = 0, False
        self.sample: dict | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.validations = state["validations"]

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.sample is None and not trainer.sanity_checking:
            self.sample = {
                key: None if batch.get(key) is None else batch[key][: self.samples].detach().cpu()
                for key in ("input_ids", "attention_mask")
            }  # packed LM batches: no mask

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.sample is None:
            return
        self.validations += 1
        if self.validations % self.every_n_val or not trainer.is_global_zero:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, L.pytorch.loggers.TensorBoardLogger)]
        if not loggers:
            return
        try:
            spectrum = analysis.measure_spectrum(pl_module.encoder, [self.sample])
        except ValueError as err:  # a kind that forms no softmax matrix: say so once, log nothing
            if not self.unavailable:
                rank_zero_warn(f"trainer.spectrum_every_n_val: {err}")
            self.unavailable = True
            return
        indices = analysis.heatmap_indices(pl_module.config["model"], spectrum)
        step = trainer.global_step
        image = figure_to_array(
            analysis.figure_heatmap(spectrum.at_index(indices), indices, f"cumulative singular value at k, step {step}")
        )
        for logger in loggers:
            logger.experiment.add_image("spectrum/heatmap", image, step, dataformats="HWC")
            for layer, rank in enumerate(spectrum.effective_ranks(self.energy)):
                logger.experiment.add_scalar(f"spectrum/effective_rank/layer_{layer}", rank, step)
