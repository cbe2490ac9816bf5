"""A study as its storage holds it, for the command that runs it and the report that reads it alike: where it lies
(Optuna's ``JournalStorage`` on ``<output_dir>/<study>/journal.log`` by default, else an Optuna RDB URL), how it is
opened (the journal in whole lines of Optuna's records: :class:`WholeLines`, :func:`check_journal`; a database with
a connect timeout: :func:`connect_args`), which of its trials count (retried and discarded ones do not) and whether
the stored study is the study file's (:func:`check_objective`, its identity: :mod:`sweeps.spec.identity`). Only
public Optuna API is used.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial

from foundation.configfile import read_yaml
from foundation.confined import check_inside, open_inside
from foundation.errors import ConfigError
from foundation.redact import redact
from sweeps.spec import budgets, identity, replication
from sweeps.spec.schema import ADDED_SEEDS, SEED_PARAM
from sweeps.spec.study import Study, load_study

# Seconds between a running trial's heartbeats, and of silence after which it is stale (settable for networks
# with long pauses, and for tests that kill workers).
HEARTBEAT_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_S", "10"))
GRACE_S = int(os.environ.get("LINFORMER_LAB_HEARTBEAT_GRACE_S", "60"))
MAX_RETRIES = 2  # a trial that kills its worker every time (out of memory) is given up after this
DISCARDED = "discarded"  # user attr of a trial started after the budget was met by other workers
# User attr of a trial stopped by SIGTERM or Ctrl-C and put back (Optuna has no state for it: it is FAIL): why, and the
# trial that continues it. It counts for nothing; reports and progress lines call it interrupted, not failed.
INTERRUPTED = "interrupted"
JOURNAL = "journal.log"
JOURNAL_LOCK = "journal.lock"  # the journal's flock (see WholeLines)
# The lock Optuna's JournalFileBackend takes by default (a symlink, or a file with JournalFileOpenLock) beside the
# journal: never ours (WholeLines), but left behind by another program's writer killed mid-append.
OPTUNA_LOCK = JOURNAL + ".lock"
# The operations a journal record may name (``op_code``): Optuna 5's journal operations (its ``JournalOperation``
# enum, which no public module exports: create/delete study, study user/system attr, create trial, trial param,
# state and values, intermediate value, trial user/system attr, discard trials). Optuna's replay fails on any
# other code (``assert False``); tests/sweeps/test_stored.py checks this set against the installed Optuna.
JOURNAL_OPS = frozenset(range(11))
# Seconds a database storage may take to answer a connection (then one line names the URL and this), settable for
# slow networks and for tests.
STORAGE_TIMEOUT_S = int(os.environ.get("LINFORMER_LAB_STORAGE_TIMEOUT_S", "30"))
# Each database driver's name for its connect timeout (SQLAlchemy's driver names); libpq's also keeps the connection
# alive with TCP keepalives, so a server that vanishes during a sweep is noticed in about a minute.
_CONNECT_TIMEOUT = {
    "psycopg2": "connect_timeout",
    "psycopg": "connect_timeout",
    "pg8000": "timeout",
    "mysqldb": "connect_timeout",
    "pymysql": "connect_timeout",
    "mysqlconnector": "connection_timeout",
}
_LIBPQ = ("psycopg2", "psycopg")


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
    opens it for the ``sweep`` command and its workers), else an Optuna RDB URL (with Optuna's heartbeats and a
    connect timeout). ``create=False`` (a reader such as ``report``) creates nothing: an SQLite file that does not
    exist is refused, and no tables are made in an empty database."""
    check_url(url, workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if url is None:
            journal = study.root / JOURNAL
            check_journal(journal)
            journal.parent.mkdir(parents=True, exist_ok=True)
            check_inside(study.root, journal)
            return replayed(journal)
        if not create:
            _check_database_exists(url)
        return _open_database(url, create)


def _open_database(url: str, create: bool) -> RDBStorage:
    """Optuna's RDB storage on ``url``, connected (Optuna checks its schema at once) within
    :data:`STORAGE_TIMEOUT_S`; any failure one ConfigError line naming the URL, its password masked."""
    started = time.monotonic()
    try:
        return RDBStorage(
            url,
            engine_kwargs={"connect_args": connect_args(url)},
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES),
            skip_table_creation=not create,
        )
    except ImportError:
        raise ConfigError(
            f"--storage {redact(url)}: its database driver is not installed; for PostgreSQL use "
            "postgresql+psycopg2://... with pip install 'linformer-lab[postgres]' (a bare "
            "postgresql:// means psycopg 3 to SQLAlchemy 2.1)"
        ) from None
    except Exception as err:  # sqlalchemy's many connection/URL errors
        first = redact(str(err).splitlines()[0]) if str(err) else type(err).__name__
        if time.monotonic() - started >= STORAGE_TIMEOUT_S or "timeout expired" in first or "timed out" in first:
            raise ConfigError(
                f"--storage {redact(url)}: no answer within {STORAGE_TIMEOUT_S} s (the storage's connect timeout, "
                "LINFORMER_LAB_STORAGE_TIMEOUT_S); check that the server is up and that this is its address"
            ) from None
        raise ConfigError(f"--storage {redact(url)}: cannot open ({first})") from None


