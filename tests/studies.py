"""Study files over the tiny run config and the trials a study's storage holds: what the tests of sweeps/
share (``write_study`` takes the settings of the ``tiny`` or ``tiny_overrides`` fixture)."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from sweeps import stored
from sweeps.spec.study import load_study

ARMS = {"full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}
# A control whose degraded arm squeezes the sequence into one slot: full attention is known to beat it.
CONTROL = {
    "reference": {"model.attention.kind": "full"},
    "degraded": {"model.attention.kind": "linformer", "model.attention.options.k": 1},
}


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


# --------------------------------------------------------------------------------------- the ladder field
RUNGS = {
    "s1": {"model.n_layers": 1, "model.d_model": 16, "model.d_ff": 32, "model.attention.options.k": 4},
    "s2": {"model.n_layers": 2, "model.d_model": 24, "model.d_ff": 48, "model.attention.options.k": 6},
    "s3": {"model.n_layers": 2, "model.d_model": 32, "model.d_ff": 64, "model.attention.options.k": 8},
}

LADDER_ARMS = {"full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}


def ladder_study(tmp_path: Path, tiny, name: str = "ladder", **changes) -> Path:
    """A 3-rung ladder (s1 < s2 < s3) × {full, linformer} × seeds 0, 1 over the tiny run config; ``changes``
    replace top-level keys of the study file."""
    base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny.args)}
    study = {
        "study": name,
        "base": str(tiny.config),
        "overrides": base,
        "space": {"seed": {"choices": [0, 1]}, "rung": {"choices": RUNGS}, "arm": {"choices": LADDER_ARMS}},
        "arms": ["rung", "arm"],
        "ladder": {"rung": "rung", "reference": {"arm": "full"}},
        **changes,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path
