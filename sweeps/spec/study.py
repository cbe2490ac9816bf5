"""A study file, loaded: :func:`load_study` reads, merges (file < preset < command line) and validates it, and
:class:`Study` turns a trial's params into its run config. The file's keys are described in :mod:`sweeps.spec.schema`;
their checks live in :mod:`sweeps.spec.validation`, the grid in :mod:`sweeps.spec.grids`, the control in
:mod:`sweeps.spec.controls` and the model-size ladder in :mod:`sweeps.spec.ladders`.

A trial's config is

    RunConfig defaults < base YAML < overrides < trial params        (then ``config.check``)

so a trial is exactly a ``linformer-lab train`` run with a few more overrides. :func:`load_study` also builds
the config of every grid point (or of every range end of an open space) so that a bad value fails there, before
any trial starts.

Checked once. A grid's points (and its control's) are merged and checked once, when the study is loaded, in the
``sweep`` command's process; the checked configs travel with the :class:`Study` to the workers (``checked``), and
:meth:`Study.config` hands a trial the checked config of its point, adding only its seed and its run keys (run
directory, experiment name, ``resume``), which it checks. Points that differ only in their replicate seed share one
checked config. A point no load checked (a tpe or random sampler's proposal) is merged and checked when the trial
asks for it, once. :meth:`Study.with_seeds` grows a loaded study by the seeds ``sweep --add-seeds`` stored, without
reading its file again, checking only the new points.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from foundation.configfile import flatten, merge, read_yaml, to_container
from foundation.errors import ConfigError, check_number
from foundation.paths import NAME_MAX, PATH_MAX, check_folder, check_name
from foundation.rundir import NAME_LIMIT
from sweeps.spec import budget, budgets, grids, replication, validation
from sweeps.spec.controls import control_spec
from sweeps.spec.ladders import check_ladder
from sweeps.spec.schema import (
    CONTROL_PARAM,
    DEFAULT_CONTEXT_GAIN,
    DEFAULT_DELTA,
    MAX_TRIALS,
    SEED_PARAM,
    SWEEPS_DIR,
    StudySpec,
    metric_kind,
)
from sweeps.spec.validation import check_trial_devices, nested
from training import config as run_config

# The keys a trial's run sets on its point's checked config (sweeps.run.trials), each with its check
RUN_KEYS = {
    "experiment": lambda value: check_name("experiment", value),
    "run_dir": lambda value: value is None or check_folder("run_dir", value),
    "resume": lambda value: None,  # a bool (the schema's type); train() checks what it resumes
}


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
    presets: tuple[str, ...] = ()  # the presets its file has
    # of a control study: (its params, the study's params) of each point that is one of the study's own grid
    # points (the same config): trained once, by the study, and reused by the report
    reused: list[tuple[dict, dict]] = field(default_factory=list)
    # budget.n_trials as asked (file < preset < command line), before a grid sets it to its number of points
    asked_n_trials: Optional[int] = None
    # of a grid: the checked config of every point the load checked, by :func:`_config_key` (points that differ only
    # in their replicate seed share one); what :meth:`config` hands a trial (see the module docstring)
    checked: dict[str, DictConfig] = field(default_factory=dict, repr=False, compare=False)
    # whether a conditional param is active at a partial point (:meth:`_active`), as the grid found it
    actives: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    # of a replication (``sweep --replicate``, :mod:`sweeps.spec.replication`): its fresh seeds as the file fixes them,
    # {"seeds": [...], "control_seeds": [...] or None}; None for any other study
    replicate: Optional[dict] = None
    # of a study at F times the budget (``sweep --budget F``, :mod:`sweeps.spec.budget`, a derived study whose
    # ``replicate`` holds its fresh seeds): F, by which every step count of its trials is scaled; None for any other
    factor: Optional[float] = None
    # of a budget-curve study (``sweep --budgets 1,2,4``, :mod:`sweeps.spec.budgets`, a derived study whose
    # ``replicate`` holds its fresh seeds): its factors, each trial a trunk and a cooldown per factor; () for others
    budgets: tuple[float, ...] = ()

    @property
    def name(self) -> str:
        if self.parent is not None:
            return f"{self.parent.name}_control"
        if self.budgets:
            return self.original_name + budgets.SUFFIX
        return self.original_name + (replication.suffix(self.factor) if self.replicate is not None else "")

    @property
    def original_name(self) -> str:
        """The name of the study a derived study derives from (its own name for any other study)."""
        return f"{self.spec.study}_{self.preset}" if self.preset else self.spec.study

    @property
    def original_args(self) -> str:
        """The original's file and preset as a command takes them: ``sweeps/kv_side.yaml --preset cpu``."""
        return f"{self.path}" + (f" --preset {self.preset}" if self.preset else "")

    @property
    def derived_flag(self) -> str:
        """The flag that makes a derived study of the original (``--replicate``, ``--budget 4``); "" for others."""
        if self.replicate is None:
            return ""
        if self.budgets:
            return f"--budgets {','.join(f'{f:g}' for f in self.budgets)}"
        return "--replicate" if self.factor is None else f"--budget {self.factor:g}"

    @property
    def file_args(self) -> str:
        """The study's file and flags as a command takes them: ``sweeps/kv_side.yaml --preset cpu [--replicate]``."""
        return self.original_args + (f" {self.derived_flag}" if self.derived_flag else "")

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
        return self.is_grid and grids.integer_seeds(self.spec.space.get(SEED_PARAM))

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
        return float(DEFAULT_DELTA[metric_kind(metric)]), "default"

    def success(self, metric: str) -> Optional[float]:
        """The success threshold of ``metric``, if the study file gives one."""
        verdict = (self.parent or self).spec.verdict
        return float(verdict.success[metric]) if metric in verdict.success else None

    @property
    def no_context_source(self) -> str:
        """Where the report reads what a model without context reaches: "degraded" or "baseline" (the control's)."""
        control = (self.parent or self).spec.control
        return control.no_context if control is not None else "degraded"

    def context_gain(self, metric: str) -> tuple[float, str]:
        """The context-gain threshold of ``metric`` and where it comes from ("study file" or "default")."""
        verdict = (self.parent or self).spec.verdict
        if metric in verdict.context_gain:
            return float(verdict.context_gain[metric]), "study file"
        return float(DEFAULT_CONTEXT_GAIN[metric_kind(metric)]), "default"

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
        layers = [
            OmegaConf.to_container(self.spec.space[name].choices[value]) if self.is_bundle(name) else {name: value}
            for name, value in params.items()
        ]
        return layers if self.factor is None else [budget.scale_layer(layer, self.factor) for layer in layers]

    def _active(self, name: str, params: dict) -> bool:
        """Whether param ``name`` is active at the partial point ``params`` (its ``when`` met by their config);
        decided once per partial point (the grid's decisions travel with the study to the workers)."""
        when = self.spec.space[name].when
        if not when:
            return True
        key = _point_key({"param": name, "at": params})
        if key not in self.actives:
            flat = flatten(to_container(run_config.merge_run([self.shared, *map(nested, self.param_layers(params))])))
            self.actives[key] = all(flat.get(k) == value for k, value in when.items())
        return self.actives[key]

    def config(self, params: dict, run: Optional[dict] = None) -> DictConfig:
        """The checked RunConfig of a trial: base < overrides < params < ``run`` (run_dir, experiment, resume).

        A point the load checked is neither merged nor checked again: its checked config is copied, the trial's
        seed and ``run`` set on it and checked. Any other point (a sampler's proposal) is merged and checked here."""
        cfg = self._checked_config(params)
        if cfg is None or not set(run or {}) <= set(RUN_KEYS):
            return self.build_config(params, run)
        for key, value in (run or {}).items():
            try:
                cfg[key] = value
            except OmegaConfBaseException as err:
                raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None
            RUN_KEYS[key](value)
        return cfg

    def build_config(self, params: dict, run: Optional[dict] = None) -> DictConfig:
        """A trial's RunConfig merged (base < overrides < params < ``run``) and checked, every rule."""
        cfg = run_config.merge_run([self.shared, *map(nested, self.param_layers(params)), nested(run or {})])
        run_config.check(cfg)
        check_trial_devices(cfg)
        return cfg

    def _checked_config(self, params: dict) -> Optional[DictConfig]:
        """A copy of the checked config of ``params`` (its seed set), or None when the load did not check it."""
        whole = self.checked.get(_config_key(self, params, whole=True))
        if whole is not None:
            return copy.deepcopy(whole)
        shared = self.checked.get(_config_key(self, params))
        if shared is None:
            return None
        run_config.check_seed(params[SEED_PARAM])
        cfg = copy.deepcopy(shared)
        cfg.seed = params[SEED_PARAM]
        return cfg

    def suggest(self, trial: Any) -> dict:
        """Ask an Optuna trial for every active param, in space order.

        A grid's integer seeds are asked as an int range: every grid point is enqueued, and a range keeps
        the param's Optuna distribution compatible when ``--add-seeds`` extends the seeds (Optuna refuses a
        categorical whose choices change within a study)."""
        params: dict = {}
        for name, p in self.spec.space.items():
            if not self._active(name, params):
                continue
            if name == SEED_PARAM and self.int_seeds:
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
        return grids.product(self.spec.space, grids.grid_values, self._active)

    def range_ends(self) -> list[dict]:
        """Like :meth:`grid` with a range reduced to its two ends: what validation of an open space builds."""
        return grids.product(self.spec.space, grids.range_end_values, self._active)

    def with_seeds(self, seeds: Sequence[int]) -> "Study":
        """This study grown by the replicate ``seeds`` (``sweep --add-seeds``; see :mod:`sweeps.spec.schema`): equal
        to ``load_study(path, preset, n_trials, timeout_s, added_seeds=self.added_seeds + seeds)``, derived from
        this loaded study without reading its file again. Its grid and control are derived again; only their new
        points are checked (the others keep their checked configs). Raises :class:`ConfigError` (one line, prefixed
        with the file) where the study cannot grow."""
        if self.parent is not None:
            raise ValueError(f"study {self.name}: a control grows with its study")
        spec = copy.deepcopy(self.spec)
        spec.budget.n_trials = self.asked_n_trials  # as asked, before the grid set it
        grown = dataclasses.replace(
            self,
            spec=spec,
            added_seeds=self.added_seeds + tuple(seeds),
            points=None,
            control=None,
            reused=[],
            checked=dict(self.checked),
            actives=dict(self.actives),
        )
        try:
            grids.add_seeds(spec, seeds)
            _resolve(grown, self.control.checked if self.control is not None else None)
        except ConfigError as err:
            raise ConfigError(f"{_where(self.path, self.preset)}: {err}") from None
        return grown


