"""A replication's report section: each decided verdict of the original study beside the fresh seeds' own
(``linformer-lab report STUDY --preset P --replicate``; the study: :mod:`sweeps.spec.replication`).

The fresh seeds are judged as any study is (:mod:`sweeps.report.findings`: Holm over the report's tests, the power
plan at 80 %). Each verdict of the original then gets one of three statuses:

* **replicated**: the fresh seeds reach the same verdict (the same arm better; on par within the same δ; the same arm
  solving the task more often);
* **contradicted**: the fresh seeds decide against it: the other arm better; or "on par within ±δ" where the
  original's 95 % CI put the gain beyond δ; or, for an original "on par", a gain whose 95 % CI lies beyond δ;
* **not decided**: anything else (undecided on the fresh seeds, or a verdict compatible with the original's but not
  the same, such as "on par" beside a gain smaller than δ): the seeds per arm to add to the replication that would
  decide it at 80 % power, planned from the fresh seeds' difference and spread (:func:`sweeps.spec.stats.
  seeds_for_better`, :func:`~sweeps.spec.stats.seeds_for_on_par`); a replication whose reference did not learn to
  use context, or whose power check failed, decides nothing.

The original's undecided pairs are no verdict, so there is nothing to replicate; they are listed by name.
Numbers first (:func:`replicate`, frozen dataclasses), then the words and table (:func:`section`) and
``replication.csv`` (:func:`write_csv`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from foundation.atomic import atomic_text
from sweeps.report import claims as rules
from sweeps.report.findings import Compared, Findings, RatesCompared
from sweeps.report.markdown import PCT, fmt, interval, table
from sweeps.spec import stats

REPLICATED, NOT_DECIDED, CONTRADICTED = "replicated", "not decided", "contradicted"
RATE = "solves more often"  # a claim of the success-rate comparisons
Evidence = Union[Compared, RatesCompared]


# --------------------------------------------------------------------------------------- numbers
@dataclass(frozen=True)
class Claim:
    """A decided verdict of the original: ``first`` better than ``second`` (or solving more often), or the two on
    par, on ``metric``."""

    kind: str  # stats.BETTER, stats.ON_PAR or RATE
    metric: str
    first: str
    second: str
    original: Evidence

    @property
    def claim_arms(self) -> tuple[str, str]:
        return self.first, self.second


@dataclass(frozen=True)
class Outcome:
    claim: Claim
    fresh: Optional[Evidence]  # the same pair on the fresh seeds; None when they did not compare it
    status: str  # REPLICATED, NOT_DECIDED or CONTRADICTED
    why: str  # what the fresh seeds show, one phrase
    more: Optional[int] = None  # not decided: seeds per arm to add to the replication (None: none can be planned)
    plans: str = "would decide it"  # what those seeds would do
    blocked: bool = False  # the fresh seeds decide nothing at all (their reference, their control: _blocked)


def edge(c: Compared, arm: str, level: float = stats.LEVEL) -> tuple[float, float, float]:
    """``arm`` − the other arm of ``c`` in the metric's favour (> 0: ``arm`` is better), with its ``level`` CI."""
    pair = c.pair
    sign = (1 if pair.direction == "maximize" else -1) * (1 if arm == pair.a else -1)
    lo, hi = sorted(sign * x for x in pair.comparison.ci(level))
    return sign * pair.comparison.diff, lo, hi


def shown(claim: Claim, e: Compared) -> tuple[float, float, float]:
    """What the table and replication.csv show of a comparison: the first arm's gain with its 95 % CI (better), or
    first − second in the metric's units with the 90 % CI the equivalence test reads (on par)."""
    if claim.kind == stats.BETTER:
        return edge(e, claim.first)
    sign = 1 if e.pair.a == claim.first else -1
    lo, hi = sorted(sign * x for x in e.pair.comparison.ci(1 - 2 * stats.ALPHA))
    return sign * e.pair.comparison.diff, lo, hi


