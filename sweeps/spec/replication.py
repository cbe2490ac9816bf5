"""A study replicated on fresh seeds (``linformer-lab sweep STUDY --preset P --replicate``).

A verdict decided on the seeds a design was tuned on (its recipe, its δ, its seed count chosen after seeing them) may
be a property of those seeds. The standard remedy is a replication: the same arms, the same code and budget, on fresh
seeds fixed before it runs. ``--replicate`` runs the study's grid and its control again on the seeds of the study
file's ``replicate:`` block, as a study of its own, ``<study>_<preset>_replicate``, stored beside the original
(``<output_dir>/<study>_<preset>_replicate/``), so that its trials never mix with the design's; its report
(:mod:`sweeps.report.replication`) sets each verdict of the original beside the fresh seeds' own.

Fresh means disjoint from every seed the design saw: the ``seed`` choices and control seeds of the file and of every
preset of it, and the seeds ``--add-seeds`` stored on the original (checked by the ``sweep`` command, which reads
them). Without a ``replicate:`` block (or with ``seeds: null``) the fresh seeds are as many as the design's, counted
from the first multiple of 100 above every seed of the file: a design on seeds 0–4 with its control at 0–2 replicates
on 100–104, the control on 100–102. ``control_seeds`` may ask for more than the design had, where the reference's
exit from the no-context level depends on the seed.

**Derived studies.** A replication is one kind of *derived study*: the original's arms and control asked again on
fresh seeds, as a study of its own beside it. The other is a study at F times the budget (``--budget F``,
:mod:`sweeps.spec.budget`): fresh seeds and every step count scaled. Its fresh seeds are as many as the
replication's (its ``replicate:`` block's counts, else the design's), from the first multiple of 100 at or above F ×
the replication's default start and above every seed of the replication: a design on seeds 0–4 replicates on
100–104 and is re-asked at ×4 on 400–404. Derived studies of one original form its *family*; a seed is held by one
member only. That is checked wherever seeds enter a member (:func:`check_family`: a derived study's fresh seeds, the
original's file, ``--add-seeds`` on any member, which takes the next numbers no member holds) against the seeds
every other member's storage holds, and again by the report of a derived study, from the seeds both journals hold.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Optional

from omegaconf import DictConfig

from foundation.errors import ConfigError
from sweeps.spec import budget
from sweeps.spec.controls import control_seeds
from sweeps.spec.grids import integer_seeds
from sweeps.spec.schema import REPLICATE_SUFFIX, SEED_PARAM
from training.config import check_seed

CURVE_SUFFIX = "_curve"  # a budget-curve study's name suffix (sweeps.spec.budgets, which imports this module's)
FRESH_STEP = 100  # the default fresh seeds start at the first multiple of this above every seed of the design


def file_seeds(raw: dict) -> set[int]:
    """Every integer seed a study file names, in its space and control and in those of each of its presets."""
    layers = [raw] + [p for p in (raw.get("presets") or {}).values() if isinstance(p, dict)]
    seen: set[int] = set()
    for layer in layers:
        seed = ((layer.get("space") or {}).get(SEED_PARAM) or {}) if isinstance(layer.get("space"), dict) else {}
        control = layer.get("control") if isinstance(layer.get("control"), dict) else {}
        for values in ((seed or {}).get("choices") if isinstance(seed, dict) else None, control.get("seeds")):
            if isinstance(values, list):
                seen |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return seen


def _listed(key: str, seeds: Any) -> list[int]:
    """``replicate.<key>``: a list of at least 2 distinct valid seeds."""
    if not isinstance(seeds, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"replicate.{key}: a list of integer seeds is required, got {seeds!r}")
    if len(set(seeds)) != len(seeds) or len(seeds) < 2:
        raise ConfigError(f"replicate.{key}: at least 2 distinct seeds are needed for a spread, got {list(seeds)}")
    for s in seeds:
        try:
            check_seed(s)
        except ConfigError as err:  # named by the key at fault, not the run config's `seed`
            raise ConfigError(f"replicate.{key}: {str(err).removeprefix('seed: ')}") from None
    return list(seeds)


def fresh_seeds(spec: DictConfig, seen: Iterable[int], names: tuple[str, str] = ()) -> dict[str, Optional[list[int]]]:
    """The replication's seeds of a study at one preset (``spec``, file < preset merged): ``{"seeds": [...],
    "control_seeds": [...] or None}``, from its ``replicate:`` block or the default rule, each checked disjoint from
    ``seen`` (every seed the design saw; ``names``: the original's and the replication's, for the error line).
    Raises :class:`ConfigError` where the study cannot be replicated."""
    seed_param = spec.space.get(SEED_PARAM)
    if spec.sampler.kind != "grid" or not integer_seeds(seed_param):
        raise ConfigError(
            "replicate: a replication reruns a grid's arms on fresh seeds; this study is not a grid whose "
            f"'{SEED_PARAM}' param lists integer seeds"
        )
    seen = _design(spec, seen)
    design_control = control_seeds(spec, ()) if spec.control is not None else []
    start = _start(seen)
    block = spec.replicate
    seeds = _listed("seeds", list(block.seeds)) if block.seeds is not None else None
    seeds = seeds or list(range(start, start + len(seed_param.choices)))
    if block.control_seeds is not None and spec.control is None:
        raise ConfigError("replicate.control_seeds: the study has no control")
    controls = _listed("control_seeds", list(block.control_seeds)) if block.control_seeds is not None else None
    if spec.control is not None and controls is None:
        controls = list(range(start, start + len(design_control)))
    for key, values in (("seeds", seeds), ("control_seeds", controls or [])):
        check_disjoint(f"replicate.{key}", values, seen, names)
    return {"seeds": seeds, "control_seeds": controls}


def _design(spec: DictConfig, seen: Iterable[int]) -> set[int]:
    """Every seed the design saw: ``seen`` (the file's, those --add-seeds stored), its ``seed`` choices, its
    control's."""
    out = set(seen) | set(spec.space[SEED_PARAM].choices)
    return out | (set(control_seeds(spec, ())) if spec.control is not None else set())


def _start(seeds: Iterable[int]) -> int:
    """The first multiple of :data:`FRESH_STEP` above every one of ``seeds``."""
    return FRESH_STEP * (max(seeds, default=-1) // FRESH_STEP + 1)


def check_disjoint(key: str, fresh: Iterable[int], seen: Iterable[int], names: tuple[str, str] = ()) -> None:
    """A derived study's seeds share none with the design's: one line naming the first seed shared and both studies
    (``names``: the original's and the derived study's, else described)."""
    shared = sorted(set(fresh) & set(seen))
    if shared:
        original, derived = names or ("the original", "the replication")
        more = f" (and {len(shared) - 1} more: {', '.join(map(str, shared[1:4]))})" if len(shared) > 1 else ""
        raise ConfigError(
            f"{key}: seed {shared[0]}{more} of study {derived} was seen by study {original} (its seeds at any "
            "preset, its control's or those --add-seeds stored); a derived study runs on fresh seeds only: give "
            f"{key} seeds the design never used"
        )


def budget_seeds(
    spec: DictConfig, seen: Iterable[int], factor: float, names: tuple[str, str] = ()
) -> dict[str, Optional[list[int]]]:
    """The fresh seeds of the study at ``factor`` × the budget (see the module docstring): as many as the
    replication's (:func:`fresh_seeds`, which checks the file's ``replicate:`` block), from the first multiple of 100
    at or above ``factor`` × the replication's default start and above each of its seeds. An open study (no grid
    of seeds) gets one fresh run seed for all its trials, and its control fresh seeds."""
    controls = control_seeds(spec, ()) if spec.control is not None else None
    if spec.sampler.kind == "grid" and integer_seeds(spec.space.get(SEED_PARAM)):
        design = _design(spec, seen)
        replica = fresh_seeds(spec, seen, names and (names[0], names[0] + REPLICATE_SUFFIX))
        counts = (
            _count("budget_seeds", spec.replicate.budget_seeds, len(replica["seeds"])),
            _count("budget_control_seeds", spec.replicate.budget_control_seeds, len(replica["control_seeds"]))
            if controls is not None
            else None,
        )
        taken = design | set(replica["seeds"]) | set(replica["control_seeds"] or [])
    else:
        run_seed = spec.overrides.get(SEED_PARAM, 0)  # the trials' own (a base's below 100, as every shipped one)
        design = taken = set(seen) | set(controls or []) | ({run_seed} if isinstance(run_seed, int) else set())
        counts = 1, len(controls) if controls is not None else None
    start = max(FRESH_STEP * math.ceil(factor * _start(design) / FRESH_STEP), _start(taken))
    out = {
        "seeds": list(range(start, start + counts[0])),
        "control_seeds": list(range(start, start + counts[1])) if counts[1] is not None else None,
    }
    for key, values in out.items():
        for s in values or []:
            try:
                check_seed(s)
            except ConfigError as err:
                raise ConfigError(f"--budget {factor:g}: {key}: {str(err).removeprefix('seed: ')}") from None
    return out


def _count(key: str, count: Any, default: int) -> int:
    """``replicate.<key>``: the number of fresh seeds at a larger budget (at least 2, for a spread), else
    ``default``."""
    if count is None:
        return default
    if isinstance(count, bool) or not isinstance(count, int) or count < 2:
        raise ConfigError(f"replicate.{key}: a number of seeds of at least 2 is required (a spread), got {count!r}")
    return count


def suffix(factor: Optional[float]) -> str:
    """The name suffix of a derived study: ``_replicate`` (``factor`` None), ``_x<F>`` (``--budget F``)."""
    return REPLICATE_SUFFIX if factor is None else budget.suffix(factor)


def is_derived_name(original: str, name: str) -> bool:
    """Whether study ``name`` is a derived study of the study named ``original`` (its replication, ``_x<F>``, its
    budget curves)."""
    return (
        name in (original + REPLICATE_SUFFIX, original + CURVE_SUFFIX)
        or re.fullmatch(re.escape(original + budget.SUFFIX) + r"[0-9]+(\.[0-9]{1,2})?", name) is not None
    )


def check_family(key: str, name: str, seeds: Iterable[int], family: Mapping[str, Iterable[int]], fix: str) -> None:
    """``seeds`` entering study ``name`` share none with those each other member of its family holds
    (``family``: study name -> its seeds): else one line naming the key at fault, the first seed shared, both
    studies, and ``fix``, the command that fixes it."""
    mine = set(seeds)
    for other, theirs in sorted(family.items()):
        if other == name:
            continue
        shared = sorted(mine & set(theirs))
        if shared:
            more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
            raise ConfigError(
                f"{key}: seed {shared[0]}{more} of study {name} is also a seed of study {other}: a derived study "
                f"(a replication, a larger budget) runs on seeds no other study of its family holds; {fix}"
            )


def next_unused(start: int, count: int, taken: Iterable[int]) -> list[int]:
    """The ``count`` seeds from ``start`` on that are not in ``taken`` (``--add-seeds``: numbers no study of the
    family holds)."""
    taken, out, seed = set(taken), [], start
    while len(out) < count:
        if seed not in taken:
            out.append(seed)
        seed += 1
    return out


def as_replicate(spec: DictConfig, fresh: dict[str, Optional[list[int]]]) -> None:
    """Turn ``spec`` into its replication's: the ``seed`` choices and the control's seeds replaced by the fresh
    ones (:func:`fresh_seeds`); an open study's trials all run at its one fresh seed (:func:`budget_seeds`)."""
    if integer_seeds(spec.space.get(SEED_PARAM)):
        spec.space[SEED_PARAM].choices = list(fresh["seeds"])
    else:
        spec.overrides[SEED_PARAM] = fresh["seeds"][0]
    if spec.control is not None:
        spec.control.seeds = list(fresh["control_seeds"])
