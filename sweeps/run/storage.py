"""A running study's bookkeeping: its storage as the ``sweep`` command and its workers hold it (:class:`RunStorage`:
the journal or RDB URL opened, its owner, its heartbeats and the trials of dead workers), and how the trial budget is
counted. How a storage is opened and read (by the report too) is :mod:`sweeps.stored`.

Default storage: Optuna's ``JournalStorage`` on ``<output_dir>/<study>/journal.log`` (a file; several
worker processes on one machine append to it safely; no server). Any Optuna RDB URL
(``postgresql+psycopg2://…``, ``mysql://…``) is accepted for workers on several machines; SQLite is refused for
parallel workers.

Stale trials. A worker killed mid-trial (SIGKILL, power loss) leaves a RUNNING trial behind. RDB storages
detect it with Optuna's own heartbeat (``heartbeat_interval`` / ``grace_period``). A journal gets the same
from :meth:`RunStorage.beating`, a thread that refreshes ``heartbeats/<trial number>`` (host and pid) every
``HEARTBEAT_S`` while the trial runs: a trial is stale when its process is gone from this host, or its file is older
than ``GRACE_S`` (or it has none and started longer ago than that). :meth:`RunStorage.fail_stale_trials` fails stale
trials and enqueues a copy of each with the same params (``RetryHeartbeatStaleTrialCallback``, grid points included),
which the next free worker runs, continuing from the dead attempt's last checkpoint
(:func:`sweeps.run.trials.continue_dead_attempt`). Only public Optuna API is used.

Owner and journal. A journal study is owned by the ``sweep`` command that launched its workers
(:meth:`RunStorage.own`: an advisory lock on ``<study dir>/.lock``, see :mod:`foundation.lock`; a second ``sweep``
of the same study gets one line naming the owner); RDB studies are shared by design (launchers on several machines
join one). Optuna appends to the journal in whole lines, fsynced, under the journal's lock
(:class:`sweeps.stored.WholeLines`: a ``flock``, released by the operating system when its holder dies; the lock
Optuna's default backend takes, a symbolic link that another program's writer killed mid-append leaves, is removed
by the owner: :meth:`RunStorage.own`); a write killed half-way leaves a torn last line.
:func:`sweeps.stored.check_journal` reads every line on open: a torn last line is cut off by the owner before its
workers start (saying so) and under Optuna's lock before every append (:class:`sweeps.stored.WholeLines`), so no
record is ever appended after half a line; a line before the last that is not a record of Optuna's is refused in one
line naming it. Before anything is written, :meth:`RunStorage.check_folder` refuses a link anywhere in the study's
folder (Optuna's lock aside, which the owner removes), and a known name of the wrong type; every file written there
is opened without following a link (:mod:`foundation.confined`).

Budget. ``n_trials`` counts finished trials (complete, pruned, failed), except failed trials that were
retried (their copy counts instead: trials that failed on an input error, interrupted ones and those of dead
workers are retried) and trials discarded because concurrent workers had already
started the last one (see :func:`budget_position`). Optuna's ``MaxTrialsCallback`` cannot count it (see
docs/architecture.md): the workers count it themselves, before each trial (``sweeps.run.command``) and as it starts
(:func:`sweeps.run.trials.discard_over_budget`). A grid study's storage makes no trial outside its points
(:func:`grid_points_only`): a worker that finds the waiting point it saw claimed by another looks again.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from foundation.atomic import atomic_write_text
from foundation.confined import check_tree
from foundation.errors import ConfigError
from foundation.lock import LOCK, Owner
from foundation.paths import check_folder
from sweeps.run.plan import PLAN
from sweeps.spec.study import Study
from sweeps.stored import (
    GRACE_S,
    HEARTBEAT_S,
    JOURNAL,
    JOURNAL_LOCK,
    MAX_RETRIES,
    OPTUNA_LOCK,
    check_journal,
    excluded_numbers,
    open_storage,
    storage_display,
)

HEARTBEATS = "heartbeats"  # a journal study's folder of heartbeat files, one per running trial


class GridPointTaken(Exception):
    """Raised instead of making a trial outside a grid study's points: the waiting point a worker saw was claimed by
    another worker before this one's ``ask`` reached it. Nothing was written; the worker looks again."""


