"""The ``sweep`` command (sweeps/run/command.py): workers and their GPUs, the exact budget, kills and retries,
pruning, seeds added on demand, and a study on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Optional

import optuna
import pytest
from optuna.trial import TrialState
from studies import ARMS, CONTROL, counted, trials_of, write_study
from tiny import child_env

from experiments import cli
from sweeps import stored
from sweeps.run import command, storage
from sweeps.spec.study import load_study


# --------------------------------------------------------------------------------------- helpers
def sweep_process(path: Path, *args: str) -> subprocess.Popen:
    """``linformer-lab sweep`` in its own process group, so a test can kill it whole."""
    env = child_env()
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "sweep", str(path), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, timeout: float = 120.0, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("condition not met")


def running_trial_with_beat(path: Path):
    """(trial, worker pid) of a RUNNING trial whose worker has written its heartbeat, if any."""
    study = load_study(path)
    for t in trials_of(path):
        if t.state != TrialState.RUNNING:
            continue
        owner = storage.RunStorage(study, None).heartbeat_owner(t.number)
        if owner is not None:
            return t, owner[1]
    return None


def hparams_of(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: (v.string_value or v.number_value) for k, v in info.hparams.items()}


# --------------------------------------------------------------------------------------- end to end
@pytest.mark.processes  # the sweep command's workers
def test_two_workers_run_the_exact_budget_with_one_run_dir_and_hparams_per_trial(tmp_path, tiny):
    path = write_study(
        tmp_path,
        tiny,
        "two_workers",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}},
        arms=["arm"],
    )
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    trials = trials_of(path)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted((t.params["seed"], t.params["arm"]) for t in trials) == [
        (0, "full"),
        (0, "linformer"),
        (1, "full"),
        (1, "linformer"),
    ]
    run_dirs = {Path(t.user_attrs["run_dir"]) for t in trials}
    root = tmp_path / "runs" / "two_workers"  # named by arm, seed and number
    assert run_dirs == {root / f"arm={t.params['arm']}" / f"seed={t.params['seed']}_trial_{t.number}" for t in trials}
    for t in trials:
        run_dir = Path(t.user_attrs["run_dir"])
        assert (run_dir / "metrics.json").is_file()
        hp = hparams_of(run_dir)
        assert hp["arm"] == t.params["arm"] and hp["seed"] == str(t.params["seed"])  # the seed as text: as_shown
        assert hp["sweep/objective"] == "val/loss" and hp["sweep/trial"] == t.number
        assert hp["model.attention.kind"] == ARMS[t.params["arm"]]["model.attention.kind"]
    assert {p.name for p in (tmp_path / "runs" / "two_workers" / "logs").iterdir()} == {"worker_0.log", "worker_1.log"}
    # the same command again finds the budget met and runs nothing
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    assert len(trials_of(path)) == 4


class _NoWorker:
    """Stands in for a worker process: records its arguments, starts nothing, has already exited."""

    started: list[dict] = []

    def __init__(self, target, kwargs, name):
        self.kwargs, self.name, self.pid, self.exitcode = kwargs, name, 0, 0
        read, write = os.pipe()
        os.close(write)
        self.sentinel = read  # readable at once (end of file): the worker "has ended"

    def start(self):
        _NoWorker.started.append(self.kwargs)

    def join(self, timeout=None):
        os.close(self.sentinel)

    def is_alive(self):
        return False


@pytest.mark.parametrize(
    "visible, count, workers, expected, line",
    [
        (None, 4, 2, ["0,1", "2,3"], None),
        ("3,5,6", 3, 2, ["3", "5"], "note: 3 GPUs for 2 workers: 1 per worker, 1 idle"),
        (None, 1, 3, ["0", "0", "0"], "warning: 3 workers share 1 GPU(s)"),
        (None, 0, 2, [None, None], None),
    ],
)
def test_each_sweep_worker_gets_its_own_gpus_counted_without_initialising_cuda(
    tmp_path, tiny_overrides, monkeypatch, capsys, visible, count, workers, expected, line
):
    import torch

    from sweeps.run import command as sweep

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: pytest.fail("the sweep process initialised CUDA"))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(sweep.mp, "get_context", lambda method: types.SimpleNamespace(Process=_NoWorker))
    monkeypatch.setattr(_NoWorker, "started", [])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)  # cores: no bound
    path = write_study(
        tmp_path,
        tiny_overrides,
        "gpus",
        {"seed": {"type": "categorical", "choices": [0, 1, 2, 3]}},
        overrides={"trainer.accelerator": "auto"},
    )
    cli.main(["sweep", str(path), "--workers", str(workers)])
    assert [kwargs["gpus"] for kwargs in _NoWorker.started] == expected
    out = capsys.readouterr().out
    notes = [text for text in out.splitlines() if text.startswith(("note:", "warning:"))]
    assert notes == ([] if line is None else [notes[0]]) and (line is None or notes[0].startswith(line))


def test_a_trial_asking_for_more_gpus_than_its_worker_has_is_refused_before_any_trial(
    tmp_path, tiny_overrides, monkeypatch, capsys
):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = write_study(
        tmp_path,
        tiny_overrides,
        "gpus",
        {"seed": {"type": "categorical", "choices": [0, 1]}},
        overrides={"trainer.accelerator": "auto", "trainer.devices": 2, "trainer.strategy": "ddp_spawn"},
    )
    assert cli.main(["sweep", str(path), "--workers", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trainer.devices=2: each sweep worker has 1 GPU(s)" in err
    assert not (tmp_path / "runs" / "gpus").exists()


@pytest.mark.processes
def test_rerunning_after_the_sweep_was_killed_completes_exactly_the_budget(tmp_path, tiny):
    path = write_study(
        tmp_path,
        tiny,
        "resume",
        {"seed": {"type": "categorical", "choices": [0, 1, 2]}},
        overrides={"trainer.max_steps": 15},
    )
    proc = sweep_process(path)
    # One worker runs the trials in turn: when the second one has its first checkpoint (step 3 of 15), the first
    # is finished and the second mid-way. Watched on the file system, often: the journal is slower to read.
    study = tmp_path / "runs" / "resume"  # trials named by seed and number: seed=<s>_trial_<n>
    wait_for(lambda: any(study.glob("seed=*_trial_1/checkpoints/last.ckpt")), every=0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole sweep: command and worker, mid-trial
    proc.wait()
    interrupted = [t for t in trials_of(path) if t.state == TrialState.RUNNING]
    assert len(interrupted) == 1
    assert cli.main(["sweep", str(path)]) == 0
    trials = trials_of(path)
    mine = counted(trials)
    assert len(mine) == 3 and all(t.state == TrialState.COMPLETE for t in mine)
    assert sorted(t.params["seed"] for t in mine) == [0, 1, 2]  # every grid point once, none repeated
    dead = next(t for t in trials if t.number == interrupted[0].number)
    assert dead.state == TrialState.FAIL and dead.number in stored.excluded_numbers(trials)
    # the retry continued from the dead attempt's checkpoint: one curve, every validation step once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    retry = next(t for t in mine if dead.number in t.system_attrs.get("retry_history", []))
    resumed = retry.user_attrs["resumed_from"]
    assert resumed["trial"] == dead.number and resumed["step"] >= 3 and retry.user_attrs.get("fail_reason") is None
    ea = EventAccumulator(retry.user_attrs["run_dir"])
    ea.Reload()
    events = ea.Scalars("val/loss")  # two events files, read in name order
    assert sorted(e.step for e in events) == list(range(2, 15, 3))  # logged at step - 1
    before = [e for e in events if e.step < resumed["step"]]  # logged by the dead attempt, kept
    assert before and all(e.wall_time < retry.datetime_start.timestamp() for e in before)


@pytest.mark.processes
def test_a_sigkilled_workers_trial_is_retried_and_the_study_completes(tmp_path, tiny):
    path = write_study(
        tmp_path,
        tiny,
        "killed_worker",
        {"seed": {"type": "categorical", "choices": [0, 1, 2, 3]}},
        overrides={"trainer.max_steps": 12},
    )
    proc = sweep_process(path, "--workers", "2")
    victim, pid = wait_for(lambda: running_trial_with_beat(path))
    os.kill(pid, signal.SIGKILL)  # one worker only; the command and the other worker go on
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    trials = trials_of(path)
    mine = counted(trials)
    assert len(mine) == 4 and all(t.state == TrialState.COMPLETE for t in mine)
    dead = next(t for t in trials if t.number == victim.number)
    assert dead.state == TrialState.FAIL
    retry = next(t for t in mine if dead.number in t.system_attrs.get("retry_history", []))
    assert retry.params == {"seed": victim.params.get("seed", retry.params["seed"])}
    assert sorted(t.params["seed"] for t in mine) == [0, 1, 2, 3]


@pytest.mark.processes  # the sweep command's worker
def test_the_median_pruner_prunes_trials_worse_than_the_first_ones(tmp_path, tiny):
    # Two good trials first (grid order), then two whose lr is too small to move the loss.
    path = write_study(
        tmp_path,
        tiny,
        "prune",
        {
            "optim.lr": {"type": "categorical", "choices": [1.0e-2, 1.0e-9]},
            "seed": {"type": "categorical", "choices": [0, 1]},
        },
        pruner={"kind": "median", "n_startup_trials": 2, "n_warmup_steps": 0},
    )
    assert cli.main(["sweep", str(path)]) == 0
    trials = trials_of(path)
    states = {(t.params["optim.lr"], t.params["seed"]): t.state for t in trials}
    assert states[(1.0e-2, 0)] == states[(1.0e-2, 1)] == TrialState.COMPLETE
    assert states[(1.0e-9, 0)] == states[(1.0e-9, 1)] == TrialState.PRUNED
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert all(t.last_step == 3 for t in pruned)  # reported at the training step of the first validation


def test_two_workers_run_the_exact_budget_of_an_open_study(tmp_path, tiny):
    space = {"optim.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}
    keys = {"sampler": {"kind": "random", "seed": 0}, "budget": {"n_trials": 3}}
    path = write_study(tmp_path, tiny, "open_two", space, overrides={"trainer.max_steps": 3}, **keys)
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    trials = trials_of(path)
    mine = counted(trials)  # those discarded because the other worker had started the last one aside
    assert len(mine) == 3 and all(t.state == TrialState.COMPLETE for t in mine)
    assert all(t.state.is_finished() for t in trials)
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0  # the budget met: nothing more runs
    assert len(trials_of(path)) == len(trials)


# --------------------------------------------------------------------------------------- seeds on demand
def test_add_seeds_takes_the_next_unused_seeds_for_the_study_and_its_control(tmp_path, tiny_overrides, capsys):
    from sweeps.run.command import open_study, with_added_seeds
    from sweeps.run.storage import RunStorage, run_storages
    from sweeps.spec.schema import ADDED_SEEDS

    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "seeds",
        {"seed": {"type": "categorical", "choices": [0, 2]}, "model.attention.options.k": {"choices": [4, 8]}},
        overrides={"model.attention.kind": "linformer"},
        control=control,
    )
    study = load_study(path)
    assert (study.n_trials, study.control.n_trials) == (4, 4)
    grown = with_added_seeds(study, run_storages(study, None), add=2)
    assert grown.seeds == [0, 2, 3, 4] and grown.control.seeds == [0, 2, 3, 4]
    assert (grown.n_trials, grown.control.n_trials) == (8, 8) and grown.added_seeds == (3, 4)
    assert grown.points[-2:] == [
        {"seed": 4, "model.attention.options.k": 4},
        {"seed": 4, "model.attention.options.k": 8},
    ]
    assert "added seeds 3, 4 (to its control too); seeds now 0, 2, 3, 4" in capsys.readouterr().out
    # stored on the study: a later command sees them, and adds after them
    assert open_study(RunStorage(study, None)).user_attrs[ADDED_SEEDS] == [3, 4]
    again = load_study(path)
    assert with_added_seeds(again, run_storages(again, None)).seeds == [0, 2, 3, 4]
    assert with_added_seeds(again, run_storages(again, None), add=1).seeds == [0, 2, 3, 4, 5]


@pytest.mark.processes  # the sweep command's worker
def test_add_seeds_runs_only_the_new_seeds_points_and_the_report_counts_them(tmp_path, tiny):
    control = CONTROL
    path = write_study(
        tmp_path,
        tiny,
        "grown",
        {"seed": {"type": "categorical", "choices": [0, 1]}},
        overrides={"model.attention.kind": "linformer", "trainer.max_steps": 3},
        control=control,
    )
    assert cli.main(["sweep", str(path)]) == 0
    cstudy = load_study(path).control

    def control_trials():
        return optuna.load_study(study_name="grown_control", storage=stored.open_storage(cstudy, None)).get_trials()

    before = {t.number: t for t in trials_of(path)}
    assert len(before) == 2 and len(control_trials()) == 4
    assert cli.main(["sweep", str(path), "--add-seeds", "1"]) == 0
    main, ctrl = counted(trials_of(path)), counted(control_trials())
    assert sorted(t.params["seed"] for t in main) == [0, 1, 2]
    assert sorted((t.params["control"], t.params["seed"]) for t in ctrl) == [
        ("degraded", 0),
        ("degraded", 1),
        ("degraded", 2),
        ("reference", 0),
        ("reference", 1),
        ("reference", 2),
    ]
    assert all(t.state == TrialState.COMPLETE for t in main + ctrl)
    for t in trials_of(path):  # the points already run were not run again
        if t.params["seed"] < 2:
            assert t.datetime_complete == before[t.number].datetime_complete
    assert cli.main(["sweep", str(path)]) == 0 and len(trials_of(path)) == 3  # resumed in place: budget met
    assert cli.main(["report", str(path)]) == 0
    summary = (tmp_path / "runs" / "grown" / "report" / "summary.md").read_text()
    assert "- trials: 3 finished of 3" in summary and "- control: 6 finished of 6" in summary
    assert "- seeds added by `sweep --add-seeds`: 2" in summary
    assert "- verdicts two-stage: seeds 2 were added after the study had been read" in summary


@pytest.mark.parametrize(
    "keys, args, message",
    [
        ({}, ["--add-seeds", "0"], "--add-seeds: must be an integer in [1, 10000], got 0"),
        (
            {"sampler": {"kind": "random"}, "budget": {"n_trials": 2}},
            ["--add-seeds", "2"],
            "--add-seeds: an open study (sampler.kind=random) has no grid to add seeds to",
        ),
        (
            {"budget": {"n_trials": 1}},
            ["--add-seeds", "1"],
            "--add-seeds: budget.n_trials=1 fixes the number of trials",
        ),
    ],
)
def test_add_seeds_is_refused_in_one_line_where_it_cannot_apply(tmp_path, tiny_overrides, capsys, keys, args, message):
    path = write_study(
        tmp_path, tiny_overrides, "refused", {"seed": {"type": "categorical", "choices": [0, 1]}}, **keys
    )
    assert cli.main(["sweep", str(path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "runs").exists()


def postgres_url():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (Debian's server binaries; run as root)."""
    import pwd
    import shutil
    import socket
    import tempfile

    pg_bin = Path("/usr/lib/postgresql/15/bin")
    if not pg_bin.is_dir() or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs Debian's PostgreSQL 15 server and root (to run it as user postgres)")
    user = pwd.getpwnam("postgres")
    root = Path(tempfile.mkdtemp(prefix="linformer-lab-pg-"))
    os.chmod(root, 0o755)
    os.chown(root, user.pw_uid, user.pw_gid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def as_postgres(*cmd: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True)

    data = root / "data"
    as_postgres(str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    as_postgres(
        str(pg_bin / "pg_ctl"),
        "-D",
        str(data),
        "-w",
        "-l",
        str(root / "log"),
        "-o",
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
        "start",
    )
    try:
        as_postgres(str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"
    finally:
        as_postgres(str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.processes
def test_two_workers_share_a_postgresql_study_and_the_report_reads_it(tmp_path, tiny, postgres_url):
    path = write_study(tmp_path, tiny, "rdb", {"seed": {"type": "categorical", "choices": [0, 1, 2]}})
    assert cli.main(["sweep", str(path), "--workers", "2", "--storage", postgres_url]) == 0
    assert cli.main(["sweep", str(path), "--workers", "2", "--storage", postgres_url]) == 0  # budget met
    study = optuna.load_study(study_name="rdb", storage=postgres_url)
    mine = counted(study.trials)
    assert len(mine) == 3 and all(t.state == TrialState.COMPLETE for t in mine)
    assert sorted(t.params["seed"] for t in mine) == [0, 1, 2]
    assert cli.main(["report", str(path), "--storage", postgres_url]) == 0
    assert (tmp_path / "runs" / "rdb" / "report" / "summary.md").is_file()
    assert not (tmp_path / "runs" / "rdb" / stored.JOURNAL).exists()


def test_a_sweep_progress_line_counts_trials_and_projects_the_time_left_at_this_sessions_pace():
    from sweeps.run.command import progress_line

    # 2 trials were done before this command; 3 more finished in 6 minutes: 7 left at 2 min each.
    assert progress_line(5, 12, 2, 360.0) == "progress: 5/12 trials, 6:00 elapsed, about 14:00 left"
    assert progress_line(2, 12, 2, 30.0) == "progress: 2/12 trials, 0:30 elapsed"  # no pace yet
    assert progress_line(4, None, 0, 3700.0) == "progress: 4/∞ trials, 1:01:40 elapsed"


# --------------------------------------------------------------------------------------- two workers, one point
def storage_url(kind: str, tmp_path) -> Optional[str]:
    """The study's storage: its journal (None), or an RDB URL, which Optuna opens behind its trial cache."""
    return None if kind == "journal" else f"sqlite:///{tmp_path / 'optuna.db'}"


@pytest.mark.parametrize("kind", ["journal", "rdb"])
def test_a_grid_worker_that_loses_the_waiting_point_to_another_makes_no_trial_outside_the_grid(
    tmp_path, tiny, monkeypatch, kind
):
    """The race of two grid workers, made deterministic: this worker sees a waiting point, another claims it before
    this one's ask. Optuna's ask would then draw a fresh trial from the sampler; the worker must make none."""
    path = write_study(tmp_path, tiny, "race", {"seed": {"type": "categorical", "choices": [0]}})
    study, url = load_study(path), storage_url(kind, tmp_path)
    command.prepare(study, storage.RunStorage(study, url))
    other = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, url))
    looked = storage.budget_state

    def look_then_lose_the_point(trials, s):
        monkeypatch.setattr(storage, "budget_state", looked)
        assert other.ask().number == 0  # the other worker claims the one point after this one looked
        return looked(trials, s)

    monkeypatch.setattr(storage, "budget_state", look_then_lose_the_point)
    # (SQLite takes one worker; the worker count changes nothing else here)
    command._work_on(study, url, workers=2 if url is None else 1, index=0, deadline=None, wait_for_running=False)
    assert [(t.number, t.state) for t in other.get_trials()] == [(0, TrialState.RUNNING)]


@pytest.mark.parametrize("kind", ["journal", "rdb"])
def test_a_grid_studys_storage_makes_trials_from_points_only(tmp_path, tiny, kind):
    path = write_study(tmp_path, tiny, "points", {"seed": {"type": "categorical", "choices": [0, 1]}})
    study = load_study(path)
    ostudy = command.prepare(study, storage.RunStorage(study, storage_url(kind, tmp_path)))
    assert [ostudy.ask().number for _ in range(2)] == [0, 1]  # the two enqueued points
    with pytest.raises(storage.GridPointTaken):
        ostudy.ask()
    assert len(ostudy.get_trials()) == 2  # nothing was written by the refused ask


# --------------------------------------------------------------------------------------- cheap before expensive
def no_preflight_yet(monkeypatch) -> None:
    """The preflight turned on, and a test failure if it starts: what the test checks must come first."""
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    monkeypatch.setattr(command, "_preflight", lambda *args: pytest.fail("the preflight ran before the check"))


@pytest.mark.parametrize("args", [(), ("--new-study",), ("--preflight",)])
def test_a_study_another_sweep_runs_is_refused_before_the_preflight(
    tmp_path, tiny_overrides, monkeypatch, capsys, args
):
    from foundation.lock import Owner

    no_preflight_yet(monkeypatch)
    path = write_study(tmp_path, tiny_overrides, "owned", {"seed": {"type": "categorical", "choices": [0, 1]}})
    study = load_study(path)
    command.open_study(storage.RunStorage(study, None))  # a study with a journal, as a running sweep has
    with Owner(study.root, "the other sweep"):  # another sweep command owns it (a lock of its own open file)
        before = sorted((p.name, p.stat().st_mtime_ns) for p in study.root.iterdir())
        assert cli.main(["sweep", str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: study owned ({study.root}): in use by "), err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in study.root.iterdir()) == before  # nothing moved aside


def test_the_progress_clock_runs_on_across_the_gate_and_trials_found_together_print_one_line(
    tmp_path, tiny_overrides, monkeypatch, capsys
):
    """Two trials finished between two looks print one progress line, not two with the same count; after the gate
    the clock goes on from the sweep's start (no "7/22, 1:10 elapsed" after "6/22, 3:04 elapsed")."""
    from optuna.distributions import CategoricalDistribution

    space = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"choices": ARMS}}
    study = load_study(write_study(tmp_path, tiny_overrides, "clock", space, arms=["arm"], control=CONTROL))
    ostudies = {s.name: optuna.create_study(study_name=s.name) for s in study.studies}
    worker = types.SimpleNamespace(sentinel=object(), exitcode=0, name="w", pid=1, join=lambda: None)

    def finishing(target, *params):
        def wait(sentinels, timeout):
            for p in params:
                dists = {k: CategoricalDistribution([v]) for k, v in p.items()}
                target.add_trial(optuna.trial.create_trial(params=p, distributions=dists, value=1.0))
            return sentinels

        return wait

    control = ostudies[study.control.name]
    both = finishing(control, {"control": "degraded", "seed": 0}, {"control": "degraded", "seed": 1})
    monkeypatch.setattr(command, "wait", both)
    pace = (time.time() - 184, 0)  # the sweep started 3:04 ago
    command.follow(study, ostudies, [worker], pace)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("progress")]
    # 6 trials: the arms' 4 and the control's degraded 2 (its reference is the arm "full", trained once)
    assert len(lines) == 1 and lines[0].startswith("progress: 2/6 trials, 3:04 elapsed"), lines
    monkeypatch.setattr(command, "wait", finishing(ostudies[study.name], {"seed": 0, "arm": "linformer"}))
    command.follow(study, ostudies, [worker], pace)  # the arms, after the gate
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("progress")]
    assert line.startswith(("progress: 3/6 trials, 3:04 elapsed, about 3:04 left", "progress: 3/6 trials, 3:05")), line


def test_the_plans_reason_reads_the_trials_this_sweep_ran_not_those_before_it(tmp_path, tiny_overrides):
    from optuna.distributions import CategoricalDistribution

    from sweeps.run import preflight

    space = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"choices": ARMS}}
    study = load_study(write_study(tmp_path, tiny_overrides, "took", space, arms=["arm"]))
    ostudy = optuna.create_study(study_name=study.name)

    def add(seed: int) -> None:
        params = {"seed": seed, "arm": "full"}
        dists = {k: CategoricalDistribution([v]) for k, v in params.items()}
        ostudy.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=1.0))

    add(0)  # finished by an earlier sweep
    time.sleep(0.05)
    started = time.time()
    add(1)
    measured = {"setup_s": 1.0, "first_step_s": 1.0, "step_s": 0.5, "validation_s": 0.5}
    trials = [(study.name, {"seed": s, "arm": "full"}, 11, 2) for s in (0, 1)]
    shape = preflight.Shape("k", "full", None, trials=trials, measured=measured)
    assert command._took(study, {study.name: ostudy}, [shape], started) == [("full", 1 + 1 + 10 * 0.5 + 2 * 0.5, 0.0)]
