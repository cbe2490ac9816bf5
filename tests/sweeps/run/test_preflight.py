"""The sweep's preflight (sweeps/run/preflight.py) and the cost it projects (sweeps/run/plan.py): trial shapes, a
failed shape refused in one line before anything is written, the projection's arithmetic, plan.json."""

from __future__ import annotations

import json

import pytest
import torch
from studies import ARMS, CONTROL, write_study

from experiments import cli
from sweeps.run import plan, preflight
from sweeps.spec.study import load_study
from training import config as run_config

SPACE = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}}


def tiny_study(tmp_path, tiny, name="pre"):
    return write_study(tmp_path, tiny, name, SPACE, arms=["arm"], control=CONTROL)


def test_trials_that_differ_only_in_seed_share_a_shape_and_the_control_reuses_the_arms(tmp_path, tiny_overrides):
    study = load_study(tiny_study(tmp_path, tiny_overrides))
    shapes = preflight.shapes_of(study)
    # full attention (the control's reference is the study's full arm), the control's k = 1, the study's Linformer
    assert len(shapes) == 3
    by_kind = {(s.cfg.model.attention.kind, s.cfg.model.attention.options.get("k")): s for s in shapes}
    assert sorted(by_kind) == [("full", None), ("linformer", 1), ("linformer", 8)]
    assert len(by_kind[("linformer", 8)].trials) == 2  # seeds 0 and 1
    assert len(by_kind[("linformer", 1)].trials) == 2  # the control's degraded arm at its seeds
    assert shapes[0].label.startswith("control degraded")  # the control runs first; its reference is the full arm
    assert "data.batch_size=8" in shapes[0].setting


def test_a_trials_projected_seconds_and_the_schedule_on_workers():
    m = {"setup_s": 2.0, "first_step_s": 5.0, "step_s": 0.5, "validation_s": 1.0}
    assert plan.trial_seconds(m, steps=11, n_validations=3) == 2 + 5 + 10 * 0.5 + 3
    # three trials of 10 s on 2 workers that start after 4 s: 4 + 10 + 10
    assert plan.schedule([10, 10, 10], 2, 4.0) == 24.0
    assert plan.schedule([30, 10, 10, 10], 2, 0.0) == 30.0


def measured_shapes(study):
    """The study's trial shapes, each with the same made-up preflight measurement but its peak memory (100 MB more
    than the shape before it)."""
    shapes = preflight.shapes_of(study)
    for i, s in enumerate(shapes):
        s.measured = {"setup_s": 1.0, "first_step_s": 2.0, "step_s": 1.0, "validation_s": 0.5, "start_s": 3.0,
                      "memory": "rss", "peak_mb": 100.0 * (i + 1), "total_mb": 1000.0}  # fmt: skip
    return shapes


