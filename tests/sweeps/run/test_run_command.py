"""Optuna studies: study files, workers, budget, faults, pruning, and the report's statistics."""

from __future__ import annotations

import csv
import math
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
import yaml
from optuna.trial import TrialState
from studies import ARMS, counted, trials_of, write_study

from experiments import cli
from sweeps import stored
from sweeps.report import markdown, power, stats
from sweeps.run import storage
from sweeps.spec.study import load_study, shipped_studies

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------- helpers
def sweep_process(path: Path, *args: str) -> subprocess.Popen:
    """``linformer-lab sweep`` in its own process group, so a test can kill it whole."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
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
    assert run_dirs == {tmp_path / "runs" / "two_workers" / f"trial_{t.number}" for t in trials}
    for t in trials:
        run_dir = Path(t.user_attrs["run_dir"])
        assert (run_dir / "metrics.json").is_file()
        hp = hparams_of(run_dir)
        assert hp["arm"] == t.params["arm"] and hp["seed"] == t.params["seed"]
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
    wait_for((tmp_path / "runs" / "resume" / "trial_1" / "checkpoints" / "last.ckpt").is_file, every=0.01)
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


def test_a_retry_continues_from_its_attempts_checkpoint_only_when_there_is_one(tmp_path):
    import torch

    from sweeps.run.trials import copy_attempt

    old = tmp_path / "trial_0"
    dead = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"run_dir": str(old)})
    dead.number = 0
    retry = optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"retry_history": [0]})
    retry.number = 1
    fresh = optuna.trial.create_trial(state=TrialState.WAITING)
    fresh.number = 2
    old.mkdir()
    (old / "events.out.tfevents.1").write_bytes(b"curve")
    assert copy_attempt([dead, retry], retry, tmp_path / "trial_1") is None  # killed before its checkpoint
    (old / "checkpoints").mkdir()
    torch.save({"state_dict": {}, "global_step": 9}, old / "checkpoints" / "last.ckpt")
    assert copy_attempt([dead, fresh], fresh, tmp_path / "trial_2") is None  # not a retry
    previous, step = copy_attempt([dead, retry], retry, tmp_path / "trial_1")
    assert previous.number == 0 and step == 9
    assert (tmp_path / "trial_1" / "events.out.tfevents.1").read_bytes() == b"curve"
    assert (tmp_path / "trial_1" / "checkpoints" / "last.ckpt").is_file() and (old / "checkpoints").is_dir()


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


# --------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("path", shipped_studies(), ids=lambda p: p.stem)
def test_every_shipped_study_validates_at_every_preset(path):
    presets = yaml.safe_load(path.read_text()).get("presets", {})
    assert {"cpu", "gpu"} <= set(presets)
    for preset in presets:
        study = load_study(path, preset)
        assert study.n_trials >= 1
        if study.is_grid:
            assert len(study.points) == study.n_trials
            seeds = {p["seed"] for p in study.points}
            assert len(seeds) >= 3 and study.arms and "seed" not in study.arms
        # every study certifies that full attention uses its context: against a model that cannot (no_context),
        # or, where a model without context provably sits at chance (recall), against that level
        control = study.control
        points = control.points + [p for p, _ in control.reused]  # the reused ones are the study's own trials
        assert control is not None and len({p["seed"] for p in points}) >= 3
        configs = {p["control"]: control.config(p) for p in points}
        assert configs["reference"].model.attention.kind == "full"
        if study.no_context_source == "degraded":
            assert configs["degraded"].model.attention.kind == "no_context"
        else:
            assert configs["degraded"].model.attention.kind == "linformer"
            assert configs["degraded"].model.attention.options.k < study.shared.model.max_len // 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"space": {"model.attention.kk": {"choices": [1]}}}, "space.model.attention.kk: not a config key"),
        ({"overrides": {"model.attention.kind": "bigbird"}}, "model.attention.kind"),
        ({"space": {"model.attention.options.k": {"choices": [8, 999]}}}, "model.attention.options.k=999"),
        (
            {
                "pruner": {"kind": "median"},
                "objective": [{"metric": "val/loss"}, {"metric": "tokens_per_sec", "direction": "maximize"}],
            },
            "Optuna cannot prune multi-objective studies",
        ),
        ({"overrides": {"trainer.devices": 2}}, "ddp_spawn"),
        (
            {"space": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}},
            "a grid needs finite values",
        ),
        ({"sampler": {"kind": "bayes"}}, "sampler.kind"),
        (
            {"control": {"reference": {"model.attention.kind": "full"}, "seeds": [0, 1]}},
            "control.degraded: give the overrides of the degraded arm",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.options.k": 2},
                    "degraded": {"model.attention.options.k": 2},
                    "seeds": [0, 1],
                }
            },
            "control: reference and degraded are the same overrides",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.kind": "full"},
                    "degraded": {"model.attention.options.k": 999},
                    "seeds": [0, 1],
                }
            },
            "control.degraded: model.attention.options.k: k=999",
        ),
        (
            {"control": {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}},
            "control.seeds: at least 2 distinct seeds",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.kind": "full"},
                    "degraded": {"model.attention.options.k": 1},
                    "seeds": [0, 1],
                },
                "space": {"control": {"choices": ["a", "b"]}},
            },
            "space.control: the name is taken by the study's control arms",
        ),
        (
            {"verdict": {"deltas": {"val/loss": 0.01}}},
            "verdict.deltas: unknown key (allowed here: delta, success, context_gain, within)",
        ),
        (
            {"verdict": {"delta": {"val/loss": -0.01}}},
            "verdict.delta.val/loss: the margin δ must be > 0 (in the metric's units), got -0.01",
        ),
        (
            {"verdict": {"delta": {"val/loss": "small"}}},
            "verdict.delta.val/loss: Value 'small' of type 'str' could not be",
        ),
        (
            {"verdict": {"delta": {"val/los": 0.01}}},
            "verdict.delta.val/los: not an objective metric of this study file (objectives: val/loss)",
        ),
        (
            {
                "objective": [{"metric": "val/accuracy", "direction": "maximize"}],
                "verdict": {"success": {"val/accuracy": 90}},
            },
            "verdict.success.val/accuracy: an accuracy is a fraction in [0, 1], so 0 < threshold <= 1 (90 % is 0.9), got 90",
        ),
        (
            {"objective": [{"metric": "tokens_per_sec", "direction": "maximize"}]},
            "verdict.delta.tokens_per_sec: objective metric 'tokens_per_sec' has no default margin δ",
        ),
        # a seed after the first is checked too, though its trial shares every other check with the first's
        ({"space": {"seed": {"type": "categorical", "choices": [0, 2**32]}}}, "trial with seed=4294967296: seed:"),
    ],
)
def test_a_bad_study_file_is_one_line_and_exit_2_before_any_trial(tmp_path, tiny_overrides, capsys, change, message):
    space = {"seed": {"type": "categorical", "choices": [0]}, **change.pop("space", {})}
    path = write_study(tmp_path, tiny_overrides, "bad", space, **change)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}") and message in err
    assert not (tmp_path / "runs").exists()


def test_an_existing_study_refuses_a_changed_objective(tmp_path, tiny_overrides, capsys):
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

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


def test_a_missing_preset_names_the_ones_there_are(capsys):
    assert cli.main(["sweep", str(REPO / "sweeps" / "sharing.yaml"), "--preset", "tpu"]) == 2
    assert "--preset tpu: no such preset (has: cpu, gpu)" in capsys.readouterr().err


def test_conditional_params_enter_the_grid_only_where_active(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "conditional",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "model.attention.kind": {"type": "categorical", "choices": ["full", "linformer"]},
            "model.attention.options.k": {
                "type": "int",
                "low": 4,
                "high": 8,
                "step": 4,
                "when": {"model.attention.kind": "linformer"},
            },
        },
    )
    study = load_study(path)
    per_seed = [{"model.attention.kind": "full"}] + [
        {"model.attention.kind": "linformer", "model.attention.options.k": k} for k in (4, 8)
    ]
    assert study.points == [{"seed": s, **arm} for s in (0, 1) for arm in per_seed]
    assert study.n_trials == 6 and study.arms == ["model.attention.kind", "model.attention.options.k"]


def test_a_trials_config_is_the_one_the_load_checked_never_merged_or_checked_again(
    tmp_path, tiny_overrides, monkeypatch
):
    import pickle

    from omegaconf import OmegaConf

    from foundation.errors import ConfigError
    from training import config as run_config

    arms = {**ARMS, "reseeded": {"model.attention.kind": "full", "seed": 7}}  # a bundle that sets the seed itself
    space = {
        "seed": {"type": "categorical", "choices": [0, 1, 2]},
        "arm": {"type": "categorical", "choices": arms},
        "model.attention.options.k": {"choices": [4, 8], "when": {"model.attention.kind": "linformer"}},
    }
    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.kind": "no_context"}}
    study = load_study(write_study(tmp_path, tiny_overrides, "once", space, arms=["arm"], control=control))
    run = {"experiment": study.name, "run_dir": str(study.root / "trial_0"), "resume": True}
    expected = {(one.name, repr(p)): one.build_config(p, run) for one in study.studies for p in one.points}
    assert study.config({"seed": 1, "arm": "reseeded"}).seed == 7

    calls = []
    for name in ("check", "merge_run"):
        real = getattr(run_config, name)
        monkeypatch.setattr(run_config, name, lambda *a, name=name, real=real: calls.append(name) or real(*a))
    worker = pickle.loads(pickle.dumps(study))  # what a worker gets
    for loaded in (study, worker):
        for one in loaded.studies:
            ostudy = optuna.create_study(directions=one.directions)
            for p in one.points:
                cfg = one.config(p, run)
                assert cfg == expected[(one.name, repr(p))] and OmegaConf.get_type(cfg) is run_config.RunConfig
                ostudy.enqueue_trial(p)
                assert one.suggest(ostudy.ask()) == p  # its conditional params decided as the load decided them
    assert calls == []  # neither merged nor checked again: in the command's process nor in a worker's

    # the keys a trial's run sets are its own, and checked
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match=r"run_dir: .*a_file is a file, not a folder"):
        worker.config(worker.points[0], {"run_dir": str(tmp_path / "a_file")})

    # an open sampler's proposal is no point the load checked: merged and checked when a trial asks for it, once
    open_space = {"optim.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}
    keys = {"sampler": {"kind": "random"}, "budget": {"n_trials": 2}}
    proposed = load_study(write_study(tmp_path, tiny_overrides, "proposed", open_space, **keys))
    assert proposed.checked == {}
    calls.clear()
    assert proposed.config({"optim.lr": 0.005}, run).optim.lr == 0.005
    assert calls == ["merge_run", "check"]


# --------------------------------------------------------------------------------------- budget
def _trial(number, state, **attrs):
    return optuna.trial.create_trial(
        state=state,
        value=1.0 if state == TrialState.COMPLETE else None,
        user_attrs=attrs.get("user_attrs", {}),
        system_attrs=attrs.get("system_attrs", {}),
    ), number


def test_the_budget_counts_finished_trials_but_not_retried_or_discarded_ones():
    made = [
        _trial(0, TrialState.COMPLETE),
        _trial(1, TrialState.FAIL),
        _trial(2, TrialState.PRUNED),
        _trial(3, TrialState.COMPLETE, system_attrs={"retry_history": [1]}),
        _trial(4, TrialState.PRUNED, user_attrs={stored.DISCARDED: "budget met"}),
        _trial(5, TrialState.RUNNING),
    ]
    trials = []
    for t, number in made:
        t.number = number
        trials.append(t)
    assert storage.budget_state(trials) == storage.BudgetState(finished=3, running=1)  # 0, 2, 3 finished; 5 running
    assert storage.budget_position(trials, 5) == 3


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


# --------------------------------------------------------------------------------------- power check
@pytest.mark.processes  # the sweep command's workers
def test_a_study_runs_its_control_beside_its_trials_and_reports_the_power_check(tmp_path, tiny):
    control = {
        "reference": {"model.attention.kind": "full"},
        "degraded": {"model.attention.kind": "linformer", "model.attention.options.k": 1},
    }
    path = write_study(
        tmp_path,
        tiny,
        "powered",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "model.attention.options.share": {"choices": ["headwise", "kv"]},
        },
        overrides={"model.attention.kind": "linformer", "trainer.max_steps": 3},
        control=control,
    )
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    main = counted(trials_of(path))
    root = tmp_path / "runs" / "powered"
    cstudy = load_study(path).control
    ctrials = optuna.load_study(study_name="powered_control", storage=stored.open_storage(cstudy, None)).get_trials()
    # the control is its own study: the main study's sampler and budget never see it
    assert len(main) == 4 and all("control" not in t.params for t in main)
    assert sorted((t.params["control"], t.params["seed"]) for t in ctrials) == [
        ("degraded", 0),
        ("degraded", 1),
        ("reference", 0),
        ("reference", 1),
    ]
    for t in ctrials:
        assert t.state == TrialState.COMPLETE and Path(t.user_attrs["run_dir"]).parent == root / "control"
        resolved = yaml.safe_load((Path(t.user_attrs["run_dir"]) / "config.yaml").read_text())
        assert resolved["model"]["attention"]["kind"] == ("full" if t.params["control"] == "reference" else "linformer")
        assert resolved["seed"] == t.params["seed"]

    assert cli.main(["report", str(path)]) == 0
    summary = (root / "report" / "summary.md").read_text()
    by_role = {
        role: {(t.params["seed"],): t.value for t in ctrials if t.params["control"] == role}
        for role in ("reference", "degraded")
    }
    trivial = {
        (t.params["seed"],): t.user_attrs["metrics"]["trivial_loss"]
        for t in ctrials
        if t.params["control"] == "reference"
    }
    check = stats.power_check(by_role["reference"], by_role["degraded"], trivial, "minimize")
    assert summary.index("## Power check") < summary.index("## Arms")
    # the advice a study file without a GPU preset gets (sweeps.report.command.advice_of)
    assert all(f"- {line}" in summary for line in power.phrase(check, "add seeds or training steps"))
    assert ("The power check failed" in summary) == (not check.has_power)
    # the control's arms sit in the table beside the study's own arms, and in none of the comparisons
    assert "| control reference (kind=full) | 2 |" in summary
    assert "| control degraded (kind=linformer k=1) | 2 |" in summary
    assert "| share=headwise | control reference (kind=full) |" not in summary
    with (root / "report" / "trials.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 8


def test_a_report_whose_control_has_not_run_says_the_power_was_not_judged(tmp_path, tiny_overrides):
    from optuna.distributions import CategoricalDistribution

    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "unjudged",
        {"seed": {"type": "categorical", "choices": [0, 1]}},
        overrides={"model.attention.kind": "linformer"},
        control=control,
    )
    study = load_study(path)
    open_study(RunStorage(study, None)).add_trial(
        optuna.trial.create_trial(
            params={"seed": 0},
            distributions={"seed": CategoricalDistribution([0, 1])},
            value=3.0,
            user_attrs={"metrics": {"val/loss": 3.0, "trivial_loss": 3.1}},
        )
    )
    summary = (write_report(study) / "summary.md").read_text()
    assert "Not judged: the control's reference and degraded arms have fewer than 2 complete trials" in summary
    assert "The power check failed" not in summary


# --------------------------------------------------------------------------------------- report
@pytest.mark.processes  # the sweep command's workers
def test_a_diverging_trial_is_recorded_with_its_reason_and_the_report_holds_every_trial(tmp_path, tiny, capsys):
    diverges = {"optim.lr": 1.0e30, "optim.gradient_clip_val": 0.0}
    path = write_study(
        tmp_path,
        tiny,
        "report",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "arm": {"type": "categorical", "choices": {**ARMS, "diverges": diverges}},
        },
        overrides={"trainer.max_steps": 3},
        arms=["arm"],
    )
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    assert "exited with code" not in capsys.readouterr().out  # a failed trial leaves its worker running
    trials = {t.number: t for t in trials_of(path)}
    assert len(trials) == 6
    for t in trials.values():
        if t.params["arm"] == "diverges":
            assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"].startswith("diverged: train/loss=")
        else:
            assert t.state == TrialState.COMPLETE and math.isfinite(t.value)

    assert cli.main(["report", str(path)]) == 0
    out = tmp_path / "runs" / "report" / "report"
    with (out / "trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(int(r["number"]) for r in rows) == sorted(trials)
    for r in rows:
        t = trials[int(r["number"])]
        assert r["state"] == t.state.name and r["arm"] == t.params["arm"]
        if t.state == TrialState.COMPLETE:
            assert float(r["val/loss"]) == pytest.approx(t.value)
            assert float(r["trivial_loss"]) == pytest.approx(t.user_attrs["metrics"]["trivial_loss"])
        else:
            assert r["fail_reason"] == t.user_attrs["fail_reason"]
    summary = (out / "summary.md").read_text()
    full = [t.value for t in trials.values() if t.params["arm"] == "full"]
    mean = sum(full) / 2
    std = math.sqrt(sum((v - mean) ** 2 for v in full))
    assert f"| full | 2 | {markdown.fmt(mean)} ± {markdown.fmt(std)} |" in summary
    assert "trivial loss" in summary
    assert summary.count("| full | linformer |") == 1 and "paired t (n=2)" in summary
    assert "| diverges | 0 |" in summary and "## Failed trials" in summary
    for png in ("history.png", "parallel_coordinate.png", "learning_curves.png"):
        assert (out / png).stat().st_size > 1000


def _add(ostudy, params: dict, value: float, metrics: Optional[dict] = None) -> None:
    """A finished trial with these params (seed an int range, as the sweep asks it)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dists = {
        p: IntDistribution(0, 99) if p == "seed" else CategoricalDistribution(sorted({v, "a", "b"}))
        for p, v in params.items()
    }
    ostudy.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions=dists,
            value=value,
            user_attrs={"metrics": {"val/loss": value, **(metrics or {})}},
        )
    )