def load_study(
    path: str | Path,
    preset: Optional[str] = None,
    n_trials: Optional[int] = None,
    timeout_s: Optional[float] = None,
    added_seeds: Sequence[int] = (),
    replicate: bool = False,
    factor: Optional[float] = None,
    curve: Optional[Sequence[float]] = None,
) -> Study:
    """Read, merge (file < preset < command-line budget) and validate a study file.

    ``preset`` None picks ``cpu`` when the file has presets. ``added_seeds``: seeds ``sweep --add-seeds``
    stored on the study, added to its grid and control. ``replicate``: the study's replication on fresh seeds
    (:mod:`sweeps.spec.replication`) instead of the study; ``factor`` (``--budget F``): the study re-asked at F × its
    steps on fresh seeds (:mod:`sweeps.spec.budget`), a derived study like the replication; ``curve`` (``--budgets
    1,2,4``): the study as budget curves on fresh seeds (:mod:`sweeps.spec.budgets`), another derived study. Raises
    :class:`ConfigError` (one line, prefixed with the file) on any problem, including a trial config that would not
    validate.
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
    try:
        if preset is not None and "presets" in presets[preset]:
            raise ConfigError(f"presets.{preset}.presets: a preset cannot hold presets")
        layers = [raw] + ([presets[preset]] if preset else [])
        command_line = {"n_trials": n_trials, "timeout_s": timeout_s}
        layers.append({"budget": {k: v for k, v in command_line.items() if v is not None}})
        factor = budget.check_factor(factor) if factor is not None else None
        if curve is not None and (replicate or factor is not None):
            raise ConfigError(
                "--budgets: a budget curve is a derived study of its own, on its own fresh seeds; it is not run with "
                f"{'--replicate' if replicate else '--budget'}"
            )
        spec = merge(StudySpec, layers)
        derived = replicate or factor is not None or curve is not None
        fresh = _fresh(spec, raw, derived, budgets.SEED_FACTOR if curve is not None else factor, preset, curve)
        if derived:
            replication.as_replicate(spec, fresh)
        if factor is not None:
            budget.scale_pruner(spec.pruner, factor)
        study = _validate(
            path, preset, spec, validation.file_metrics(raw, presets), tuple(added_seeds), tuple(presets), factor
        )
        study.replicate = fresh if derived else None
        if curve is not None:
            _as_curve(study, budgets.parse(curve))
        check_folders(study)
    except ConfigError as err:
        raise ConfigError(f"{_where(path, preset)}: {err}") from None
    return study


# What the lab writes below a study's folder: its control's folder, a trial's run folder, and the longest file a run
# writes there (a TensorBoard events file: events.out.tfevents.<10-digit time>.<hostname, up to 64 bytes>.<pid>.<n>,
# ~110 bytes; checkpoints/last.ckpt), with room to spare; and what `sweep --new-study` appends to a study's folder.
RUN_FILE_BYTES = 160
ASIDE_SUFFIX = ".YYYYmmdd-HHMMSS"


def derived_folders(study: Study) -> list[tuple[str, Path]]:
    """Every folder the lab derives for a study: its own (``<study>_<preset>[_replicate|_x<F>]``, and the name
    ``sweep --new-study`` moves it aside to), its control's (``control/``) and its trial folders at their longest
    (``<arm>/seed=<s>_trial_<n>``: an arm's name of :data:`~foundation.rundir.NAME_LIMIT` characters, a 20-digit seed,
    n up to :data:`MAX_TRIALS`: retried trials take new numbers), each with the key that makes it."""
    out = [("study", study.root), ("study", study.root.with_name(study.root.name + ASIDE_SUFFIX))]
    longest = Path("a" * NAME_LIMIT) / f"seed={10**19}_trial_{MAX_TRIALS}"
    return out + [("study" if s.parent is None else "control", s.root / longest) for s in study.studies]


def check_folders(study: Study) -> None:
    """Each folder :func:`derived_folders` names fits the file system: a name of at most ``NAME_MAX`` bytes, a path
    (its deepest file included) of at most ``PATH_MAX``; else one line naming the study file's key at fault."""
    for key, folder in derived_folders(study):
        name = os.fsencode(folder.name)
        if len(name) > NAME_MAX:
            raise ConfigError(
                f"{key}: the folder name {folder.name[:48]!r}... that the study name makes (with its preset, a derived "
                f"study's suffix, --new-study's time) is {len(name)} bytes, more "
                f"than the {NAME_MAX} a file system allows in one name; shorten study: (or the preset's name)"
            )
        path = len(os.fsencode(str(folder.absolute()))) + 1 + RUN_FILE_BYTES
        if path > PATH_MAX:
            raise ConfigError(
                f"output_dir: the runs of study {study.name} would lie at {path} bytes of path (under "
                f"{str(folder.absolute())[:48]}...), more than the {PATH_MAX} a path may have; shorten output_dir "
                "or study:"
            )


