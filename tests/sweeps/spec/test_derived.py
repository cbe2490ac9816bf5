"""Derived studies (issues 55 and 56): a study re-asked at F times its steps on fresh seeds (``--budget F``), the seeds
of a study's family (the original, its replication, its larger budgets) disjoint wherever they enter, and every folder
the lab derives for a study checked against the file system's limits before anything is written."""

from __future__ import annotations

import os

import pytest
from studies import write_study

from experiments import cli
from foundation.errors import ConfigError
from foundation.paths import NAME_MAX
from lightning_modules.optim import lr_factor
from sweeps.run import command as sweep
from sweeps.run.storage import RunStorage
from sweeps.spec import budget, identity
from sweeps.spec.schema import ADDED_SEEDS, SWEEPS_DIR
from sweeps.spec.study import load_study, shipped_studies

ARMS = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3, "trainer.max_steps": 9}}
CONTROL = {"reference": {"optim.lr": 1e-3}, "degraded": {"optim.lr": 5e-3}}


def study_file(tmp_path, tiny_overrides, name="der", seeds=(0, 1, 2), arms=ARMS, more=(), **keys):
    return write_study(
        tmp_path,
        tiny_overrides,
        name,
        {"seed": {"type": "categorical", "choices": list(seeds)}, "arm": {"choices": arms}},
        overrides={"trainer.max_steps": 6, "optim.warmup_steps": 2, "trainer.val_check_interval": 3, **dict(more)},
        arms=["arm"],
        control=CONTROL,
        **keys,
    )


def long_named(tmp_path, tiny_overrides, length: int):
    """A study file (short file name) whose ``study:`` is ``length`` bytes."""
    path = study_file(tmp_path, tiny_overrides, name="long")
    path.write_text(path.read_text().replace("study: long\n", f"study: {'s' * length}\n", 1))
    return path


def one_line_refusal(capsys, argv, text):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and text in err, err
    return err


# --------------------------------------------------------------------------------------- --budget F
def test_a_budget_study_scales_every_step_count_and_stretches_the_schedule(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, pruner={"kind": "median", "n_warmup_steps": 2})
    original, larger = load_study(path), load_study(path, factor=4)
    assert larger.name == "der_x4" and larger.root == original.root.with_name("der_x4")
    assert larger.control.name == "der_x4_control" and larger.file_args.endswith("der.yaml --budget 4")
    for arm in ARMS:
        a, b = original.config({"seed": 0, "arm": arm}), larger.config({"seed": 400, "arm": arm})
        assert b.trainer.max_steps == 4 * a.trainer.max_steps  # arm b's own 9 steps too: 36
        assert b.optim.warmup_steps == 4 * a.optim.warmup_steps
        assert b.trainer.val_check_interval == 4 * a.trainer.val_check_interval
        a.trainer.max_steps = b.trainer.max_steps
        a.optim.warmup_steps, a.trainer.val_check_interval, a.seed = (
            b.optim.warmup_steps,
            b.trainer.val_check_interval,
            400,
        )
        assert a == b  # nothing else changes
    assert larger.spec.pruner.n_warmup_steps == 8
    # the learning rate at a fraction of training is the original's: the schedule stretched to the new end
    a, b = original.config({"seed": 0, "arm": "a"}), larger.config({"seed": 400, "arm": "a"})
    for schedule in ("linear", "cosine", "constant"):
        ones = [lr_factor(s, a.optim.warmup_steps, a.trainer.max_steps, schedule) for s in range(a.trainer.max_steps)]
        fours = [lr_factor(4 * s, b.optim.warmup_steps, b.trainer.max_steps, schedule) for s in range(6)]
        assert fours[a.optim.warmup_steps :] == ones[a.optim.warmup_steps :]  # after warm-up: equal at each fraction
        assert max(fours) == max(ones) == 1.0  # the same peak


def test_a_budget_study_runs_on_seeds_fresh_to_the_design_and_the_replication(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [100, 101, 102, 103]})
    replica, x4, x2 = load_study(path, replicate=True), load_study(path, factor=4), load_study(path, factor=2)
    assert replica.seeds == [100, 101, 102, 103]
    assert x4.seeds == [400, 401, 402, 403] and x4.control.seeds == [400, 401, 402]
    assert x2.seeds == [200, 201, 202, 203]
    # a replication block that reaches the budget's hundred pushes it above
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [400, 401]})
    assert load_study(path, factor=4).seeds == [500, 501]


