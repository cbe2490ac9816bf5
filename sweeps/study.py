"""Study files (``sweeps/*.yaml``): schema, validation, search space and trial configs.

A study file names a base experiment YAML, the ``overrides`` every trial shares (its training budget)
and a search ``space``. A trial's config is

    RunConfig defaults < base YAML < overrides < trial params        (then ``config.check``)

so a trial is exactly a ``linformer-lab train`` run with a few more overrides. ``presets`` (``cpu``,
``gpu``) are partial studies merged over the file; each preset is its own Optuna study, named
``<study>_<preset>``, under ``<output_dir>/<study>_<preset>/``.

A space param is either a dotted RunConfig key (``model.attention.options.k``) whose ``choices`` are values, or
a free label whose ``choices`` map choice names to bundles of overrides (``arm: {full: {...}, ...}``),
for arms that differ in several keys at once. ``when: {key: value}`` makes a param conditional on the
trial's config so far. Every problem is a one-line :class:`ConfigError` naming the file and the key;
:func:`load_study` also builds the config of every grid point (or of every range end of an open space)
so that a bad value fails here, before any trial starts.

``control`` is a contrast known to be real (e.g. full attention against a Linformer whose k is far too
small for the task), run at every seed beside the study's own trials: its ``reference`` is the study's
baseline arm, its ``degraded`` arm a variant known to be worse. It is a companion grid study,
``<study>_<preset>_control`` under ``<study dir>/control/``, so that it never feeds the main study's
sampler, pruner or budget. The report first checks the reference leaves the trivial baseline and the
contrast separates beyond the seed spread: a study whose control does not separate has no power at its
budget, and its report says so above every verdict.

``verdict`` says what the report's verdicts (:mod:`sweeps.stats`, docs/verdicts.md) need per objective
metric: ``delta``, the margin δ within which two arms are "on par" (default by the metric's name,
:data:`DEFAULT_DELTA`; a metric with no default must be given one), and ``success``, a threshold past
which a run counts as having solved the task (the report then gives success rates per arm).

``ladder`` makes the study a model-size ladder (docs/scale.md): ``rung`` names the space param whose choices
are the model sizes, smallest first, and ``reference`` the values of the other arm params that make the arm
every other arm is measured against at each rung (``{arm: full}``). Arms are then compared only within a
rung, and the report adds the gap to the reference per rung against parameters and training FLOPs, its
trend over size, and the reference's attention spectrum across sizes (:mod:`sweeps.scale`).

``linformer-lab sweep --add-seeds N`` adds replicate seeds to a grid study and its control; they are
stored on the study (user attr ``added_seeds``) and passed back here as ``added_seeds``, which extends
the ``seed`` choices (and the control's seeds) so that every later ``sweep`` and ``report`` sees them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from foundation.configfile import merge, read_yaml
from foundation.errors import ConfigError, check_number
from training import config as run_config

REPO_ROOT = Path(__file__).resolve().parents[1]
SWEEPS_DIR = Path(__file__).resolve().parent
SPAWN_STRATEGIES = ("ddp_spawn", "ddp_fork", "ddp_notebook")
SCALAR = (str, int, float, bool, type(None))
CONTROL_PARAM = "control"
DEFAULT_CONTROL_SEEDS = [0, 1, 2]
MAX_TRIALS = 1_000_000
SEED_PARAM = "seed"  # the replicate param that `sweep --add-seeds` extends
ADDED_SEEDS = "added_seeds"  # user attr of a stored study: the seeds `sweep --add-seeds` added, in order
# The equivalence margin δ of a metric that a study file gives none, by the end of its name: 0.01 nats of a
# loss, half an accuracy point of an accuracy in [0, 1]. Any other metric needs verdict.delta.<metric>.
DEFAULT_DELTA = {"loss": 0.01, "accuracy": 0.005}


# --------------------------------------------------------------------------------------- schema
@dataclass
class ParamSpec:
    type: Literal["categorical", "int", "float"] = "categorical"
    # categorical: a list of values of the config key named by the param, or a mapping
    # choice name -> {dotted key: value} (the param is then a free label, e.g. "arm").
    choices: Any = None
    low: Any = None
    high: Any = None
    step: Any = None
    log: bool = False
    # Sample this param only when the trial's config (base < overrides < earlier params) has these values.
    when: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ObjectiveSpec:
    metric: str = "val/loss"  # a key of metrics.json
    direction: Literal["minimize", "maximize"] = "minimize"


@dataclass
class SamplerSpec:
    kind: Literal["grid", "tpe", "random"] = "grid"
    seed: int = 0
    n_startup_trials: int = 10  # TPE: random trials before the model kicks in


@dataclass
class PrunerSpec:
    # Steps are training steps: a trial reports val/loss at every validation (trainer.val_check_interval).
    kind: Literal["none", "median", "hyperband"] = "none"
    n_startup_trials: int = 5  # median: trials that are never pruned
    n_warmup_steps: int = 0  # median: steps before pruning may happen
    min_resource: int = 1  # hyperband: steps of the smallest bracket
    reduction_factor: int = 3  # hyperband


@dataclass
class BudgetSpec:
    n_trials: Optional[int] = None  # finished trials (complete, pruned or failed); grid: default all points
    timeout_s: Optional[float] = None  # no trial starts after this many seconds of one `sweep` command


@dataclass
class ControlSpec:
    reference: Dict[str, Any] = field(default_factory=dict)  # the baseline arm's overrides
    degraded: Dict[str, Any] = field(default_factory=dict)  # a variant known to be worse on this task
    # Seeds of the control trials; null: the study's `seed` choices, else [0, 1, 2].
    seeds: Optional[List[int]] = None


@dataclass
class VerdictSpec:
    # Per objective metric, the margin δ (in the metric's units) within which two arms count as "on par"
    # (equivalence test); a metric missing here gets DEFAULT_DELTA by its name, or must be given.
    delta: Dict[str, float] = field(default_factory=dict)
    # Per objective metric, the value at or beyond which (in the objective's direction) a run solved the
    # task: the report gives each arm's success rate and compares the rates (for outcomes that split into
    # solved and stuck runs, e.g. recall at ~1 or on a plateau).
    success: Dict[str, float] = field(default_factory=dict)


@dataclass
class LadderSpec:
    # The space param whose choices are the model sizes (rungs), smallest first: usually a free label,
    # rung name -> {model.n_layers: ..., model.d_model: ..., model.n_heads: ..., trainer.max_steps: ...}.
    rung: str = ""
    # The arm every gap is taken against, by the values of the other arm params: {arm: full}.
    reference: Dict[str, Any] = field(default_factory=dict)


@dataclass
class StudySpec:
    study: str = ""
    base: str = ""
    overrides: Dict[str, Any] = field(default_factory=dict)
    space: Dict[str, ParamSpec] = field(default_factory=dict)
    objective: List[ObjectiveSpec] = field(default_factory=lambda: [ObjectiveSpec()])
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    # Params that define an arm; the others (seed) are replicates. null: grid -> all but seed, else none.
    arms: Optional[List[str]] = None
    control: Optional[ControlSpec] = None
    verdict: VerdictSpec = field(default_factory=VerdictSpec)
    ladder: Optional[LadderSpec] = None  # a model-size ladder (see the module docstring)
    presets: Dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- helpers
def _nested(flat: dict) -> DictConfig:
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


def _grid_values(name: str, p: ParamSpec) -> list:
    if p.type == "categorical":
        return list(p.choices)
    if p.step is None:
        raise ConfigError(f"space.{name}: a grid needs finite values: give 'step' (or use type: categorical)")
    n = int(round((p.high - p.low) / p.step))
    return [p.low + i * p.step if p.type == "int" else round(p.low + i * p.step, 12) for i in range(n + 1)]


def _check_param(name: str, p: ParamSpec) -> None:
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


# --------------------------------------------------------------------------------------- the study
@dataclass
class Study:
    """A validated study file at one preset."""

    path: Path
    preset: Optional[str]
    spec: DictConfig  # StudySpec, preset applied
    base_path: Path
    base: dict  # the checked base experiment, as plain containers
    shared: DictConfig  # RunConfig of base < overrides, merged once (OmegaConf merges are slow)
    points: Optional[list[dict]] = None  # grid studies: every distinct grid point, in order
    control: Optional["Study"] = None  # the companion control study (see the module docstring)
    parent: Optional["Study"] = None  # of a control study: the study it checks
    added_seeds: tuple[int, ...] = ()  # seeds `sweep --add-seeds` added to the file's (see the module docstring)

    @property
    def name(self) -> str:
        if self.parent is not None:
            return f"{self.parent.name}_control"
        return f"{self.spec.study}_{self.preset}" if self.preset else self.spec.study

    @property
    def root(self) -> Path:
        """``<output_dir>/<name>``: the journal, the trial run directories and the report (a control
        study: ``<its study's root>/control``)."""
        if self.parent is not None:
            return self.parent.root / "control"
        return Path(self.shared.output_dir) / self.name

    @property
    def studies(self) -> list["Study"]:
        """The studies a sweep runs, in order: the control first (when there is one), then this one."""
        return ([self.control] if self.control is not None else []) + [self]

    @property
    def metrics(self) -> list[str]:
        return [o.metric for o in self.spec.objective]

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.spec.objective]

    @property
    def is_grid(self) -> bool:
        return self.spec.sampler.kind == "grid"

    @property
    def n_trials(self) -> Optional[int]:
        return self.spec.budget.n_trials

    @property
    def arms(self) -> list[str]:
        if self.spec.arms is not None:
            return list(self.spec.arms)
        return [p for p in self.spec.space if p != "seed"] if self.is_grid else []

    @property
    def int_seeds(self) -> bool:
        """Whether this is a grid whose ``seed`` param lists integer seeds (what ``--add-seeds`` extends)."""
        p = self.spec.space.get(SEED_PARAM)
        return (
            self.is_grid
            and p is not None
            and p.type == "categorical"
            and OmegaConf.is_list(p.choices)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in p.choices)
        )

    @property
    def seeds(self) -> list[int]:
        """The replicate seeds of a grid (its ``seed`` choices, added seeds included); [] when it has none."""
        return list(self.spec.space[SEED_PARAM].choices) if self.int_seeds else []

    @property
    def ladder(self) -> Optional[DictConfig]:
        """The study's ``ladder`` (None for a study without one, and for a control study)."""
        return self.spec.ladder if self.parent is None else None

    @property
    def rungs(self) -> list[str]:
        """A ladder's rungs, smallest first (the choices of its rung param); [] without a ladder."""
        return [str(r) for r in self.spec.space[self.ladder.rung].choices] if self.ladder is not None else []

    def delta(self, metric: str) -> tuple[float, str]:
        """The equivalence margin δ of ``metric`` and where it comes from ("study file" or "default")."""
        verdict = (self.parent or self).spec.verdict
        if metric in verdict.delta:
            return float(verdict.delta[metric]), "study file"
        return float(DEFAULT_DELTA[_metric_kind(metric)]), "default"

    def success(self, metric: str) -> Optional[float]:
        """The success threshold of ``metric``, if the study file gives one."""
        verdict = (self.parent or self).spec.verdict
        return float(verdict.success[metric]) if metric in verdict.success else None

    def is_bundle(self, name: str) -> bool:
        """Whether param ``name`` is a free label whose choices name bundles of overrides."""
        return isinstance(self.spec.space[name].choices, DictConfig)

    def arm_label(self, params: dict, without: Sequence[str] = ()) -> str:
        """How reports name the arm of a trial's ``params``: its arm params in order, a bundle's choice by its
        name, a value as ``key=value`` (the key's last part); params in ``without`` left out."""
        return " ".join(
            str(v) if self.is_bundle(p) else f"{p.rsplit('.', 1)[-1]}={v}"
            for p, v in params.items()
            if p in self.arms and p not in without
        )

    # ---------------------------------------------------------------- params -> config
    def param_overrides(self, params: dict) -> dict:
        """Dotted config key -> value that a trial's params set (bundles expanded), in space order."""
        out: dict = {}
        for layer in self.param_layers(params):
            out.update(layer)
        return out

    def param_layers(self, params: dict) -> list[dict]:
        """What each of a trial's params sets (dotted key -> value, a bundle expanded), one layer per param in
        space order: a later param's ``kind`` starts from that kind's options (foundation.configfile)."""
        return [
            OmegaConf.to_container(self.spec.space[name].choices[value]) if self.is_bundle(name) else {name: value}
            for name, value in params.items()
        ]

    def _active(self, name: str, params: dict) -> bool:
        when = self.spec.space[name].when
        if not when:
            return True
        flat = run_config.flatten(
            run_config.to_container(run_config.merge_run([self.shared, *map(_nested, self.param_layers(params))]))
        )
        return all(flat.get(key) == value for key, value in when.items())

    def config(self, params: dict, run: Optional[dict] = None) -> DictConfig:
        """The checked RunConfig of a trial: base < overrides < params < ``run`` (run_dir, experiment)."""
        cfg = run_config.merge_run([self.shared, *map(_nested, self.param_layers(params)), _nested(run or {})])
        run_config.check(cfg)
        check_trial_devices(cfg)
        return cfg

    def suggest(self, trial: Any) -> dict:
        """Ask an Optuna trial for every active param, in space order.

        A grid's integer seeds are asked as an int range: every grid point is enqueued, and a range keeps
        the param's Optuna distribution compatible when ``--add-seeds`` extends the seeds (Optuna refuses a
        categorical whose choices change within a study). Studies stored with a categorical seed keep it."""
        params: dict = {}
        for name, p in self.spec.space.items():
            if not self._active(name, params):
                continue
            stored = trial.study.get_trials(deepcopy=False) if name == SEED_PARAM and self.int_seeds else None
            if stored is not None and not seed_is_categorical(stored):
                params[name] = trial.suggest_int(name, min(p.choices), max(p.choices))
            elif p.type == "categorical":
                params[name] = trial.suggest_categorical(name, list(p.choices))
            elif p.type == "int":
                params[name] = trial.suggest_int(name, p.low, p.high, step=p.step or 1, log=p.log)
            else:
                params[name] = trial.suggest_float(name, float(p.low), float(p.high), step=p.step, log=p.log)
        return params

    def grid(self) -> list[dict]:
        """Every distinct grid point: the product of all params' values, conditional params dropped
        where inactive, duplicates removed, in order (later params vary fastest)."""
        return self._product(_grid_values)

    def range_ends(self) -> list[dict]:
        """Like :meth:`grid` with a range reduced to its two ends: what validation of an open space builds."""
        return self._product(lambda name, p: _grid_values(name, p) if p.type == "categorical" else [p.low, p.high])

    def _product(self, values_of: Any) -> list[dict]:
        points: list[dict] = [{}]
        for name, p in self.spec.space.items():
            values = values_of(name, p)
            points = [
                new
                for pt in points
                for new in ([dict(pt, **{name: v}) for v in values] if self._active(name, pt) else [pt])
            ]
        unique = {tuple(sorted(pt.items())): pt for pt in points}
        return list(unique.values())