def claims(found: Findings) -> list[Claim]:
    """The original's decided verdicts: every 'better' and 'on par' comparison, every success rate shown apart."""
    out = []
    for c in found.compared:
        if c.verdict.kind == stats.BETTER:
            g = c.pair.gain()
            out.append(Claim(stats.BETTER, c.pair.metric, g.better, g.worse, c))
        elif c.verdict.kind == stats.ON_PAR:
            out.append(Claim(stats.ON_PAR, c.pair.metric, c.pair.a, c.pair.b, c))
    for r in found.rates:
        if r.better is not None:
            out.append(Claim(RATE, r.metric, r.better, r.b if r.better == r.a else r.a, r))
    return out


def undecided(found: Findings) -> list[Compared]:
    """The original's pairs with no verdict (nothing to replicate)."""
    return [c for c in found.compared if c.verdict.kind == stats.UNDECIDED]


def _find(claim: Claim, fresh: Findings) -> Optional[Evidence]:
    arms = {claim.first, claim.second}
    pool = fresh.rates if claim.kind == RATE else fresh.compared
    for e in pool:
        a, b, metric = (e.a, e.b, e.metric) if claim.kind == RATE else (e.pair.a, e.pair.b, e.pair.metric)
        if {a, b} == arms and metric == claim.metric:
            return e
    return None


def _more(total: Optional[int], n: int) -> Optional[int]:
    return None if total is None else max(total - n, 1)


def _better_claim(claim: Claim, c: Compared) -> Outcome:
    size, lo, hi = edge(c, claim.first)
    kind, delta = c.verdict.kind, c.pair.delta
    if kind == stats.BETTER:
        if size > 0:
            return Outcome(claim, c, REPLICATED, f"{claim.first} better by {fmt(size)}")
        return Outcome(claim, c, CONTRADICTED, f"{claim.second} better by {fmt(-size)}")
    _, original_lo, _ = edge(claim.original, claim.first)
    if kind == stats.ON_PAR and original_lo >= delta:
        return Outcome(claim, c, CONTRADICTED, f"on par within ±{fmt(delta)}, where the original's CI lies beyond δ")
    plan = c.verdict.seeds_better if kind == stats.UNDECIDED else stats.seeds_for_better(c.pair.comparison)
    lean = "" if size > 0 else f", leaning to {claim.second}"
    return Outcome(claim, c, NOT_DECIDED, f"{said(c)}{lean}", _more(plan, c.verdict.n))


def said(c: Compared) -> str:
    """A pair's verdict in the words of the replication and ×F tables: who is better, on par within ±δ, or undecided."""
    if c.verdict.kind == stats.BETTER:
        return f"{c.pair.gain().better} better"
    return f"on par within ±{fmt(c.pair.delta)}" if c.verdict.kind == stats.ON_PAR else "undecided"


def _on_par_claim(claim: Claim, c: Compared) -> Outcome:
    kind, delta = c.verdict.kind, c.pair.delta
    if kind == stats.ON_PAR:
        return Outcome(claim, c, REPLICATED, f"on par within ±{fmt(delta)}")
    winner = c.pair.gain().better
    size, lo, _ = edge(c, winner)
    if kind == stats.BETTER and lo >= delta:
        return Outcome(claim, c, CONTRADICTED, f"{winner} better by {fmt(size)}, its 95 % CI beyond δ")
    plan = c.verdict.seeds_on_par if kind == stats.UNDECIDED else stats.seeds_for_on_par(c.pair.comparison, delta)
    shown = f"{winner} better by {fmt(size)}, less than δ" if kind == stats.BETTER else "undecided"
    return Outcome(claim, c, NOT_DECIDED, shown, _more(plan, c.verdict.n))


def _rate_claim(claim: Claim, r: RatesCompared) -> Outcome:
    if r.better == claim.first:
        return Outcome(claim, r, REPLICATED, f"{claim.first} solves it more often")
    if r.better == claim.second:
        return Outcome(claim, r, CONTRADICTED, f"{claim.second} solves it more often")
    return Outcome(claim, r, NOT_DECIDED, "no difference in success shown (seeds for rates are not planned)")


