"""Callbacks that measure a run: throughput, step time, peak memory, wall-clock quality curves, training
FLOPs and their share of the device's peak (MFU), and the attention spectrum during training; and the one that
sets a process up to train fast (:class:`Accelerate`)."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from typing import Any, Iterator, Optional

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from foundation.errors import ConfigError
from lightning_modules import analysis
from lightning_modules.figures import figure_to_array
from lightning_modules.flops import device_peak, training_step_flops

TENSOR_CORES = "high"  # float32 matmuls in TF32 on CUDA (torch.set_float32_matmul_precision)


class Accelerate(L.Callback):
    """What every process that trains does first (the launching process, and each rank ``ddp_spawn`` starts, which
    gets this callback's copy): on a CUDA device, float32 matmuls on the tensor cores
    (``torch.set_float32_matmul_precision("high")``: TF32; a bf16-mixed run multiplies in bf16 anyway); and, when
    ``compile``, the module's encoder compiled in place (``nn.Module.compile``: every block, attention and
    feed-forward, fused by ``torch.compile``; its state_dict keys unchanged, so a compiled run's checkpoints load into
    an uncompiled model and resume exactly, and the LM head with its data-dependent target count stays eager).
    Compiled once per run; earlier compiled graphs are dropped first (``torch.compiler.reset``), so the trials a sweep
    worker runs one after another never pile up recompilations of one another's models."""

    def __init__(self, compile: bool) -> None:
        self.compile = compile
        self._compiled = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.set_float32_matmul_precision(TENSOR_CORES)
        if self.compile and not self._compiled:
            torch.compiler.reset()
            try:
                pl_module.encoder.compile()
            except Exception as err:
                raise compile_failed(err) from err
            self._compiled = True


class CompileFailed(ConfigError):
    """``torch.compile`` failed on this run's model: one line naming ``trainer.compile`` and the way out.

    A failed compile stops the run rather than falling back to eager: the trials of one study are compared at one
    setting (an eager fall-back would mix compiled and eager trials, whose speed and rounding differ, in one
    comparison), and the way out is one key. A ConfigError, so that a sweep puts the trial back uncounted and stops
    with this line (every trial of the shape would meet it); ``sweep`` meets it in its preflight, before any trial."""


@contextlib.contextmanager
def compile_failures(compiling: bool) -> Iterator[None]:
    """Inside: a failure of ``torch.compile`` (raised when the model is compiled, or by TorchDynamo or Inductor at its
    first call) becomes :class:`CompileFailed`; nothing else changes. Out of memory stays what it is."""
    if not compiling:
        yield
        return
    try:
        yield
    except CompileFailed:
        raise
    except Exception as err:
        chain = [err, err.__cause__, err.__context__]
        if not any(e is not None and type(e).__module__.startswith(COMPILERS) for e in chain):
            raise
        raise compile_failed(err) from err


COMPILERS = ("torch._dynamo", "torch._inductor")  # the modules whose exceptions are torch.compile's