@pytest.mark.parametrize(
    "a, b, first",
    [
        # B lower by 0.2 at every seed, spread 0.01
        (
            [3.0, 3.1, 2.9, 3.05],
            [2.8, 2.91, 2.69, 2.86],
            "**Answer:** arm b is better than arm a on val/loss by 0.198 (95 % CI [0.182, 0.213], Holm-adjusted p < 0.001, "
            "4 seeds each).",
        ),
        # equal on average, ±0.002 from seed to seed, 8 seeds
        (
            [3.0 + 0.01 * s for s in range(8)],
            [3.0 + 0.01 * s + (0.002 if s % 2 else -0.002) for s in range(8)],
            "**Answer:** arm a and arm b are on par within ±0.01 val/loss (TOST p < 0.001 after Holm, 8 seeds each).",
        ),
        # two seeds, differing by ±1/256 (exactly 0 on average): undecided, with the seeds to add
        (
            [3.0, 3.0078125],
            [2.99609375, 3.01171875],
            "**Answer:** arm a vs arm b on val/loss is undecided after 2 seeds each: 3 more seeds per arm would show 'on par' "
            "within ±0.01 at 80 % power if the observed difference (0) and spread hold (no difference was observed to plan "
            "'better' for); plan the seeds now and add them all with `linformer-lab sweep {path} --add-seeds 3`.",
        ),
    ],
)
def test_the_report_opens_with_the_answer_the_delta_and_the_holm_statement(tmp_path, tiny_overrides, a, b, first):
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    arms = {"arm a": {"optim.lr": 1e-3}, "arm b": {"optim.lr": 2e-3}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "answered",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": arms}},
        arms=["arm"],
        sampler={"kind": "grid"},
    )
    study = load_study(path)
    ostudy = open_study(RunStorage(study, None))
    for arm, values in (("arm a", a), ("arm b", b)):
        for seed, value in enumerate(values):
            _add(ostudy, {"seed": seed, "arm": arm}, value)
    lines = (write_report(study) / "summary.md").read_text().splitlines()
    assert lines[0] == "# Study answered" and lines[2] == first.format(path=path)
    assert lines[4] == "- δ, the margin within which two arms are on par: val/loss ±0.01 (default)."
    assert lines[5].startswith("- Holm's correction over the 1 'better' tests of this report (1 comparisons of means)")


