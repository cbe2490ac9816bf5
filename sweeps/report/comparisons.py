"""The comparisons of a study's own arms and their verdicts, as the report says them: each verdict in words
(better, on par within ±δ, or undecided with the seeds that would decide it; docs/verdicts.md), the answer's sentence
of a pair, the comparisons and success-rate tables, the Holm and validation-error statements, and the seeds to
add. The numbers are :mod:`sweeps.report.findings`' (computed once per report, over :mod:`sweeps.spec.stats`)."""

from __future__ import annotations

from typing import Optional

from sweeps.control import trivial_key
from sweeps.report import claims, markdown
from sweeps.report.findings import (
    Compared,
    Findings,
    RatesCompared,
)
from sweeps.report.markdown import PCT, at_or_beyond, fmt, interval, p_is
from sweeps.spec import stats
from sweeps.spec.study import Study


def seeds(c: Compared) -> str:
    return f"{c.n_a} seeds each" if c.n_a == c.n_b else f"{c.n_a} and {c.n_b} seeds"


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


def add_seeds_command(study: Study, n: int) -> str:
    return f"`linformer-lab sweep {study.file_args} --add-seeds {n}`"


def pair_sentence(study: Study, c, found: Findings) -> str:
    """One of the study's comparisons as the answer's sentence, with its success rates and the seeds to add."""
    text = sentence(c)
    if c.validation_error is not None:
        text += f"; {noise(c)}"
    for r in found.rates:
        if (r.metric, r.a, r.b) == (c.pair.metric, c.pair.a, c.pair.b):
            text += rates_clause(r, c.pair.direction)
    if c.verdict.kind == stats.UNDECIDED and c.verdict.more_seeds is not None:
        text += f"; plan the seeds now and add them all with {add_seeds_command(study, c.verdict.more_seeds)}"
    return text


def holm_line(found: Findings) -> list[str]:
    m_better, m_par = found.family()
    if not m_par:
        return []
    n_rates = f", {markdown.counted(len(found.rates), 'comparison')} of success rates" if found.rates else ""
    rate = f"{stats.ALPHA * 100:.0f} %"
    better, par = markdown.counted(m_better, "'better' test"), markdown.counted(m_par, "'on par' test")
    return [
        f"- Holm's correction over the {better} of this report ({markdown.counted(m_par, 'comparison')} of "
        f"means{n_rates}) keeps their family-wise error rate at {rate}; the {par} (TOST: the 90 % CI of A − B "
        "inside ±δ) "
        f"{'is' if m_par == 1 else 'are'} a second Holm family at {rate}. "
        f"Seed counts are planned at {markdown.PCT} power for the observed difference and spread, at "
        "the level Holm applies to each test now. The control's arms are in neither family: its power check "
        "and the context gain are design checks of the study."
    ]


ON_PAR_TESTS = "'on par'"


def family_line(found: Findings) -> list[str]:
    """The report's Holm families, comparison by comparison: two reports of the same runs that correct over other
    families (a study alone; one budget of its curves) can read another verdict for the same pair."""
    if not found.compared:
        return []
    better = [f"{c.pair.a} − {c.pair.b} on {c.pair.metric}" for c in found.compared]
    better += [f"success rates of {r.a} and {r.b} on {r.metric}" for r in found.rates]
    on_par = [f"{c.pair.a} − {c.pair.b} on {c.pair.metric}" for c in found.compared if c.pair.may_be_on_par]
    families = f"{claims.family_words(better)}; {claims.family_words(on_par, ON_PAR_TESTS)}"
    return [
        f"- Holm families of this report: {families}. "
        "A report over other runs of the same pairs (another budget, the replication pooled in) corrects over "
        "another family, so the same pair can read decided in one and undecided in the other."
    ]


def noise_line(found: Findings) -> list[str]:
    """How the validation sampling error beside each verdict is measured, or that it is not available."""
    # a throughput has no validation examples: only the quality metrics' comparisons can carry the error
    quality = [c for c in found.compared if trivial_key(c.pair.metric) is not None or c.validation_error is not None]
    if not quality:
        return []
    if all(c.validation_error is None for c in quality):
        return [
            "- Validation sampling error: not available (the runs' metrics.json hold no per-example validation "
            "sums, `validation_examples`): these verdicts cover the seeds' spread, not the validation set's."
        ]
    return [
        f"- Validation sampling error: the 95 % half-width of A − B from the validation set alone (a bootstrap of "
        f"{stats.BOOTSTRAP} resamples of the validation examples, the same for every run), beside every verdict; "
        "a verdict whose margin lies inside it says so."
    ]


def comparisons_table(found: Findings, metric: str, direction: str) -> list[str]:
    """Every comparison on ``metric``: A − B, its CI, the tests, δ and the verdict; then the success rates."""
    body = []
    for c in found.of(metric):
        lo, hi = c.pair.comparison.ci()
        v = c.verdict
        body.append(
            [
                c.pair.a,
                c.pair.b,
                markdown.fmt(c.pair.comparison.diff),
                markdown.interval(lo, hi) if lo == lo else "-",
                c.pair.comparison.test,
                f"{markdown.fmt_p(v.p)} ({markdown.fmt_p(v.p_holm)})",
                f"{markdown.fmt_p(v.tost_p)} ({markdown.fmt_p(v.tost_p_holm)})",
                f"±{markdown.fmt(c.pair.delta)}",
                "-" if c.validation_error is None else f"±{markdown.fmt(c.validation_error)}",
                verdict(c.pair, v) + (f"; {noise(c)}" if c.inside_noise else ""),
            ]
        )
    header = ["A", "B", "A − B", "95 % CI", "test", "p (Holm)", "TOST p (Holm)", "δ", "validation error", "verdict"]
    out = [f"## Comparisons of {metric} ({direction}; A − B with its 95 % CI)", "", *markdown.table(header, body), ""]
    return out + rates_table(found, metric, direction)


def rates_table(found: Findings, metric: str, direction: str) -> list[str]:
    these = [r for r in found.rates if r.metric == metric]
    if not these:
        return []
    body = [
        [r.a, r.b, str(r.rate_a), str(r.rate_b), f"{markdown.fmt_p(r.p)} ({markdown.fmt_p(r.p_holm)})", rates(r)]
        for r in these
    ]
    return [
        f"### Success rates ({metric} {markdown.at_or_beyond(direction)} {markdown.fmt(these[0].threshold)}: solved)",
        "",
        *markdown.table(["A", "B", "A solved", "B solved", "Boschloo p (Holm)", "verdict"], body),
        "",
    ]


def seeds_advice(study: Study, found: Findings) -> list[str]:
    """The seeds that would decide every undecided pair of the study's own arms, and how to add them."""
    undecided = [
        c.verdict.more_seeds
        for c in found.compared
        if c.verdict.kind == stats.UNDECIDED and c.verdict.more_seeds is not None
    ]
    if not undecided:
        return []
    n = max(undecided)
    return [
        f"To decide every undecided pair of the study's arms at {markdown.PCT} power, add {n} seeds: "
        f"{add_seeds_command(study, n)} (every arm and the control; the runs done are kept). Decide the "
        "count before running and run all of it: adding seeds until a verdict appears (optional stopping) "
        "inflates the error rates these verdicts promise (docs/verdicts.md).",
        "",
    ]
