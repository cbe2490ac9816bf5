"""Studies on a real PostgreSQL server shared by worker processes, as on several machines.

The server is a throwaway cluster (``tests/pg.py``); without one these tests are skipped with the reason, and
under CI they fail instead. Its URL carries a password, which must appear nowhere the project writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml
from optuna.trial import TrialState
from tiny import child_env

from experiments import cli
from sweeps import stored
from sweeps.run.command import usable_workers
from sweeps.spec.study import load_study

pytestmark = [pytest.mark.postgres, pytest.mark.processes]  # a server, sweep workers


@pytest.fixture
def tiny_study(tiny_overrides, tmp_path):
    """Writes a grid study over seeds on the tiny run config, its data prepared once here (workers starting
    together on an empty cache would each tokenize the corpus)."""
    from training import config as run_config
    from training.train import build_datamodule

    datamodule = build_datamodule(run_config.load(tiny_overrides.config, tiny_overrides.args))
    datamodule.prepare_data()

    def write(name: str, seeds: int, **overrides) -> Path:
        base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny_overrides.args)}
        study = {
            "study": name,
            "base": str(tiny_overrides.config),
            "overrides": {**base, **overrides},
            "space": {"seed": {"type": "categorical", "choices": list(range(seeds))}},
            "sampler": {"kind": "grid"},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        return path

    return write


def trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=name, storage=url).get_trials()
    except KeyError:  # not created yet
        return []


def counted(all_trials):
    excluded = stored.excluded_numbers(all_trials)
    return [t for t in all_trials if t.number not in excluded]


def files_holding(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_three_workers_share_one_study_on_postgresql(tiny_study, postgres_url, postgres_server, tmp_path, capsys):
    path = tiny_study("pg_three", seeds=6)
    assert cli.main(["sweep", str(path), "--workers", "3", "--storage", postgres_url]) == 0
    # no more workers than cores here (and trials left): on 2 cores, 2 of the 3 asked for share the study
    started = usable_workers(3, 6, len(os.sched_getaffinity(0)))
    assert started >= 2
    done = trials(postgres_url, "pg_three")
    assert len(done) == 6 and all(t.state == TrialState.COMPLETE for t in done)
    assert sorted(t.params["seed"] for t in done) == list(range(6))  # every grid point once
    root = load_study(path).root
    assert {p.name for p in (root / "logs").iterdir()} == {f"worker_{i}.log" for i in range(started)}
    for t in done:
        named = root / f"seed={t.params['seed']}_trial_{t.number}"  # named by its seed and number
        assert Path(t.user_attrs["run_dir"]) == named and (named / "metrics.json").is_file()
    # The same command again finds the budget met; the report reads the study from the server alone.
    assert cli.main(["sweep", str(path), "--workers", "3", "--storage", postgres_url]) == 0
    assert len(trials(postgres_url, "pg_three")) == 6
    assert cli.main(["report", str(path), "--storage", postgres_url]) == 0

    # The password is in no console line, log, report, config or TensorBoard file.
    printed = capsys.readouterr()
    secret = postgres_server.password
    assert secret not in printed.out + printed.err
    assert "postgres:***@127.0.0.1" in printed.out
    assert files_holding(tmp_path / "runs", secret) == []
    assert "postgres:***@" in (root / "report" / "summary.md").read_text()


def running_with_heartbeat(url: str, name: str) -> int:
    """Trials of study ``name`` that are RUNNING and have recorded a heartbeat (Optuna's own tables)."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as db:
            return db.execute(
                sqlalchemy.text(
                    "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id JOIN trial_heartbeats h "
                    "ON h.trial_id = t.trial_id WHERE s.study_name = :name AND t.state = 'RUNNING'"
                ),
                {"name": name},
            ).scalar()
    except sqlalchemy.exc.ProgrammingError:  # tables not created yet
        return 0
    finally:
        engine.dispose()


def _workers(sweep_pid: int) -> list[int]:
    """The sweep command's worker processes (spawned: their command line runs ``spawn_main``)."""
    children = Path(f"/proc/{sweep_pid}/task/{sweep_pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_a_sigkilled_worker_on_postgresql_is_found_stale_and_its_trial_retried(tiny_study, postgres_url, tmp_path):
    path = tiny_study("pg_kill", seeds=4, **{"trainer.max_steps": 30})
    # Heartbeat every second, stale after 4 s of silence (the defaults, 10 s and 60 s, suit real networks).
    env = child_env(LINFORMER_LAB_HEARTBEAT_S="1", LINFORMER_LAB_HEARTBEAT_GRACE_S="4")
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "sweep", str(path), "--workers", "2", "--storage", postgres_url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Both workers in a trial that has a heartbeat: Optuna never finds a trial stale that has none (a worker
        # killed between starting a trial and its first heartbeat leaves it RUNNING for good).
        deadline = time.monotonic() + 300
        while running_with_heartbeat(postgres_url, "pg_kill") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "two trials never ran at once"
            time.sleep(0.2)
        victim = _workers(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"(pid {victim}) exited with code -9" in out

    every = trials(postgres_url, "pg_kill")
    mine = counted(every)
    assert len(mine) == 4 and all(t.state == TrialState.COMPLETE for t in mine)
    assert sorted(t.params["seed"] for t in mine) == [0, 1, 2, 3]  # no grid point lost or run twice
    (dead,) = [t for t in every if t.state == TrialState.FAIL]
    retry = next(t for t in mine if dead.number in t.system_attrs.get("retry_history", []))
    assert retry.params == dead.system_attrs["fixed_params"]  # the same grid point
    root = load_study(path).root
    assert all((root / f"seed={t.params['seed']}_trial_{t.number}" / "metrics.json").is_file() for t in mine)
