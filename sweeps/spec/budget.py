"""A study re-asked at F times its training budget (``linformer-lab sweep STUDY --preset P --budget F``).

A verdict taken after a fixed number of steps mixes two things: how good a variant is, and how early it leaves the
no-context level. ``--budget F`` asks the same question again with F × the steps, as a *derived study* of its own
(:mod:`sweeps.spec.replication`: the same arms, on fresh seeds, beside the original, ``<study>_<preset>_x<F>``).

**The same recipe, its schedule stretched to the new end.** Every key counted in optimiser steps is multiplied by F
(rounded to a whole step): ``trainer.max_steps``, ``optim.warmup_steps``, ``optim.short_steps`` (a length
curriculum's short phase) and ``trainer.val_check_interval`` of the base, the ``overrides`` and every trial's params
(an arm's bundle that sets its own ``trainer.max_steps``, a size ladder's rungs), and the pruner's ``n_warmup_steps``
and ``min_resource``. The learning-rate schedule
(:func:`lightning_modules.optim.lr_factor`) ends at ``trainer.max_steps``, so with its warm-up scaled too the
learning rate at a *fraction* p of training is the original's at p: warm-up over the same first share of training,
the same peak, the decay (linear or cosine) reaching its end at the new last step. Validation falls at the same
fractions of training, so a run has as many validation points as at ×1. Nothing else changes: the model, the data,
the batch, the peak learning rate, and the keys that only say what is logged (``trainer.log_every_n_steps``, whose
points just become denser, ``trainer.spectrum_every_n_val``, counted in validations).
"""

from __future__ import annotations

import math
from typing import Any

from foundation.errors import ConfigError

STEP_KEYS = (  # the recipe's step counts
    "trainer.max_steps",
    "optim.warmup_steps",
    "optim.short_steps",
    "trainer.val_check_interval",
)
AT_LEAST_ONE = ("trainer.max_steps", "trainer.val_check_interval")  # (a warm-up may be 0 steps)
PRUNER_STEP_KEYS = ("n_warmup_steps", "min_resource")
MAX_FACTOR = 100
SUFFIX = "_x"  # a budget study's name: <study>_<preset>_x<F>


def check_factor(factor: Any) -> float:
    """``--budget F``: a number above 1 and at most :data:`MAX_FACTOR`, with at most two decimals (it names a
    folder); 1 is the replication (``--replicate``)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ConfigError(f"--budget: a number of times the study's steps is required, got {factor!r}")
    if factor == 1:
        raise ConfigError("--budget 1: the same budget on fresh seeds is the replication; use --replicate")
    if not 1 < factor <= MAX_FACTOR:
        raise ConfigError(f"--budget: {factor:g} is not in (1, {MAX_FACTOR}]: a larger budget, up to {MAX_FACTOR} ×")
    if abs(factor * 100 - round(factor * 100)) > 1e-9:
        raise ConfigError(f"--budget: {factor!r} has more than two decimals (it names the study's folder, _x<F>)")
    return float(round(factor * 100) / 100)


def suffix(factor: float) -> str:
    """``_x4``, ``_x2.5``: the name suffix of the study at ``factor`` × the steps."""
    return f"{SUFFIX}{factor:g}"


def scaled_steps(key: str, value: Any, factor: float) -> Any:
    """``value`` of the step-valued ``key`` at ``factor`` × the steps (a whole number of steps; at least 1 where 0
    means nothing); any other key's value as it is."""
    if key not in STEP_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    steps = int(round(value * factor))
    return max(steps, 1) if key in AT_LEAST_ONE else steps


def check_changes(steps: Any, factor: float) -> None:
    """``--budget F`` changes the recipe's ``trainer.max_steps`` (``steps`` at ×1): a factor whose steps round back
    to the ×1 recipe would run the same study on fresh seeds under the name of a larger budget; one line naming the
    least factor that changes it."""
    if scaled_steps("trainer.max_steps", steps, factor) != steps:
        return
    least = next(
        f / 100 for f in range(101, 100 * MAX_FACTOR + 1) if scaled_steps("trainer.max_steps", steps, f / 100) != steps
    )
    raise ConfigError(
        f"--budget {factor:g}: trainer.max_steps={steps} stays {steps} steps at {factor:g} × (a whole number of "
        f"steps): this factor changes no step count; use --budget {least:g} or more"
    )


def scale_layer(layer: Any, factor: float, prefix: str = "") -> Any:
    """A layer of config keys (dotted or nested mappings, plain containers) with its step-valued keys scaled."""
    if not isinstance(layer, dict):
        return layer
    out = {}
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        out[key] = (
            scale_layer(value, factor, f"{dotted}.") if isinstance(value, dict) else scaled_steps(dotted, value, factor)
        )
    return out


def scale_config(cfg: Any, factor: float) -> None:
    """A merged RunConfig (a DictConfig) with its step-valued keys scaled, in place."""
    for key in STEP_KEYS:
        section, name = key.split(".")
        cfg[section][name] = scaled_steps(key, cfg[section][name], factor)


def scale_pruner(pruner: Any, factor: float) -> None:
    """The pruner's step counts (a StudySpec's ``pruner``) scaled, in place."""
    for name in PRUNER_STEP_KEYS:
        value = pruner[name]
        if isinstance(value, int) and not isinstance(value, bool):
            pruner[name] = max(int(round(value * factor)), 1 if name == "min_resource" else 0)