def _blocked(fresh: Findings, controlled: bool) -> tuple[Optional[str], Optional[int]]:
    """Why the fresh seeds decide nothing (their control has not run, their reference did not learn to use context,
    their power check failed), or None; with the seeds per arm to add that would let the control separate at 80 %
    power, where its contrast can be planned. ``controlled``: the study has a control."""
    if controlled and fresh.context is None:
        return "the fresh seeds' control has not run yet", None
    if not fresh.informative:
        return "the reference did not learn to use context on the fresh seeds", None
    if fresh.power is not None and not fresh.power.has_power:
        contrast = fresh.power.contrast
        return "the control's power check failed on the fresh seeds", _more(
            stats.seeds_for_better(contrast), contrast.n
        )
    return None, None


def replicate(original: Findings, fresh: Findings, controlled: bool) -> list[Outcome]:
    """Each decided verdict of ``original`` judged against ``fresh`` (the replication's findings); ``controlled``: the
    study has a control, whose context gain and power check the fresh seeds must pass to decide anything."""
    blocked, more = _blocked(fresh, controlled)
    out = []
    for claim in claims(original):
        e = _find(claim, fresh)
        if blocked is not None:
            out.append(Outcome(claim, e, NOT_DECIDED, blocked, more, "would let the control separate", True))
        elif e is None:
            out.append(Outcome(claim, e, NOT_DECIDED, "not compared on the fresh seeds (not run yet?)"))
        elif claim.kind == RATE:
            out.append(_rate_claim(claim, e))
        else:
            out.append((_better_claim if claim.kind == stats.BETTER else _on_par_claim)(claim, e))
    return out


# --------------------------------------------------------------------------------------- words
def seed_range(seeds: Sequence[int]) -> str:
    """``0–4`` for a run of consecutive seeds, else ``0, 2, 5``."""
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}–{s[-1]}"
    return ", ".join(map(str, s))


def claim_text(claim: Claim) -> str:
    if claim.kind == stats.BETTER:
        return f"{claim.first} better than {claim.second} on {claim.metric}"
    if claim.kind == stats.ON_PAR:
        return f"{claim.first} and {claim.second} on par within ±{fmt(claim.original.pair.delta)} on {claim.metric}"
    return f"{claim.first} solves it more often than {claim.second} ({claim.metric})"


def estimate(claim: Claim, e: Optional[Evidence]) -> str:
    """The evidence as the claim reads it (:func:`shown`; the solved counts of success rates), with the seeds per
    arm."""
    if e is None:
        return "-"
    if claim.kind == RATE:
        first, second = (e.rate_a, e.rate_b) if e.a == claim.first else (e.rate_b, e.rate_a)
        return f"{first.k}/{first.n} vs {second.k}/{second.n}"
    size, lo, hi = shown(claim, e)
    if claim.kind == stats.BETTER:
        return f"{fmt(size)} {interval(lo, hi)} (n = {e.verdict.n})"
    return f"{fmt(size)}, 90 % CI {interval(lo, hi)} (n = {e.verdict.n})"


def tally(outcomes: list[Outcome]) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in (REPLICATED, NOT_DECIDED, CONTRADICTED)}
    n = len(outcomes)
    return f"of the original's {n} decided verdict{'s' if n != 1 else ''}, " + ", ".join(
        f"{v} {s}" for s, v in counts.items()
    )


def _status_cell(o: Outcome, add_seeds: str) -> str:
    text = f"**{o.status}**: {o.why}"
    if o.status == NOT_DECIDED and o.more is not None:
        seeds = "seed" if o.more == 1 else "seeds"
        text += f"; {o.more} more {seeds} per arm {o.plans} at {PCT} power ({add_seeds.format(n=o.more)})"
    return text


