"""The objective: one Optuna trial's params → a run config → :func:`training.train.train` → its value(s).

The trial's config is the study's base < overrides < the trial's params (:meth:`Study.config`), its run
directory ``<output_dir>/<study>/<arm>/seed=<s>_trial_<number>/`` (:func:`sweeps.run.trials.trial_folder`), its
experiment name the study's; its TensorBoard HPARAMS entry carries the trial's params, the study, the trial number
and the objective's metric names, and the study's folder (a control's trials too) is its TensorBoard log directory.
Everything around a trial (budget, retries of dead workers, failure bookkeeping) lives in :mod:`sweeps.run.trials`.
"""

from __future__ import annotations

import math
import threading
import types
from typing import Any

import lightning as L
import optuna
from optuna_integration import PyTorchLightningPruningCallback

from foundation.errors import ConfigError, Diverged
from sweeps.run import trunks
from sweeps.spec.study import Study

PRUNE_MONITOR = "val/loss"


class StudyMisconfigured(ConfigError):
    """A problem every trial would hit (e.g. an objective metric that metrics.json lacks): stop the sweep."""


# Set by a sweep worker's SIGTERM handler, which only notes the signal: the worker stops at the next safe point
# (a journal write is never cut by it), see sweeps/run/command.py.
STOP_ASKED = threading.Event()


def note_stop(signum: int, frame: Any) -> None:
    STOP_ASKED.set()


class StopWhenAsked(L.Callback):
    """A stop asked before training started (while the data was prepared) stops the run after its first step, as
    Lightning's own SIGTERM handler does during ``fit``: the step is saved and the trial put back."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if STOP_ASKED.is_set():
            trainer._signal_connector.received_sigterm = True  # Lightning's flag: it stops after this step


class StepPruning(PyTorchLightningPruningCallback):
    """Optuna's Lightning pruning callback, reporting at the training step instead of the epoch.

    Runs here validate every ``val_check_interval`` steps inside one long epoch, so the epoch number
    would be 0 at every report and Optuna would ignore all but the first.
    """

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, types.SimpleNamespace(current_epoch=trainer.global_step))


# The HPARAMS place of each study's trials (its control's too), by the study's name: worked out once a process.
_PLACES: dict[str, Any] = {}


def log_place(study: Study) -> Any:
    """Where the trials of ``study`` and its control show in TensorBoard (``training.tensorboard.LogPlace``): the
    study's folder, each trial by its arm, seed and number; the study's arms, its control's role and the seed as the
    axes; and every column that some trial lacks filled, so that HPARAMS shows every trial: an arm's trials have no
    control role ("study"), full attention no ``k`` ("–")."""
    from sweeps.run.preflight import trial_points
    from sweeps.spec.schema import CONTROL_PARAM
    from training.tensorboard import BUDGET, NOT_APPLICABLE, STUDY, LogPlace
    from training.train import hparams_of

    top = study.parent or study
    if top.name not in _PLACES:
        rows = [{**hparams_of(s.config(p)), **p} for s in top.studies for p in trial_points(s)]
        names = [n for n in dict.fromkeys(k for row in rows for k in row) if any(n not in row for row in rows)]
        fill = tuple((n, STUDY if n == CONTROL_PARAM else NOT_APPLICABLE) for n in names)
        curve = [BUDGET] if top.budgets else []  # a curve's trunk and cooldowns: one session each
        axes = tuple(dict.fromkeys([*top.arms, *([CONTROL_PARAM] if top.control else []), *top.spec.space, *curve]))
        _PLACES[top.name] = LogPlace(root=top.root, axes=axes, fill=fill, trial_ids=True)
    return _PLACES[top.name]


def objective(study: Study, trial: optuna.Trial, run: dict[str, Any]) -> float | list[float]:
    """Train the trial's config (``run``: its run directory and experiment name, and ``resume`` for a retry
    that continues a dead attempt) and return the study's metric(s) from its ``metrics.json``."""
    from training.train import train  # heavy import, only in workers

    params = study.suggest(trial)
    pruned = study.spec.pruner.kind != "none" and not study.budgets  # a curve's trunk is not pruned on its way
    pruning = StepPruning(trial, monitor=PRUNE_MONITOR) if pruned else None
    hparams = {
        **params,
        "sweep/study": study.name,
        "sweep/trial": trial.number,
        "sweep/objective": ",".join(study.metrics),
    }
    if study.budgets:  # a trunk and a cooldown per budget (sweeps/run/trunks.py); it answers at the largest
        points = trunks.run_curve(
            study, params, study.config(params, run), hparams, [StopWhenAsked()], log_place(study)
        )
        folder = trunks.point_folder(study, params)
        trial.set_user_attr(trunks.CURVE_DIR, str(folder))  # its trunk and cooldowns
        trial.set_user_attr("run_dir", str(trunks.cooldown_folder(folder, max(study.budgets))))  # what it answers
        trial.set_user_attr(trunks.POINTS, {name: _scalars(m) for name, m in points.items()})
        metrics = trunks.largest(points, study.budgets)
    else:
        metrics = train(
            study.config(params, run),
            callbacks=[StopWhenAsked(), *([pruning] if pruning else [])],  # train() guards against divergence
            hparams=hparams,
            log=log_place(study),  # one TensorBoard log directory: the study's, control's too
        )
    if pruning is not None:
        pruning.check_pruned()  # a decision taken in a spawned rank (ddp_spawn) surfaces here
    missing = [m for m in study.metrics if m not in metrics]
    if missing:
        known = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float))))
        raise StudyMisconfigured(f"objective: metric {missing[0]!r} is not in metrics.json (has: {known})")
    values = [float(metrics[m]) for m in study.metrics]
    bad = [(m, v) for m, v in zip(study.metrics, values) if not math.isfinite(v)]
    if bad:
        raise Diverged(f"diverged: {bad[0][0]}={bad[0][1]} at the end")
    trial.set_user_attr("metrics", _scalars(metrics))
    return values[0] if len(values) == 1 else values


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a ``metrics.json`` (what a trial keeps in its user attrs)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
