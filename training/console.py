"""What a run prints while it trains: a progress bar in a terminal, plain periodic lines elsewhere, and no
third-party noise.

Each filter names one message at its source, so every other warning still shows:

- Lightning's advert for its cloud logger ("💡 Tip: ... litlogger"), logged at INFO by its rank-zero logger;
- Lightning's advice to call ``torch.set_float32_matmul_precision`` on a GPU with Tensor Cores (INFO, same logger):
  a run on CUDA sets it itself (``lightning_modules.callbacks.Accelerate``), in every process that trains, but
  Lightning checks it before any callback of the run can set it;
- Lightning's ``PossibleUserWarning`` "GPU available but not used" on a run whose ``trainer.accelerator`` chose the
  CPU (its "GPU available: True (cuda), used: False" line stays and says the same without advice);
- Lightning's device lines on a machine without the device: "GPU available: False, used: False" and "TPU available:
  False, using: 0 TPU cores" (INFO, same logger; the run's device is in its config and its first line);
- Lightning's "`Trainer.fit` stopped: `max_steps=N` reached." (INFO): a run ends with lines of its own that say
  where it stopped, and an unfinished one says so as an error;
- Lightning's warning that ``on_before_batch_transfer`` is overridden in the module while a data module is passed:
  the lab's language models move their batches' tensors there on purpose (lightning_modules/language_model.py),
  whatever the data module;
- torch's ``FutureWarning`` that ``isinstance(treespec, LeafSpec)`` is deprecated, raised by Lightning's own
  ``utilities/_pytree.py`` (Lightning's code, not ours, uses the old name);
- the datasets library's progress bars ("Generating train split", "Map", "Filter") while a corpus is prepared,
  switched off with its documented ``datasets.disable_progress_bars()`` unless the user set
  ``HF_DATASETS_DISABLE_PROGRESS_BARS`` (then that setting decides, as datasets documents).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.warnings import PossibleUserWarning

ADVERT = "💡 Tip:"
TENSOR_CORES = "that has Tensor Cores. To properly utilize them"
GPU_UNUSED = "GPU available but not used"
PYTREE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
NO_DEVICE = ("GPU available: False", "TPU available: False")  # starts of Lightning's lines for an absent device
FIT_STOPPED = "`Trainer.fit` stopped: `max_steps="
BATCH_HOOK = r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a"
DATASETS_BARS = "HF_DATASETS_DISABLE_PROGRESS_BARS"
# Lightning's rank-zero helpers log through whichever of these modules was imported last.
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
FALLBACK_COLUMNS = 100  # a terminal that reports zero columns gets a bar of this width


class _NoAdvice(logging.Filter):
    """Lightning's rank-zero records but its advert, its Tensor-Cores advice, its lines for an absent device and its
    "fit stopped at max_steps"."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not (message.startswith((ADVERT, *NO_DEVICE, FIT_STOPPED)) or TENSOR_CORES in message)


_NO_ADVICE = _NoAdvice()


def quiet_third_parties() -> None:
    """Install the filters above (idempotent): process-wide, each for exactly one message."""
    warnings.filterwarnings("ignore", message=PYTREE, category=FutureWarning, module=r"lightning\..*_pytree")
    warnings.filterwarnings("ignore", message=GPU_UNUSED, category=PossibleUserWarning)
    warnings.filterwarnings("ignore", message=BATCH_HOOK, category=UserWarning)
    for name in RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if _NO_ADVICE not in logger.filters:
            logger.addFilter(_NO_ADVICE)
    if os.environ.get(DATASETS_BARS) is None:
        import datasets  # (the data modules import it anyway)

        datasets.disable_progress_bars()


def _without_version(items: dict[str, Any]) -> dict[str, Any]:
    items.pop("v_num", None)  # the logger's version: the run directory, printed at the start and the end
    return items


class Bar(TQDMProgressBar):
    """Lightning's tqdm bar without ``v_num``, drawn at :data:`FALLBACK_COLUMNS` when the terminal reports a
    width of zero (tqdm then prints nothing at all)."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        return _without_version(super().get_metrics(trainer, pl_module))

    @staticmethod
    def _sized(bar: Any) -> Any:
        width = bar.dynamic_ncols(bar.fp)[0] if callable(bar.dynamic_ncols) else bar.ncols
        if width is None or width <= 0:  # tqdm reads a zero-column terminal as -1
            bar.dynamic_ncols, bar.ncols, bar.nrows = False, FALLBACK_COLUMNS, None  # rows -1 would hide it too
        return bar

    def init_train_tqdm(self) -> Any:
        return self._sized(super().init_train_tqdm())

    def init_validation_tqdm(self) -> Any:
        return self._sized(super().init_validation_tqdm())

    def init_test_tqdm(self) -> Any:
        return self._sized(super().init_test_tqdm())


class Lines(ProgressBar):
    """Progress without a terminal (a log file, a pipe, CI): one plain line every ``every`` steps and after each
    validation, ``step 300/600 (50%)  train/loss 2.9  elapsed 0:21  left 0:21``."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = max(1, every)
        self._enabled = True
        self._started = 0.0
        self._first_step = 0

    @property
    def refresh_rate(self) -> int:
        """Steps between two reads of the metrics (a line): a multiple of the loggers' interval, like the bar's."""
        return self.every

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        return _without_version(super().get_metrics(trainer, pl_module))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started, self._first_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step % self.every == 0:
            self._line(trainer, pl_module, "")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._line(trainer, pl_module, "validated")

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        step, total = trainer.global_step, trainer.max_steps
        elapsed = time.monotonic() - self._started
        done = step - self._first_step
        left = elapsed / done * (total - step) if done > 0 and total > 0 else None
        shown = self.get_metrics(trainer, pl_module)
        metrics = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
        pct = f" ({100 * step / total:.0f}%)" if total > 0 else ""
        timing = f"elapsed {clock(elapsed)}" + (f"  left {clock(left)}" if left is not None else "")
        print("  ".join(p for p in (f"step {step}/{total}{pct}", what, metrics, timing) if p), flush=True)


def clock(seconds: float) -> str:
    """``1:02:03`` or ``2:03``."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress(log_every_n_steps: int, tty: bool | None = None) -> ProgressBar:
    """The bar for a terminal, plain lines (every 10 logging intervals) when stdout is not one."""
    if sys.stdout.isatty() if tty is None else tty:
        # The bar reads its metrics (train/loss) back from the device when it refreshes: as often as the loggers.
        return Bar(refresh_rate=max(1, log_every_n_steps))
    return Lines(every=10 * max(1, log_every_n_steps))
