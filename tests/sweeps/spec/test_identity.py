"""A study's identity (sweeps/spec/identity.py) holds every config key that decides a trial, its steps included, and
leaves out only keys that never change a trial's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from studies import write_study

from experiments import cli
from foundation.configfile import flatten, to_container
from foundation.errors import ConfigError
from sweeps.run.command import check_stored, open_study
from sweeps.run.storage import RunStorage
from sweeps.spec import identity
from sweeps.spec.study import load_study
from training import config as run_config

SEEDS = {"seed": {"type": "categorical", "choices": [0, 1]}}


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


# The tiny study's trials run 6 steps, validate every 3 on 2 batches: each of these changes what a trial computes.
DECIDING = {"trainer.max_steps": (6, 8), "trainer.val_check_interval": (3, 2), "trainer.limit_val_batches": (2, 1)}


@pytest.mark.parametrize("key", DECIDING)
def test_a_study_whose_steps_or_validation_changed_is_refused_by_sweep_and_report(
    tmp_path, tiny_overrides, capsys, key
):
    """Trials of 6 and 8 steps (or validated otherwise) would be pooled in one arm: the study file changed since the
    study started is one line naming the key and both values, exit 2, nothing written."""
    there, here = DECIDING[key]
    path = write_study(tmp_path, tiny_overrides, "steps", SEEDS)
    open_study(RunStorage(load_study(path), None))
    write_study(tmp_path, tiny_overrides, "steps", SEEDS, overrides={key: here})
    before = snapshot(tmp_path)
    capsys.readouterr()
    for command in ("sweep", "report"):
        assert cli.main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and f"another identity: config.{key}: {there} there, {here} here" in err
    assert snapshot(tmp_path) == before


def test_a_study_stored_before_its_identity_held_its_steps_is_still_compared_on_everything_else(
    tmp_path, tiny_overrides
):
    """A study an earlier version stored, whose identity lacks ``trainer.max_steps`` (and ``trainer.compile``, a key
    since), is not refused for it (its steps are unknown there), but is for any other change."""
    path = write_study(tmp_path, tiny_overrides, "earlier", SEEDS)
    ostudy = open_study(RunStorage(load_study(path), None))
    recorded = ostudy.user_attrs[identity.IDENTITY]
    later = ("trainer.max_steps", "trainer.compile")
    assert set(later) <= set(recorded["config"])
    earlier = {**recorded, "config": {k: v for k, v in recorded["config"].items() if k not in later}}
    ostudy.set_user_attr(identity.IDENTITY, earlier)
    write_study(tmp_path, tiny_overrides, "earlier", SEEDS, overrides={"trainer.max_steps": 8})
    check_stored(load_study(path), None)
    write_study(tmp_path, tiny_overrides, "earlier", SEEDS, overrides={"trainer.max_steps": 8, "optim.lr": 0.002})
    with pytest.raises(ConfigError, match=r"another identity: config\.optim\.lr: 0\.001 there, 0\.002 here"):
        check_stored(load_study(path), None)


def test_a_study_stored_before_a_neutral_key_existed_resumes_and_refuses_a_new_value_of_it(tmp_path, tiny_overrides):
    """``optim.projection_lr_scale`` came after studies were stored: their identity lacks it, and it reads there as
    1.0, what they ran. The unchanged study resumes; one that sets E/F's rate to 0.1 is another question."""
    path = write_study(tmp_path, tiny_overrides, "neutral", SEEDS)
    ostudy = open_study(RunStorage(load_study(path), None))
    recorded = ostudy.user_attrs[identity.IDENTITY]
    assert recorded["config"]["optim.projection_lr_scale"] == 1.0
    earlier = {**recorded, "config": {k: v for k, v in recorded["config"].items() if k != "optim.projection_lr_scale"}}
    ostudy.set_user_attr(identity.IDENTITY, earlier)
    check_stored(load_study(path), None)
    write_study(tmp_path, tiny_overrides, "neutral", SEEDS, overrides={"optim.projection_lr_scale": 0.1})
    with pytest.raises(ConfigError, match=r"config\.optim\.projection_lr_scale: 1\.0 there, 0\.1 here"):
        check_stored(load_study(path), None)


def measured(key: str) -> bool:
    """A metric the machine measures about a run rather than one it computes: seconds, memory, speed, its folder, and
    its identity (drawn once per run, never from the seed)."""
    return key.endswith(("_s", "_mb", "_per_sec")) or key in ("ppl_vs_wallclock", "run_dir", "run_id")


def _trained(tiny, *args: str) -> tuple[dict, dict]:
    """(flat config, metrics.json) of a tiny run of 2 steps validated after each, trained with ``args``."""
    fixed = ["trainer.max_steps=2", "trainer.val_check_interval=1", "trainer.limit_val_batches=1"]
    fixed += ["trainer.deterministic=true", "model.dropout=0.1"]  # dropout: later draws would show an earlier one
    settings = [*tiny.args, *fixed, *args]
    assert cli.main(["train", str(tiny.config), *settings]) == 0
    cfg = run_config.load(tiny.config, settings)
    metrics = json.loads((Path(cfg.run_dir) / "metrics.json").read_text())
    return flatten(to_container(cfg)), metrics


def _computed(metrics: dict) -> dict:
    """What a run computed, one entry per number: its metrics but the measured ones, its validation curve without
    the seconds."""
    leaves: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, (dict, list)):
            for key, item in value.items() if isinstance(value, dict) else enumerate(value):
                walk(f"{prefix}.{key}", item)
        else:
            leaves[prefix] = value

    walk("metrics", {k: v for k, v in metrics.items() if not measured(k)})
    walk("curve", [c[1:] for c in metrics["ppl_vs_wallclock"]])
    return leaves


def test_the_keys_a_studys_identity_leaves_out_never_change_a_trials_numbers(tiny, tmp_path):
    """A run trained with every key of ``NOT_IDENTITY`` changed (where it writes, its loader processes, how often
    it logs and measures the spectrum) scores, validates and counts to the last bit as the run without; its threads
    changed too, to the rounding of a sum split otherwise among them (as ``sweep --workers``, which sets them, does):
    a study run again with them changed is the same study."""
    config, metrics = _trained(tiny, f"run_dir={tmp_path / 'a'}", "trainer.cpu_threads=1")
    changed = [
        "experiment=elsewhere",
        f"run_dir={tmp_path / 'b'}",
        f"output_dir={tmp_path / 'other_runs'}",
        f"data.cache_dir={tmp_path / 'other_cache'}",
        "data.num_workers=2",
        "trainer.log_every_n_steps=2",
        "trainer.spectrum_every_n_val=1",
    ]
    _, metrics_b = _trained(tiny, *changed, "trainer.cpu_threads=1")
    assert _computed(metrics_b) == _computed(metrics)
    config_c, metrics_c = _trained(
        tiny, *changed[:1], f"run_dir={tmp_path / 'c'}", *changed[2:], "trainer.cpu_threads=2"
    )
    first, threaded = _computed(metrics), _computed(metrics_c)
    numbers = {k: v for k, v in first.items() if isinstance(v, float)}
    assert {k: v for k, v in threaded.items() if k not in numbers} == {
        k: v for k, v in first.items() if k not in numbers
    }
    assert {k: threaded[k] for k in numbers} == pytest.approx(numbers, rel=1e-6)
    differ = {k for k in set(config) | set(config_c) if config.get(k) != config_c.get(k)}
    assert differ == set(identity.NOT_IDENTITY) - {"resume"}  # every key left out is tried here (resume: a new run)