def test_a_recall_study_reports_success_rates_with_exact_intervals(tmp_path, tiny_overrides):
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    arms = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "recall",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": arms}},
        arms=["arm"],
        objective=[{"metric": "val/accuracy", "direction": "maximize"}],
        verdict={"success": {"val/accuracy": 0.9}},
    )
    study = load_study(path)
    ostudy = open_study(RunStorage(study, None))
    for arm, values in (("a", [1.0, 0.99, 1.0, 0.98, 1.0, 1.0]), ("b", [1.0, 0.26, 0.99, 0.3, 0.28, 1.0])):
        for seed, value in enumerate(values):
            _add(ostudy, {"seed": seed, "arm": arm}, value, {"val/accuracy": value})
    summary = (write_report(study) / "summary.md").read_text()
    # per arm: 6/6 [0.54, 1.00] and 3/6 [0.12, 0.88] (Clopper-Pearson); compared by Boschloo's test
    assert "| a | 6 | 0.995 ± 0.00837 | 6/6 [0.54, 1.00] |" in summary
    assert "| b | 6 | 0.638 ± 0.393 | 3/6 [0.12, 0.88] |" in summary
    # Boschloo p = 0.068 for 6/6 vs 3/6 (Fisher's: 0.18), doubled by Holm with the t test's p = 0.074
    assert "runs reaching val/accuracy ≥ 0.9: 6/6 vs 3/6, Boschloo p = 0.14 after Holm" in summary.splitlines()[2]
    assert "| a | b | 6/6 [0.54, 1.00] | 3/6 [0.12, 0.88] | 0.068 (0.14) | undecided (no difference shown) |" in summary
    assert "(1 comparisons of means, 1 comparisons of success rates)" in summary
    assert "- Success: a run with val/accuracy ≥ 0.9 solved the task (study file)" in summary


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