def _as_curve(study: Study, factors: list[float]) -> None:
    """``study`` (and its control) asked as budget curves at ``factors``: every point's config checked as a trunk
    and a cooldown per factor (:func:`sweeps.spec.budgets.check_curve`)."""
    for s in study.studies:
        for params in s.points if s.is_grid else s.range_ends():
            budgets.check_curve(s.config(params), factors)
        s.budgets = budgets.check_factors(factors, s.shared.trainer.max_steps)


def _fresh(
    spec: DictConfig,
    raw: dict,
    derived: bool,
    factor: Optional[float] = None,
    preset: Optional[str] = None,
    curve: Optional[Sequence[float]] = None,
) -> Optional[dict]:
    """A derived study's fresh seeds (the replication's, or at ``factor`` × the budget), checked whenever the study
    is loaded as one or its file gives a ``replicate:`` block (so that ``sweep --check`` finds a bad one); None
    otherwise."""
    block = spec.replicate
    if not derived and block.seeds is None and block.control_seeds is None:
        return None
    original = f"{spec.study}_{preset}" if preset else spec.study
    names = (original, original + (budgets.SUFFIX if curve is not None else replication.suffix(factor)))
    if factor is not None:
        return replication.budget_seeds(spec, replication.file_seeds(raw), factor, names)
    return replication.fresh_seeds(spec, replication.file_seeds(raw), names)


