"""The control's judgement, from the trials its storage holds: the reference's context gain over a model without
context and the power check of the control's contrast (:func:`sweeps.spec.stats.power_check`). One home for the
rule the report phrases (:mod:`sweeps.report.context`, :mod:`sweeps.report.power`) and the sweep's gate applies
before the arms (:mod:`sweeps.run.gate`): the reference is *informative* when its gain reaches the study's
``verdict.context_gain`` with a 95 % CI above 0 (:attr:`ContextGain.informative`), and the control *has power*
when the reference leaves the trivial baseline and beats its degraded arm beyond the seed spread
(:attr:`~sweeps.spec.stats.PowerCheck.has_power`). Also the rows of trials (each with its arm and replicate) that
both read."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweeps import stored
from sweeps.spec import budgets, stats
from sweeps.spec.schema import CONTROL_PARAM
from sweeps.spec.study import Study

ROLES = ("reference", "degraded")  # the control's two arms


@dataclass
class Row:
    trial: FrozenTrial
    arm: str  # "learned" or "k=32 share=none"; "" when the study has no arms
    replicate: tuple  # the values of the non-arm params (e.g. (seed,))
    role: str = ""  # control trials: "reference" or "degraded"
    reused: bool = False  # a control row that is one of the study's own trials (trained once, by the study)

    @property
    def metrics(self) -> dict:
        return self.trial.user_attrs.get("metrics", {})

    @property
    def complete(self) -> bool:
        return self.trial.state == TrialState.COMPLETE


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def control_label(study: Study, role: str) -> str:
    """``control reference (kind=full)``: a control arm named by its role and what it sets."""
    bundle = study.spec.space[CONTROL_PARAM].choices[role]
    return f"control {role} ({' '.join(f'{_short(k)}={v}' for k, v in bundle.items())})"


def rows_of(study: Study, trials: list[FrozenTrial]) -> list[Row]:
    """Trials that count (retried and discarded ones left out), with their arm and replicate."""
    excluded = stored.excluded_numbers(trials)
    rows = []
    for t in trials:
        if t.number in excluded or t.state in (TrialState.WAITING, TrialState.RUNNING):
            continue
        replicate = tuple(v for p, v in t.params.items() if p not in study.arms)
        if study.parent is not None:
            role = t.params[CONTROL_PARAM]
            rows.append(Row(t, control_label(study, role), replicate, role))
            continue
        rows.append(Row(t, study.arm_label(t.params), replicate))
    return rows


def reused_rows(study: Study, rows: list[Row]) -> list[Row]:
    """The control's points that are the study's own trials (:attr:`Study.reused`), as control rows."""
    control = study.control
    if control is None:
        return []
    by_params = {tuple(sorted(r.trial.params.items())): r for r in rows if not r.role}
    out = []
    for params, own in control.reused:
        r = by_params.get(tuple(sorted(own.items())))
        if r is not None:
            role = params[CONTROL_PARAM]
            replicate = tuple(v for p, v in params.items() if p not in control.arms)
            out.append(Row(r.trial, control_label(control, role), replicate, role, reused=True))
    return out


def value(r: Row, metric: str, study: Study) -> Optional[float]:
    """The trial's value of ``metric`` (an objective, or any number of its metrics.json); None if not complete."""
    if not r.complete:
        return None
    if metric in study.metrics:
        return r.trial.values[study.metrics.index(metric)]
    return r.metrics.get(metric)


def trivial_key(metric: str) -> Optional[str]:
    """The metrics.json entry holding the trivial baseline of ``metric`` (val/loss -> trivial_loss)."""
    for suffix in ("loss", "accuracy"):
        if metric.endswith(suffix):
            return f"trivial_{suffix}"
    return None


def control_values(study: Study, control_rows: list[Row]) -> tuple[dict, dict]:
    """({role: {replicate: value}}, {replicate: no-context baseline of the reference's run}) of the control on
    the first objective (the baseline: :func:`no_context_key`)."""
    metric = study.metrics[0]
    by_role: dict[str, dict] = {role: {} for role in ROLES}
    for r in control_rows:
        if (v := value(r, metric, study)) is not None:
            by_role[r.role][r.replicate] = v
    return by_role, baseline_values([r for r in control_rows if r.role == "reference"], metric)


def power_of(study: Study, control_rows: list[Row]) -> Optional[stats.PowerCheck]:
    """The control's power check on the first objective; None while an arm has fewer than 2 complete trials."""
    by_role, trivial = control_values(study, control_rows)
    if any(len(v) < 2 for v in by_role.values()):
        return None
    return stats.power_check(by_role["reference"], by_role["degraded"], trivial, study.directions[0])