def grid_points_only(opened: BaseStorage) -> None:
    """Make ``opened`` refuse a trial without a template: a grid study's trials are its enqueued points (and their
    retried copies), each made from a template trial; ``Study.ask`` makes one without a template only when it finds no
    waiting trial to claim, which in a grid study means another worker claimed the point between this worker's look
    (:func:`sweeps.run.command._work_on`) and its ``ask``. Optuna would then draw a fresh trial from the sampler: a
    trial outside the grid. Set on the instance, so that Optuna's RDB cache and heartbeat see the storage they know;
    an RDB storage is guarded at ``_create_new_trial``, the method Optuna's cache in front of it calls (its public
    ``create_new_trial`` calls it too), a journal at ``create_new_trial``."""
    name = "_create_new_trial" if hasattr(opened, "_create_new_trial") else "create_new_trial"
    make = getattr(opened, name)

    def create_new_trial(study_id: int, template_trial: Optional[FrozenTrial] = None) -> Any:
        if template_trial is None:
            raise GridPointTaken
        return make(study_id, template_trial)

    setattr(opened, name, create_new_trial)


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


class RunStorage:
    """One study's storage as the ``sweep`` command and its workers run it: the journal (its lock, its torn last line,
    its owner, its folder, its heartbeat files) or an RDB URL (with Optuna's own heartbeat), opened once per process
    (:attr:`storage`), and the trials of dead workers found and retried (:meth:`fail_stale_trials`). Each process makes
    one per study it runs; the report reads through :func:`sweeps.stored.open_storage` alone.

    ``study``: the study whose folder and name it holds (a study grown by ``--add-seeds`` has the same)."""

    def __init__(self, study: Study, url: Optional[str], workers: int = 1) -> None:
        self.study, self.url, self.workers = study, url, workers
        self._storage: Optional[BaseStorage] = None

    @property
    def journal(self) -> Optional[Path]:
        """The journal file (None for an RDB study)."""
        return self.study.root / JOURNAL if self.url is None else None

    @property
    def display(self) -> str:
        """The storage as printed: the journal file, or the URL with its password masked."""
        return storage_display(self.study, self.url)

    @property
    def storage(self) -> BaseStorage:
        """The Optuna storage, opened on first use (a journal is read whole when opened: once per process). A grid
        study's storage makes no trial but from a template (:func:`grid_points_only`)."""
        if self._storage is None:
            self._storage = open_storage(self.study, self.url, self.workers)
            if self.study.is_grid:
                grid_points_only(self._storage)
        return self._storage

    def stored_study(self) -> Optional[optuna.Study]:
        """The study as its storage already holds it (None when it does not hold it yet): a journal opened to read
        only, a database as the sweep opens it (within its connect timeout); what the command checks before the
        preflight, before it owns the study or writes anything."""
        if self.journal is not None and not self.journal.is_file():
            return None
        opened = open_storage(self.study, None, create=False) if self.journal is not None else self.storage
        try:
            return optuna.load_study(study_name=self.study.name, storage=opened)
        except KeyError:  # the storage does not hold it yet
            return None

    # ----------------------------------------------------------------------------- the journal's folder and owner
    def own(self) -> Optional[Owner]:
        """The ``sweep`` command's ownership of a journal study, for the command's life (None for an RDB study,
        which launchers on several machines share by design); then, for the study and its control, the journal's
        torn last line, if any, is cut off and Optuna's own lock left behind is removed (:meth:`_recover`)."""
        if self.journal is None:
            return None
        journals = [one.root / JOURNAL for one in self.study.studies]
        for journal in journals:  # a garbage line is refused before anything is written
            check_journal(journal)
        self.study.root.mkdir(parents=True, exist_ok=True)
        owner = Owner(self.study.root, f"study {self.study.name} ({self.study.root})")
        owner.record()
        for journal in journals:
            check_journal(journal, repair=True)
            self._recover(journal.parent / OPTUNA_LOCK)
        return owner

    @staticmethod
    def _recover(optuna_lock: Path) -> None:
        """Remove Optuna's own lock of a journal (a symbolic link, or the empty file of its open lock), which a
        writer of another program killed mid-append leaves behind: its holder is dead, since this process owns the
        study and its workers lock the journal with :class:`sweeps.stored.WholeLines` alone, never with it; left
        there, it would make any program that opens the journal with Optuna's default lock wait on it. Only the
        link is removed, never what it names."""
        if not optuna_lock.is_symlink() and not (optuna_lock.is_file() and optuna_lock.stat().st_size == 0):
            return
        optuna_lock.unlink()
        print(f"{optuna_lock}: removed Optuna's journal lock, left by a process that died", file=sys.stderr)

    def check_folder(self) -> None:
        """Before anything is written: the study's folder (and its control's, inside it) holds no link and no known
        name of the wrong type (:func:`foundation.confined.check_tree`); the folder it lies in is a folder."""
        root = self.study.root
        check_folder("output_dir", str(root.parent))
        check_tree(
            root,
            f"study {self.study.name}",
            files=(JOURNAL, LOCK, JOURNAL_LOCK, PLAN, *(f"control/{name}" for name in (JOURNAL, LOCK, JOURNAL_LOCK))),
            folders=("logs", HEARTBEATS, "control", "control/" + HEARTBEATS),
            links=(OPTUNA_LOCK, "control/" + OPTUNA_LOCK),  # removed by the owner (own), never opened
        )

    def aside_path(self) -> Optional[Path]:
        """Where ``sweep --new-study`` moves the study's folder: ``<folder>.<UTC time>``; None when there is nothing
        to move. A name already taken is one line (nothing is moved onto it)."""
        root = self.study.root
        if not (root / JOURNAL).exists():
            return None
        aside = root.with_name(f"{root.name}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        if os.path.lexists(aside):
            raise ConfigError(
                f"--new-study: {aside} already exists, where the earlier study would be moved; move it away or wait "
                "a second"
            )
        return aside

    def set_aside(self, aside: Optional[Path]) -> Optional[Path]:
        """Move the study's folder (journal, trial runs, report) to ``aside`` (:meth:`aside_path`), its owner's lock
        with it."""
        if aside is None:
            return None
        if os.path.lexists(aside):
            raise ConfigError(f"--new-study: {aside} already exists, where the earlier study would be moved")
        self.study.root.rename(aside)
        return aside

    # ----------------------------------------------------------------------------- heartbeats
    def heartbeat_file(self, number: int) -> Path:
        return self.study.root / HEARTBEATS / str(number)

    def record_heartbeat(self, number: int) -> None:
        """Write ``heartbeats/<number>``: this host and pid, now."""
        atomic_write_text(self.heartbeat_file(number), f"{socket.gethostname()} {os.getpid()}\n", self.study.root)

    def heartbeat_owner(self, number: int) -> Optional[tuple[str, int]]:
        """(host, pid) of the process running trial ``number`` of a journal study, from its heartbeat file."""
        try:
            host, pid = self.heartbeat_file(number).read_text().split()
        except (OSError, ValueError):
            return None
        return host, int(pid)

    @contextlib.contextmanager
    def beating(self, number: int, interval_s: float = HEARTBEAT_S) -> Iterator[None]:
        """While the body runs, a journal study's trial ``number`` has a fresh heartbeat file, refreshed by a thread
        every ``interval_s`` (RDB storages beat through Optuna itself)."""
        if self.journal is None:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while True:
                self.record_heartbeat(number)
                if stop.wait(interval_s):
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{number}", daemon=True)
        self.record_heartbeat(number)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # ----------------------------------------------------------------------------- trials of dead workers
    def stale_trials(self, ostudy: optuna.Study, grace_s: float = GRACE_S) -> list[FrozenTrial]:
        """The running trials of a journal study whose worker is gone: its process is gone from this host, or its
        heartbeat is older than ``grace_s`` (or it has none and started longer ago than that)."""
        now, host = time.time(), socket.gethostname()
        stale = []
        for trial in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = self.heartbeat_owner(trial.number)
            if owner is None:  # no beat yet: the trial has just started, unless it started long ago
                started = trial.datetime_start or datetime.now(timezone.utc)
                if now - started.timestamp() > grace_s:
                    stale.append(trial)
            elif (owner[0] == host and not _pid_alive(owner[1])) or now - self.heartbeat_file(
                trial.number
            ).stat().st_mtime > grace_s:
                stale.append(trial)
        return stale

    def fail_stale_trials(self, ostudy: optuna.Study, grace_s: float = GRACE_S) -> None:
        """Fail the trials whose worker died and enqueue a retry of each (same params), at most ``MAX_RETRIES``
        times per trial: by Optuna's heartbeat for an RDB study, by :meth:`stale_trials` for a journal."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if self.journal is None:
                optuna.storages.fail_stale_trials(ostudy)
                return
            retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)
            for trial in self.stale_trials(ostudy, grace_s):
                try:  # another worker may fail it first: only the one whose tell succeeds retries it
                    ostudy.tell(trial.number, state=TrialState.FAIL)
                except (RuntimeError, UpdateFinishedTrialError):
                    continue
                retry(ostudy, next(t for t in ostudy.get_trials(deepcopy=False) if t.number == trial.number))


def run_storages(study: Study, url: Optional[str], workers: int = 1) -> dict[str, RunStorage]:
    """The storage of the study and of its control, by study name (what the ``sweep`` command holds)."""
    return {one.name: RunStorage(one, url, workers) for one in study.studies}


# --------------------------------------------------------------------------------------- budget


@dataclass
class BudgetState:
    finished: int  # counted complete + pruned + failed
    running: int  # counted running (some may belong to dead workers not yet detected)


def budget_state(trials: list[FrozenTrial], study: Optional[Study] = None) -> BudgetState:
    """Counted finished and running trials; of a grid ``study``, finished counts its points that have a finished
    counted trial (trials of points outside the file's grid count for nothing)."""
    excluded = excluded_numbers(trials)
    counted = [t for t in trials if t.number not in excluded]
    finished = sum(t.state.is_finished() for t in counted)
    if study is not None and study.is_grid and study.points is not None:
        done = {point_key(t.params) for t in counted if t.state.is_finished()}
        finished = sum(point_key(p) in done for p in study.points[: study.n_trials])
    return BudgetState(finished=finished, running=sum(t.state == TrialState.RUNNING for t in counted))


def point_finished(trials: list[FrozenTrial], point: dict, number: int) -> bool:
    """Whether a counted trial other than ``number`` has finished the grid point ``point``."""
    excluded = excluded_numbers(trials)
    return any(
        t.number != number
        and t.number not in excluded
        and t.state.is_finished()
        and point_key(t.params) == point_key(point)
        for t in trials
    )


def point_key(params: dict) -> str:
    """A grid point (or a trial's params) as a comparable key."""
    return json.dumps(params, sort_keys=True)


def budget_position(trials: list[FrozenTrial], number: int) -> int:
    """0-based rank of trial ``number`` among the counted finished-or-running trials, by trial number.

    Two workers that both see one free slot both start a trial; the one whose rank reaches ``n_trials``
    discards itself, so the budget is never exceeded, whatever the storage.
    """
    excluded = excluded_numbers(trials)
    return sum(
        1
        for t in trials
        if t.number < number and t.number not in excluded and (t.state.is_finished() or t.state == TrialState.RUNNING)
    )


def requeue(ostudy: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a copy of a trial (same params, or same enqueued grid point) that replaces it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(max_retry=None)(ostudy, trial)
