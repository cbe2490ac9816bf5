"""Where a study lives, how stale trials are found, and how the trial budget is counted.

Default storage: Optuna's ``JournalStorage`` on ``<output_dir>/<study>/journal.log`` (a file; several
worker processes on one machine append to it safely; no server). Any Optuna RDB URL
(``postgresql+psycopg2://…``, ``mysql://…``) is accepted for workers on several machines; SQLite is refused for
parallel workers.

Stale trials. A worker killed mid-trial (SIGKILL, power loss) leaves a RUNNING trial behind. RDB
storages detect it with Optuna's heartbeat (``heartbeat_interval`` / ``grace_period``);
:class:`HeartbeatJournalStorage` gives the journal the same interface, with a heartbeat file per trial
(``heartbeats/<trial_id>``: host and pid, refreshed every ``HEARTBEAT_S``): a trial is stale when its
process is gone from this host, or its file is older than ``GRACE_S``. Optuna's
``fail_stale_trials`` then fails it and ``RetryHeartbeatStaleTrialCallback`` enqueues a copy with the
same params (grid points included), which the next free worker runs, continuing from the dead attempt's
last checkpoint (:func:`sweeps.objective.continue_attempt`).

Budget. ``n_trials`` counts finished trials (complete, pruned, failed), except failed trials that were
retried (their copy counts instead) and trials discarded because concurrent workers had already
started the last one (see :func:`budget_position`).
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from experiments.config import ConfigError
from experiments.redact import redact
from sweeps.study import Study

# Seconds between a running trial's heartbeats, and of silence after which it is stale (settable for networks
# with long pauses, and for tests that kill workers).
HEARTBEAT_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_S", "10"))
GRACE_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_GRACE_S", "60"))
MAX_RETRIES = 2  # a trial that kills its worker every time (out of memory) is given up after this
DISCARDED = "discarded"  # user attr of a trial started after the budget was met by other workers
JOURNAL = "journal.log"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:  # a killed child not yet reaped by its parent is a zombie: dead for our purpose
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """A file journal with Optuna's heartbeat interface (which Optuna implements for RDB only)."""

    def __init__(self, path: Path, callback: Optional[Callable] = None,
                 heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(JournalFileBackend(str(path)))
        self._beats = path.parent / "heartbeats"
        self._beats.mkdir(exist_ok=True)
        self._callback, self._interval, self._grace = callback, heartbeat_s, grace_s

    def record_heartbeat(self, trial_id: int) -> None:
        tmp = self._beats / f".{trial_id}.{os.getpid()}"
        tmp.write_text(f"{socket.gethostname()} {os.getpid()}\n")
        os.replace(tmp, self._beats / str(trial_id))

    def heartbeat_owner(self, trial_id: int) -> Optional[tuple[str, int]]:
        """(host, pid) of the process running a trial, from its heartbeat file."""
        try:
            host, pid = (self._beats / str(trial_id)).read_text().split()
        except (OSError, ValueError):
            return None
        return host, int(pid)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now, host = time.time(), socket.gethostname()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = self._beats / str(trial._trial_id)
            owner = self.heartbeat_owner(trial._trial_id)
            if owner is None:  # no beat yet: the trial has just started, unless it started long ago
                started = trial.datetime_start or datetime.now(timezone.utc)
                if now - started.timestamp() > self._grace:
                    stale.append(trial._trial_id)
            elif (owner[0] == host and not _pid_alive(owner[1])) or now - beat.stat().st_mtime > self._grace:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int:
        return self._interval

    def get_heartbeat_stale_trial_callback(self) -> Optional[Callable]:
        return self._callback


def open_storage(study: Study, url: Optional[str], workers: int = 1) -> BaseStorage:
    """The study's storage: the journal file by default, else an Optuna RDB URL, both with heartbeats."""
    if url is not None and url.startswith("sqlite") and workers > 1:
        raise ConfigError(f"--storage {redact(url)}: SQLite cannot take parallel workers; use the default journal "
                          "file (no --storage) or a PostgreSQL/MySQL URL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)
        if url is None:
            return HeartbeatJournalStorage(study.root / JOURNAL, callback=retry)
        try:
            return RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                              heartbeat_stale_trial_callback=retry)
        except ImportError:
            raise ConfigError(f"--storage {redact(url)}: its database driver is not installed; for PostgreSQL use "
                              "postgresql+psycopg2://... with pip install 'linformer-lab[postgres]' (a bare "
                              "postgresql:// means psycopg 3 to SQLAlchemy 2.1)") from None
        except Exception as err:  # sqlalchemy's many connection/URL errors
            raise ConfigError(f"--storage {redact(url)}: cannot open ({redact(str(err).splitlines()[0])})") from None


def storage_display(study: Study, url: Optional[str]) -> str:
    """This study's storage as printed and written into reports: the journal file, or the URL with its password
    masked (give optuna-dashboard the real one)."""
    return redact(url) if url is not None else str(study.root / JOURNAL)


def fail_stale_trials(ostudy: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(ostudy)


# --------------------------------------------------------------------------------------- budget
def _discarded(trials: list[FrozenTrial]) -> set[int]:
    return {t.number for t in trials if DISCARDED in t.user_attrs}


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials replaced by a copy with the same params after their worker died or was interrupted."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])} - _discarded(trials)


def excluded_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials that do not count toward the budget: retried or discarded ones."""
    return retried_numbers(trials) | _discarded(trials)


@dataclass
class BudgetState:
    finished: int  # counted complete + pruned + failed
    running: int  # counted running (some may belong to dead workers not yet detected)


def budget_state(trials: list[FrozenTrial]) -> BudgetState:
    excluded = excluded_numbers(trials)
    counted = [t for t in trials if t.number not in excluded]
    return BudgetState(finished=sum(t.state.is_finished() for t in counted),
                       running=sum(t.state == TrialState.RUNNING for t in counted))


def budget_position(trials: list[FrozenTrial], number: int) -> int:
    """0-based rank of trial ``number`` among the counted finished-or-running trials, by trial number.

    Two workers that both see one free slot both start a trial; the one whose rank reaches ``n_trials``
    discards itself, so the budget is never exceeded, whatever the storage.
    """
    excluded = excluded_numbers(trials)
    return sum(1 for t in trials if t.number < number and t.number not in excluded
               and (t.state.is_finished() or t.state == TrialState.RUNNING))


def requeue(ostudy: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a copy of a trial (same params, or same enqueued grid point) that replaces it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(max_retry=None)(ostudy, trial)