def seed_is_categorical(trials: Sequence[Any]) -> bool:
    """Whether stored trials hold the seed as a categorical param (studies run before ``--add-seeds``
    existed): Optuna checks every trial's param against the first one's, so such a study keeps it."""
    from optuna.distributions import CategoricalDistribution

    first = next((t for t in trials if SEED_PARAM in t.distributions), None)
    return first is not None and isinstance(first.distributions[SEED_PARAM], CategoricalDistribution)


def _metric_kind(metric: str) -> Optional[str]:
    """The DEFAULT_DELTA entry that applies to ``metric`` by the end of its name; None: no default."""
    return next((kind for kind in DEFAULT_DELTA if metric.endswith(kind)), None)


def _check_verdict(spec: DictConfig, file_metrics: set[str]) -> None:
    """verdict.delta / verdict.success: keys are objective metrics of the file (some preset's at least),
    values in range; every objective metric of this preset has a δ."""
    known = ", ".join(sorted(file_metrics))
    for section in ("delta", "success"):
        for metric, value in spec.verdict[section].items():
            where = f"verdict.{section}.{metric}"
            if metric not in file_metrics:
                raise ConfigError(f"{where}: not an objective metric of this study file (objectives: {known})")
            if section == "delta" and not value > 0:
                raise ConfigError(f"{where}: the margin δ must be > 0 (in the metric's units), got {value}")
            if _metric_kind(metric) == "accuracy":
                rule, ok = (
                    ("0 < δ < 1 (half an accuracy point is 0.005)", value < 1)
                    if section == "delta"
                    else ("0 < threshold <= 1 (90 % is 0.9)", 0 < value <= 1)
                )
                if not ok:
                    raise ConfigError(f"{where}: an accuracy is a fraction in [0, 1], so {rule}, got {value}")
    for metric in (o.metric for o in spec.objective):
        if metric not in spec.verdict.delta and _metric_kind(metric) is None:
            raise ConfigError(
                f"verdict.delta.{metric}: objective metric {metric!r} has no default margin δ "
                "(defaults: *loss 0.01, *accuracy 0.005); give the smallest difference that "
                "matters, in its units"
            )