def connect_args(url: str) -> dict:
    """The database driver's arguments that bound the wait for a connection to :data:`STORAGE_TIMEOUT_S` (none for
    SQLite, a file, whose lock waits are its own busy timeout; none for a driver not known here)."""
    from sqlalchemy.engine import make_url

    driver = make_url(url).get_driver_name()
    if driver not in _CONNECT_TIMEOUT:
        return {}
    args = {_CONNECT_TIMEOUT[driver]: STORAGE_TIMEOUT_S}
    if driver in _LIBPQ:  # probes after 30 s of silence, every 10 s, given up after 3 unanswered
        args.update(keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
    return args


def _check_database_exists(url: str) -> None:
    """An SQLite URL names an existing file (connecting would create it)."""
    if not url.startswith("sqlite"):
        return
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if database and database != ":memory:" and not Path(database).is_file():
        raise ConfigError(f"--storage {redact(url)}: no database file {database}; give the storage the study ran on")


def check_journal(path: Path, repair: bool = False) -> None:
    """Every line of the journal ``path`` but the last is a record of Optuna's (a JSON object naming a known
    operation, :data:`JOURNAL_OPS`, and the worker that wrote it), or one ConfigError line names the first that is
    not, and what to do. A last line without its newline is a write killed half-way (or one in flight): Optuna's
    reader skips it, but its next append would follow it on the same line and break the journal for every later
    read; so it is cut off when ``repair`` (saying so on stderr), else left (every append cuts it first:
    :class:`WholeLines`). Read once, a JSON parse per line: the cost of Optuna's own replay."""
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
        wrong = _not_a_record(line)
        if wrong:
            raise not_a_record(path, number, len(lines) + bool(tail), f"{wrong}: {line[:40]!r}")
    if tail and repair:
        cut_torn_tail(path)


def _not_a_record(line: bytes) -> Optional[str]:
    """What makes ``line`` no journal record of Optuna's, or None when it is one."""
    try:
        record = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(record, dict):
        return "not a JSON object"
    op = record.get("op_code")
    if op is None:
        return "no op_code"
    if type(op) is not int or op not in JOURNAL_OPS:
        return f"unknown op_code {op!r}"
    if not isinstance(record.get("worker_id"), str):
        return "no worker_id"
    return None


def not_a_record(path: Path, number: int, lines: int, why: str) -> ConfigError:
    """The one line for line ``number`` of the journal ``path`` that is not a record Optuna can replay."""
    return ConfigError(
        f"{path}: line {number} of {lines} is not a journal record of this study ({why}); refused: move that "
        "line out of the file or restore the journal from a backup"
    )


class _CountedLines(JournalFileBackend):
    """Optuna's journal file backend that remembers the line of the last record it handed to the replay, so that a
    record Optuna cannot replay (a known operation without the fields it needs) is named by its line."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path.absolute()), lock_obj=WholeLines(path))  # absolute: opens ignore the cwd
        self.path, self.line = path, 0

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        for number, record in enumerate(super().read_logs(log_number_from), start=log_number_from + 1):
            self.line = number
            yield record


def replayed(journal: Path) -> JournalStorage:
    """Optuna's journal storage on ``journal``, its records replayed (what opening it means): a record that fails
    the replay is one ConfigError line naming its line (:func:`not_a_record`), never Optuna's traceback."""
    backend = _CountedLines(journal)
    try:
        return JournalStorage(backend)
    except (KeyError, AssertionError, TypeError, ValueError, IndexError, AttributeError) as err:
        why = f"Optuna cannot replay it: {type(err).__name__} {err}"
        raise not_a_record(journal, backend.line, journal.read_bytes().count(b"\n"), why) from None


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


def points_of(trial: FrozenTrial) -> dict[str, dict[str, float]]:
    """A finished curve trial's points (:data:`sweeps.spec.budgets.POINTS`): budget name -> its cooldown's scalar
    metrics ({} for other trials)."""
    return trial.user_attrs.get(budgets.POINTS) or {}


def short_of(trial: FrozenTrial, factors: Sequence[float]) -> bool:
    """A complete trial of a curve that lacks a point of one of ``factors`` (a longer ``--budgets`` than it ran
    with): the sweep puts it back, and its copy trains only the new trunk steps and cooldowns."""
    wanted = {budgets.name(f) for f in factors}
    return trial.state == optuna.trial.TrialState.COMPLETE and bool(wanted - set(points_of(trial)))


# --------------------------------------------------------------------------------------- the study file's?
def objective_of(study: Study) -> list[str]:
    return [f"{m} ({d})" for m, d in zip(study.metrics, study.directions)]


def name_metrics(ostudy: optuna.Study, study: Study) -> None:
    """Name the stored study's objectives by the study file's metrics (``val/masked_loss``, not optuna-dashboard's
    "Objective 0"): written once, when the stored study has no names yet, so a study stored before names were set
    gets them when it is resumed."""
    if ostudy.metric_names != list(study.metrics):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ostudy.set_metric_names(list(study.metrics))


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


# --------------------------------------------------------------------------------------- a study's family
# The original study and its derived studies (its replication, its studies at a larger budget: sweeps.spec.replication)
# hold disjoint seeds; these read what each one's storage holds, writing nothing.
def _read_only(name: str, journal: Path, storage: Optional[BaseStorage]) -> Optional[optuna.Study]:
    """The stored study ``name``, read only: in ``storage`` (an RDB), else in the journal file ``journal``; None
    where it is not there."""
    if storage is None:
        if not journal.is_file():
            return None
        check_journal(journal)
        storage = replayed(journal)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def _family(study: Study, url: Optional[str]) -> tuple[list[str], Optional[BaseStorage]]:
    """The original's name and those of its derived studies that the storage holds (for the default journals: the
    folders beside the original's), with the RDB storage they are in (None: journals)."""
    original = study.original_name
    if url is None:
        parent = Path(study.shared.output_dir)
        names = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
        storage = None
    else:
        try:
            storage = open_storage(study, url, create=False)
            names = optuna.get_all_study_names(storage)
        except Exception:  # a database that holds no study yet (no file, no tables): no member has run
            return [], None
    return [original] + sorted(n for n in set(names) if replication.is_derived_name(original, n)), storage


def held_seeds(ostudy: optuna.Study) -> set[int]:
    """The seeds a stored study holds: its trials', those ``--add-seeds`` stored, a derived study's fresh seeds."""
    fixed = (ostudy.user_attrs.get(identity.IDENTITY) or {}).get("replicate") or {}
    seeds = [t.params.get(SEED_PARAM) for t in ostudy.get_trials(deepcopy=False)]
    seeds += list(ostudy.user_attrs.get(ADDED_SEEDS) or []) + [s for v in fixed.values() for s in v or []]
    return {s for s in seeds if isinstance(s, int) and not isinstance(s, bool)}


def family_names(study: Study) -> list[str]:
    """The names of ``study``'s family in its journals' folder: the original's and its derived studies' (the
    original's first)."""
    return _family(study, None)[0]


def family_seeds(study: Study, url: Optional[str]) -> dict[str, set[int]]:
    """Study name -> the seeds it and its control hold, for each member of ``study``'s family that has run; the
    original also holds every seed its file names (at any preset), run or not."""
    out = {study.original_name: replication.file_seeds(read_yaml(study.path))}
    names, storage = _family(study, url)
    for name in names:
        root = Path(study.shared.output_dir) / name
        found = [
            _read_only(name, root / JOURNAL, storage),
            _read_only(f"{name}_control", root / "control" / JOURNAL, storage),
        ]
        if any(f is not None for f in found):
            out[name] = out.get(name, set()).union(*(held_seeds(f) for f in found if f is not None))
    return out


def check_family(study: Study, url: Optional[str]) -> None:
    """Before a ``sweep`` writes anything: the seeds of ``study`` (its file's, or a derived study's fresh ones) share
    none with any other member of its family, and a derived study's original, where it has run, is the study its
    file describes now (else a derived study would answer another question than the one it re-asks)."""
    family = family_seeds(study, url)
    if study.replicate is None:
        seeds = set(study.seeds) | (set(study.control.seeds) if study.control is not None else set())
        replication.check_family(
            f"space.{SEED_PARAM}", study.name, seeds, family, f"give {study.path} seeds that study does not hold"
        )
        return
    for key, seeds in study.replicate.items():
        where = f"replicate.{key}" if study.factor is None else f"--budget {study.factor:g} ({key})"
        fix = (
            f"give replicate.{key} in {study.path} seeds no study of the family holds"
            if study.factor is None
            else "its seeds follow from the factor: take another --budget, or move that study's folder aside"
        )
        if study.budgets:  # a curve study's seeds follow from the curve rule (sweeps.spec.budgets)
            where, fix = f"--budgets ({key})", "its seeds are fixed by the curve rule: move that study's folder aside"
        replication.check_family(where, study.name, seeds or [], family, fix)
    check_original(study, url)


def check_original(study: Study, url: Optional[str]) -> None:
    """A derived study's original, where it has run, still has the identity its file gives it now."""
    original = load_study(study.path, study.preset)
    names, storage = _family(original, url)
    ostudy = _read_only(original.name, original.root / JOURNAL, storage) if names else None
    if ostudy is None or identity.IDENTITY not in ostudy.user_attrs:
        return
    differ = identity.changed(ostudy.user_attrs[identity.IDENTITY], original)
    if differ:
        raise ConfigError(
            f"{study.path}: study {original.name} in {storage_display(original, url)} ran with another identity "
            f"than the file gives it now ({'; '.join(differ[:3])}); {study.name} re-asks the original's question, so "
            f"it is refused: restore the file, or run the original afresh first with `linformer-lab sweep "
            f"{original.file_args} --new-study`"
        )


def check_derived(study: Study, url: Optional[str]) -> None:
    """Before a derived study's report writes anything: the seeds its storage holds share none with those its
    original's holds (the freshness its report states, re-checked from both journals)."""
    family = family_seeds(study, url)
    if study.name in family and study.original_name in family:
        replication.check_family(
            f"report {study.derived_flag}",
            study.name,
            family[study.name],
            {study.original_name: family[study.original_name]},
            f"its seeds are not fresh: run it afresh with `linformer-lab sweep {study.file_args} --new-study`",
        )