# --------------------------------------------------------------------------------------- context gain
@dataclass(frozen=True)
class ContextGain:
    """The reference's gain over a model without context on ``metric``, in the reference's favour (> 0: the
    reference is better), paired over seeds where it can be, with its 95 % CI."""

    metric: str
    threshold: float  # the study's verdict.context_gain (or its default): the reference's bar (the study's power)
    floor: float  # δ of the metric: an arm uses its context when its gain's CI lies above it (verdicts per pair)
    source: str  # where the no-context values come from: "degraded" or "baseline"
    comparison: stats.Comparison  # no-context − reference (minimised metric), reference − no-context (maximised)
    reference_mean: float
    no_context_mean: float

    @property
    def gain(self) -> float:
        return self.comparison.diff

    @property
    def informative(self) -> bool:
        """At least the threshold, with a 95 % CI that excludes 0 (on the reference's side)."""
        lo, _ = self.comparison.ci()
        return self.comparison.judged and self.gain >= self.threshold and lo > 0

    @property
    def uses_context(self) -> bool:
        """The model demonstrably uses its context: the 95 % CI of its gain lies above δ, the margin within which
        the study calls two models on par (a gain inside it cannot be told from no gain at the study's
        resolution)."""
        lo, _ = self.comparison.ci()
        return self.comparison.judged and lo > self.floor


def no_context_key(metric: str, metrics: dict) -> Optional[str]:
    """The metrics.json number a model without context reaches on ``metric``: the unigram baseline on the same
    targets (``baselines/unigram/<name>``, flattened), else the trivial baseline."""
    unigram = f"baselines/unigram/{metric.removeprefix('val/')}"
    return unigram if unigram in metrics else trivial_key(metric)


def baseline_values(rows: list[Row], metric: str) -> dict:
    """{replicate: no-context baseline} of these rows' complete runs that recorded one."""
    out = {}
    for r in rows:
        metrics = {**r.metrics, **run_baselines(r)}
        if r.complete and (key := no_context_key(metric, metrics)) in metrics:
            out[r.replicate] = float(metrics[key])
    return out


def run_baselines(r: Row) -> dict:
    """``baselines`` of the run's metrics.json, flattened (``baselines/unigram/masked_loss``); {} when absent."""
    baselines = run_metrics(r).get("baselines")
    if not isinstance(baselines, dict):
        return {}
    return {f"baselines/{k}": float(v) for k, v in baselines.items() if isinstance(v, (int, float))}


def run_metrics(r: Row) -> dict:
    """The run's metrics.json, when its run directory is on this machine ({} otherwise)."""
    run_dir = r.trial.user_attrs.get("run_dir")
    path = Path(run_dir) / "metrics.json" if run_dir else None
    if path is None or not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def gain_order(direction: str, model: Any, no_context: Any) -> tuple[Any, Any]:
    """(a, b) such that a − b is the model's gain over the model without context: no_context − model on a
    minimised metric, model − no_context on a maximised one."""
    return (no_context, model) if direction == "minimize" else (model, no_context)


def _gain(study: Study, model: dict, no_context: dict) -> Optional[ContextGain]:
    """A model's gain over the no-context values on the first objective ({replicate: value} each, paired where
    the replicates match); None while either side has fewer than 2 values."""
    metric, direction = study.metrics[0], study.directions[0]
    if len(model) < 2 or len(no_context) < 2:
        return None
    pair = gain_order(direction, model, no_context)
    threshold, _ = study.context_gain(metric)
    means = [stats.summarize(list(v.values())).mean for v in (model, no_context)]
    return ContextGain(metric, threshold, study.delta(metric)[0], study.no_context_source, stats.compare(*pair), *means)


def _no_context(study: Study, rows: list[Row], control_rows: list[Row]) -> dict:
    """{replicate: value} of a model without context beside ``rows``: the control's degraded arm, or the
    baseline these rows' runs recorded (``control.no_context: baseline``)."""
    if study.no_context_source == "baseline":
        return baseline_values(rows, study.metrics[0])
    return control_values(study, control_rows)[0]["degraded"]


def context_of(study: Study, control_rows: list[Row]) -> Optional[ContextGain]:
    """The reference's context gain on the first objective (see :mod:`sweeps.spec.schema`); None while there are
    fewer than 2 replicates to judge it by."""
    reference = [r for r in control_rows if r.role == "reference"]
    return _gain(
        study, control_values(study, control_rows)[0]["reference"], _no_context(study, reference, control_rows)
    )