def section(
    name: str, design: str, fresh: str, outcomes: list[Outcome], gains: str, left: list[Compared], add_seeds: str
) -> list[str]:
    """The replication section, opened by the references' context gains: ``name`` the original study,
    ``design``/``fresh`` their seeds in words, ``gains`` the two references' context gains, ``left`` the original's
    undecided pairs, ``add_seeds`` the command that grows the replication (``{n}`` for the count)."""
    body = [
        [
            claim_text(o.claim),
            estimate(o.claim, o.claim.original),
            estimate(o.claim, o.fresh),
            _status_cell(o, add_seeds),
        ]
        for o in outcomes
    ]
    out = [
        f"## Replication of {name} on fresh seeds",
        "",
        f"**Context gain of the reference:** {gains}.",
        "",
        f"**Replication: {tally(outcomes)}.**" if outcomes else f"**Replication:** {name} decided no verdict.",
        "",
        f"The fresh {fresh} were fixed before they ran (by the study file, or by the count given to "
        f"`--add-seeds`) and are disjoint from every seed the design saw ({design}). The fresh seeds are judged "
        f"as any study (Holm over this report's tests, seeds planned at {PCT} power); a verdict is replicated "
        "when they reach the same one, contradicted when they decide against it, and not decided otherwise. "
        "Estimates: the first arm's gain with its 95 % CI ('better'), A − B with the 90 % CI of the equivalence "
        "test ('on par'), solved runs (success rates); "
        "n seeds per arm.",
    ]
    if left:
        out += [
            "",
            "- Undecided in the original (no verdict, nothing to replicate): "
            + ", ".join(f"{c.pair.a} vs {c.pair.b} ({c.pair.metric})" for c in left)
            + ".",
        ]
    header = [f"verdict of {name}", "original: estimate", "fresh seeds: estimate", "replication"]
    return out + ["", *table(header, body), ""] if body else out + [""]


def write_csv(outcomes: list[Outcome], path: Path, at: Optional[list[str]] = None) -> None:
    """``replication.csv``: one row per verdict of the original, with both estimates and the status (``at``: what each
    is at a larger budget, :func:`at_budget`, in an ``at_budget`` column)."""

    def numbers(claim: Claim, e: Optional[Evidence]) -> list:
        if e is None or claim.kind == RATE:
            return [None] * 4
        return [*(round(x, 6) if math.isfinite(x) else None for x in shown(claim, e)), e.verdict.n]

    with atomic_text(path) as fh:
        w = csv.writer(fh)
        w.writerow(
            ["claim", "metric", "first", "second"]
            + [f"{s}_{k}" for s in ("original", "fresh") for k in ("estimate", "lo", "hi", "n")]
            + ["fresh_shows", "status", "more_seeds"]
            + (["at_budget"] if at is not None else [])
        )
        for i, o in enumerate(outcomes):
            c = o.claim
            w.writerow(
                [
                    c.kind,
                    c.metric,
                    c.first,
                    c.second,
                    *numbers(c, c.original),
                    *numbers(c, o.fresh),
                    o.why,
                    o.status,
                    o.more,
                    *([at[i]] if at is not None else []),
                ]
            )


# --------------------------------------------------------------------------------------- a larger budget
HOLDS, SMALLER, CHANGED = rules.HOLDS, rules.SMALLER, rules.CHANGED
AT_BUDGET = (HOLDS, rules.LARGER, SMALLER, CHANGED, rules.NOT_SHOWN, rules.UNDECIDED, NOT_DECIDED)
END_SHARE = 0.2  # "at the end": the fall of the loss over the last fifth of training
DECAYING = (
    "not judged: the learning rate decays to 0 at the end of these runs, where the loss falls at any budget "
    "(the budget curves, `sweep --budgets`, read it)"
)


def oriented(c: Compared, arm: str) -> stats.Comparison:
    """``c``'s difference as ``arm``'s gain over the other arm in the metric's favour (> 0: ``arm`` is better)."""
    comparison = c.pair.comparison
    sign = (1 if c.pair.direction == "maximize" else -1) * (1 if arm == c.pair.a else -1)
    return dataclasses.replace(comparison, diff=sign * comparison.diff)


