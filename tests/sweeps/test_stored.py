"""A study as its storage holds it (sweeps/stored.py): a study refuses a changed objective, a journal line that is
not a record of Optuna's and a database that never answers, to the sweep and the report alike, in one line."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend
from studies import write_study

from experiments import cli
from sweeps import stored
from sweeps.run.command import open_study
from sweeps.run.storage import RunStorage
from sweeps.spec.study import load_study


def test_an_existing_study_refuses_a_changed_objective(tmp_path, tiny_overrides, capsys):
    path = write_study(tmp_path, tiny_overrides, "changed", {"seed": {"type": "categorical", "choices": [0]}})
    open_study(RunStorage(load_study(path), None))  # the study as first run: val/loss, minimize
    changed = write_study(
        tmp_path,
        tiny_overrides,
        "changed",
        {"seed": {"type": "categorical", "choices": [0]}},
        objective=[{"metric": "val/loss", "direction": "maximize"}],
    )
    for command in ("sweep", "report"):
        assert cli.main([command, str(changed)]) == 2
        assert "has objective val/loss (minimize), the file now says val/loss (maximize)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- the journal's records
def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def one_error(err: str) -> str:
    """The one ``error:`` line of a command's stderr (and no traceback)."""
    errors = [line for line in err.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), err
    return errors[0]


NOT_RECORDS = {
    "another program's JSON line": (b'{"note": "moved from node 7"}\n', "no op_code"),
    "an operation Optuna does not know": (b'{"op_code": 42, "worker_id": "w"}\n', "unknown op_code 42"),
    "a known operation without its fields": (b'{"op_code": 5, "worker_id": "w"}\n', "Optuna cannot replay it"),
}


@pytest.mark.parametrize("line, why", NOT_RECORDS.values(), ids=NOT_RECORDS)
def test_a_journal_line_optuna_cannot_replay_is_one_line_naming_it_for_sweep_and_report(
    tmp_path, tiny_overrides, capsys, line, why
):
    """Optuna would end in ``KeyError: 'op_code'`` (which ``report`` took for a study not in the journal) or an
    ``AssertionError``: both commands name the file, the line and what to do instead, exit 2, and write nothing."""
    path = write_study(tmp_path, tiny_overrides, "foreign", {"seed": {"type": "categorical", "choices": [0, 1]}})
    study = load_study(path)
    open_study(RunStorage(study, None)).enqueue_trial({"seed": 0})
    journal = study.root / stored.JOURNAL
    records = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([*records[:2], line, *records[2:]]))  # line 3 of them all
    before = snapshot(tmp_path)
    capsys.readouterr()
    for command in ("sweep", "report"):
        assert cli.main([command, str(path)]) == 2
        error = one_error(capsys.readouterr().err)
        assert f"{journal}: line 3 of {len(records) + 1} is not a journal record of this study ({why}" in error
        assert error.endswith("move that line out of the file or restore the journal from a backup")
    assert snapshot(tmp_path) == before


class _Records(BaseJournalBackend):
    """A journal held in a list (Optuna's public backend interface)."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records

    def read_logs(self, log_number_from: int):
        yield from self.records[log_number_from:]

    def append_logs(self, logs: list[dict]) -> None:
        self.records += logs


def test_the_operations_a_journal_may_name_are_exactly_those_the_installed_optuna_replays():
    """A code Optuna's replay does not know ends in its ``assert False``; a known one gets as far as its fields."""

    def replays(op: int) -> bool:
        try:
            JournalStorage(_Records([{"op_code": op, "worker_id": "w"}]))
        except AssertionError:
            return False
        except (KeyError, TypeError, ValueError):  # a known operation, missing its fields
            return True
        return True

    assert {op for op in range(64) if replays(op)} == stored.JOURNAL_OPS


# --------------------------------------------------------------------------------------- a database that never answers
@contextlib.contextmanager
def silent_server(hold_s: float = 30.0) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte (a hung database, a firewall
    that answers the handshake); it lets go of its connections after ``hold_s``, so a client without a timeout ends
    in an error, not a hang. Yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, held = threading.Event(), []

    def accept() -> None:
        deadline = time.monotonic() + hold_s
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                held.append(listener.accept()[0])
            except socket.timeout:
                continue
        for connection in held:
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_database_that_accepts_and_never_answers_is_one_line_naming_it_and_the_timeout(
    tmp_path, tiny_overrides, capsys, monkeypatch
):
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver (pip install 'linformer-lab[postgres]')")
    monkeypatch.setattr(stored, "STORAGE_TIMEOUT_S", 2)  # libpq's least
    path = write_study(tmp_path, tiny_overrides, "silent", {"seed": {"type": "categorical", "choices": [0, 1]}})
    before = snapshot(tmp_path)
    with silent_server() as port:
        url = f"postgresql+psycopg2://lab:hunter2@127.0.0.1:{port}/optuna"
        for command in ("sweep", "report"):
            started = time.monotonic()
            assert cli.main([command, str(path), "--storage", url]) == 2
            assert time.monotonic() - started < 15  # the 2 s asked, not the server's 30 s
            out = capsys.readouterr()
            error = one_error(out.err)
            assert f"--storage postgresql+psycopg2://lab:***@127.0.0.1:{port}/optuna: no answer within 2 s" in error
            assert "hunter2" not in out.out + out.err
    assert snapshot(tmp_path) == before


def test_a_database_that_never_answers_refuses_the_sweep_before_its_preflight(
    tmp_path, tiny_overrides, capsys, monkeypatch
):
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver (pip install 'linformer-lab[postgres]')")
    from sweeps.run import command

    monkeypatch.setattr(stored, "STORAGE_TIMEOUT_S", 2)
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    monkeypatch.setattr(command, "_preflight", lambda *args: pytest.fail("the preflight ran before the storage"))
    path = write_study(tmp_path, tiny_overrides, "silent", {"seed": {"type": "categorical", "choices": [0, 1]}})
    with silent_server() as port:
        for preflight in ([], ["--preflight"]):
            started = time.monotonic()
            assert (
                cli.main(["sweep", str(path), "--storage", f"postgresql+psycopg2://lab@127.0.0.1:{port}/x", *preflight])
                == 2
            )
            assert time.monotonic() - started < 15
            assert "no answer within 2 s" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()
