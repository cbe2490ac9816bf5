"""What a study found, as numbers: its trials as report rows, every comparison of arms with its verdict, the
success rates, and the control's power check. Computed once per report (:func:`findings`); the renderers
(:mod:`sweeps.report.command` and the sections: :mod:`sweeps.report.power`, :mod:`sweeps.report.comparisons`,
:mod:`sweeps.report.context`, :mod:`sweeps.report.scale`) read it, and nothing here is prose."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from optuna.trial import FrozenTrial, TrialState

from foundation.checked import read_json
from sweeps import stored
from sweeps.report import stats
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


# --------------------------------------------------------------------------------------- comparisons
@dataclass
class Compared:
    """One comparison of the report: a pair of arms on one metric, with its verdict."""

    pair: stats.Pair
    verdict: stats.Verdict
    n_a: int  # replicates with a value, per arm
    n_b: int
    # the half-width of the 95 % interval of A − B that the validation set's sampling alone gives (a bootstrap over
    # validation examples, stats.validation_error); None when a run has no per-example sums (metrics.json)
    validation_error: Optional[float] = None

    @property
    def margin(self) -> float:
        """What the verdict rests on: |A − B| for 'better', δ for 'on par', |A − B| otherwise."""
        return self.pair.delta if self.verdict.kind == stats.ON_PAR else abs(self.pair.comparison.diff)

    @property
    def inside_noise(self) -> bool:
        """The verdict's margin lies inside the validation sampling error."""
        return self.validation_error is not None and self.margin <= self.validation_error


@dataclass
class RatesCompared:
    metric: str
    threshold: float
    a: str
    b: str
    rate_a: stats.Rate
    rate_b: stats.Rate
    p: float  # Boschloo's two-sided p, and Holm-adjusted (a member of the "better" family)
    p_holm: float = math.nan

    @property
    def better(self) -> Optional[str]:
        """The arm that solves the task more often, when Boschloo's test shows it after Holm."""
        if self.p_holm >= stats.ALPHA:
            return None
        return self.a if self.rate_a.k / self.rate_a.n > self.rate_b.k / self.rate_b.n else self.b


@dataclass
class Findings:
    arms: list[str]
    own: list[str]  # the study's own arms (not the control's), in order
    values: dict  # (arm, metric) -> {replicate: value}
    compared: list[Compared]
    rates: list[RatesCompared]
    power: Optional[stats.PowerCheck] = None  # the control's check; None: no control, or not run yet
    context: Optional["ContextGain"] = None  # the reference's context gain; None: no control, or not run yet
    # each own arm's gain over the same model without context (first objective); {}: no control, or not run yet
    arm_context: dict = field(default_factory=dict)
    # pairs left without a verdict on a metric a model without context has a level on, because neither arm
    # demonstrably uses its context (ContextGain.uses_context): (a, b, metric)
    blind: list = field(default_factory=list)

    @property
    def informative(self) -> bool:
        """False when the reference did not learn to use context: then the report gives no verdict."""
        return self.context is None or self.context.informative

    def family(self) -> tuple[int, int]:
        """(size of the "better" family, size of the "on par" family)."""
        return len(self.compared) + len(self.rates), sum(c.pair.may_be_on_par for c in self.compared)

    def of(self, metric: str) -> list[Compared]:
        """The comparisons on ``metric``."""
        return [c for c in self.compared if c.pair.metric == metric]

    def blind_on(self, metric: str) -> list[tuple[str, str]]:
        """The pairs left without a verdict on ``metric`` because neither arm demonstrably uses its context."""
        return [(a, b) for a, b, m in self.blind if m == metric]


def compared_pairs(study: Study, rows: list[Row], arms: list[str]) -> list[tuple[str, str]]:
    """The pairs of the study's own arms a report compares: every pair, except arms that differ in a param of
    ``verdict.within`` or, on a ladder, in their rung (a 37k-parameter model against a 344k one answers no
    question of the study). The control's arms are in none: they certify the study (its power check and context
    gain), outside both Holm families."""
    pairs = list(itertools.combinations(arms, 2))
    shared = list((study.parent or study).spec.verdict.within) + (
        [study.ladder.rung] if study.ladder is not None else []
    )
    if not shared:
        return pairs
    key = {r.arm: tuple(r.trial.params.get(p) for p in shared) for r in rows if not r.role}
    return [(a, b) for a, b in pairs if key[a] == key[b]]


