"""Study files over the tiny run config and the trials a study's storage holds: what the tests of sweeps/
share (``write_study`` takes the settings of the ``tiny`` or ``tiny_overrides`` fixture)."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from sweeps import stored
from sweeps.spec.study import load_study

ARMS = {"full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}


def write_study(tmp_path: Path, tiny, name: str, space: dict, overrides: dict = (), **keys) -> Path:
    """A study file over the tiny run config (the ``tiny`` fixture's settings)."""
    base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny.args)}
    study = {
        "study": name,
        "base": str(tiny.config),
        "overrides": {**base, **dict(overrides)},
        "space": space,
        "sampler": {"kind": "grid"},
        **keys,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def trials_of(path: Path) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    try:
        return optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).get_trials()
    except KeyError:  # not created yet
        return []


def counted(trials):
    excluded = stored.excluded_numbers(trials)
    return [t for t in trials if t.number not in excluded]
