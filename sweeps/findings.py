"""What a study found, as numbers: its trials as report rows, every comparison of arms with its verdict, the
success rates, and the control's power check. Computed once per report (:func:`findings`); the renderers
(:mod:`sweeps.report`, :mod:`sweeps.scale`) and :mod:`sweeps.words` read it, and nothing here is prose."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional

from optuna.trial import FrozenTrial, TrialState

from sweeps import stats, storage
from sweeps.schema import CONTROL_PARAM
from sweeps.study import Study

ROLES = ("reference", "degraded")  # the control's two arms


@dataclass
class Row:
    trial: FrozenTrial
    arm: str  # "learned" or "k=32 share=none"; "" when the study has no arms
    replicate: tuple  # the values of the non-arm params (e.g. (seed,))
    role: str = ""  # control trials: "reference" or "degraded"

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
    excluded = storage.excluded_numbers(trials)
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
    own: bool  # both arms are the study's own (not the control's)


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

    def family(self) -> tuple[int, int]:
        """(size of the "better" family, size of the "on par" family)."""
        return len(self.compared) + len(self.rates), len(self.compared)

    def of(self, metric: str, own: bool = False) -> list[Compared]:
        """The comparisons on ``metric`` (only the study's own pairs with ``own``)."""
        return [c for c in self.compared if c.pair.metric == metric and (c.own or not own)]


def compared_pairs(study: Study, rows: list[Row], arms: list[str]) -> list[tuple[str, str]]:
    """The pairs of arms a report compares: every pair; on a ladder, only the study's own arms at the same rung,
    and the control's two arms (a 37k-parameter model against a 344k one answers no question of the study)."""
    pairs = list(itertools.combinations(arms, 2))
    if study.ladder is None:
        return pairs
    rung = {r.arm: (bool(r.role), r.trial.params.get(study.ladder.rung)) for r in rows}
    return [(a, b) for a, b in pairs if rung[a] == rung[b]]


def _pairs(study: Study, rows: list[Row], arms: list[str], values: dict, own: set) -> tuple[list, list]:
    """Every pair of arms on every objective metric, with success rates where the study sets a threshold."""
    pairs, rates = [], []
    for metric, direction in zip(study.metrics, study.directions):
        delta, _ = study.delta(metric)
        threshold = study.success(metric)
        for a, b in compared_pairs(study, rows, arms):
            va, vb = values[(a, metric)], values[(b, metric)]
            pair = stats.Pair(a, b, metric, direction, delta, stats.compare(va, vb))
            pairs.append((pair, len(va), len(vb), a in own and b in own))
            if threshold is not None:
                ra, rb = (stats.success_rate(list(v.values()), threshold, direction) for v in (va, vb))
                rates.append(RatesCompared(metric, threshold, a, b, ra, rb, stats.compare_rates(ra, rb)))
    return pairs, rates


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
    pairs, rates = _pairs(study, rows, arms, values, own)
    verdicts, rate_p = stats.judge([p for p, *_ in pairs], [r.p for r in rates])
    for r, p in zip(rates, rate_p):
        r.p_holm = p
    compared = [Compared(pair, v, n_a, n_b, own_pair) for (pair, n_a, n_b, own_pair), v in zip(pairs, verdicts)]
    power = power_of(study, list(control_rows)) if study.control is not None else None
    return Findings(arms, [a for a in arms if a in own], values, compared, rates, power)


def control_values(study: Study, control_rows: list[Row]) -> tuple[dict, dict]:
    """({role: {replicate: value}}, {replicate: trivial baseline}) of the control on the first objective."""
    metric = study.metrics[0]
    by_role: dict[str, dict] = {role: {} for role in ROLES}
    trivial: dict = {}
    key = trivial_key(metric)
    for r in control_rows:
        if (v := value(r, metric, study)) is not None:
            by_role[r.role][r.replicate] = v
            if r.role == "reference" and key in r.metrics:
                trivial[r.replicate] = r.metrics[key]
    return by_role, trivial


def power_of(study: Study, control_rows: list[Row]) -> Optional[stats.PowerCheck]:
    """The control's power check on the first objective; None while an arm has fewer than 2 complete trials."""
    by_role, trivial = control_values(study, control_rows)
    if any(len(v) < 2 for v in by_role.values()):
        return None
    return stats.power_check(by_role["reference"], by_role["degraded"], trivial, study.directions[0])
