"""The schema of a study file (``sweeps/*.yaml``): its keys as typed dataclasses, and the constants they share.

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

``control`` certifies that the study's reference arm uses its context: its ``reference`` is the study's
baseline arm, its ``degraded`` arm a model that cannot use context (``model.attention.kind: no_context``, each
position sees only itself), run at every seed beside the study's own trials. It is a companion grid study,
``<study>_<preset>_control`` under ``<study dir>/control/``, so that it never feeds the main study's sampler,
pruner or budget. A control point whose config is one of the study's own grid points (the reference arm is
usually one of the study's arms) is not run again: the report reuses the study's trial. ``no_context`` says
where the report reads what a model without context reaches: ``degraded`` (the degraded arm's runs) or
``baseline`` (the no-context baseline of the reference's runs, metrics.json ``baselines`` ``unigram/<metric>``,
else ``trivial_loss`` / ``trivial_accuracy``: for a task where a model without context provably sits at chance,
e.g. associative recall, whose degraded arm is then any contrast known to be worse). The report opens with the
reference's context gain, no-context − reference on the first objective (in the direction that favours the
reference), with its 95 % CI over seeds; below the study's threshold, or with a CI that holds 0, it gives no
verdict: the reference did not learn to use context.

``verdict`` says what the report's verdicts (:mod:`sweeps.spec.stats`, docs/verdicts.md) need per objective
metric: ``delta``, the margin δ within which two arms are "on par" (default by the metric's name,
:data:`DEFAULT_DELTA`; a metric with no default must be given one), ``success``, a threshold past
which a run counts as having solved the task (the report then gives success rates per arm), and
``context_gain``, the smallest context gain of the reference that makes the study informative (default by the
metric's name, :data:`DEFAULT_CONTEXT_GAIN`).

``ladder`` makes the study a model-size ladder (docs/scale.md): ``rung`` names the space param whose choices
are the model sizes, smallest first, and ``reference`` the values of the other arm params that make the arm
every other arm is measured against at each rung (``{arm: full}``). Arms are then compared only within a
rung, and the report adds the gap to the reference per rung against parameters and training FLOPs, its
trend over size, and the reference's attention spectrum across sizes (:mod:`sweeps.report.scale`).

``replicate`` fixes the fresh seeds of ``linformer-lab sweep --replicate`` (:mod:`sweeps.spec.replication`): the study's
arms run again on seeds disjoint from every seed the design saw, as a study of its own stored beside the original
(``<study>_<preset>_replicate``), whose report says of each verdict of the original whether the fresh seeds replicate,
leave undecided or contradict it. ``sweep --budget F`` (:mod:`sweeps.spec.budget`) re-asks the study at F × its steps on
other fresh seeds, ``<study>_<preset>_x<F>``; both are derived studies, whose seeds no other study of the family holds.

``linformer-lab sweep --add-seeds N`` adds replicate seeds to a grid study and its control; they are
stored on the study (user attr ``added_seeds``) and passed back here as ``added_seeds``, which extends
the ``seed`` choices (and the control's seeds) so that every later ``sweep`` and ``report`` sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
SWEEPS_DIR = Path(__file__).resolve().parents[1]
SPAWN_STRATEGIES = ("ddp_spawn", "ddp_fork", "ddp_notebook")
SCALAR = (str, int, float, bool, type(None))
CONTROL_PARAM = "control"
DEFAULT_CONTROL_SEEDS = [0, 1, 2]
MAX_TRIALS = 1_000_000
SEED_PARAM = "seed"  # the replicate param that `sweep --add-seeds` extends
REPLICATE_SUFFIX = "_replicate"  # a replication's study name: <study>_<preset>_replicate
ADDED_SEEDS = "added_seeds"  # user attr of a stored study: the seeds `sweep --add-seeds` added, in order
# The equivalence margin δ of a metric that a study file gives none, by the end of its name: 0.01 nats of a
# loss, half an accuracy point of an accuracy in [0, 1]. Any other metric needs verdict.delta.<metric>.
DEFAULT_DELTA = {"loss": 0.01, "accuracy": 0.005}
# The context gain (no-context − reference, in the reference's favour) a study's reference must reach for its
# verdicts to mean anything, by the end of the metric's name: half a nat of a loss, ten accuracy points.
DEFAULT_CONTEXT_GAIN = {"loss": 0.5, "accuracy": 0.1}
NO_CONTEXT_SOURCES = ("degraded", "baseline")  # control.no_context


def metric_kind(metric: str) -> Optional[str]:
    """The DEFAULT_DELTA entry that applies to ``metric`` by the end of its name; None: no default."""
    return next((kind for kind in DEFAULT_DELTA if metric.endswith(kind)), None)


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
    degraded: Dict[str, Any] = field(default_factory=dict)  # a model that cannot use context (or known worse)
    # Seeds of the control trials; null: the study's `seed` choices, else [0, 1, 2].
    seeds: Optional[List[int]] = None
    # What a model without context reaches: the degraded arm's runs, or the reference runs' no-context baseline.
    no_context: str = "degraded"


@dataclass
class VerdictSpec:
    # Per objective metric, the margin δ (in the metric's units) within which two arms count as "on par"
    # (equivalence test); a metric missing here gets DEFAULT_DELTA by its name, or must be given.
    delta: Dict[str, float] = field(default_factory=dict)
    # Per objective metric, the value at or beyond which (in the objective's direction) a run solved the
    # task: the report gives each arm's success rate and compares the rates (for outcomes that split into
    # solved and stuck runs, e.g. recall at ~1 or on a plateau).
    success: Dict[str, float] = field(default_factory=dict)
    # Per objective metric, the context gain of the reference below which the report gives no verdict; a metric
    # missing here gets DEFAULT_CONTEXT_GAIN by its name (the first objective of a study with a control must have one).
    context_gain: Dict[str, float] = field(default_factory=dict)
    # Arm params whose values two compared arms must share (e.g. [data.mqar.n_pairs]: each kind against the others
    # at the same task size, not a kind at N = 4 against another at N = 8); [] compares every pair of arms.
    within: List[str] = field(default_factory=list)


@dataclass
class LadderSpec:
    # The space param whose choices are the model sizes (rungs), smallest first: usually a free label,
    # rung name -> {model.n_layers: ..., model.d_model: ..., model.n_heads: ..., trainer.max_steps: ...}.
    rung: str = ""
    # The arm every gap is taken against, by the values of the other arm params: {arm: full}.
    reference: Dict[str, Any] = field(default_factory=dict)
    # What the gap's trend is read against: "parameters" (and training FLOPs), or "n_over_k": the sequence length over
    # the compared arm's k at each rung (a ladder of lengths at fixed k, the paper's Fig. 3d).
    axis: str = "parameters"
    # The published answer to the ladder's question, stated beside the lab's in the report (one sentence).
    claim: Optional[str] = None


@dataclass
class ReplicateSpec:
    # The fresh seeds of `sweep --replicate`, fixed before it runs, disjoint from every seed the design saw (the
    # study's, its control's, those `--add-seeds` stored). null: as many as the study has, from the first multiple
    # of 100 above every seed of the design (seeds 0-4 -> 100-104).
    seeds: Optional[List[int]] = None
    # The control's fresh seeds; null: as many as the control has, from the same start. More than the design's where the
    # reference's exit from the no-context level depends on the seed.
    control_seeds: Optional[List[int]] = None
    # How many fresh seeds per arm (and for the control) the study asks at a larger budget (`sweep --budget F`),
    # chosen from the x1 study's spread (its report's seeds-needed plan): a verdict whose effect is many times its
    # spread needs fewer seeds than its replication. null: as many as the replication's.
    budget_seeds: Optional[int] = None
    budget_control_seeds: Optional[int] = None


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
    replicate: ReplicateSpec = field(default_factory=ReplicateSpec)  # `sweep --replicate` (see the module docstring)
    presets: Dict[str, Any] = field(default_factory=dict)