def compile_failed(err: BaseException) -> CompileFailed:
    said = " ".join(str(err).split())[:160]
    return CompileFailed(
        f"trainer.compile: torch.compile failed on this model ({type(err).__name__}: {said}); set "
        "trainer.compile=false to train eager"
    )


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocator peak on GPU, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class RunMetrics(L.Callback):
    """Logs ``perf/tokens_per_sec``, ``perf/step_time_s``, ``perf/peak_mem_mb`` and, where the device has a named
    peak, ``perf/mfu`` every ``log_every_n_steps`` training steps; keeps the totals that ``metrics.json`` reports,
    and after each validation a point of its ``ppl_vs_wallclock`` curve (seconds spent in training steps, tokens,
    val/ppl; TensorBoard draws any scalar against wall-clock time with its "Relative" x axis).

    Timing without a device synchronisation per step: a stretch of consecutive training steps runs from the
    start of its first batch to the end of its last, which synchronises the device once (a CUDA step returns
    before its kernels finish); a stretch ends at each logging step, before a validation and at the end of
    training. ``perf/*`` are the means over the steps since the last logging step (the time between steps,
    fetching the next batch, included; validation excluded). The first step of each process that trains is its
    own stretch (logged as one, when it is a logging step), kept apart as ``warmup_s``: it compiles the model
    (``trainer.compile``), counts the FLOPs (:class:`TrainingFlops`) and warms the libraries up, once, so the
    run's throughput is that of the steps after it:

        tokens_per_sec = tokens of the timed steps / their seconds

    MFU (model FLOPs utilisation) is the model's training FLOP/s on one device over that device's peak at the run's
    precision (:func:`~lightning_modules.flops.device_peak`, the peak named), over the same steps:

        mfu = mean_flops_per_batch · batches / seconds / peak

    with ``mean_flops_per_batch`` the count of ``flops`` (:class:`TrainingFlops`) and ``batches`` this rank's; absent,
    with the reason, where there is no peak (a CPU, an unknown GPU).

    ``peak_mem_mb`` is read on the device the module trains on, while it trains: after ``fit`` Lightning's
    teardown has moved the module back to the CPU, where the figure would be the process's peak RSS instead of
    the CUDA allocator's peak."""

    def __init__(self, flops: Optional["TrainingFlops"] = None) -> None:
        self.flops = flops
        self.tokens = 0  # every step's, the first of each process's included
        self.train_seconds = 0.0  # the timed steps' (each process's first apart)
        self.timed_tokens = 0
        self.timed_batches: Optional[int] = 0  # (None: resumed from a checkpoint that did not count them)
        self.warmup_s = 0.0  # each process's first step
        self.curve: list[tuple[float, int, float]] = []  # (seconds, tokens, val ppl)
        self.validated_at = -1  # global step of the latest validation during fit
        self.device = torch.device("cpu")  # the device of the latest training step
        self.peak_mem_mb = 0.0  # peak memory during training, on that device (see peak_memory_mb)
        # Whether fit ran in this process: under ddp_spawn / ddp_fork it runs in worker processes, which have
        # copies of this callback, and only the weights and the last metrics come back.
        self.fit_here = False
        self.device_name = "cpu"  # torch.cuda.get_device_name of the device trained on
        self.peak: tuple[float, str] | str = device_peak("cpu", "32-true")  # (FLOP/s, its name), or why none
        self._warming = True  # the next step is this process's first
        self._opened: float | None = None  # perf_counter at the start of the open stretch of steps
        self._logged_at = 0  # global step of the last perf/* log
        self._window = [0.0, 0, 0]  # seconds, tokens and batches since then

    _STATE = ("tokens", "train_seconds", "timed_tokens", "timed_batches", "warmup_s", "validated_at", "peak_mem_mb")

    def state_dict(self) -> dict[str, Any]:
        return {
            **{key: getattr(self, key) for key in self._STATE},
            "curve": self.curve,
            "device_name": self.device_name,
            "peak": list(self.peak) if isinstance(self.peak, tuple) else self.peak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # (a checkpoint of an earlier version holds no timed counts: every step counted as timed, batches unknown)
        defaults = {"timed_tokens": state["tokens"], "timed_batches": None, "warmup_s": 0.0, "validated_at": -1}
        for key in self._STATE:  # a resumed run reports the larger peak_mem_mb of both processes'
            setattr(self, key, state.get(key, defaults.get(key, getattr(self, key))))
        self.curve = [tuple(c) for c in state["curve"]]
        self.device_name = state.get("device_name", self.device_name)
        peak = state.get("peak", self.peak)
        self.peak = tuple(peak) if isinstance(peak, list) else peak

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_here = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._logged_at, self._window = trainer.global_step, [0.0, 0, 0]  # (a resumed run starts mid-way)
        self._warming = True
        device = pl_module.device
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        self.peak = device_peak(self.device_name, str(trainer.precision))

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
        self.device = pl_module.device
        step = trainer.global_step
        logs = step != self._logged_at and step % max(1, trainer.log_every_n_steps) == 0
        if self._warming:  # this process's first step: its own stretch, not timed (logged as what it took)
            seconds = self._close(warmup=True)
            if logs:
                self._log(pl_module, seconds, n, 1, step - self._logged_at)
            self._warming, self._logged_at = False, step
            return
        self.timed_tokens += n
        self.timed_batches = None if self.timed_batches is None else self.timed_batches + 1
        self._window[1] += n
        self._window[2] += 1
        if logs:
            self._close()
            self._log(pl_module, *self._window, step - self._logged_at)
            self._logged_at, self._window = step, [0.0, 0, 0]

    def _log(self, pl_module: L.LightningModule, seconds: float, tokens: int, batches: int, steps: int) -> None:
        """``perf/*`` of a stretch of ``steps`` steps (``batches`` batches of this rank, ``tokens`` of every rank)."""
        # CPU tensors: a Python number would be copied to the device, and wait for it, at every call.
        logged = {
            "perf/tokens_per_sec": torch.tensor(tokens / max(seconds, 1e-9)),
            "perf/step_time_s": torch.tensor(seconds / steps),
            "perf/peak_mem_mb": torch.tensor(self.peak_mem_mb),
        }
        mfu = self._mfu(batches, seconds)
        pl_module.log_dict({**logged, **({"perf/mfu": torch.tensor(mfu)} if mfu is not None else {})})

    @property
    def tokens_per_sec(self) -> float:
        """The timed steps' throughput (a run of one step per process: that of its steps, warm-up included)."""
        if self.train_seconds > 0:
            return self.timed_tokens / self.train_seconds
        return self.tokens / max(self.warmup_s, 1e-9)

    def _mfu(self, batches: Optional[int], seconds: float) -> Optional[float]:
        """The MFU of ``batches`` of this rank trained in ``seconds``; None without a peak or a FLOP count."""
        counted = self.flops.mean_flops_per_batch if self.flops is not None else None
        if not isinstance(self.peak, tuple) or not counted or not batches or seconds <= 0:
            return None
        return counted * batches / seconds / self.peak[0]

    def utilisation(self) -> dict[str, Any]:
        """What ``metrics.json`` says of the chip: the device trained on, the first steps' ``warmup_s``, and ``mfu``
        over the timed steps with ``mfu_peak`` (the peak's name), or ``mfu_unavailable`` (why there is none)."""
        out = {"device": self.device_name, "warmup_s": self.warmup_s}
        mfu = self._mfu(self.timed_batches, self.train_seconds)
        if mfu is not None:
            return {**out, "mfu": mfu, "mfu_peak": self.peak[1]}
        if isinstance(self.peak, str):
            why = self.peak
        elif self.timed_batches is None:
            why = "resumed from a checkpoint that does not count its timed batches"
        else:
            why = "no FLOP count or no timed step (a module without training_loss, a run of one step)"
        return {**out, "mfu_unavailable": why}

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._close()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def _close(self, warmup: bool = False) -> float:
        """End the open stretch of training steps: one device synchronisation, its seconds (the timed steps', or
        ``warmup``'s) and the peak kept; returns its seconds."""
        if self._opened is None:
            return 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self._opened
        self._opened = None
        if warmup:
            self.warmup_s += seconds
        else:
            self.train_seconds += seconds
            self._window[0] += seconds
        self.peak_mem_mb = max(self.peak_mem_mb, peak_memory_mb(self.device))
        return seconds

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.validated_at = trainer.global_step
        ppl = trainer.callback_metrics.get("val/ppl")
        if ppl is None:  # tasks without a perplexity (classification)
            return
        self.curve.append((self.train_seconds, self.tokens, float(ppl)))


class TrainingFlops(L.Callback):
    """The matrix FLOPs a run spends in training (forward and backward; the optimiser's element-wise update is
    not counted): one step's count, taken once on the first batch trained (:func:`training_step_flops` on the
    module's ``training_loss``, under the trainer's precision context, leaving the run's RNG and gradients
    untouched), times the batches trained by every rank:

        train_flops = flops_per_batch · batches · world_size

    Under a length curriculum (``optim.short_steps``) a short step is counted apart, on the first short batch as the
    module cuts it (``training_batch``): ``short_flops_per_batch · short_batches`` is added to the full-length steps'
    count. The first batch of each length stands for every batch of that length: exact for fixed-shape batches, and
    for masked LM up to the number of masked positions, whose share of the FLOPs is the LM head's. A module without
    ``training_loss`` is not counted (``train_flops`` None). The state is checkpointed, so a resumed run keeps
    counting."""

    def __init__(self) -> None:
        self.flops_per_batch: int | None = None  # a full-length step's
        self.short_flops_per_batch: int | None = None  # a length-curriculum short step's
        self.batches = 0  # trained by this rank, short ones included
        self.short_batches = 0
        self.world_size = 1
        self._short = False

    @property
    def train_flops(self) -> int | None:
        full = self.batches - self.short_batches
        if (full and self.flops_per_batch is None) or (self.short_batches and self.short_flops_per_batch is None):
            return None
        counted = (self.flops_per_batch or 0) * full + (self.short_flops_per_batch or 0) * self.short_batches
        return counted * self.world_size if self.batches else None

    @property
    def mean_flops_per_batch(self) -> float | None:
        """One rank's mean count over the batches it trained (short and full-length ones)."""
        total = self.train_flops
        return None if total is None else total / self.world_size / self.batches

    def state_dict(self) -> dict[str, Any]:
        keys = ("flops_per_batch", "short_flops_per_batch", "batches", "short_batches", "world_size")
        return {key: getattr(self, key) for key in keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.world_size = trainer.world_size
        if not hasattr(pl_module, "training_loss"):
            return
        length = getattr(pl_module, "short_length", lambda: None)()
        self._short = length is not None
        if (self.short_flops_per_batch if self._short else self.flops_per_batch) is None:
            cut = getattr(pl_module, "training_batch", lambda b: b)(batch)
            flops = training_step_flops(
                pl_module, lambda: pl_module.training_loss(cut), trainer.precision_plugin.train_step_context
            )
            if self._short:
                self.short_flops_per_batch = flops
            else:
                self.flops_per_batch = flops

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.batches += 1
        self.short_batches += int(self._short)


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
            with torch.compiler.set_stance("force_eager"):  # its hooks read every layer's attention (uncompiled)
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