def _where(path: Path, preset: Optional[str]) -> str:
    """How a study file's errors begin: the file, and its preset."""
    return f"{path}" + (f" (preset {preset})" if preset else "")


def _validate(
    path: Path,
    preset: Optional[str],
    spec: DictConfig,
    file_metrics: set[str],
    added_seeds: tuple[int, ...] = (),
    presets: tuple[str, ...] = (),
    factor: Optional[float] = None,
) -> Study:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", spec.study or ""):
        raise ConfigError(f"study: a name of letters, digits, '_' or '-' is required, got {spec.study!r}")
    check_name("study", spec.study)  # (its length: one folder name)
    if not spec.base:
        raise ConfigError("base: the experiment YAML every trial starts from is required")
    base_path = validation.resolve_base(path, spec.base)
    try:
        base = to_container(run_config.load(base_path))
    except ConfigError as err:
        raise ConfigError(f"base {spec.base}: {err}") from None
    validation.check_objective(spec)
    validation.check_verdict(spec, file_metrics)
    if added_seeds:
        grids.add_seeds(spec, added_seeds)
    validation.check_space(spec, set(flatten(base)))
    b = spec.budget
    if b.n_trials is not None:
        check_number("budget.n_trials", b.n_trials, 1, MAX_TRIALS, integer=True)
    if b.timeout_s is not None:
        check_number("budget.timeout_s", b.timeout_s, 0, 365 * 86400, low_open=True)
    try:
        shared = run_config.merge_run([base, nested(dict(spec.overrides))])
        steps = shared.trainer.max_steps  # at ×1
        if factor is not None:  # the recipe at F × its steps (sweeps.spec.budget)
            budget.scale_config(shared, factor)
        study = Study(
            path=path,
            preset=preset,
            spec=spec,
            base_path=base_path,
            base=base,
            shared=shared,
            added_seeds=added_seeds,
            presets=presets,
            asked_n_trials=b.n_trials,
            factor=factor,
        )
        study.build_config({})
    except ConfigError as err:
        raise ConfigError(f"overrides: {err}") from None
    if factor is not None:
        budget.check_changes(steps, factor)
    if spec.ladder is not None:
        check_ladder(spec, study.arms, study.config)
    _resolve(study)
    return study