def certifies(study: Study, control_rows: list[Row]) -> bool:
    """The control's rule, the gate's and the report's: the reference is informative (its context gain reaches the
    study's bar, CI above 0) and the control has power (the reference beats its degraded arm beyond the seed
    spread). False while either cannot be judged yet."""
    return certified(context_of(study, control_rows), power_of(study, control_rows))


def certified(gain: Optional[ContextGain], power: Optional[stats.PowerCheck]) -> bool:
    """The rule of :func:`certifies`, on a context gain and a power check already taken."""
    return gain is not None and gain.informative and power is not None and power.has_power


# --------------------------------------------------------------------------------------- budget curves
def at_budget(study: Study, rows: Sequence[Row], factor: float) -> list[Row]:
    """The rows of a budget-curve study as they read at one budget: each trial's values and metrics its cooldown's
    at ``factor`` (:data:`sweeps.spec.budgets.POINTS`; a trial without that point is left out)."""
    name, out = budgets.name(factor), []
    for r in rows:
        point = stored.points_of(r.trial).get(name)
        if point is None or any(m not in point for m in study.metrics):
            continue
        trial: FrozenTrial = copy.copy(r.trial)
        trial.values = [float(point[m]) for m in study.metrics]
        where = r.trial.user_attrs.get(budgets.CURVE_DIR)
        cooldown = {"run_dir": str(Path(where) / f"cooldown_{name}")} if where else {}
        trial.user_attrs = {**r.trial.user_attrs, "metrics": dict(point), **cooldown}
        out.append(Row(trial, r.arm, r.replicate, r.role, r.reused))
    return out


def certified_budgets(study: Study, control_rows: Sequence[Row]) -> tuple[float, ...]:
    """The budgets of a curve study at which its control :func:`certifies` (judged on the control's cooldown points
    there): a verdict at any other budget is uninformative. A degraded arm that learns with budget (a k too small
    at ×1 that catches up by ×8) certifies the small budgets only."""
    return tuple(f for f in study.budgets if certifies(study, at_budget(study.control, control_rows, f)))


# --------------------------------------------------------------------------------------- importance over the arms
@dataclass
class ArmImportance:
    """What the arm params of a study (its control's role for a control) explain of one objective's spread, seeds
    left out (a seed is a replicate, not a hyper-parameter): ``importances`` of the params that explain something
    beyond the seed spread (each one's share of the spread they explain: its between-values sum of squares over
    theirs), and ``p_values`` of every varying arm
    param (:func:`sweeps.spec.stats.blocked_p`: the objective by the param's values, each seed's own level taken
    out)."""

    importances: dict[str, float]
    p_values: dict[str, float]

    @property
    def nothing(self) -> list[str]:
        """The varying arm params that explain nothing beyond the seed spread."""
        return [p for p in self.p_values if p not in self.importances]

    def words(self) -> str:
        """``projection (p = 0.41) explains nothing beyond the seed spread (ANOVA over the values, seeds as
        blocks)``."""
        said = [f"{_short(p)} (p = {self.p_values[p]:.2g})" for p in self.nothing]
        if not said:
            return ""
        verb = "explains" if len(said) == 1 else "explain"
        return f"{' and '.join(said)} {verb} nothing beyond the seed spread (ANOVA over the values, seeds as blocks)"


def arm_params(study: Study) -> list[str]:
    """The params a study's importance is over: its arms (a control's: its role), never the seed."""
    return [CONTROL_PARAM] if study.parent is not None else [p for p in study.arms if p != "seed"]


def arm_importance(study: Study, trials: list[FrozenTrial], objective: int = 0) -> ArmImportance:
    """:class:`ArmImportance` of objective number ``objective`` over the complete counted ``trials``."""
    excluded = stored.excluded_numbers(trials)
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.number not in excluded]
    p_values, spread = {}, {}
    for p in arm_params(study):
        # each trial by the param's value and its replicate (its other params: the seed, the other arms)
        cells = {
            (repr(t.params[p]), repr(sorted((k, v) for k, v in t.params.items() if k != p))): t.values[objective]
            for t in done
            if p in t.params
        }
        if len({g for g, _ in cells}) >= 2:
            p_values[p], spread[p] = stats.blocked_p(cells), stats.between_ss(cells)
    explaining = {p: spread[p] for p, pv in p_values.items() if pv < stats.ALPHA}  # beyond the seed spread
    total = sum(explaining.values())
    return ArmImportance(
        {p: v / total if total > 0 else 1.0 / len(explaining) for p, v in explaining.items()}, p_values
    )