def test_a_budget_study_asks_the_seed_counts_its_block_sets_from_the_x1_spread(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, replicate={"budget_seeds": 2, "budget_control_seeds": 5})
    x4, replica = load_study(path, factor=4), load_study(path, replicate=True)
    assert x4.seeds == [400, 401] and x4.control.seeds == [400, 401, 402, 403, 404]
    assert replica.seeds == [100, 101, 102] and replica.control.seeds == [100, 101, 102]  # the replication's own
    for key, bad in (("budget_seeds", 1), ("budget_control_seeds", 0)):
        path = study_file(tmp_path, tiny_overrides, replicate={key: bad})
        one_line_refusal(capsys, ["sweep", str(path), "--budget", "4", "--check"], f"replicate.{key}: ")


def test_the_identity_of_a_budget_study_holds_its_factor_and_seeds(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    held = identity.identity_of(load_study(path, factor=4))
    assert held["budget"] == 4.0 and held["replicate"]["seeds"] == [400, 401, 402]
    assert held["config"]["trainer.max_steps"] == 24
    assert identity.changed(held, load_study(path, factor=2))  # another budget is another study


@pytest.mark.parametrize(
    "factor, text",
    [
        ("1", "--budget 1: the same budget on fresh seeds is the replication; use --replicate"),
        ("0.5", "--budget: 0.5 is not in (1, 100]"),
        ("1000", "--budget: 1000 is not in (1, 100]"),
        ("nan", "--budget: a number of times the study's steps is required"),
        ("inf", "--budget: a number of times the study's steps is required"),
        ("2.345", "--budget: 2.345 has more than two decimals"),
    ],
)
def test_a_budget_that_is_not_a_larger_one_is_refused_in_one_line(tmp_path, tiny_overrides, capsys, factor, text):
    path = study_file(tmp_path, tiny_overrides)
    one_line_refusal(capsys, ["sweep", str(path), "--budget", factor, "--check"], text)
    assert not (tmp_path / "runs").exists()


def test_an_open_study_at_a_larger_budget_runs_at_one_fresh_seed_with_scaled_sampled_steps(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "open",
        {"optim.warmup_steps": {"type": "int", "low": 0, "high": 4}},
        sampler={"kind": "random"},
        budget={"n_trials": 2},
    )
    larger = load_study(path, factor=3)
    cfg = larger.config({"optim.warmup_steps": 2})
    assert cfg.optim.warmup_steps == 6 and cfg.seed == larger.replicate["seeds"][0] == 300


@pytest.mark.parametrize("name", [p.stem for p in shipped_studies()])
def test_every_shipped_cpu_study_validates_at_four_times_its_budget_writing_nothing(
    tmp_path, monkeypatch, capsys, name
):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", str(SWEEPS_DIR / f"{name}.yaml"), "--preset", "cpu", "--budget", "4", "--check"]) == 0
    assert f"study OK: {name}_cpu_x4" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------- a family's seeds
def test_seeds_added_to_the_original_skip_those_its_replication_holds(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [3, 4], "control_seeds": [3, 4]})
    replica = load_study(path, replicate=True)
    sweep.open_study(RunStorage(replica, None))  # the replication has run: it holds 3 and 4
    original = load_study(path)
    stores = {s.name: RunStorage(s, None) for s in original.studies}
    grown = sweep.with_added_seeds(original, stores, 2)
    assert grown.seeds == [0, 1, 2, 5, 6]
    assert sweep.open_study(stores[original.name]).user_attrs[ADDED_SEEDS] == [5, 6]


def test_seeds_added_to_a_replication_skip_every_seed_the_file_names_at_any_preset(tmp_path, tiny_overrides):
    path = study_file(
        tmp_path,
        tiny_overrides,
        replicate={"seeds": [40, 41], "control_seeds": [40, 41]},
        presets={"q": {"space": {"seed": {"choices": [0, 42]}}}},
    )
    replica = load_study(path, replicate=True)
    stores = {s.name: RunStorage(s, None) for s in replica.studies}
    assert sweep.with_added_seeds(replica, stores, 2).seeds == [40, 41, 43, 44]  # 42 is preset q's design seed


def test_a_replication_whose_block_takes_a_seed_the_original_added_is_refused_naming_both(
    tmp_path, tiny_overrides, capsys
):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [3, 4], "control_seeds": [3, 4]})
    sweep.open_study(RunStorage(load_study(path), None)).set_user_attr(ADDED_SEEDS, [3])
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    err = one_line_refusal(
        capsys, ["sweep", str(path), "--replicate"], "replicate.seeds: seed 3 of study der_replicate"
    )
    assert "is also a seed of study der:" in err and "replicate.seeds in" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before  # nothing written