def _pairs(study: Study, rows: list[Row], arms: list[str], values: dict, blind: set) -> tuple[list, list, list]:
    """Every pair of the study's own arms on every objective metric, with success rates where the study sets a
    threshold; and the pairs left out. On a metric a model without context has a level on (a loss, an accuracy),
    two arms of ``blind`` (neither demonstrably uses its context) compare models that ignore their input: no
    verdict; one arm of ``blind`` against one that uses its context may be "better", never "on par"."""
    pairs, rates, left = [], [], []
    for metric, direction in zip(study.metrics, study.directions):
        delta, _ = study.delta(metric)
        threshold = study.success(metric)
        context_level = metric == study.metrics[0] or trivial_key(metric) is not None
        for a, b in compared_pairs(study, rows, arms):
            if a in blind and b in blind and context_level:
                left.append((a, b, metric))
                continue
            va, vb = values[(a, metric)], values[(b, metric)]
            one_blind = context_level and (a in blind or b in blind)
            pair = stats.Pair(a, b, metric, direction, delta, stats.compare(va, vb), may_be_on_par=not one_blind)
            pairs.append((pair, len(va), len(vb)))
            if threshold is not None:
                ra, rb = (stats.success_rate(list(v.values()), threshold, direction) for v in (va, vb))
                rates.append(RatesCompared(metric, threshold, a, b, ra, rb, stats.compare_rates(ra, rb)))
    return pairs, rates, left


def findings(study: Study, rows: list[Row], control_rows: list[Row] = ()) -> Findings:
    """Every pair of arms on every objective metric, judged together (Holm over the report's tests), and the
    control's power check."""
    rows = list(rows) + list(control_rows)
    arms = list(dict.fromkeys(r.arm for r in rows))
    own = {r.arm for r in rows if not r.role}
    values = {
        (arm, m): {r.replicate: v for r in rows if r.arm == arm and (v := value(r, m, study)) is not None}
        for arm in arms
        for m in study.metrics
    }
    own_arms = [a for a in arms if a in own]
    context = context_of(study, list(control_rows)) if study.control is not None else None
    arm_context = _arm_context(study, rows, own_arms, values, list(control_rows)) if context is not None else {}
    blind = {arm for arm, gain in arm_context.items() if not gain.uses_context}
    pairs, rates, left = _pairs(study, rows, own_arms, values, blind)
    verdicts, rate_p = stats.judge([p for p, *_ in pairs], [r.p for r in rates])
    for r, p in zip(rates, rate_p):
        r.p_holm = p
    compared = [Compared(pair, v, n_a, n_b) for (pair, n_a, n_b), v in zip(pairs, verdicts)]
    _validation_errors(compared, [r for r in rows if not r.role])
    power = power_of(study, list(control_rows)) if study.control is not None else None
    return Findings(arms, own_arms, values, compared, rates, power, context, arm_context, left)


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


def run_examples(r: Row, metric: str) -> Optional[tuple[list, list]]:
    """(sum, count) per validation example of ``metric`` from the run's metrics.json ``validation_examples``."""
    entry = (run_metrics(r).get("validation_examples") or {}).get(metric.removeprefix("val/"))
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("sum"), list)
        or not isinstance(entry.get("count"), list)
    ):
        return None
    return (entry["sum"], entry["count"]) if len(entry["sum"]) == len(entry["count"]) > 0 else None


def _validation_errors(compared: list[Compared], rows: list[Row]) -> None:
    """Each comparison's validation sampling error, where every complete run of both arms has the same examples."""
    cache: dict = {}
    for c in compared:
        runs = {}
        for arm in (c.pair.a, c.pair.b):
            mine = [r for r in rows if r.arm == arm and r.complete]
            runs[arm] = [cache.setdefault((id(r), c.pair.metric), run_examples(r, c.pair.metric)) for r in mine]
        found = [e for v in runs.values() for e in v]
        if not all(runs.values()) or any(e is None for e in found) or len({len(e[0]) for e in found}) != 1:
            continue
        c.validation_error = stats.validation_error(runs[c.pair.a], runs[c.pair.b])


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


def _arm_context(study: Study, rows: list[Row], arms: list[str], values: dict, control_rows: list[Row]) -> dict:
    """{arm: its ContextGain} for the study's own arms that have one: the same rule as the reference's."""
    out = {}
    for arm in arms:
        mine = [r for r in rows if r.arm == arm and not r.role]
        gain = _gain(study, values[(arm, study.metrics[0])], _no_context(study, mine, control_rows))
        if gain is not None:
            out[arm] = gain
    return out


def curve_of(row: Row) -> Optional[list[tuple[float, float, float]]]:
    """A trial's validation curve, ``[seconds, tokens, val ppl]`` per validation (its run's metrics.json
    ``ppl_vs_wallclock``, :mod:`training.curves`); None where its run directory holds none."""
    run_dir = row.trial.user_attrs.get("run_dir")
    path = Path(run_dir) / "metrics.json" if run_dir else None
    if path is None or not path.is_file():
        return None
    curve = read_json(path).get("ppl_vs_wallclock") or []
    return [tuple(float(v) for v in point) for point in curve] or None
