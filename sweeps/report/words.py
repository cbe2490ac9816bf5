"""Every verdict of a report in words: one place phrases what :mod:`sweeps.report.stats` and
:mod:`sweeps.report.findings` computed (docs/verdicts.md), for the tables, the answer and the control's power check."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from sweeps.report import stats
from sweeps.report.findings import Compared, ContextGain, RatesCompared

PCT = f"{stats.POWER * 100:.0f} %"


def fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.3g}"


def fmt_p(p: float) -> str:
    return "-" if not math.isfinite(p) else "< 0.001" if p < 0.001 else f"{p:.2g}"


def p_is(p: float) -> str:
    """``p < 0.001`` or ``p = 0.03``."""
    text = fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def interval(lo: float, hi: float) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def signed(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.3g}"


def signed_interval(lo: float, hi: float) -> str:
    return "-" if not math.isfinite(lo) else f"[{signed(lo)}, {signed(hi)}]"


def si(x: Optional[float]) -> str:
    """37300 -> 37.3k, 9.2e7 -> 92M, 1.2e15 -> 1.2P."""
    if x is None or not math.isfinite(x):
        return "-"
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10**power:
            return f"{x / 10**power:.3g}{prefix}"
    return f"{x:.3g}"


def table(header: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def at_or_beyond(direction: str) -> str:
    return "≥" if direction == "maximize" else "≤"


def mean_std(values: Sequence[float]) -> str:
    s = stats.summarize(values)
    return "-" if s.n == 0 else fmt(s.mean) if s.n == 1 else f"{fmt(s.mean)} ± {fmt(s.std)}"


def seeds(c: Compared) -> str:
    return f"{c.n_a} seeds each" if c.n_a == c.n_b else f"{c.n_a} and {c.n_b} seeds"


# --------------------------------------------------------------------------------------- one verdict
def plan(v: stats.Verdict, c: stats.Comparison, delta: float) -> str:
    """What seeds per arm each verdict would need, in words."""

    def count(n: Optional[int], missing: str) -> str:
        return missing if n is None else f"needs {n} seeds per arm ({v.more(n)} more)"

    over = f"needs over {stats.MAX_SEEDS} seeds per arm"
    better = count(v.seeds_better, "cannot be planned: no difference observed" if c.diff == 0 else over)
    par = count(v.seeds_on_par, f"is out of reach: |A − B| = {fmt(abs(c.diff))} ≥ δ" if abs(c.diff) >= delta else over)
    return f"'better' {better}; 'on par' {par}; at {PCT} power"


def verdict(pair: stats.Pair, v: stats.Verdict) -> str:
    """The verdict of a table row: 'A better than B by …', 'on par within ±δ (…)' or 'undecided: …'."""
    c = pair.comparison
    if v.kind == stats.ON_PAR:
        text = f"on par within ±{fmt(pair.delta)} (90 % CI of A − B {interval(*c.ci(1 - 2 * stats.ALPHA))})"
        if v.p_holm < stats.ALPHA:
            text += f"; {pair.gain().better} is better by {fmt(abs(c.diff))}, less than δ"
        return text
    if v.kind == stats.BETTER:
        g = pair.gain()
        return f"{g.better} better than {g.worse} by {fmt(g.size)} (95 % CI {interval(g.lo, g.hi)})"
    if v.unplannable == stats.NO_SEEDS:
        return "undecided: fewer than 2 seeds in an arm: no spread to plan from; add seeds, then read the plan here"
    if v.unplannable == stats.NO_SPREAD:
        return "undecided: no spread in an arm to plan from"
    return f"undecided: {plan(v, c, pair.delta)}"


def noise(c: Compared) -> str:
    """The validation sampling error of a comparison, and whether its verdict's margin lies inside it."""
    if c.validation_error is None:
        return "validation sampling error: not available (a run has no per-example validation sums)"
    text = f"validation sampling error ±{fmt(c.validation_error)}"
    if not c.inside_noise:
        return text
    if c.verdict.kind == stats.ON_PAR:
        return text + f": δ = {fmt(c.pair.delta)} lies inside it, so this validation set cannot resolve parity"
    if c.verdict.kind == stats.BETTER:
        return text + ": the difference lies inside it, so this validation set cannot tell the arms apart"
    return text + ": the observed difference lies inside it"


def rates(r: RatesCompared) -> str:
    return f"{r.better} solves it more often" if r.better else "undecided (no difference shown)"