def _add_seeds(spec: DictConfig, added_seeds: Sequence[int]) -> None:
    """Extend the ``seed`` choices of a grid study by ``added_seeds`` (see the module docstring)."""
    if spec.sampler.kind != "grid":
        raise ConfigError(
            f"--add-seeds: an open study (sampler.kind={spec.sampler.kind}) has no grid to add "
            "seeds to; add-seeds is for grid studies"
        )
    p = spec.space.get(SEED_PARAM)
    if p is None:
        raise ConfigError(f"--add-seeds: space has no {SEED_PARAM!r} param (the replicates to add to)")
    if (
        p.type != "categorical"
        or not OmegaConf.is_list(p.choices)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in p.choices)
    ):
        raise ConfigError(
            f"--add-seeds: space.{SEED_PARAM}.choices must be a list of integer seeds, got "
            f"{OmegaConf.to_container(p.choices) if OmegaConf.is_config(p.choices) else p.choices!r}"
        )
    p.choices = list(p.choices) + [s for s in added_seeds if s not in p.choices]


# --------------------------------------------------------------------------------------- loading
def _resolve_base(study_path: Path, base: str) -> Path:
    for root in (study_path.parent, REPO_ROOT, Path.cwd()):
        if (root / base).is_file():
            return root / base
    raise ConfigError(f"base: {base} not found (relative to {study_path.parent} or {REPO_ROOT})")