def test_a_budget_study_refuses_seeds_another_derived_study_holds(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides)
    ostudy = sweep.open_study(RunStorage(load_study(path, replicate=True), None))
    ostudy.set_user_attr(ADDED_SEEDS, [400])  # a replication grown far: its seeds reach the ×4 study's
    one_line_refusal(
        capsys, ["sweep", str(path), "--budget", "4", "--check"], "--budget 4 (seeds): seed 400 of study der_x4"
    )
    assert not (tmp_path / "runs" / "der_x4").exists()


def test_a_derived_study_refuses_an_original_whose_file_changed_at_sweep_time(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides)
    sweep.open_study(RunStorage(load_study(path), None))  # the original ran with lr 1e-3 in arm a
    study_file(tmp_path, tiny_overrides, arms={**ARMS, "a": {"optim.lr": 4e-3}})
    for flags in (["--replicate"], ["--budget", "4"]):
        err = one_line_refusal(capsys, ["sweep", str(path), *flags], "study der in ")
        assert "ran with another identity" in err and f"`linformer-lab sweep {path} --new-study`" in err
    assert not (tmp_path / "runs" / "der_replicate").exists() and not (tmp_path / "runs" / "der_x4").exists()


def test_a_replication_seed_out_of_range_names_the_replicate_key(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [100, 2**40]})
    err = one_line_refusal(capsys, ["sweep", str(path), "--replicate", "--check"], "replicate.seeds: ")
    assert " seed: " not in err


def test_a_report_of_a_missing_original_or_replication_names_the_command_with_its_flags(
    tmp_path, tiny_overrides, capsys
):
    path = study_file(tmp_path, tiny_overrides, name="miss")
    one_line_refusal(capsys, ["report", str(path)], f"run `linformer-lab sweep {path}` first")
    one_line_refusal(
        capsys, ["report", str(path), "--replicate"], f"run `linformer-lab sweep {path} --replicate` first"
    )
    one_line_refusal(
        capsys, ["report", str(path), "--budget", "4"], f"run `linformer-lab sweep {path} --budget 4` first"
    )


# --------------------------------------------------------------------------------------- folder names
@pytest.mark.parametrize(
    "length, flags",
    [
        (NAME_MAX - len("_replicate") + 1, ["--replicate"]),
        (NAME_MAX - len("_x4") + 1, ["--budget", "4"]),
        (NAME_MAX - len(".YYYYmmdd-HHMMSS") + 1, []),
    ],
)
def test_a_study_name_whose_derived_folder_overflows_is_refused_before_anything_is_written(
    tmp_path, tiny_overrides, capsys, length, flags
):
    path = long_named(tmp_path, tiny_overrides, length)
    one_line_refusal(capsys, ["sweep", str(path), *flags], "study: the folder name 'ssss")
    assert not (tmp_path / "runs").exists()


def test_an_output_dir_whose_trial_paths_overflow_path_max_is_refused_naming_it(tmp_path, tiny_overrides, capsys):
    # output_dir at 3,900 bytes whatever tmp_path's length: the study's folder fits, its trials' files do not
    room = 3900 - len(os.fsencode(str(tmp_path))) - 1
    n, last = divmod(room, 200) if room % 200 else (room // 200 - 1, 200)
    deep = ("d" * 199 + "/") * n + "d" * last
    path = study_file(tmp_path, tiny_overrides, more={"output_dir": str(tmp_path / deep)})
    assert len(os.fsencode(str(tmp_path / deep))) == 3900
    one_line_refusal(capsys, ["sweep", str(path)], "output_dir: the runs of study der would lie at")
    assert not (tmp_path / ("d" * 200)).exists()


def test_the_folders_of_a_study_name_within_the_limits_pass(tmp_path, tiny_overrides):
    path = long_named(tmp_path, tiny_overrides, NAME_MAX - len(".YYYYmmdd-HHMMSS") - len("_x4"))
    assert load_study(path, factor=4).name.endswith("_x4")


def test_the_budget_module_scales_only_step_keys():
    layer = {"trainer.max_steps": 600, "optim.lr": 1e-3, "trainer": {"val_check_interval": 60}, "optim.warmup_steps": 0}
    assert budget.scale_layer(layer, 2.5) == {
        "trainer.max_steps": 1500,
        "optim.lr": 1e-3,
        "trainer": {"val_check_interval": 150},
        "optim.warmup_steps": 0,
    }
    with pytest.raises(ConfigError):
        budget.check_factor(True)