def short(c: Compared) -> str:
    """A pair in the answer's groups: the better one's verdict, or the two names (with the seeds to add)."""
    pair, v = c.pair, c.verdict
    if v.kind == stats.BETTER:
        return verdict(pair, v)
    if v.kind == stats.ON_PAR:
        return f"{pair.a} and {pair.b}"
    more = f"{v.more_seeds} more seeds" if v.more_seeds is not None else "no plan yet"
    return f"{pair.a} vs {pair.b} ({more})"


def _undecided_other(c: Compared) -> str:
    """The verdict the added seeds would not reach, in words."""
    pair, v, comparison = c.pair, c.verdict, c.pair.comparison
    if v.deciding == stats.BETTER:
        if v.seeds_on_par is not None:
            return f"'on par' would need {v.more(v.seeds_on_par)} more"
        if abs(comparison.diff) >= pair.delta:
            return f"parity within ±{fmt(pair.delta)} is out of reach"
        return f"'on par' would need over {stats.MAX_SEEDS} seeds per arm"
    if v.seeds_better is not None:
        return f"'better' would need {v.more(v.seeds_better)} more"
    if comparison.diff == 0:
        return "no difference was observed to plan 'better' for"
    return f"'better' would need over {stats.MAX_SEEDS} seeds per arm"


def sentence(c: Compared) -> str:
    """One comparison as the answer's sentence (without its success rates and seed command)."""
    pair, v = c.pair, c.verdict
    metric, delta = pair.metric, fmt(pair.delta)
    if v.kind == stats.ON_PAR:
        tost = f"TOST {p_is(v.tost_p_holm)} after Holm"
        return f"{pair.a} and {pair.b} are on par within ±{delta} {metric} ({tost}, {seeds(c)})"
    if v.kind == stats.BETTER:
        g = pair.gain()
        return (
            f"{g.better} is better than {g.worse} on {metric} by {fmt(g.size)} (95 % CI "
            f"{interval(g.lo, g.hi)}, Holm-adjusted {p_is(v.p_holm)}, {seeds(c)})"
        )
    if v.more_seeds is None:
        why = verdict(pair, v).removeprefix("undecided: ")
        return f"{pair.a} vs {pair.b} on {metric} is undecided at ±{delta} after {seeds(c)}: {why}"
    within = f" within ±{delta}" if v.deciding == stats.ON_PAR else ""
    return (
        f"{pair.a} vs {pair.b} on {metric} is undecided after {seeds(c)}: {v.more_seeds} more seeds per arm "
        f"would show '{v.deciding}'{within} at {PCT} power if the observed difference "
        f"({fmt(pair.comparison.diff)}) and spread hold ({_undecided_other(c)})"
    )


def rates_clause(r: RatesCompared, direction: str) -> str:
    return (
        f"; runs reaching {r.metric} {at_or_beyond(direction)} {fmt(r.threshold)}: "
        f"{r.rate_a.k}/{r.rate_a.n} vs {r.rate_b.k}/{r.rate_b.n}, Boschloo {p_is(r.p_holm)} after Holm"
        + (f": {r.better} solves it more often" if r.better else "")
    )


def rung_verdict(c: Optional[Compared], line: str, arm: str, reference: str, short: bool = False) -> str:
    """A ladder's verdict on ``line`` (report arm ``arm``) against the reference at one rung, in a few words."""
    if c is None:
        return "-"
    v, pair = c.verdict, c.pair
    if v.kind == stats.BETTER:
        name = line if pair.gain().better == arm else reference
        return f"{name} better" + ("" if short else f" by {fmt(abs(pair.comparison.diff))}")
    if v.kind == stats.ON_PAR:
        return "on par" + ("" if short else f" within ±{fmt(pair.delta)}")
    if short:
        return "undecided"
    if v.more_seeds is not None:
        return f"undecided: {v.more_seeds} more seeds per arm would show '{v.deciding}'"
    return "undecided: " + verdict(pair, v).removeprefix("undecided: ").split(";")[0]