def load_study(
    path: str | Path,
    preset: Optional[str] = None,
    n_trials: Optional[int] = None,
    timeout_s: Optional[float] = None,
    added_seeds: Sequence[int] = (),
) -> Study:
    """Read, merge (file < preset < command-line budget) and validate a study file.

    ``preset`` None picks ``cpu`` when the file has presets. ``added_seeds``: seeds ``sweep --add-seeds``
    stored on the study, added to its grid and control. Raises :class:`ConfigError` (one line, prefixed
    with the file) on any problem, including a trial config that would not validate.
    """
    path = Path(path)
    raw = read_yaml(path)
    presets = raw.get("presets") or {}
    if not isinstance(presets, dict) or not all(isinstance(v, dict) for v in presets.values()):
        raise ConfigError(f"{path}: presets: must map preset names to partial studies")
    if preset is None and "cpu" in presets:
        preset = "cpu"
    if preset is not None and preset not in presets:
        raise ConfigError(f"{path}: --preset {preset}: no such preset (has: {', '.join(presets) or 'none'})")
    where = f"{path}" + (f" (preset {preset})" if preset else "")
    try:
        if preset is not None and "presets" in presets[preset]:
            raise ConfigError(f"presets.{preset}.presets: a preset cannot hold presets")
        layers = [raw] + ([presets[preset]] if preset else [])
        command_line = {"n_trials": n_trials, "timeout_s": timeout_s}
        layers.append({"budget": {k: v for k, v in command_line.items() if v is not None}})
        spec = merge(StudySpec, layers)
        study = _validate(path, preset, spec, _file_metrics(raw, presets), tuple(added_seeds))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return study


