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
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from omegaconf import DictConfig

from foundation.errors import ConfigError
from sweeps.spec.controls import control_seeds
from sweeps.spec.grids import integer_seeds
from sweeps.spec.schema import SEED_PARAM
from training.config import check_seed

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
        check_seed(s)
    return list(seeds)


def fresh_seeds(spec: DictConfig, seen: Iterable[int]) -> dict[str, Optional[list[int]]]:
    """The replication's seeds of a study at one preset (``spec``, file < preset merged): ``{"seeds": [...],
    "control_seeds": [...] or None}``, from its ``replicate:`` block or the default rule, each checked disjoint from
    ``seen`` (every seed the design saw). Raises :class:`ConfigError` where the study cannot be replicated."""
    seed_param = spec.space.get(SEED_PARAM)
    if spec.sampler.kind != "grid" or not integer_seeds(seed_param):
        raise ConfigError(
            "replicate: a replication reruns a grid's arms on fresh seeds; this study is not a grid whose "
            f"'{SEED_PARAM}' param lists integer seeds"
        )
    seen = set(seen) | set(seed_param.choices)
    design_control = control_seeds(spec, ()) if spec.control is not None else []
    seen |= set(design_control)
    start = FRESH_STEP * (max(seen, default=-1) // FRESH_STEP + 1)
    block = spec.replicate
    seeds = _listed("seeds", list(block.seeds)) if block.seeds is not None else None
    seeds = seeds or list(range(start, start + len(seed_param.choices)))
    if block.control_seeds is not None and spec.control is None:
        raise ConfigError("replicate.control_seeds: the study has no control")
    controls = _listed("control_seeds", list(block.control_seeds)) if block.control_seeds is not None else None
    if spec.control is not None and controls is None:
        controls = list(range(start, start + len(design_control)))
    for key, values in (("seeds", seeds), ("control_seeds", controls or [])):
        check_disjoint(f"replicate.{key}", values, seen)
    return {"seeds": seeds, "control_seeds": controls}


def check_disjoint(key: str, fresh: Iterable[int], seen: Iterable[int]) -> None:
    """A replication's seeds share none with the design's: one line naming those they share."""
    shared = sorted(set(fresh) & set(seen))
    if shared:
        raise ConfigError(
            f"{key}: seeds {', '.join(map(str, shared))} were seen by the design (its seeds, its control's or "
            "those --add-seeds stored); a replication runs on fresh seeds only"
        )


def as_replicate(spec: DictConfig, fresh: dict[str, Optional[list[int]]]) -> None:
    """Turn ``spec`` into its replication's: the ``seed`` choices and the control's seeds replaced by the fresh
    ones (:func:`fresh_seeds`)."""
    spec.space[SEED_PARAM].choices = list(fresh["seeds"])
    if spec.control is not None:
        spec.control.seeds = list(fresh["control_seeds"])