def pooled_earlier(o: Outcome, earlier: Sequence[Findings]) -> Optional[stats.Comparison]:
    """The claim's gain (its first arm over its second) from every earlier seed of the family: the design's and, where
    it has run, the replication's (``earlier``: their findings), pooled (:func:`sweeps.report.claims.pooled`); None
    for a claim that is not 'better'."""
    if o.claim.kind != stats.BETTER:
        return None
    arms = [rules.pooled(*(f.values.get((arm, o.claim.metric), {}) for f in earlier)) for arm in o.claim.claim_arms]
    comparison = stats.compare(*arms)  # first − second
    sign = 1 if o.claim.original.pair.direction == "maximize" else -1
    return dataclasses.replace(comparison, diff=sign * comparison.diff)


def at_budget(o: Outcome, earlier: Optional[stats.Comparison] = None) -> str:
    """What a larger budget (``--budget F``, judged by :func:`replicate` on its fresh seeds) says of a verdict of the
    original, by a test between the budgets (:func:`sweeps.report.claims.budget_word`): the ×F gain against
    ``earlier``, the pooled estimate of every earlier seed of the family (:func:`pooled_earlier`; else the original's
    estimate, which was reported because it was significant and so is biased away from 0): **larger**, **smaller** or
    **changed** (the other arm ahead) where the change between the budgets is significant; **holds** where it is shown
    inside ±δ; **not shown to differ** otherwise; **undecided** where the ×F CI crosses 0; an 'on par' verdict holds
    where the ×F seeds find it on par again; **changed** where the ×F seeds decide against the verdict; **not
    decided** where they decide nothing (their reference did not learn, their control lacked power, the pair not
    run)."""
    if o.status == CONTRADICTED:
        return CHANGED
    if o.fresh is None or o.blocked:
        return NOT_DECIDED
    if o.claim.kind != stats.BETTER:
        return HOLDS if o.status == REPLICATED else NOT_DECIDED
    first = earlier if earlier is not None else oriented(o.claim.original, o.claim.first)
    later = oriented(o.fresh, o.claim.first)
    return rules.budget_word(first, later, rules.change(first, later), o.claim.original.pair.delta)


def end_fall(
    curve: Sequence[Sequence[Sequence[float]]], direction: str = "minimize", share: float = END_SHARE
) -> Optional[float]:
    """How much a run's objective improved over the last ``share`` of its training, in the objective's units, read
    from the slope of a least-squares line through its points in that share (at least the last two; ``curve``:
    ``(steps, values)``, the sample curve of :func:`sweeps.report.figures.step_curves`): > 0 still improving
    (falling where ``direction`` is minimize, rising where maximize). None for a curve of fewer than two points."""
    steps, values = curve
    points = [(float(s), float(v)) for s, v in zip(steps, values) if math.isfinite(v)]
    if len(points) < 2 or points[-1][0] <= 0:
        return None
    end = points[-1][0]
    last = [pt for pt in points if pt[0] >= (1 - share) * end - 1e-9]
    last = last if len(last) >= 2 else points[-2:]
    xs, ys = [x for x, _ in last], [y for _, y in last]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return (-slope if direction == "minimize" else slope) * share * end


@dataclass(frozen=True)
class Ending:
    """An arm's runs at their end: the mean improvement of the objective over the last share of training (None: no
    curve has two points), how many runs had a curve, and the spread (std over seeds) of its final objective."""

    arm: str
    fall: Optional[float]
    runs: int
    spread: float

    @property
    def improving(self) -> Optional[bool]:
        """Still improving: its objective improved, over the last fifth of training, by more than its seed spread."""
        if self.fall is None or not math.isfinite(self.spread):
            return None
        return self.fall > self.spread


def ending(
    arm: str, curves: Sequence[Sequence[Sequence[float]]], finals: Sequence[float], direction: str = "minimize"
) -> Ending:
    """The :class:`Ending` of an arm from its runs' curves of the objective and its final values over seeds."""
    falls = [f for c in curves if (f := end_fall(c, direction)) is not None]
    spread = stats.summarize(list(finals)).std if len(finals) >= 2 else math.nan
    return Ending(arm, sum(falls) / len(falls) if falls else None, len(falls), spread)