def trend(t: Optional[stats.Trend], what: str, line: str, reference: str, direction: str) -> str:
    """A gap's slope per tenfold size with its 95 % CI, and what it means for ``line``."""
    if t is None:
        return f"no trend: fewer than 2 rungs with {what} recorded"
    lo, hi = t.slope_ci()
    ci = signed_interval(lo, hi)
    fit = f"{signed(t.slope)} per tenfold {what} (95 % CI {ci}, least squares over {t.n} seeds' gaps)"
    if not math.isfinite(lo):
        return fit + ": too few points for an interval"
    if lo <= 0 <= hi:
        return fit + ": no trend shown (the interval holds 0)"
    worse_up = (lo > 0) == (direction == "minimize")  # the gap moves toward "line worse"
    return fit + f": {line} {'loses ground to' if worse_up else 'gains on'} {reference} as {what} grow"


# --------------------------------------------------------------------------------------- the control
def power(check: stats.PowerCheck, advice: str = "run the GPU preset") -> list[str]:
    """The control's power check, one line per finding."""
    lines = []
    if check.trivial is not None:
        c = check.trivial
        means = f"{fmt(check.reference_mean)} vs {fmt(check.trivial_mean)}"
        found = f"({means}; difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test})"
        lines.append(
            f"The reference arm leaves the trivial baseline {found}."
            if check.leaves_trivial
            else f"The reference arm does NOT leave the trivial baseline {found}: nothing was learned at this "
            f"budget; {advice}."
        )
    else:
        lines.append("No trivial baseline for this metric: only the contrast is judged.")
    c = check.contrast
    gap = f"{fmt(abs(c.diff))} ± {fmt(c.half_width)}, {c.test}"
    if check.separates:
        lines.append(
            f"The control separates: the reference is better than the degraded arm by {gap}. The study "
            "can see an effect of this size at this budget; a smaller one may still go unseen."
        )
    elif check.reversed:
        lines.append(
            f"The control is REVERSED: the degraded arm is better than the reference by {gap}. The "
            "control is not the contrast it was meant to be here; check its arms before reading on."
        )
    else:
        lines.append(
            f"The control does NOT separate (difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test}): "
            f"this study has no power at this budget, so no verdict below can be trusted; {advice}."
        )
    return lines


def context(gain: Optional[ContextGain], reference: str) -> str:
    """The report's first line: the reference's context gain, its CI and the threshold it is held to."""
    if gain is None:
        return (
            "**Context gain:** not judged yet: the control needs at least 2 complete runs of the reference and "
            "of the model without context; until then nothing below says whether the reference uses its context."
        )
    c = gain.comparison
    lo, hi = c.ci()
    source = "the degraded arm" if gain.source == "degraded" else "the no-context baseline of its runs"
    verdict = "the reference uses its context" if gain.informative else "uninformative"
    return (
        f"**Context gain:** {reference} gains {fmt(gain.gain)} on {gain.metric} over a model without context "
        f"({source}: {fmt(gain.no_context_mean)} vs {fmt(gain.reference_mean)}; 95 % CI {interval(lo, hi)}, "
        f"{c.test}); the study needs ≥ {fmt(gain.threshold)}: {verdict}."
    )


BLIND = "no verdict: neither arm demonstrably uses its context"


def blind(pairs: list[tuple[str, str]], gains: dict) -> str:
    """The pairs of arms left without a verdict because neither arm demonstrably uses its context, with the arms'
    gains, their 95 % CIs and the floor δ the CI must clear."""
    arms = list(dict.fromkeys(a for pair in pairs for a in pair))
    floor = fmt(next(iter(gains.values())).floor) if gains else "-"
    shown = ", ".join(f"{a} {fmt(gains[a].gain)} {interval(*gains[a].comparison.ci())}" for a in arms if a in gains)
    return (
        f"{BLIND} ({len(pairs)} pair{'s' if len(pairs) != 1 else ''}: "
        f"{', '.join(f'{a} vs {b}' for a, b in pairs)}; gains over a model without context [95 % CI]: {shown}, "
        f"each needs a CI above δ = {floor}): a difference between two models that ignore their input says nothing "
        "about attention"
    )


def uninformative(gain: ContextGain) -> str:
    """The report's only answer when the reference did not learn to use context."""
    lo, hi = gain.comparison.ci()
    holds_zero = "; its 95 % CI holds 0" if not gain.comparison.judged or lo <= 0 <= hi else ""
    return (
        f"uninformative: the reference did not learn to use context (gain {fmt(gain.gain)}, needs ≥ "
        f"{fmt(gain.threshold)}{holds_zero}). No verdict is given: arms that ignore their context answer no question "
        "about attention."
    )
