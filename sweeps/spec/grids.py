"""The grid of a study: every value of a space param, the product of a space, and the seeds ``--add-seeds``
adds to it.

A grid holds at most ``MAX_GRID_POINTS`` points: its size is the product of each param's value count, computed
before any list is built, so a space of 10⁹ points is one line at once instead of an hour of building a list."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from foundation.errors import ConfigError
from sweeps.spec.schema import SEED_PARAM, ParamSpec

MAX_GRID_POINTS = 10_000  # the largest shipped grid has 75; each point is a trained run


def value_count(name: str, p: ParamSpec) -> int:
    """How many values :func:`grid_values` gives ``p``, without building them."""
    if p.type == "categorical":
        return len(p.choices)
    if p.step is None:
        raise ConfigError(f"space.{name}: a grid needs finite values: give 'step' (or use type: categorical)")
    return int(round((p.high - p.low) / p.step)) + 1


def end_count(name: str, p: ParamSpec) -> int:
    """How many values :func:`range_end_values` gives ``p``."""
    return len(p.choices) if p.type == "categorical" else 2


def check_grid_size(space: DictConfig, count: Callable[[str, Any], int] = value_count) -> None:
    """At most ``MAX_GRID_POINTS`` points (the product of the value counts bounds the grid from above)."""
    size, counts = 1, []
    for name, p in space.items():
        counts.append(f"{name} {count(name, p)}")
        size *= max(1, count(name, p))
    if size > MAX_GRID_POINTS:
        raise ConfigError(
            f"space: up to {size:,} combinations of values ({' × '.join(counts)}), more than the "
            f"{MAX_GRID_POINTS:,} a study may hold; use fewer values (or a tpe or random sampler over ranges)"
        )


def grid_values(name: str, p: ParamSpec) -> list:
    """The values of one param on a grid: its choices, or its range in steps."""
    if p.type == "categorical":
        return list(p.choices)
    if p.step is None:
        raise ConfigError(f"space.{name}: a grid needs finite values: give 'step' (or use type: categorical)")
    n = int(round((p.high - p.low) / p.step))
    return [p.low + i * p.step if p.type == "int" else round(p.low + i * p.step, 12) for i in range(n + 1)]


def range_end_values(name: str, p: ParamSpec) -> list:
    """Like :func:`grid_values` with a range reduced to its two ends (what validation of an open space builds)."""
    return grid_values(name, p) if p.type == "categorical" else [p.low, p.high]


def product(
    space: DictConfig, values_of: Callable[[str, Any], list], active: Callable[[str, dict], bool]
) -> list[dict]:
    """Every distinct point of ``space``: the product of each param's ``values_of``, a param left out where it
    is not ``active`` at the point so far, duplicates removed, in order (later params vary fastest)."""
    check_grid_size(space, value_count if values_of is grid_values else end_count)
    points: list[dict] = [{}]
    for name, p in space.items():
        values = values_of(name, p)
        points = [
            new for pt in points for new in ([dict(pt, **{name: v}) for v in values] if active(name, pt) else [pt])
        ]
    unique = {tuple(sorted(pt.items())): pt for pt in points}
    return list(unique.values())


def integer_seeds(p: Any) -> bool:
    """Whether a space param lists integer seeds (what ``--add-seeds`` extends)."""
    return (
        p is not None
        and p.type == "categorical"
        and OmegaConf.is_list(p.choices)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in p.choices)
    )


def add_seeds(spec: DictConfig, added_seeds: Sequence[int]) -> None:
    """Extend the ``seed`` choices of a grid study by ``added_seeds`` (see :mod:`sweeps.spec.schema`)."""
    if spec.sampler.kind != "grid":
        raise ConfigError(
            f"--add-seeds: an open study (sampler.kind={spec.sampler.kind}) has no grid to add "
            "seeds to; add-seeds is for grid studies"
        )
    p = spec.space.get(SEED_PARAM)
    if p is None:
        raise ConfigError(f"--add-seeds: space has no {SEED_PARAM!r} param (the replicates to add to)")
    if not integer_seeds(p):
        raise ConfigError(
            f"--add-seeds: space.{SEED_PARAM}.choices must be a list of integer seeds, got "
            f"{OmegaConf.to_container(p.choices) if OmegaConf.is_config(p.choices) else p.choices!r}"
        )
    p.choices = list(p.choices) + [s for s in added_seeds if s not in p.choices]