def test_the_plan_states_each_arms_tokens_per_second_against_full_attention_at_its_n(tmp_path, tiny_overrides):
    arms = {"arm": {"type": "categorical", "choices": {
        "full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}}}  # fmt: skip
    space = {"seed": {"type": "categorical", "choices": [0]}, **arms}
    study = load_study(write_study(tmp_path, tiny_overrides, "speed", space))
    shapes = measured_shapes(study)
    seconds = {"full": 2.0, "linformer": 0.5}
    for shape in shapes:
        shape.measured["step_s"] = seconds.get(str(shape.cfg.model.attention.kind), 1.0)
    projected = plan.project(study, shapes, workers=1, threads=1, gpus=0)
    linformer = [a for a in projected["against_full"] if "linformer" in a["setting"]]
    assert linformer and all(a["ratio"] == pytest.approx(4.0) for a in linformer)  # 4x full attention's tokens/s
    assert all("kind=full" not in a["setting"] for a in projected["against_full"])
    (line,) = [line for line in plan.lines(projected) if line.startswith("plan: tokens/s against full attention")]
    assert "linformer at n = 32: 4.00×" in line and "full at n" not in line


def test_the_plan_reads_a_ratio_near_one_as_noise_and_names_a_kind_that_scores_every_key(tmp_path, tiny_overrides):
    arms = {"arm": {"type": "categorical", "choices": {
        "full": {"model.attention.kind": "full"},
        "close": {"model.attention.kind": "linformer"},
        "keys": {"model.attention.kind": "linformer", "model.attention.options.compress": "keys"}}}}  # fmt: skip
    space = {"seed": {"type": "categorical", "choices": [0]}, **arms}
    study = load_study(write_study(tmp_path, tiny_overrides, "near", space))
    shapes = measured_shapes(study)
    for shape in shapes:
        options = shape.cfg.model.attention.get("options") or {}
        one_sided = options.get("compress", "both") != "both"
        kind = str(shape.cfg.model.attention.kind)
        shape.measured["step_s"] = 1.0 if kind == "full" else (2.0 if one_sided else 1.1)
    projected = plan.project(study, shapes, workers=1, threads=1, gpus=0)
    by_arm = {a["arm"].split(": ")[-1]: a for a in projected["against_full"]}
    assert by_arm["close"]["reading"] == "within noise" and not by_arm["close"]["quadratic"]
    assert by_arm["keys"]["reading"] == "slower" and by_arm["keys"]["quadratic"]
    (line,) = [line for line in plan.lines(projected) if line.startswith("plan: tokens/s against full attention")]
    assert "close at n = 32: 0.91× (within ±15% of 1" in line and "keys at n = 32: 0.50× (scores all n keys" in line
    # beyond the band a ratio is read as it is, with no note
    assert plan._reading(1.0 + plan.SAME_SPEED + 0.01) == "faster" and plan._reading(0.8) == "slower"


def test_a_length_curriculum_is_timed_at_both_lengths_and_projected_phase_by_phase(tiny):
    cfg = run_config.load(
        tiny.config, tiny.args + ["model.attention.kind=full", "optim.short_steps=3", "optim.short_lengths=[8]"]
    )
    measured = preflight.measure(cfg, steps=6, threads=1)
    assert measured["short_steps"] == 3 and measured["short_step_s"] > 0 and measured["step_s"] > 0
    times = {"setup_s": 1.0, "first_step_s": 2.0, "validation_s": 0.5, "checkpoint_s": 0.0}
    one_phase = plan.trial_seconds({**times, "step_s": 1.0}, steps=10, n_validations=2)
    two_phases = plan.trial_seconds({**times, "step_s": 1.0, "short_step_s": 0.25, "short_steps": 4}, 10, 2)
    assert one_phase == 1 + 2 + 9 * 1.0 + 2 * 0.5
    assert two_phases == 1 + 2 + 3 * 0.25 + 6 * 1.0 + 2 * 0.5  # the first (compiling) step is a short one


def test_the_plan_projects_the_trials_left_and_names_the_largest_arm(tmp_path, tiny_overrides):
    study = load_study(tiny_study(tmp_path, tiny_overrides))
    shapes = measured_shapes(study)
    one = 1 + 2 + 5 * 1 + 2 * 0.5  # 6 steps, 2 validations (tiny: every 3 steps)
    projected = plan.project(study, shapes, workers=1, threads=1, gpus=0)
    n = sum(len(s.trials) for s in shapes)
    assert projected["trials"] == n and projected["wall_s"] == pytest.approx(3 + n * one)
    assert projected["largest_peak_mb"] == 300.0 and projected["largest_peak_arm"].startswith(shapes[2].label)
    assert projected["cpu_hours"] == pytest.approx(projected["wall_s"] / 3600)
    # gated: the control's trials to the last, then the workers start again for the arms
    gated = plan.project(study, shapes, workers=2, threads=1, gpus=0, gated=True)
    control = sum(len(t) for t in [s.trials for s in shapes] if t and t[0][0].endswith("_control"))
    arms = n - control
    assert gated["wall_s"] == pytest.approx(3 + -(-control // 2) * one + 3 + -(-arms // 2) * one)
    # the same on one GPU shared by two workers: each trial's device time counts twice
    shared = plan.project(study, shapes, workers=2, threads=1, gpus=1)
    assert shared["device_hours"] == pytest.approx(shared["wall_s"] / 3600)
    assert shared["wall_s"] > projected["wall_s"] / 2


def test_seeds_added_after_the_preflight_are_projected_in_the_shapes_it_measured(tmp_path, tiny_overrides):
    study = load_study(tiny_study(tmp_path, tiny_overrides))
    shapes = measured_shapes(study)
    grown = study.with_seeds([2, 3])
    # every trial of the file's seeds finished: what is left is the two new seeds of every arm and control point
    left = {(n, repr(sorted(p.items()))) for s in preflight.shapes_of(grown) for n, p, _, _ in s.trials}
    left = {key: () for key in left if "('seed', 2)" in key[1] or "('seed', 3)" in key[1]}
    assert plan.project(grown, shapes, workers=1, threads=1, gpus=0, left=left)["trials"] == 0  # the file's shapes
    regrouped = preflight.with_trials_of(shapes, grown)
    assert [s.key for s in regrouped] == [s.key for s in shapes]  # the measurements kept, no shape added
    assert [s.measured for s in regrouped] == [s.measured for s in shapes]
    assert plan.project(grown, regrouped, workers=1, threads=1, gpus=0, left=left)["trials"] == len(left) > 0
    assert sum(len(s.trials) for s in regrouped) == 2 * sum(len(s.trials) for s in shapes)


def test_a_shape_measured_in_this_process_trains_and_writes_nothing(tmp_path, tiny_overrides):
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args)
    measured = preflight.measure(cfg, steps=5, threads=1)
    assert measured["step_s"] > 0 and measured["first_step_s"] > 0 and measured["validation_s"] > 0
    assert measured["memory"] == "rss" and 0 <= measured["peak_mb"] < measured["total_mb"]
    assert not (tmp_path / "runs").exists()


def _failure(tmp_path, tiny_overrides, monkeypatch, *overrides) -> str:
    study = load_study(tiny_study(tmp_path, tiny_overrides))
    shape = preflight.shapes_of(study)[0]
    shape.cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, *overrides])
    try:
        preflight.measure(shape.cfg, steps=4, threads=1)
    except Exception as err:  # what the child process catches
        return preflight.failure_line(shape, err)
    raise AssertionError("the simulated failure did not happen")


def test_a_compile_failure_is_one_line_naming_the_arm_and_trainer_compile(tmp_path, tiny_overrides, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated: the compiler cannot build this graph")

    monkeypatch.setattr(torch, "compile", broken)
    line = _failure(tmp_path, tiny_overrides, monkeypatch, "trainer.compile=true")
    assert line.startswith("preflight: control degraded") and "trainer.compile=True" in line
    assert "set trainer.compile=false" in line and "\n" not in line


def test_out_of_memory_is_one_line_with_a_smaller_batch_as_the_way_out(tmp_path, tiny_overrides, monkeypatch):
    from lightning_modules.encoder import TransformerEncoder

    def oom(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")

    monkeypatch.setattr(TransformerEncoder, "forward", oom)
    line = _failure(tmp_path, tiny_overrides, monkeypatch)
    assert "out of memory" in line and "a smaller data.batch_size (now 8)" in line and "\n" not in line


def test_a_cpu_allocation_that_fails_is_out_of_memory_at_this_shape_naming_the_arm(
    tmp_path, tiny_overrides, monkeypatch
):
    from lightning_modules.encoder import TransformerEncoder

    def too_big(self, *args, **kwargs):  # torch's own CPU failure (a RuntimeError), as under an address-space limit
        return torch.empty(2**50, dtype=torch.uint8)

    monkeypatch.setattr(TransformerEncoder, "forward", too_big)
    line = _failure(tmp_path, tiny_overrides, monkeypatch)
    assert "DefaultCPUAllocator: can't allocate memory" in line and line.startswith("preflight: control degraded")
    assert "failed: out of memory at this shape" in line and "use a smaller data.batch_size (now 8)" in line
    assert "\n" not in line


def test_a_failed_shape_refuses_the_sweep_in_one_line_per_shape_before_anything_is_written(
    tmp_path, tiny_overrides, monkeypatch, capsys
):
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    path = tiny_study(tmp_path, tiny_overrides)

    def runner(shape, steps, threads, gpus):
        if shape.cfg.model.attention.kind == "linformer":
            shape.failure = f"preflight: {shape.label} [{shape.setting}] failed: simulated"
        else:
            shape.measured = {"setup_s": 0, "first_step_s": 0, "step_s": 0, "validation_s": 0}

    monkeypatch.setattr(preflight, "run_shape", runner)
    monkeypatch.setattr(preflight, "measured_line", lambda shape: "measured")
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    failed = [line for line in err if "failed: simulated" in line]
    assert len(failed) == 2  # the control's k = 1 and the study's Linformer, one line each
    assert all(line.startswith("error: preflight: ") for line in failed)
    assert not (tmp_path / "runs").exists()


@pytest.mark.processes  # a fresh process per shape
def test_sweep_preflight_prints_each_shape_and_the_cost_and_writes_nothing(tmp_path, tiny, monkeypatch, capsys):
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    path = write_study(tmp_path, tiny, "pre", {"seed": {"type": "categorical", "choices": [0, 1]}})
    assert cli.main(["sweep", str(path), "--preflight", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "s/step after warm-up" in out and "peak " in out and "plan: 2 trial(s)" in out
    assert "preflight OK: nothing written" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.processes  # the preflight's process and the sweep's worker
def test_a_sweep_writes_its_plan_and_ends_with_the_measured_against_the_projected_time(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    path = write_study(tmp_path, tiny, "planned", {"seed": {"type": "categorical", "choices": [0, 1]}})
    import subprocess
    import sys

    from tiny import child_env

    done = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "sweep", str(path)],
        env=child_env(LINFORMER_LAB_PREFLIGHT="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((load_study(path).root / plan.PLAN).read_text())
    assert written["trials"] == 2 and written["wall_s"] > 0 and written["shapes"][0]["step_s"] > 0
    lines = done.stdout.splitlines()
    assert any(line.startswith("plan: 2 trial(s)") for line in lines)
    assert any(line.startswith("plan: measured") and "× the projection" in line for line in lines)


def test_preflight_with_add_seeds_plans_the_added_seeds_and_writes_nothing(
    tmp_path, tiny_overrides, monkeypatch, capsys
):
    monkeypatch.setenv("LINFORMER_LAB_PREFLIGHT", "1")
    path = write_study(tmp_path, tiny_overrides, "grow", {"seed": {"type": "categorical", "choices": [0, 1]}})

    def runner(shape, steps, threads, gpus):
        shape.measured = {"setup_s": 1.0, "first_step_s": 2.0, "step_s": 1.0, "validation_s": 0.5, "start_s": 3.0,
                          "memory": "rss", "peak_mb": 100.0, "total_mb": 1000.0}  # fmt: skip

    monkeypatch.setattr(preflight, "run_shape", runner)
    monkeypatch.setattr(preflight, "measured_line", lambda shape: "measured")
    assert cli.main(["sweep", str(path), "--preflight", "--add-seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "plan: 4 trial(s)" in out and "preflight OK: nothing written" in out  # the 2 seeds of the file and 2 more
    assert not (tmp_path / "runs").exists()


def test_the_preflight_trains_on_until_two_blocks_of_steps_agree_and_states_their_noise():
    """Seconds per step are read in blocks after the warm-up: a block slowed by the machine's other load does not
    count alone; the shape trains on (up to its cap) until its last two blocks agree, and says how far apart they
    were."""
    timer = preflight.StepTimer(0.0, 10)  # blocks of 3 steps after 1 + 2 warm-up steps, at most 4 blocks more
    gaps = [1.0, 0.1, 0.1] + [0.1] * 3 + [0.3] * 3 + [0.1] * 3 + [0.105] * 3  # busy in the second block
    now = 0.0
    for gap in gaps:
        now += gap
        timer.marks.append(now)
        if len(timer.marks) >= timer.steps and timer.agreed():
            break
    assert len(timer.marks) == 15  # 10 steps were not enough: blocks 0.1, 0.3, 0.1, then 0.105 agreed
    timer.first_batch = 0.0
    result = timer.result()
    assert result["step_s"] == pytest.approx(0.1025) and result["step_agreed"]
    assert result["step_noise"] == pytest.approx(0.005 / 0.1025)
    assert preflight._noise(result) == "(±2 %: two blocks agreed)"
    assert timer.cap == 10 + 4 * 3


def test_a_projection_off_by_more_than_a_quarter_says_which_shape_and_the_machines_load():
    shapes = [
        {"arm": "learned", "step_s": 0.2, "step_noise": 0.5, "load": 6.0},
        {"arm": "random", "step_s": 0.05, "step_noise": 0.02, "load": 6.0},
    ]
    projected = {"wall_s": 100.0, "shapes": shapes}
    took = [("learned", 40.0, 12.0), ("learned", 40.0, 13.0), ("random", 10.0, 11.0), ("random", 10.0, 10.0)]
    (line,) = plan.why_off(projected, 50.0, took)
    assert line.startswith("plan: off by more than 25%: learned's trials most (2 trial(s), 0.31× their projection")
    assert "0.2 s/step, measured to ±25 %" in line and "load average 6.0 at its preflight" in line
    assert plan.why_off(projected, 110.0, took) == []  # within a quarter: nothing to explain
