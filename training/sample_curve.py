"""A validation curve with enough points to read: the objective on a fixed sample of the validation set, often.

A run validates on its whole validation set every ``trainer.val_check_interval`` steps (twice in a 600-step CPU
run): those are the numbers ``metrics.json``, the studies and every report read, and nothing here changes them. In
between, :class:`SampleValidation` scores the objective on a fixed sample of the validation set every
``max_steps / POINTS`` steps (at least 1), and logs it to TensorBoard as ``val_sample/<name>``
(``val_sample/masked_loss``) beside the full set's ``val/<name>``, with the no-context level of the full set
(``no_context/<name>``, the level ``metrics.json`` reports) at the same steps, so the level is drawn as a line:

    sample = batches ⌊i · B / m⌋ for i < m of the validation loader's first B = limit_val_batches batches,
    m = ⌈B / SAMPLE_SHARE⌉

the same batches (blocks and masks) at every point and, the validation data being the same for every run of a
config, for every run and seed. It costs ``POINTS / SAMPLE_SHARE`` (about 0.6) of one full validation per run.

The scoring leaves the run as it was: the model is put back in the training mode of each of its modules, the RNG
states of torch (CPU and the run's device) and Python are restored, and the seconds it takes are outside the
timed training steps (``RunMetrics`` closes its stretch first), so a run's training, its full validations and its
``metrics.json`` (``ppl_vs_wallclock`` included, which holds the full validations only) are what they were without
it. Optuna's pruning callback, which acts at the full validations, sees nothing of it.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from lightning_modules.callbacks import RunMetrics

POINTS = 20  # sample validations per run (a run of fewer steps: one per step)
SAMPLE_SHARE = 32  # the sample is this share of the validation batches (at least one batch)
PREFIX = "val_sample/"


def sample_tag(metric: str) -> str:
    """The TensorBoard tag of ``metric``'s sample curve: ``val/masked_loss`` -> ``val_sample/masked_loss``."""
    return PREFIX + metric.removeprefix("val/")


def sample_every(max_steps: int) -> int:
    """Steps between two sample validations: ``⌈max_steps / POINTS⌉``."""
    return max(1, math.ceil(max_steps / POINTS))


def sample_positions(batches: int) -> list[int]:
    """Which of the validation loader's first ``batches`` batches make the sample: m evenly spread positions."""
    m = max(1, math.ceil(batches / SAMPLE_SHARE))
    return sorted({i * batches // m for i in range(m)})


class SampleValidation(L.Callback):
    """Every :func:`sample_every` steps, logs ``val_sample/<name>`` of ``metric`` (``val/masked_loss``) on the fixed
    sample (module docstring), and what ``levels()`` returns (``{"no_context/masked_loss": 3.09}``), at the global
    step. ``run`` (the run's :class:`RunMetrics`) has its timed stretch closed first: the sample's seconds are not
    training seconds. A module without ``sample_scores`` logs nothing."""

    def __init__(
        self,
        metric: str,
        run: Optional[RunMetrics] = None,
        levels: Callable[[L.Trainer], dict[str, float]] = lambda trainer: {},
    ) -> None:
        self.metric, self.run, self.levels = metric, run, levels
        self.tag = sample_tag(metric)
        self.batches: Optional[list[Any]] = None
        self._last = -1

    def _sample(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Any]:
        """The sample's batches, taken from the validation loader once, on the module's device."""
        if self.batches is None:
            loader = trainer.datamodule.val_dataloader()
            wanted = set(sample_positions(min(len(loader), int(trainer.limit_val_batches))))
            kept = []
            for i, batch in enumerate(loader):
                if i > max(wanted):
                    break
                if i in wanted:
                    kept.append(move_data_to_device(pl_module.on_before_batch_transfer(batch, 0), pl_module.device))
            self.batches = kept
        return self.batches

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last or step % sample_every(trainer.max_steps) or not hasattr(pl_module, "sample_scores"):
            return
        self._last = step
        if self.run is not None:
            self.run._close()
        scores = self.score(trainer, pl_module)
        if self.metric not in scores or not trainer.is_global_zero:
            return
        logged = {self.tag: scores[self.metric], **self.levels(trainer)}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=step)

    def score(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """The module's validation scores on the sample, leaving its modes and every RNG as they were."""
        modes = {m: m.training for m in pl_module.modules()}
        device = pl_module.device
        python_rng = random.getstate()
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                batches = self._sample(trainer, pl_module)
                pl_module.eval()
                with torch.inference_mode(), trainer.precision_plugin.val_step_context():
                    return pl_module.sample_scores(batches)
        finally:
            random.setstate(python_rng)
            for module, training in modes.items():
                module.train(training)


# A run's curves as read: a report draws them and then judges each arm's end from them (×F reports); the dashboard
# reads them at every refresh. The key holds the
# run's events files with their sizes and times, so a run that wrote more since is read again.
_READ: dict[tuple, Optional[tuple[list[int], list[float]]]] = {}


def run_curve(run_dir: str, metric: str) -> Optional[tuple[list[int], list[float]]]:
    """``(steps, values)`` of ``metric``'s sample curve in the run's events, else of its full validations (None: the
    run logged neither); in step order, a step written twice with its later value (a resumed run has one events file
    per process, read in the order of their names, which need not be the order they were written in). The report's
    learning curves and the dashboard's intermediate values read it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(run_dir).glob("events.out.tfevents.*"))
    key = (str(run_dir), metric, tuple((f.name, st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]))
    if key not in _READ:
        ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        ea.Reload()
        tags = ea.Tags().get("scalars", [])
        tag = next((t for t in (sample_tag(metric), metric) if t in tags), None)
        curve = None
        if tag is not None:
            latest = {e.step: e.value for e in sorted(ea.Scalars(tag), key=lambda e: e.wall_time)}
            steps = sorted(latest)
            curve = steps, [latest[s] for s in steps]
        _READ[key] = curve
    return _READ[key]
