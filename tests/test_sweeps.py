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

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from experiments import cli
from sweeps import stats, storage
from sweeps.study import load_study, shipped_studies

REPO = Path(__file__).resolve().parents[1]
ARMS = {"full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}


# --------------------------------------------------------------------------------------- helpers
_PREPARED: set = set()


@pytest.fixture
def tiny(tiny_overrides, data_cache):
    """``tiny_overrides`` with its data prepared once in this process: workers that start together on an
    empty cache would each tokenize the corpus."""
    if data_cache not in _PREPARED:
        from training import config as run_config
        from training.train import build_datamodule

        datamodule = build_datamodule(run_config.load(tiny_overrides.config, tiny_overrides.args))
        datamodule.prepare_data()
        datamodule.setup("fit")
        _PREPARED.add(data_cache)
    return tiny_overrides


def write_study(tmp_path: Path, tiny, name: str, space: dict, overrides: dict = (), **keys) -> Path:
    """A study file over the tiny run config (the ``tiny`` fixture's settings)."""
    base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny.args)}
    study = {"study": name, "base": str(tiny.config), "overrides": {**base, **dict(overrides)}, "space": space,
             "sampler": {"kind": "grid"}, **keys}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def trials_of(path: Path) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    try:
        return optuna.load_study(study_name=study.name, storage=storage.open_storage(study, None)).get_trials()
    except KeyError:  # not created yet
        return []


def counted(trials):
    excluded = storage.excluded_numbers(trials)
    return [t for t in trials if t.number not in excluded]


