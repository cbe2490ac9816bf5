"""The control of a study (``control:`` in a study file; see :mod:`sweeps.spec.schema`): a companion grid study of
the reference arm against a degraded one, at every control seed."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from foundation.errors import ConfigError
from sweeps.spec.schema import CONTROL_PARAM, DEFAULT_CONTROL_SEEDS, SEED_PARAM, StudySpec


def control_seeds(spec: DictConfig, added_seeds: Sequence[int]) -> list[int]:
    """``control.seeds`` (with the added seeds), else the study's ``seed`` choices, else DEFAULT_CONTROL_SEEDS
    (with the added seeds); at least 2 distinct."""
    c, seed_param = spec.control, spec.space.get(SEED_PARAM)
    if c.seeds is not None:
        seeds = list(c.seeds) + [s for s in added_seeds if s not in c.seeds]
    elif seed_param is not None and seed_param.type == "categorical" and not isinstance(seed_param.choices, DictConfig):
        seeds = list(seed_param.choices)
    else:
        seeds = list(DEFAULT_CONTROL_SEEDS) + [s for s in added_seeds if s not in DEFAULT_CONTROL_SEEDS]
    if len(set(seeds)) < 2:
        raise ConfigError(f"control.seeds: at least 2 distinct seeds are needed to measure a spread, got {seeds}")
    return seeds


def control_spec(spec: DictConfig, added_seeds: Sequence[int]) -> DictConfig:
    """The StudySpec of the control: param ``control`` ∈ {reference, degraded} × the control seeds, a grid."""
    c = spec.control
    for role in ("reference", "degraded"):
        if not c[role]:
            raise ConfigError(f"control.{role}: give the overrides of the {role} arm (e.g. model.attention.kind: full)")
    if c.reference == c.degraded:
        raise ConfigError("control: reference and degraded are the same overrides; a control contrasts two arms")
    return OmegaConf.merge(
        OmegaConf.structured(StudySpec),
        {
            "study": spec.study,
            "base": spec.base,
            "overrides": spec.overrides,
            "space": {
                CONTROL_PARAM: {"choices": {"reference": c.reference, "degraded": c.degraded}},
                SEED_PARAM: {"choices": control_seeds(spec, added_seeds)},
            },
            "objective": spec.objective,
            "sampler": {"kind": "grid"},
            "arms": [CONTROL_PARAM],
        },
    )