def _resolve(study: Study, control_checked: Optional[dict[str, DictConfig]] = None) -> None:
    """A study's points and budget (a grid's), every point's config checked (those in ``study.checked`` were), and
    its control (``control_checked``: the checked configs of an earlier control of the study)."""
    configs = {}
    containers: dict[str, Any] = {}
    for params in _samples(study):
        try:
            configs[_checked_identity(study, params, containers)] = params
        except ConfigError as err:
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            raise ConfigError(f"trial with {shown}: {err}") from None
    if not study.is_grid:  # an open study's range ends: its trials' params are the sampler's, checked when proposed
        study.checked.clear()
    if study.spec.control is not None:
        study.control = _control_study(study, configs if study.is_grid else {}, control_checked or {})


def _identity_of(container: Any) -> str:
    """A trial's run config (as plain data) as one string: two trials with the same identity train the same model."""
    return json.dumps(container, sort_keys=True, default=str)


def _point_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _config_key(study: Study, params: dict, whole: bool = False) -> str:
    """Where ``study.checked`` keeps the checked config of ``params``: by the params but their replicate seed
    (``whole``: by all of them, for a config that a later param's bundle gives another seed)."""
    if whole or SEED_PARAM not in params or study.is_bundle(SEED_PARAM):
        return "point " + _point_key(params)
    return "seeds " + _point_key({k: v for k, v in params.items() if k != SEED_PARAM})