def _file_metrics(raw: dict, presets: dict) -> set[str]:
    """The objective metrics of a study file at any preset (what a verdict key may name)."""
    metrics = {ObjectiveSpec.metric}
    for layer in [raw, *presets.values()]:
        objective = layer.get("objective")
        for o in objective if isinstance(objective, list) else []:
            if isinstance(o, dict) and isinstance(o.get("metric", ObjectiveSpec.metric), str):
                metrics.add(o.get("metric", ObjectiveSpec.metric))
    return metrics


def _validate(
    path: Path, preset: Optional[str], spec: DictConfig, file_metrics: set[str], added_seeds: tuple[int, ...] = ()
) -> Study:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", spec.study or ""):
        raise ConfigError(f"study: a name of letters, digits, '_' or '-' is required, got {spec.study!r}")
    if not spec.base:
        raise ConfigError("base: the experiment YAML every trial starts from is required")
    base_path = _resolve_base(path, spec.base)
    try:
        base = run_config.to_container(run_config.load(base_path))
    except ConfigError as err:
        raise ConfigError(f"base {spec.base}: {err}") from None
    _check_objective(spec)
    _check_verdict(spec, file_metrics)
    if added_seeds:
        _add_seeds(spec, added_seeds)
    _check_space(spec, set(run_config.flatten(base)))
    b = spec.budget
    if b.n_trials is not None:
        check_number("budget.n_trials", b.n_trials, 1, MAX_TRIALS, integer=True)
    if b.timeout_s is not None:
        check_number("budget.timeout_s", b.timeout_s, 0, 365 * 86400, low_open=True)
    try:
        shared = run_config.merge_run([base, _nested(dict(spec.overrides))])
        study = Study(
            path=path, preset=preset, spec=spec, base_path=base_path, base=base, shared=shared, added_seeds=added_seeds
        )
        study.config({})
    except ConfigError as err:
        raise ConfigError(f"overrides: {err}") from None
    if spec.control is not None:
        study.control = _control_study(study)
    if spec.ladder is not None:
        _check_ladder(study)
    for params in _samples(study, added_seeds):
        try:
            study.config(params)
        except ConfigError as err:
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            raise ConfigError(f"trial with {shown}: {err}") from None
    return study