def ending_cell(e: Optional[Ending]) -> str:
    if e is None or e.fall is None:
        return "no curve of two validations"
    words = {True: "still improving", False: "flat", None: "no spread to judge"}[e.improving]
    return f"{words}: improved {fmt(e.fall)} over the last fifth (seed std {fmt(e.spread)}, {e.runs} runs)"


def undecided_at_budget(original: Findings, fresh: Findings) -> list[list[str]]:
    """The original's undecided pairs beside what the seeds at a larger budget say of them: the pair (its ×1
    leader first), both estimates with their CIs, and the larger budget's verdict."""
    rows = []
    for c in undecided(original):
        g = c.pair.gain()
        claim = Claim(stats.BETTER, c.pair.metric, g.better, g.worse, c)
        f = _find(claim, fresh)
        words = "not run" if f is None else said(f)
        rows.append([f"{g.better} against {g.worse} on {c.pair.metric}", estimate(claim, c), estimate(claim, f), words])
    return rows


def budget_section(
    name: str,
    factor: float,
    outcomes: list[Outcome],
    gains: str,
    endings: list[tuple[str, str, str]],
    seeds: str,
    open_pairs: list[list[str]] = (),
    at: Optional[Sequence[str]] = None,
) -> list[str]:
    """The section of a study re-asked at ``factor`` × its steps: per verdict of the original (``name``) what it is
    at ×F (:func:`at_budget`), both estimates with their CIs side by side; then whether each arm was still improving
    at the end of its runs at ×1 and at ×F (``endings``: arm, its ×1 cell, its ×F cell, :func:`ending_cell`)."""
    x = f"×{factor:g}"
    at = list(at) if at is not None else [at_budget(o) for o in outcomes]
    counts = {s: at.count(s) for s in AT_BUDGET}
    tallied = ", ".join(f"{v} {s}" for s, v in counts.items() if v)
    body = [
        [claim_text(o.claim), estimate(o.claim, o.claim.original), estimate(o.claim, o.fresh), f"**{w}**: {o.why}"]
        for o, w in zip(outcomes, at)
    ]
    out = [
        f"## {name} re-asked at {x} the budget",
        "",
        f"**Context gain of the reference:** {gains}.",
        "",
        f"**At {x}: of the original's {len(outcomes)} decided verdicts, {tallied}.**"
        if outcomes
        else f"**At {x}:** {name} decided no verdict.",
        "",
        f"Every step count of the recipe is {x} (its learning-rate schedule stretched to the new end), on fresh "
        f"{seeds}. Each gain at {x} is set against the pooled estimate of every earlier seed of the family (the "
        "design's and the replication's, where it has run), not the ×1 estimate reported because it was significant; "
        "larger, smaller or changed only where a t test of the change between the budgets is significant at 5 %, "
        "holds only where the change is shown inside ±δ (TOST), else not shown to differ; undecided where the "
        f"{x} CI crosses 0 (docs/verdicts.md). The {x} seeds are judged under Holm's correction over their own "
        "tests: a family of their own. Still improving: read only where the runs train at a constant learning rate "
        "(the slope of the sample curve over the last fifth against the seed spread of the final value).",
        "",
    ]
    if body:
        out += [*table([f"verdict of {name}", "×1: estimate", f"{x}: estimate", f"at {x}"], body), ""]
    if open_pairs:
        out += [
            f"Undecided at ×1, each pair as the ×1 seeds led it (the first arm ahead), and what the {x} seeds say:",
            "",
            *table(["pair", "×1: estimate", f"{x}: estimate", f"at {x}"], [list(r) for r in open_pairs]),
            "",
        ]
    if endings:
        out += [*table(["arm", "×1: at the end", f"{x}: at the end"], [list(e) for e in endings]), ""]
    return out
