"""A study file, loaded (sweeps/spec/study.py): every shipped study at every preset, presets by name, trial configs
checked once at the load, and a study grown by seeds."""

from __future__ import annotations

import optuna
import pytest
import yaml
from studies import ARMS, write_study
from tiny import REPO

from experiments import cli
from sweeps.spec.study import load_study, shipped_studies


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


def test_a_missing_preset_names_the_ones_there_are(capsys):
    assert cli.main(["sweep", str(REPO / "sweeps" / "sharing.yaml"), "--preset", "tpu"]) == 2
    assert (
        "--preset tpu: no such preset (has: cpu, cpu_mqar, gpu, cpu_long, cpu_long_window)" in capsys.readouterr().err
    )


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