def _check_objective(spec: DictConfig) -> None:
    if not 1 <= len(spec.objective) <= 2:
        raise ConfigError(f"objective: give 1 metric or 2 (a Pareto front), got {len(spec.objective)}")
    if len({o.metric for o in spec.objective}) != len(spec.objective):
        raise ConfigError("objective: the same metric is listed twice")
    if len(spec.objective) == 2 and spec.pruner.kind != "none":
        raise ConfigError(
            f"pruner.kind={spec.pruner.kind}: Optuna cannot prune multi-objective studies; "
            "set pruner.kind: none or keep one objective"
        )


def _check_space(spec: DictConfig, flat_keys: set[str]) -> None:
    """Every param of the space names a config key (or is a free label of override bundles); arms are params."""
    if spec.control is not None and CONTROL_PARAM in spec.space:
        raise ConfigError(f"space.{CONTROL_PARAM}: the name is taken by the study's control arms; rename the param")
    for name, p in spec.space.items():
        _check_param(name, p)
        if not isinstance(p.choices, DictConfig) and not run_config.is_key(name, flat_keys):
            raise ConfigError(f"space.{name}: not a config key; a free label needs choices that map names to overrides")
        for key in p.when:
            if not run_config.is_key(key, flat_keys):
                raise ConfigError(f"space.{name}.when: {key} is not a config key")
    for name in spec.arms or []:
        if name not in spec.space:
            raise ConfigError(f"arms: {name!r} is not a param of space (has: {', '.join(spec.space)})")


def _samples(study: Study, added_seeds: tuple[int, ...]) -> list[dict]:
    """The trial params whose configs are checked before any trial runs: a grid's every point (its budget set
    from it), an open study's range ends."""
    b = study.spec.budget
    if not study.is_grid:
        if b.n_trials is None and b.timeout_s is None:
            raise ConfigError("budget: an open study needs n_trials or timeout_s")
        return study.range_ends()
    study.points = study.grid()
    if added_seeds and b.n_trials is not None and b.n_trials != len(study.points):
        raise ConfigError(
            f"--add-seeds: budget.n_trials={b.n_trials} fixes the number of trials of this grid; "
            f"remove it (a grid runs all its {len(study.points)} points)"
        )
    if b.n_trials is None:
        b.n_trials = len(study.points)
    elif b.n_trials > len(study.points):
        raise ConfigError(f"budget.n_trials={b.n_trials}: the grid has only {len(study.points)} distinct points")
    return study.points