def sweep_process(path: Path, *args: str) -> subprocess.Popen:
    """``linformer-lab sweep`` in its own process group, so a test can kill it whole."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "experiments.cli", "sweep", str(path), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


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
        owner = storage.heartbeat_owner(study, t.number)
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
def test_two_workers_run_the_exact_budget_with_one_run_dir_and_hparams_per_trial(tmp_path, tiny):
    path = write_study(tmp_path, tiny, "two_workers",
                       {"seed": {"type": "categorical", "choices": [0, 1]},
                        "arm": {"type": "categorical", "choices": ARMS}}, arms=["arm"])
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    trials = trials_of(path)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted((t.params["seed"], t.params["arm"]) for t in trials) == [
        (0, "full"), (0, "linformer"), (1, "full"), (1, "linformer")]
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


@pytest.mark.parametrize("visible, count, workers, expected, line", [
    (None, 4, 2, ["0,1", "2,3"], None),
    ("3,5,6", 3, 2, ["3", "5"], "note: 3 GPUs for 2 workers: 1 per worker, 1 idle"),
    (None, 1, 3, ["0", "0", "0"], "warning: 3 workers share 1 GPU(s)"),
    (None, 0, 2, [None, None], None),
])
def test_each_sweep_worker_gets_its_own_gpus_counted_without_initialising_cuda(
        tmp_path, tiny_overrides, monkeypatch, capsys, visible, count, workers, expected, line):
    import torch

    from sweeps import sweep

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: pytest.fail("the sweep process initialised CUDA"))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(sweep.mp, "get_context", lambda method: types.SimpleNamespace(Process=_NoWorker))
    monkeypatch.setattr(_NoWorker, "started", [])
    path = write_study(tmp_path, tiny_overrides, "gpus", {"seed": {"type": "categorical", "choices": [0, 1]}},
                       overrides={"trainer.accelerator": "auto"})
    cli.main(["sweep", str(path), "--workers", str(workers)])
    assert [kwargs["gpus"] for kwargs in _NoWorker.started] == expected
    out = capsys.readouterr().out
    notes = [text for text in out.splitlines() if text.startswith(("note:", "warning:"))]
    assert notes == ([] if line is None else [notes[0]]) and (line is None or notes[0].startswith(line))


def test_a_trial_asking_for_more_gpus_than_its_worker_has_is_refused_before_any_trial(tmp_path, tiny_overrides,
                                                                                      monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = write_study(tmp_path, tiny_overrides, "gpus", {"seed": {"type": "categorical", "choices": [0, 1]}},
                       overrides={"trainer.accelerator": "auto", "trainer.devices": 2,
                                  "trainer.strategy": "ddp_spawn"})
    assert cli.main(["sweep", str(path), "--workers", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trainer.devices=2: each sweep worker has 1 GPU(s)" in err
    assert not (tmp_path / "runs" / "gpus").exists()


def test_rerunning_after_the_sweep_was_killed_completes_exactly_the_budget(tmp_path, tiny):
    path = write_study(tmp_path, tiny, "resume",
                       {"seed": {"type": "categorical", "choices": [0, 1, 2]}},
                       overrides={"trainer.max_steps": 30})

    def running_with_checkpoint():
        found = running_trial_with_beat(path)
        run_dir = found and found[0].user_attrs.get("run_dir")
        return run_dir and (Path(run_dir) / "checkpoints" / "last.ckpt").is_file()

    proc = sweep_process(path)
    wait_for(lambda: any(t.state == TrialState.COMPLETE for t in trials_of(path)) and running_with_checkpoint())
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
    assert dead.state == TrialState.FAIL and dead.number in storage.excluded_numbers(trials)
    # the retry continued from the dead attempt's checkpoint: one curve, every validation step once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    retry = next(t for t in mine if dead.number in t.system_attrs.get("retry_history", []))
    resumed = retry.user_attrs["resumed_from"]
    assert resumed["trial"] == dead.number and resumed["step"] >= 3 and retry.user_attrs.get("fail_reason") is None
    ea = EventAccumulator(retry.user_attrs["run_dir"])
    ea.Reload()
    events = ea.Scalars("val/loss")
    assert [e.step for e in events] == list(range(2, 30, 3))  # logged at step - 1
    before = [e for e in events if e.step < resumed["step"]]  # logged by the dead attempt, kept
    assert before and all(e.wall_time < retry.datetime_start.timestamp() for e in before)


def test_a_sigkilled_workers_trial_is_retried_and_the_study_completes(tmp_path, tiny):
    path = write_study(tmp_path, tiny, "killed_worker",
                       {"seed": {"type": "categorical", "choices": [0, 1, 2, 3]}},
                       overrides={"trainer.max_steps": 12})
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

    from sweeps.trials import copy_attempt

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


def test_the_median_pruner_prunes_trials_worse_than_the_first_ones(tmp_path, tiny):
    # Two good trials first (grid order), then two whose lr is too small to move the loss.
    path = write_study(tmp_path, tiny, "prune",
                       {"optim.lr": {"type": "categorical", "choices": [1.0e-2, 1.0e-9]},
                        "seed": {"type": "categorical", "choices": [0, 1]}},
                       pruner={"kind": "median", "n_startup_trials": 2, "n_warmup_steps": 0})
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
        # every study carries its power check: full attention against a Linformer known to be worse
        control = study.control
        assert control is not None and len({p["seed"] for p in control.points}) >= 3
        configs = {p["control"]: control.config(p) for p in control.points}
        assert configs["reference"].model.attention.kind == "full"
        assert configs["degraded"].model.attention.kind == "linformer"
        assert configs["degraded"].model.attention.k < study.shared.model.max_len // 4


@pytest.mark.parametrize("change, message", [
    ({"space": {"model.attention.kk": {"choices": [1]}}}, "space.model.attention.kk: not a config key"),
    ({"overrides": {"model.attention.kind": "performer"}}, "model.attention.kind"),
    ({"space": {"model.attention.k": {"choices": [8, 999]}}}, "model.attention.k=999"),
    ({"pruner": {"kind": "median"}, "objective": [{"metric": "val/loss"}, {"metric": "tokens_per_sec",
                                                                          "direction": "maximize"}]},
     "Optuna cannot prune multi-objective studies"),
    ({"overrides": {"trainer.devices": 2}}, "ddp_spawn"),
    ({"space": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}}, "a grid needs finite values"),
    ({"sampler": {"kind": "bayes"}}, "sampler.kind"),
    ({"control": {"reference": {"model.attention.kind": "full"}, "seeds": [0, 1]}},
     "control.degraded: give the overrides of the degraded arm"),
    ({"control": {"reference": {"model.attention.k": 2}, "degraded": {"model.attention.k": 2}, "seeds": [0, 1]}},
     "control: reference and degraded are the same overrides"),
    ({"control": {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.k": 999},
                  "seeds": [0, 1]}}, "control.degraded: model.attention.k: k=999"),
    ({"control": {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.k": 1}}},
     "control.seeds: at least 2 distinct seeds"),
    ({"control": {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.k": 1},
                  "seeds": [0, 1]}, "space": {"control": {"choices": ["a", "b"]}}},
     "space.control: the name is taken by the study's control arms"),
])
def test_a_bad_study_file_is_one_line_and_exit_2_before_any_trial(tmp_path, tiny_overrides, capsys, change,
                                                                  message):
    space = {"seed": {"type": "categorical", "choices": [0]}, **change.pop("space", {})}
    path = write_study(tmp_path, tiny_overrides, "bad", space, **change)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}") and message in err
    assert not (tmp_path / "runs").exists()


def test_an_existing_study_refuses_a_changed_objective(tmp_path, tiny_overrides, capsys):
    from sweeps.sweep import open_study

    path = write_study(tmp_path, tiny_overrides, "changed", {"seed": {"type": "categorical", "choices": [0]}})
    open_study(load_study(path), None)  # the study as first run: val/loss, minimize
    changed = write_study(tmp_path, tiny_overrides, "changed", {"seed": {"type": "categorical", "choices": [0]}},
                          objective=[{"metric": "val/loss", "direction": "maximize"}])
    for command in ("sweep", "report"):
        assert cli.main([command, str(changed)]) == 2
        assert "has objective val/loss (minimize), the file now says val/loss (maximize)" in capsys.readouterr().err


def test_a_missing_preset_names_the_ones_there_are(capsys):
    assert cli.main(["sweep", str(REPO / "sweeps" / "sharing.yaml"), "--preset", "tpu"]) == 2
    assert "--preset tpu: no such preset (has: cpu, gpu)" in capsys.readouterr().err


def test_conditional_params_enter_the_grid_only_where_active(tmp_path, tiny_overrides):
    path = write_study(tmp_path, tiny_overrides, "conditional", {
        "seed": {"type": "categorical", "choices": [0, 1]},
        "model.attention.kind": {"type": "categorical", "choices": ["full", "linformer"]},
        "model.attention.k": {"type": "int", "low": 4, "high": 8, "step": 4,
                              "when": {"model.attention.kind": "linformer"}}})
    study = load_study(path)
    per_seed = [{"model.attention.kind": "full"}] + [
        {"model.attention.kind": "linformer", "model.attention.k": k} for k in (4, 8)]
    assert study.points == [{"seed": s, **arm} for s in (0, 1) for arm in per_seed]
    assert study.n_trials == 6 and study.arms == ["model.attention.kind", "model.attention.k"]


# --------------------------------------------------------------------------------------- budget
def _trial(number, state, **attrs):
    return optuna.trial.create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                                     user_attrs=attrs.get("user_attrs", {}),
                                     system_attrs=attrs.get("system_attrs", {})), number


def test_the_budget_counts_finished_trials_but_not_retried_or_discarded_ones():
    made = [_trial(0, TrialState.COMPLETE), _trial(1, TrialState.FAIL), _trial(2, TrialState.PRUNED),
            _trial(3, TrialState.COMPLETE, system_attrs={"retry_history": [1]}),
            _trial(4, TrialState.PRUNED, user_attrs={storage.DISCARDED: "budget met"}), _trial(5, TrialState.RUNNING)]
    trials = []
    for t, number in made:
        t.number = number
        trials.append(t)
    assert storage.budget_state(trials) == storage.BudgetState(finished=3, running=1)  # 0, 2, 3 finished; 5 running
    assert storage.budget_position(trials, 5) == 3


# --------------------------------------------------------------------------------------- statistics
def test_student_t_quantiles_match_the_tables():
    for df, q in [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042), (1e9, 1.960)]:
        assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)


def test_identical_arms_are_not_distinguishable():
    a = {0: 5.1, 1: 5.3, 2: 5.2}
    c = stats.compare(a, dict(a))
    assert c.diff == 0 and not c.distinguishable
    assert stats.verdict("A", "B", c, "minimize") == "not distinguishable at this budget: run the GPU preset"


def test_arms_within_the_seed_noise_are_not_distinguishable():
    c = stats.compare({0: 5.0, 1: 5.4, 2: 4.9}, {0: 5.1, 1: 5.2, 2: 5.1})
    assert not c.distinguishable and "not distinguishable" in stats.verdict("A", "B", c, "minimize")


def test_well_separated_arms_get_the_difference_with_its_interval():
    a, b = {0: 3.0, 1: 3.1, 2: 2.9}, {0: 4.0, 1: 4.2, 2: 3.95}
    c = stats.compare(a, b)
    d = [a[k] - b[k] for k in a]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    assert c.test == "paired t (n=3)"
    assert c.diff == pytest.approx(mean) and c.half_width == pytest.approx(4.3027 * sd / math.sqrt(3), rel=1e-4)
    text = stats.verdict("learned", "random", c, "minimize")
    assert text == f"learned better than random by {stats.fmt(-mean)} ± {stats.fmt(c.half_width)}"
    assert stats.verdict("learned", "random", c, "maximize").startswith("random better than learned by")


def test_arms_with_different_seeds_are_compared_by_welch():
    c = stats.compare({0: 1.0, 1: 1.2}, {2: 2.0, 3: 2.1, 4: 1.9})
    va, vb = 0.02 / 2, 0.01 / 3  # s²/n of each arm
    df = (va + vb) ** 2 / (va ** 2 / 1 + vb ** 2 / 2)
    assert c.test == "Welch t (2 vs 3)" and c.diff == pytest.approx(-0.9)
    assert c.half_width == pytest.approx(stats.t_quantile(0.975, df) * math.sqrt(va + vb))
    assert df == pytest.approx(1.7, abs=0.1)


def test_one_seed_per_arm_is_never_distinguishable():
    c = stats.compare({0: 1.0}, {0: 9.0})
    assert not c.distinguishable
    assert stats.verdict("A", "B", c, "minimize").startswith("not distinguishable at this budget")


# --------------------------------------------------------------------------------------- power check
def test_a_control_that_separates_and_leaves_the_trivial_baseline_gives_the_study_power():
    check = stats.power_check({0: 2.80, 1: 2.82, 2: 2.81}, {0: 3.08, 1: 3.09, 2: 3.10},
                              {0: 3.09, 1: 3.09, 2: 3.09}, "minimize")
    assert check.leaves_trivial and check.separates and check.has_power
    assert check.lines[1].startswith("The control separates: the reference is better than the degraded arm by 0.28 ± ")


def test_a_control_within_the_seed_noise_says_the_study_has_no_power():
    check = stats.power_check({0: 2.9, 1: 3.1, 2: 3.0}, {0: 3.0, 1: 3.0, 2: 3.05}, {0: 3.09, 1: 3.09, 2: 3.09},
                              "minimize")
    assert not check.separates and not check.has_power
    assert "does NOT separate" in check.lines[1]
    assert "no verdict below can be trusted; run the GPU preset" in check.lines[1]


def test_a_reference_on_the_trivial_plateau_is_caught_even_when_the_control_separates():
    # both arms learn nothing useful, the degraded one diverges a little: a "separation" without learning
    check = stats.power_check({0: 3.09, 1: 3.10, 2: 3.08}, {0: 3.5, 1: 3.6, 2: 3.55}, {0: 3.09, 1: 3.09, 2: 3.09},
                              "minimize")
    assert check.separates and not check.leaves_trivial and not check.has_power
    assert "does NOT leave the trivial baseline" in check.lines[0]


def test_a_reversed_control_is_named_as_such_and_accuracy_is_maximised():
    check = stats.power_check({0: 0.30, 1: 0.31, 2: 0.29}, {0: 0.90, 1: 0.95, 2: 0.92}, {0: 0.0625, 1: 0.0625,
                                                                                         2: 0.0625}, "maximize")
    assert check.leaves_trivial and not check.separates and "REVERSED" in check.lines[1]
    check = stats.power_check({0: 1.0, 1: 0.99, 2: 1.0}, {0: 0.30, 1: 0.35, 2: 0.28}, {}, "maximize")
    assert check.has_power and check.lines[0].startswith("No trivial baseline")


def test_a_study_runs_its_control_beside_its_trials_and_reports_the_power_check(tmp_path, tiny):
    control = {"reference": {"model.attention.kind": "full"},
               "degraded": {"model.attention.kind": "linformer", "model.attention.k": 1}}
    path = write_study(tmp_path, tiny, "powered", {"seed": {"type": "categorical", "choices": [0, 1]},
                                                     "model.attention.share": {"choices": ["headwise", "kv"]}},
                       overrides={"model.attention.kind": "linformer", "trainer.max_steps": 3}, control=control)
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    main = counted(trials_of(path))
    root = tmp_path / "runs" / "powered"
    cstudy = load_study(path).control
    ctrials = optuna.load_study(study_name="powered_control", storage=storage.open_storage(cstudy, None)).get_trials()
    # the control is its own study: the main study's sampler and budget never see it
    assert len(main) == 4 and all("control" not in t.params for t in main)
    assert sorted((t.params["control"], t.params["seed"]) for t in ctrials) == [
        ("degraded", 0), ("degraded", 1), ("reference", 0), ("reference", 1)]
    for t in ctrials:
        assert t.state == TrialState.COMPLETE and Path(t.user_attrs["run_dir"]).parent == root / "control"
        resolved = yaml.safe_load((Path(t.user_attrs["run_dir"]) / "config.yaml").read_text())
        assert resolved["model"]["attention"]["kind"] == ("full" if t.params["control"] == "reference" else "linformer")
        assert resolved["seed"] == t.params["seed"]

    assert cli.main(["report", str(path)]) == 0
    summary = (root / "report" / "summary.md").read_text()
    by_role = {role: {(t.params["seed"],): t.value for t in ctrials if t.params["control"] == role}
               for role in ("reference", "degraded")}
    trivial = {(t.params["seed"],): t.user_attrs["metrics"]["trivial_loss"] for t in ctrials
               if t.params["control"] == "reference"}
    check = stats.power_check(by_role["reference"], by_role["degraded"], trivial, "minimize")
    assert summary.index("## Power check") < summary.index("## Arms")
    assert all(f"- {line}" in summary for line in check.lines)
    assert ("The power check failed" in summary) == (not check.has_power)
    # the control's arms sit in the table and in the comparisons beside the study's own arms
    assert "| control reference (kind=full) | 2 |" in summary
    assert "| control degraded (kind=linformer k=1) | 2 |" in summary
    assert "| share=headwise | control reference (kind=full) |" in summary
    with (root / "report" / "trials.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 8


def test_a_report_whose_control_has_not_run_says_the_power_was_not_judged(tmp_path, tiny_overrides):
    from optuna.distributions import CategoricalDistribution

    from sweeps.report import write_report
    from sweeps.sweep import open_study

    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.k": 1}}
    path = write_study(tmp_path, tiny_overrides, "unjudged", {"seed": {"type": "categorical", "choices": [0, 1]}},
                       overrides={"model.attention.kind": "linformer"}, control=control)
    study = load_study(path)
    open_study(study, None).add_trial(optuna.trial.create_trial(
        params={"seed": 0}, distributions={"seed": CategoricalDistribution([0, 1])}, value=3.0,
        user_attrs={"metrics": {"val/loss": 3.0, "trivial_loss": 3.1}}))
    summary = (write_report(study) / "summary.md").read_text()
    assert "Not judged: the control's reference and degraded arms have fewer than 2 complete trials" in summary
    assert "The power check failed" not in summary


# --------------------------------------------------------------------------------------- report
def test_a_diverging_trial_is_recorded_with_its_reason_and_the_report_holds_every_trial(tmp_path, tiny):
    diverges = {"optim.lr": 1.0e30, "optim.gradient_clip_val": 0.0}
    path = write_study(tmp_path, tiny, "report",
                       {"seed": {"type": "categorical", "choices": [0, 1]},
                        "arm": {"type": "categorical", "choices": {**ARMS, "diverges": diverges}}},
                       overrides={"trainer.max_steps": 3}, arms=["arm"])
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
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
    assert f"| full | 2 | {stats.fmt(mean)} ± {stats.fmt(std)} |" in summary
    assert "trivial loss" in summary
    assert summary.count("| full | linformer |") == 1 and "paired t (n=2)" in summary
    assert "| diverges | 0 |" in summary and "## Failed trials" in summary
    for png in ("history.png", "parallel_coordinate.png", "learning_curves.png"):
        assert (out / png).stat().st_size > 1000


# --------------------------------------------------------------------------------------- RDB storage
@pytest.fixture
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
    as_postgres(str(pg_bin / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start")
    try:
        as_postgres(str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "optuna")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/optuna"
    finally:
        as_postgres(str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
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
    assert not (tmp_path / "runs" / "rdb" / storage.JOURNAL).exists()