def _checked_identity(study: Study, params: dict, containers: dict[str, Any]) -> str:
    """The identity of a trial's config, checked once into ``study.checked``. Trials that differ only in their
    replicate seed differ in no other check, so their config is built and checked once (a config takes about 0.1 s
    to merge, most of a study file's validation) and only the seed itself is checked for the others; a config
    already in ``study.checked`` is not checked again. ``containers``: each checked config as plain data."""
    whole, shared = _config_key(study, params, whole=True), _config_key(study, params)
    if whole in study.checked:
        key = whole
    elif shared in study.checked:
        key = shared
        run_config.check_seed(params[SEED_PARAM])
    else:
        # shared by the seeds of these params unless another param's bundle sets the seed too
        seeded = sum(SEED_PARAM in layer for layer in study.param_layers(params))
        key = shared if seeded == 1 else whole
        study.checked[key] = study.build_config(params)
    if key not in containers:
        containers[key] = OmegaConf.to_container(study.checked[key], resolve=True)
    return _identity_of(containers[key] if key == whole else {**containers[key], "seed": params[SEED_PARAM]})


def _samples(study: Study) -> list[dict]:
    """The trial params whose configs are checked before any trial runs: a grid's every point (its budget set
    from it), an open study's range ends."""
    b = study.spec.budget
    if not study.is_grid:
        if b.n_trials is None and b.timeout_s is None:
            raise ConfigError("budget: an open study needs n_trials or timeout_s")
        return study.range_ends()
    study.points = study.grid()
    if study.added_seeds and b.n_trials is not None and b.n_trials != len(study.points):
        raise ConfigError(
            f"--add-seeds: budget.n_trials={b.n_trials} fixes the number of trials of this grid; "
            f"remove it (a grid runs all its {len(study.points)} points)"
        )
    if b.n_trials is None:
        b.n_trials = len(study.points)
    elif b.n_trials > len(study.points):
        raise ConfigError(f"budget.n_trials={b.n_trials}: the grid has only {len(study.points)} distinct points")
    return study.points


def _control_study(study: Study, study_points: dict[str, dict], checked: dict[str, DictConfig]) -> Study:
    """The control's grid study (:mod:`sweeps.spec.controls`), every point's config checked (``checked``: configs
    an earlier control of the study checked, not checked again); a point whose config is one of ``study_points``
    (config identity -> the study's params) is reused, not run (``reused``)."""
    control = Study(
        path=study.path,
        preset=study.preset,
        spec=control_spec(study.spec, study.added_seeds),
        base_path=study.base_path,
        base=study.base,
        shared=study.shared,
        parent=study,
        added_seeds=study.added_seeds,
        presets=study.presets,
        checked=dict(checked),
        factor=study.factor,
        budgets=study.budgets,
    )
    points = []
    containers: dict[str, Any] = {}
    for params in control.grid():
        try:
            identity = _checked_identity(control, params, containers)
        except ConfigError as err:
            raise ConfigError(f"control.{params[CONTROL_PARAM]}: {err}") from None
        if identity in study_points:
            control.reused.append((params, study_points[identity]))
        else:
            points.append(params)
    control.points = points
    control.spec.budget.n_trials = len(points)
    return control


def shipped_studies() -> list[Path]:
    return sorted(SWEEPS_DIR.glob("*.yaml"))
