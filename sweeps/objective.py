"""One Optuna trial = one ``experiments.train.train`` run.

The trial's config is the study's base < overrides < the trial's params, its run directory
``<output_dir>/<study>/trial_<number>/``, its experiment name the study's; its TensorBoard HPARAMS
entry carries the trial's params, the study, the trial number and the objective's metric names. What
a trial ends with is recorded on it: the objective values, the scalar ``metrics.json`` entries
(user attr ``metrics``, so reports work from the storage alone), or ``fail_reason``.

A trial that retries one whose worker died or was interrupted (same params, Optuna's ``retry_history``)
continues from that attempt's last checkpoint: the attempt's run directory is copied into the new one
(TensorBoard events, checkpoint with its RNG states) and the run resumes there (``resume=true``), so it
ends exactly as an uninterrupted run would; the attempt's intermediate values up to that step are
reported again, so pruners see the whole curve. User attr ``resumed_from``: ``{trial, step}``.
"""

from __future__ import annotations

import math
import shutil
import types
from pathlib import Path
from typing import Any, Optional

import lightning as L
import optuna
import torch
from optuna.trial import FrozenTrial
from optuna_integration import PyTorchLightningPruningCallback

from experiments.config import ConfigError
from experiments.resume import read_checkpoint
from experiments.rundir import CHECKPOINT
from sweeps import storage as S
from sweeps.study import Study

PRUNE_MONITOR = "val/loss"


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


class DivergenceGuard(L.Callback):
    """Stops a run at the first non-finite training loss (cheaper and narrower than ``detect_anomaly``)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not torch.isfinite(loss).all():
            raise Diverged(f"diverged: train/loss={loss.item()} at step {trainer.global_step}")


class StepPruning(PyTorchLightningPruningCallback):
    """Optuna's Lightning pruning callback, reporting at the training step instead of the epoch.

    Runs here validate every ``val_check_interval`` steps inside one long epoch, so the epoch number
    would be 0 at every report and Optuna would ignore all but the first.
    """

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, types.SimpleNamespace(current_epoch=trainer.global_step))


class StudyMisconfigured(ConfigError):
    """A problem every trial would hit (e.g. an objective metric that metrics.json lacks): stop the sweep."""


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if isinstance(err, Diverged) else f"{type(err).__name__}: {text[0] if text else ''}"


def continue_attempt(trials: list[FrozenTrial], frozen: FrozenTrial,
                     run_dir: Path) -> Optional[tuple[FrozenTrial, int]]:
    """If ``frozen`` retries an attempt that left a checkpoint, copy that attempt's run directory to
    ``run_dir`` and return (the attempt, its checkpoint's step); else None (the trial starts afresh)."""
    history = frozen.system_attrs.get("retry_history", [])
    previous = next((t for t in trials if t.number == history[-1]), None) if history else None
    old = Path(previous.user_attrs.get("run_dir", "")) if previous is not None else None
    if old is None or not (old / CHECKPOINT).is_file() or run_dir.exists():
        return None
    shutil.copytree(old, run_dir)
    return previous, int(read_checkpoint(run_dir / CHECKPOINT)["global_step"])


class Objective:
    """``objective(trial) -> value(s)`` for ``optuna.Study.optimize``."""

    def __init__(self, study: Study) -> None:
        self.study = study
        self.prune = study.spec.pruner.kind != "none"

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        from experiments.train import train  # heavy import, only in workers

        ostudy = trial.study
        trials = ostudy.get_trials(deepcopy=False)
        frozen = next(t for t in trials if t.number == trial.number)  # its system attrs: grid point, retries
        if self.study.n_trials is not None and S.budget_position(trials, trial.number) >= self.study.n_trials:
            trial.set_user_attr(S.DISCARDED, "the budget was met by concurrent workers")
            if "fixed_params" in frozen.system_attrs:  # an enqueued grid point: put it back
                S.requeue(ostudy, frozen)
            raise optuna.TrialPruned("discarded: budget already met")

        params = self.study.suggest(trial)
        run_dir = self.study.root / f"trial_{trial.number}"
        for inherited in ("fail_reason", "resumed_from"):  # copied from the attempt this trial retries
            if trial.user_attrs.get(inherited) is not None:
                trial.set_user_attr(inherited, None)
        resumed = continue_attempt(trials, frozen, run_dir)
        run = {"experiment": self.study.name, "run_dir": str(run_dir)}
        if resumed is not None:
            previous, step = resumed
            run["resume"] = True
            trial.set_user_attr("resumed_from", {"trial": previous.number, "step": step})
            for at, value in sorted(previous.intermediate_values.items()):
                if at <= step:
                    trial.report(value, at)
        cfg = self.study.config(params, run)
        trial.set_user_attr("run_dir", str(run_dir))
        pruning = StepPruning(trial, monitor=PRUNE_MONITOR) if self.prune else None
        callbacks: list[L.Callback] = [DivergenceGuard(), *([pruning] if pruning else [])]
        hparams = {**params, "sweep/study": self.study.name, "sweep/trial": trial.number,
                   "sweep/objective": ",".join(self.study.metrics)}
        try:
            metrics = train(cfg, callbacks=callbacks, hparams=hparams)
            if pruning is not None:
                pruning.check_pruned()  # a decision taken in a spawned rank (ddp_spawn) surfaces here
            missing = [m for m in self.study.metrics if m not in metrics]
            if missing:
                known = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float))))
                raise StudyMisconfigured(f"objective: metric {missing[0]!r} is not in metrics.json (has: {known})")
            values = [float(metrics[m]) for m in self.study.metrics]
            bad = [(m, v) for m, v in zip(self.study.metrics, values) if not math.isfinite(v)]
            if bad:
                raise Diverged(f"diverged: {bad[0][0]}={bad[0][1]} at the end")
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:  # Optuna fails the trial: put an identical one back for the resumed study
            trial.set_user_attr("fail_reason", "interrupted")
            S.requeue(ostudy, next(t for t in ostudy.get_trials(deepcopy=False) if t.number == trial.number))
            raise
        except Exception as err:
            trial.set_user_attr("fail_reason", _reason(err))
            raise
        trial.set_user_attr("metrics", {k: v for k, v in metrics.items()
                                        if isinstance(v, (int, float)) and math.isfinite(v)})
        return values[0] if len(values) == 1 else values
