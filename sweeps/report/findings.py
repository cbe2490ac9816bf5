"""What a study found, as numbers: its trials as report rows, every comparison of arms with its verdict, the
success rates, and the control's power check. Computed once per report (:func:`findings`); the renderers
(:mod:`sweeps.report.command` and the sections: :mod:`sweeps.report.power`, :mod:`sweeps.report.comparisons`,
:mod:`sweeps.report.context`, :mod:`sweeps.report.scale`) read it, and nothing here is prose."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from foundation.checked import read_json
from sweeps.control import (
    ContextGain,
    Row,
    _gain,
    _no_context,
    context_of,
    power_of,
    run_metrics,
    trivial_key,
    value,
)
from sweeps.spec import stats
from sweeps.spec.study import Study


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
