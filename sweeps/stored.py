"""A study as its storage holds it, for the command that runs it and the report that reads it alike: where it lies
(Optuna's ``JournalStorage`` on ``<output_dir>/<study>/journal.log`` by default, else an Optuna RDB URL), how it is
opened (the journal in whole lines: :class:`WholeLines`, :func:`check_journal`), which of its trials count (retried
and discarded ones do not) and whether the stored study is the study file's (:func:`check_objective`, its identity:
:mod:`sweeps.spec.identity`). Only public Optuna API is used.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial

from foundation.confined import check_inside, open_inside
from foundation.errors import ConfigError
from foundation.redact import redact
from sweeps.spec import identity
from sweeps.spec.study import Study

# Seconds between a running trial's heartbeats, and of silence after which it is stale (settable for networks
# with long pauses, and for tests that kill workers).
HEARTBEAT_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_S", "10"))
GRACE_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_GRACE_S", "60"))
MAX_RETRIES = 2  # a trial that kills its worker every time (out of memory) is given up after this
DISCARDED = "discarded"  # user attr of a trial started after the budget was met by other workers
JOURNAL = "journal.log"
JOURNAL_LOCK = "journal.lock"  # the journal's flock (see WholeLines)


def check_url(url: Optional[str], workers: int = 1) -> None:
    """What can be told of a storage URL without connecting or creating anything: its form, SQLite with parallel
    workers."""
    if url is None:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"--storage {redact(url)}: not a database URL (e.g. postgresql+psycopg2://user@host/db)"
        ) from None
    if url.startswith("sqlite") and workers > 1:
        raise ConfigError(
            f"--storage {redact(url)}: SQLite cannot take parallel workers; use the default journal "
            "file (no --storage) or a PostgreSQL/MySQL URL"
        )


def open_storage(study: Study, url: Optional[str], workers: int = 1, create: bool = True) -> BaseStorage:
    """The study's storage: the journal file by default (its heartbeats: :class:`sweeps.run.storage.RunStorage`, which
    opens it for the ``sweep`` command and its workers), else an Optuna RDB URL (with Optuna's heartbeats).
    ``create=False`` (a reader such as ``report``) creates nothing: an SQLite file that does not exist is refused, and
    no tables are made in an empty database."""
    check_url(url, workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)
        if url is None:
            journal = study.root / JOURNAL
            check_journal(journal)
            journal.parent.mkdir(parents=True, exist_ok=True)
            check_inside(study.root, journal)
            # an absolute path: Optuna's file opens do not depend on the working directory
            return JournalStorage(JournalFileBackend(str(journal.absolute()), lock_obj=WholeLines(journal)))
        if not create:
            _check_database_exists(url)
        try:
            return RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=retry,
                skip_table_creation=not create,
            )
        except ImportError:
            raise ConfigError(
                f"--storage {redact(url)}: its database driver is not installed; for PostgreSQL use "
                "postgresql+psycopg2://... with pip install 'linformer-lab[postgres]' (a bare "
                "postgresql:// means psycopg 3 to SQLAlchemy 2.1)"
            ) from None
        except Exception as err:  # sqlalchemy's many connection/URL errors
            raise ConfigError(f"--storage {redact(url)}: cannot open ({redact(str(err).splitlines()[0])})") from None


def _check_database_exists(url: str) -> None:
    """An SQLite URL names an existing file (connecting would create it)."""
    if not url.startswith("sqlite"):
        return
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if database and database != ":memory:" and not Path(database).is_file():
        raise ConfigError(f"--storage {redact(url)}: no database file {database}; give the storage the study ran on")


def check_journal(path: Path, repair: bool = False) -> None:
    """Every line of the journal ``path`` but the last is a whole JSON record, or one ConfigError line names the
    first that is not. A last line without its newline is a write killed half-way (or one in flight): cut off
    when ``repair`` (saying so on stderr), else left for Optuna, which skips it."""
    if not path.exists():
        return
    if not path.is_file():
        raise ConfigError(f"{path}: not a journal file (a {'folder' if path.is_dir() else 'special file'})")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the study journal ({err.strerror or type(err).__name__})") from None
    *lines, tail = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise ConfigError(
                f"{path}: line {number} of {len(lines) + bool(tail)} is not a journal record ({line[:40]!r}); "
                "refused: restore the journal from a backup or move it aside to start the study afresh"
            )
    if tail and repair:
        cut_torn_tail(path)


def cut_torn_tail(path: Path) -> None:
    """Cut ``path`` back to its last newline when a write killed half-way left a partial line after it."""
    with os.fdopen(open_inside(path.parent, path, os.O_RDWR), "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:  # the last newline, read backwards in blocks
            start = max(0, end - 65536)
            f.seek(start)
            found = f.read(end - start).rfind(b"\n")
            if found >= 0:
                end = start + found + 1
                break
            end = start
        if end == size:
            return
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
    print(f"{path}: removed a torn last line ({size - end} bytes) left by a write killed half-way", file=sys.stderr)


class WholeLines:
    """The journal's lock (what ``JournalFileBackend(lock_obj=…)`` calls, ``acquire`` and ``release``: the interface
    of Optuna's file locks, whose base class is private): ``flock`` on ``journal.lock`` beside it, which the operating
    system releases when its holder dies, however it dies (Optuna's own symlink lock outlives a killed holder: with a
    relative path its link dangles and every later process waits on it for good). Acquiring blocks in the kernel,
    without polling. Once acquired and before Optuna appends, a torn last line is cut off: no record is ever appended
    after half a line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: Optional[int] = None

    def acquire(self) -> bool:
        fd = open_inside(self.path.parent, self.path.parent / JOURNAL_LOCK, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd
        cut_torn_tail(self.path)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def storage_display(study: Study, url: Optional[str]) -> str:
    """This study's storage as printed and written into reports: the journal file, or the URL with its password
    masked (give optuna-dashboard the real one)."""
    return redact(url) if url is not None else str(study.root / JOURNAL)


# --------------------------------------------------------------------------------------- which trials count
def _discarded(trials: list[FrozenTrial]) -> set[int]:
    return {t.number for t in trials if DISCARDED in t.user_attrs}


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials replaced by a copy with the same params after their worker died or was interrupted."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])} - _discarded(trials)


def excluded_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Trials that do not count toward the budget: retried or discarded ones."""
    return retried_numbers(trials) | _discarded(trials)


# --------------------------------------------------------------------------------------- the study file's?
def objective_of(study: Study) -> list[str]:
    return [f"{m} ({d})" for m, d in zip(study.metrics, study.directions)]


def check_objective(study: Study, ostudy: optuna.Study, url: Optional[str]) -> None:
    """The stored study was created by this suite and its identity is the file's (see :mod:`sweeps.spec.identity`)."""
    stored = ostudy.user_attrs.get("objective")
    where = f"{study.path}: study {study.name} in {storage_display(study, url)}"
    again = "run `sweep --new-study` to start it afresh (the earlier study is kept aside) or rename the study"
    recorded = ostudy.user_attrs.get(identity.IDENTITY)
    if recorded is None:
        raise ConfigError(
            f"{where} was not created by linformer-lab (it carries no identity of ours: another program's study "
            "of the same name?); refused, its trials are not ours: rename the study or use another storage"
        )
    if stored is not None and stored != objective_of(study):
        raise ConfigError(
            f"{where} has objective {', '.join(stored)}, the file now says {', '.join(objective_of(study))}: {again}"
        )
    differ = identity.changed(recorded, study)
    if differ:
        more = f"; and {len(differ) - 4} more" if len(differ) > 4 else ""
        what = "search space" if all(d.startswith("space.") for d in differ) else "identity"
        raise ConfigError(
            f"{where} was started with another {what}: {'; '.join(differ[:4])}{more}; its trials answer "
            f"another question: {again}"
        )