def test_a_grown_study_equals_the_study_loaded_with_its_seeds_and_checks_only_its_new_points(
    tmp_path, tiny_overrides, monkeypatch
):
    from omegaconf import OmegaConf

    from foundation.errors import ConfigError
    from sweeps.spec import study as spec_study
    from training import config as run_config

    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "grows",
        {"seed": {"type": "categorical", "choices": [0, 2]}, "model.attention.options.k": {"choices": [4, 8]}},
        overrides={"model.attention.kind": "linformer"},
        control=control,
    )
    study = load_study(path)
    loaded = load_study(path, added_seeds=[3, 4])
    before = (study.points, study.seeds, study.control.points)

    checked = []
    monkeypatch.setattr(spec_study, "read_yaml", lambda *a: pytest.fail("the study file was read again"))
    monkeypatch.setattr(run_config, "load", lambda *a: pytest.fail("the base experiment was read again"))
    monkeypatch.setattr(run_config, "check", checked.append)
    grown = study.with_seeds([3, 4])
    assert checked == []  # its new points differ from the checked ones in their seed alone: only that is checked
    for a, b in ((grown, loaded), (grown.control, loaded.control)):
        assert OmegaConf.to_container(a.spec) == OmegaConf.to_container(b.spec)
        assert (a.points, a.n_trials, a.seeds, a.added_seeds, a.reused) == (
            b.points,
            b.n_trials,
            b.seeds,
            b.added_seeds,
            b.reused,
        )
        assert all(a.config(p) == b.config(p) for p in a.points)
    assert grown.seeds == [0, 2, 3, 4] and grown.n_trials == 8 and grown.control.parent is grown
    assert (study.points, study.seeds, study.control.points) == before  # the loaded study is left as it was
    assert grown.with_seeds([5]).seeds == loaded.with_seeds([5]).seeds == [0, 2, 3, 4, 5]

    # a study that cannot take the seeds: the same line as loading it with them
    with pytest.raises(ConfigError) as from_loaded:
        study.with_seeds([2**32])
    monkeypatch.undo()
    with pytest.raises(ConfigError) as from_file:
        load_study(path, added_seeds=[2**32])
    assert str(from_loaded.value) == str(from_file.value) and str(from_file.value).startswith(
        f"{path}: trial with seed="
    )


@pytest.mark.processes  # the sweep command's worker
def test_add_seeds_runs_only_the_new_seeds_points_and_the_report_counts_them(tmp_path, tiny):
    control = {
        "reference": {"model.attention.kind": "full"},
        "degraded": {"model.attention.kind": "linformer", "model.attention.options.k": 1},
    }
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
