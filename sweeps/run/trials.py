"""Around one trial: the budget, retries of dead workers, and what a trial ends with.

:func:`run_trial` is what a worker hands to ``optuna.Study.optimize``; each concern is one named function:

* :func:`discard_over_budget`: two workers that both saw one free slot both start a trial; the one ranked past
  ``n_trials`` discards itself (user attr ``discarded``; an enqueued grid point is put back), so the budget is
  never exceeded, whatever the storage;
* :func:`continue_dead_attempt`: a trial that retries one whose worker died or was interrupted (same params,
  Optuna's ``retry_history``) continues from that attempt's last checkpoint: the attempt's run directory is
  copied into the new one (TensorBoard events, checkpoint with its RNG states) and the run resumes there, so it
  ends exactly as an uninterrupted run would; the attempt's intermediate values up to that step are reported
  again, so pruners see the whole curve (user attr ``resumed_from``: ``{trial, step}``);
* a SIGTERM (or Ctrl-C, which the ``sweep`` command passes on as SIGTERM) is noted by the worker, never kills it
  mid-write: a trial asked to stop before it trains, or while it trains (its step saved), is put back; one that
  has finished training is recorded; the worker then exits 143 (``sweeps.run.objective.STOP_ASKED``);
* :func:`record_failure`: a failed trial keeps its reason (user attr ``fail_reason``); an interrupted or
  terminated one is re-enqueued for the resumed study and marked ``interrupted`` (why, and the trial that continues
  it: Optuna records it FAIL, having no state for it; it counts for nothing); one that failed on an input error
  (a ``ConfigError``: the same for every process, e.g. a data file that is missing or an accelerator this machine
  lacks) is re-enqueued too and marked ``input_error``, and its worker stops: such trials never consume the budget,
  and a rerun after the fix runs them;
* a trial's own failure (divergence, out of memory, any other exception of its training) reaches Optuna as
  :class:`TrialFailed`, the one exception the worker's ``optimize(catch=...)`` lets the study go on after (the
  trial is FAIL, counted); an input error and a stop end the worker.

What a finished trial records: the objective values, the scalar ``metrics.json`` entries (user attr
``metrics``, so reports work from the storage alone), or ``fail_reason``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

import optuna
from optuna.trial import FrozenTrial

from foundation.checkpoint import read_checkpoint
from foundation.errors import ConfigError, Terminated
from foundation.rundir import CHECKPOINT, values_name
from sweeps import stored
from sweeps.run import storage
from sweeps.run.objective import STOP_ASKED, Diverged, objective
from sweeps.spec.schema import SEED_PARAM
from sweeps.spec.study import Study


class TrialFailed(Exception):
    """A trial's own failure, recorded on it (FAIL, ``fail_reason``, counted): its worker goes on with the next trial
    (``optimize(catch=(TrialFailed,))``). The exception that caused it is its ``__cause__``."""


INPUT_ERROR = "input_error"  # user attr of a trial that failed on an input error (put back, not counted)
INHERITED = (
    "fail_reason",
    "resumed_from",
    INPUT_ERROR,
    stored.INTERRUPTED,
)  # user attrs a retry copies from its attempt, which are not its own


def run_trial(study: Study, trial: optuna.Trial, runs: storage.RunStorage) -> float | list[float]:
    """One trial, start to end: budget check, continuation of a dead attempt, the objective, failure record. A
    failure of its own is raised as :class:`TrialFailed`; an input error (``ConfigError``) and a stop (``Terminated``,
    ``KeyboardInterrupt``) as they are, to end the worker."""
    trials = trial.study.get_trials(deepcopy=False)
    frozen = next(t for t in trials if t.number == trial.number)  # its system attrs: grid point, retries
    with runs.beating(trial.number):
        discard_over_budget(study, trial, trials, frozen)
        run_dir = study.root / trial_folder(study.suggest(trial), trial.number)
        trial.set_user_attr("run_dir", str(run_dir))
        try:
            run = {
                "experiment": study.name,
                "run_dir": str(run_dir),
                **continue_dead_attempt(trial, trials, frozen, run_dir),
            }
            if STOP_ASKED.is_set():  # asked to stop before training: put back untouched
                raise Terminated(f"trial {trial.number}: stopped by SIGTERM before it trained")
            return objective(study, trial, run)
        except optuna.TrialPruned:
            raise
        except (ConfigError, Terminated) as err:
            record_failure(trial, err)
            raise
        except Exception as err:
            record_failure(trial, err)
            raise TrialFailed(reason(err)) from err
        except BaseException as err:
            record_failure(trial, err)
            raise


def trial_folder(params: dict[str, Any], number: int) -> Path:
    """Where a trial runs, inside its study's folder, named by what differs: its arm (the parameters but the seed),
    then its seed and number: ``kind=full/seed=0_trial_3`` (TensorBoard shows the runs by these names); a study
    without parameters: ``trial_3``. A trial records its folder (user attr ``run_dir``): stored trials of any
    earlier layout keep theirs."""
    arm = {k: v for k, v in params.items() if k != SEED_PARAM}
    leaf = f"seed={params[SEED_PARAM]}_trial_{number}" if SEED_PARAM in params else f"trial_{number}"
    return Path(values_name(arm)) / leaf if arm else Path(leaf)


def discard_over_budget(study: Study, trial: optuna.Trial, trials: list[FrozenTrial], frozen: FrozenTrial) -> None:
    """Raise ``TrialPruned`` (marked ``discarded``) when concurrent workers have already started the last trial
    of the budget. A grid counts points: its trial is discarded when another trial already finished its point,
    or when its point lies past ``n_trials`` (then it is put back, for a later, larger budget)."""
    put_back = "fixed_params" in frozen.system_attrs
    if study.is_grid and put_back:
        point = frozen.system_attrs["fixed_params"]
        if storage.point_finished(trials, point, trial.number):
            put_back = False
        elif storage.point_key(point) in {storage.point_key(p) for p in (study.points or [])[: study.n_trials]}:
            return
    elif study.n_trials is None or storage.budget_position(trials, trial.number) < study.n_trials:
        return
    trial.set_user_attr(stored.DISCARDED, "the budget was met by concurrent workers")
    if put_back:
        storage.requeue(trial.study, frozen)
    raise optuna.TrialPruned("discarded: budget already met")


def continue_dead_attempt(
    trial: optuna.Trial, trials: list[FrozenTrial], frozen: FrozenTrial, run_dir: Path
) -> dict[str, Any]:
    """Config overrides that continue the attempt this trial retries (``{"resume": True}``), or {} to start afresh."""
    for inherited in INHERITED:
        if trial.user_attrs.get(inherited) is not None:
            trial.set_user_attr(inherited, None)
    found = copy_attempt(trials, frozen, run_dir)
    if found is None:
        return {}
    previous, step = found
    trial.set_user_attr("resumed_from", {"trial": previous.number, "step": step})
    for at, value in sorted(previous.intermediate_values.items()):
        if at <= step:
            trial.report(value, at)
    return {"resume": True}


def copy_attempt(trials: list[FrozenTrial], frozen: FrozenTrial, run_dir: Path) -> Optional[tuple[FrozenTrial, int]]:
    """If ``frozen`` retries an attempt that left a checkpoint, copy that attempt's run directory to
    ``run_dir`` and return (the attempt, its checkpoint's step); else None (the trial starts afresh)."""
    history = frozen.system_attrs.get("retry_history", [])
    previous = next((t for t in trials if t.number == history[-1]), None) if history else None
    old = Path(previous.user_attrs.get("run_dir", "")) if previous is not None else None
    if old is None or not (old / CHECKPOINT).is_file() or run_dir.exists():
        return None
    shutil.copytree(old, run_dir)
    return previous, int(read_checkpoint(run_dir / CHECKPOINT)["global_step"])


def reason(err: BaseException) -> str:
    """A failure as one line: the divergence message, or the exception's type and first line."""
    text = str(err).strip().splitlines()
    return text[0] if isinstance(err, Diverged) else f"{type(err).__name__}: {text[0] if text else ''}"


def interrupted_words(trial: optuna.Trial, err: BaseException) -> str:
    """``terminated (SIGTERM): put back, trial 7 continues it``: what an interrupted trial's user attr
    ``interrupted`` says, once its copy is enqueued."""
    how = "interrupted (Ctrl-C)" if isinstance(err, KeyboardInterrupt) else "terminated (SIGTERM)"
    copies = [
        t.number
        for t in trial.study.get_trials(deepcopy=False)
        if t.system_attrs.get("retry_history", [None])[-1] == trial.number
    ]
    return f"{how}: put back, trial {max(copies)} continues it" if copies else f"{how}: put back"


def record_failure(trial: optuna.Trial, err: BaseException) -> None:
    """Keep why the trial failed; an interrupted or terminated trial (Optuna fails it) gets an identical copy
    enqueued, which continues from its last checkpoint."""
    if isinstance(err, (KeyboardInterrupt, Terminated)):
        trial.set_user_attr("fail_reason", "interrupted" if isinstance(err, KeyboardInterrupt) else "terminated")
        storage.requeue(
            trial.study, next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
        )
        trial.set_user_attr(stored.INTERRUPTED, interrupted_words(trial, err))
    elif isinstance(err, ConfigError):  # every trial would meet it: put back, uncounted; the worker stops
        trial.set_user_attr("fail_reason", reason(err))
        trial.set_user_attr(INPUT_ERROR, " ".join(str(err).split()))
        storage.requeue(
            trial.study, next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
        )
    elif isinstance(err, Exception):
        trial.set_user_attr("fail_reason", reason(err))