def _check_ladder(study: Study) -> None:
    """``ladder``: a categorical arm param of a grid with at least 2 rungs that grow in parameters, and a
    reference arm named by a choice of every other arm param."""
    from training.train import model_parameters  # builds the model on the meta device: no memory, no data

    spec, ladder = study.spec, study.spec.ladder
    if not study.is_grid:
        raise ConfigError(f"ladder: a ladder is a grid (every rung × arm × seed); sampler.kind is {spec.sampler.kind}")
    if ladder.rung not in spec.space:
        raise ConfigError(f"ladder.rung: {ladder.rung!r} is not a param of space (has: {', '.join(spec.space)})")
    p = spec.space[ladder.rung]
    if p.type != "categorical" or len(p.choices) < 2 or p.when:
        raise ConfigError(
            f"ladder.rung: space.{ladder.rung} must be a categorical param with at least 2 choices "
            "(the model sizes, smallest first) and no 'when'"
        )
    if ladder.rung not in study.arms:
        raise ConfigError(f"ladder.rung: {ladder.rung!r} must be one of arms ({', '.join(study.arms)})")
    others = [a for a in study.arms if a != ladder.rung]
    if not others:
        raise ConfigError(
            f"ladder: arms has no param beside the rung {ladder.rung!r}; add the param whose choices "
            "are the arms compared at each rung (e.g. arm: {full: ..., linformer: ...})"
        )
    for key in ladder.reference:
        if key not in others:
            raise ConfigError(
                f"ladder.reference.{key}: not an arm param beside the rung (arm params: {', '.join(others)})"
            )
    for name in others:
        choices = [str(c) for c in spec.space[name].choices] if spec.space[name].type == "categorical" else []
        if name not in ladder.reference:
            raise ConfigError(
                f"ladder.reference: give the reference arm's value of {name!r}"
                + (f" (choices: {', '.join(choices)})" if choices else "")
            )
        if str(ladder.reference[name]) not in choices:
            raise ConfigError(
                f"ladder.reference.{name}: {ladder.reference[name]!r} is not a choice of space.{name} "
                f"(choices: {', '.join(choices) or 'none: a ladder arm param must be categorical'})"
            )
    if all(len(spec.space[name].choices) == 1 for name in others):
        raise ConfigError("ladder.reference: the reference is the only arm; add the arms to compare with it")
    sizes = []
    for rung in p.choices:
        chosen = {ladder.rung: rung, **ladder.reference}
        try:  # the params in space order, as a trial applies them
            sizes.append((str(rung), model_parameters(study.config({n: chosen[n] for n in spec.space if n in chosen}))))
        except ConfigError as err:
            raise ConfigError(f"ladder: rung {rung}: {err}") from None
    for (small, n_small), (large, n_large) in zip(sizes, sizes[1:]):
        if n_large <= n_small:
            raise ConfigError(
                f"ladder.rung: rungs must grow, smallest first: {large!r} has {n_large:,} parameters, "
                f"not more than {small!r} before it ({n_small:,})"
            )


def _control_study(study: Study) -> Study:
    """The grid study of ``control``: param ``control`` ∈ {reference, degraded} × the control seeds."""
    c = study.spec.control
    for role in ("reference", "degraded"):
        if not c[role]:
            raise ConfigError(f"control.{role}: give the overrides of the {role} arm (e.g. model.attention.kind: full)")
    if c.reference == c.degraded:
        raise ConfigError("control: reference and degraded are the same overrides; a control contrasts two arms")
    seed_param = study.spec.space.get("seed")
    if c.seeds is not None:
        seeds = list(c.seeds) + [s for s in study.added_seeds if s not in c.seeds]
    elif seed_param is not None and seed_param.type == "categorical" and not isinstance(seed_param.choices, DictConfig):
        seeds = list(seed_param.choices)
    else:
        seeds = list(DEFAULT_CONTROL_SEEDS) + [s for s in study.added_seeds if s not in DEFAULT_CONTROL_SEEDS]
    if len(set(seeds)) < 2:
        raise ConfigError(f"control.seeds: at least 2 distinct seeds are needed to measure a spread, got {seeds}")
    spec = OmegaConf.merge(
        OmegaConf.structured(StudySpec),
        {
            "study": study.spec.study,
            "base": study.spec.base,
            "overrides": study.spec.overrides,
            "space": {
                CONTROL_PARAM: {"choices": {"reference": c.reference, "degraded": c.degraded}},
                "seed": {"choices": seeds},
            },
            "objective": study.spec.objective,
            "sampler": {"kind": "grid"},
            "arms": [CONTROL_PARAM],
        },
    )
    control = Study(
        path=study.path,
        preset=study.preset,
        spec=spec,
        base_path=study.base_path,
        base=study.base,
        shared=study.shared,
        parent=study,
        added_seeds=study.added_seeds,
    )
    control.points = control.grid()
    spec.budget.n_trials = len(control.points)
    for params in control.points:
        try:
            control.config(params)
        except ConfigError as err:
            raise ConfigError(f"control.{params[CONTROL_PARAM]}: {err}") from None
    return control


def shipped_studies() -> list[Path]:
    return sorted(SWEEPS_DIR.glob("*.yaml"))
