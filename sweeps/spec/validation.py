"""Validation of a study file: every problem is one line (:class:`ConfigError`) naming the key, the value and
what is allowed, raised before any trial starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from foundation.errors import ConfigError
from sweeps.spec.schema import (
    CONTROL_PARAM,
    NO_CONTEXT_SOURCES,
    REPO_ROOT,
    SCALAR,
    SPAWN_STRATEGIES,
    ObjectiveSpec,
    ParamSpec,
    metric_kind,
)
from training import config as run_config


def nested(flat: dict) -> DictConfig:
    """{"a.b": 1} -> {a: {b: 1}} as one OmegaConf layer."""
    layer = OmegaConf.create()
    for key, value in flat.items():
        try:
            OmegaConf.update(layer, key, value, merge=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None
    return layer


def requested_devices(devices: Any) -> Optional[int]:
    """Number of devices a Lightning ``devices`` value asks for; None when it depends on the machine."""
    if isinstance(devices, int):
        return None if devices == -1 else devices
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            return requested_devices(int(text))
        return len([d for d in text.split(",") if d.strip()]) if "," in text else None
    return len(devices)


def check_trial_devices(cfg: DictConfig) -> None:
    """Refuse what would break inside an Optuna objective: 'ddp' re-executes the launching script in
    every extra rank (each rank would then run its own sweep and create its own trials)."""
    t = cfg.trainer
    n = requested_devices(t.devices)
    multi = n is None or n > 1 or t.num_nodes > 1
    if t.strategy in SPAWN_STRATEGIES:
        return
    if t.strategy.startswith("ddp") or multi:
        raise ConfigError(
            f"trainer.strategy={t.strategy} with trainer.devices={t.devices}: a sweep trial must run on one "
            f"device, or on several with a spawn-based strategy ({', '.join(SPAWN_STRATEGIES)}); "
            "'ddp' would re-run the whole sweep in every rank"
        )


def check_param(name: str, p: ParamSpec) -> None:
    where = f"space.{name}"
    if p.type == "categorical":
        if isinstance(p.choices, DictConfig):
            if not p.choices:
                raise ConfigError(f"{where}.choices: empty")
            for choice, bundle in p.choices.items():
                if not isinstance(bundle, DictConfig):
                    raise ConfigError(f"{where}.choices.{choice}: must be a mapping of dotted config keys to values")
            return
        if not OmegaConf.is_list(p.choices) or not p.choices:
            raise ConfigError(
                f"{where}.choices: categorical needs a non-empty list of values "
                "or a mapping of choice names to overrides"
            )
        for value in p.choices:
            if not isinstance(value, SCALAR):
                shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
                raise ConfigError(
                    f"{where}.choices: {shown!r} is not a scalar; name it in a mapping instead "
                    "(choices: {name: {key: value}})"
                )
        return
    if p.choices is not None:
        raise ConfigError(f"{where}: 'choices' is for type: categorical (got type: {p.type})")
    kinds = (int,) if p.type == "int" else (int, float)
    for key in ("low", "high") + (("step",) if p.step is not None else ()):
        value = p[key]
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ConfigError(
                f"{where}.{key}: {p.type} range needs a number{' (integer)' if p.type == 'int' else ''}, got {value!r}"
            )
    if p.low > p.high:
        raise ConfigError(f"{where}: low={p.low} > high={p.high}")
    if p.log and p.step is not None:
        raise ConfigError(f"{where}: 'log' and 'step' cannot be combined (Optuna)")
    if p.log and p.low <= 0:
        raise ConfigError(f"{where}.low: a log range needs low > 0, got {p.low}")
    if p.step is not None and p.step <= 0:
        raise ConfigError(f"{where}.step: must be > 0, got {p.step}")


# verdict.<section>: (the rule any value must meet, the rule an accuracy must meet), each as (words, test)
VERDICT_RULES = {
    "delta": (
        ("the margin δ must be > 0 (in the metric's units)", lambda v: v > 0),
        ("0 < δ < 1 (half an accuracy point is 0.005)", lambda v: 0 < v < 1),
    ),
    "success": (
        ("a threshold is a number", lambda v: True),
        ("0 < threshold <= 1 (90 % is 0.9)", lambda v: 0 < v <= 1),
    ),
    "context_gain": (
        ("the threshold must be > 0 (in the metric's units; defaults: *loss 0.5, *accuracy 0.1)", lambda v: v > 0),
        ("0 < threshold < 1 (ten accuracy points is 0.1)", lambda v: 0 < v < 1),
    ),
}


def check_verdict(spec: DictConfig, file_metrics: set[str]) -> None:
    """verdict.delta / success / context_gain: keys are objective metrics of the file (some preset's at least),
    values in range; every objective metric of this preset has a δ, and a study with a control a context-gain
    threshold for its first objective."""
    known = ", ".join(sorted(file_metrics))
    for section, ((rule, ok), (accuracy_rule, accuracy_ok)) in VERDICT_RULES.items():
        for metric, value in spec.verdict[section].items():
            where = f"verdict.{section}.{metric}"
            if metric not in file_metrics:
                raise ConfigError(f"{where}: not an objective metric of this study file (objectives: {known})")
            if not ok(value):
                raise ConfigError(f"{where}: {rule}, got {value}")
            if metric_kind(metric) == "accuracy" and not accuracy_ok(value):
                raise ConfigError(f"{where}: an accuracy is a fraction in [0, 1], so {accuracy_rule}, got {value}")
    for metric in (o.metric for o in spec.objective):
        if metric not in spec.verdict.delta and metric_kind(metric) is None:
            raise ConfigError(
                f"verdict.delta.{metric}: objective metric {metric!r} has no default margin δ "
                "(defaults: *loss 0.01, *accuracy 0.005); give the smallest difference that "
                "matters, in its units"
            )
    for i, name in enumerate(spec.verdict.within):
        if name not in (spec.arms or []):
            arms = ", ".join(spec.arms or []) or "none"
            raise ConfigError(
                f"verdict.within[{i}]: {name!r} is not one of the study's arms ({arms}); "
                "pairs can be kept within equal values of an arm param only"
            )
    first = spec.objective[0].metric
    if spec.control is not None and first not in spec.verdict.context_gain and metric_kind(first) is None:
        raise ConfigError(
            f"verdict.context_gain.{first}: the first objective {first!r} has no default context-gain threshold "
            "(defaults: *loss 0.5, *accuracy 0.1); give the smallest gain over a model without context that "
            "shows the reference uses its context, in the metric's units"
        )
    if spec.control is not None and spec.control.no_context not in NO_CONTEXT_SOURCES:
        raise ConfigError(
            f"control.no_context: {spec.control.no_context!r} is not one of {', '.join(NO_CONTEXT_SOURCES)} "
            "(degraded: the degraded arm's runs; baseline: the reference runs' no-context baseline)"
        )


def check_objective(spec: DictConfig) -> None:
    if not 1 <= len(spec.objective) <= 2:
        raise ConfigError(f"objective: give 1 metric or 2 (a Pareto front), got {len(spec.objective)}")
    if len({o.metric for o in spec.objective}) != len(spec.objective):
        raise ConfigError("objective: the same metric is listed twice")
    if len(spec.objective) == 2 and spec.pruner.kind != "none":
        raise ConfigError(
            f"pruner.kind={spec.pruner.kind}: Optuna cannot prune multi-objective studies; "
            "set pruner.kind: none or keep one objective"
        )


def check_space(spec: DictConfig, flat_keys: set[str]) -> None:
    """Every param of the space names a config key (or is a free label of override bundles); arms are params."""
    if spec.control is not None and CONTROL_PARAM in spec.space:
        raise ConfigError(f"space.{CONTROL_PARAM}: the name is taken by the study's control arms; rename the param")
    for name, p in spec.space.items():
        check_param(name, p)
        if not isinstance(p.choices, DictConfig) and not run_config.is_key(name, flat_keys):
            raise ConfigError(f"space.{name}: not a config key; a free label needs choices that map names to overrides")
        for key in p.when:
            if not run_config.is_key(key, flat_keys):
                raise ConfigError(f"space.{name}.when: {key} is not a config key")
    for name in spec.arms or []:
        if name not in spec.space:
            raise ConfigError(f"arms: {name!r} is not a param of space (has: {', '.join(spec.space)})")


def file_metrics(raw: dict, presets: dict) -> set[str]:
    """The objective metrics of a study file at any preset (what a verdict key may name)."""
    metrics = {ObjectiveSpec.metric}
    for layer in [raw, *presets.values()]:
        objective = layer.get("objective")
        for o in objective if isinstance(objective, list) else []:
            if isinstance(o, dict) and isinstance(o.get("metric", ObjectiveSpec.metric), str):
                metrics.add(o.get("metric", ObjectiveSpec.metric))
    return metrics


def resolve_base(study_path: Path, base: str) -> Path:
    for root in (study_path.parent, REPO_ROOT, Path.cwd()):
        if (root / base).is_file():
            return root / base
    raise ConfigError(f"base: {base} not found (relative to {study_path.parent} or {REPO_ROOT})")
