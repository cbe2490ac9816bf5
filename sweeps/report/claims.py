"""Claims a reviewer accepts: what a report may say of an effect across budgets, of two arms that "match", of a trend,
and of a verdict decided after seeds were added (docs/verdicts.md, "Claims").

* **Across budgets, a test.** An effect at a later budget is set against the *pooled* estimate of every earlier seed
  of the family (:func:`pooled`: the design's and the replication's seeds together), not against the ×1 estimate
  that was reported because it was significant (that one is biased away from 0: the winner's curse, and a smaller
  later value is then partly regression to the mean). The change between the two is tested (:func:`change`: paired by
  seed where both budgets ran the same seeds, as a budget curve's cooldowns do; Welch otherwise), and
  :func:`budget_word` says **larger** / **smaller** / **changed** (the other arm ahead) only where that test is
  significant, **holds** only where an equivalence test puts the change inside ±δ, and else **not shown to differ**;
  a later CI that crosses 0 is **undecided**, never "same direction".
* **Matches.** An arm "matches" another only through an equivalence test (TOST at α) of their difference inside ±δ
  (:func:`matches`); two close means are otherwise just close.
* **Trends.** A trend over n, k or model size is fitted only through at least :data:`MIN_TREND_POINTS` points, and
  then shown with its fit and each point's residual (:func:`trend_words`); with fewer, only the points.
* **Two-stage.** A verdict read after ``--add-seeds`` grew a study that had been looked at was decided in two looks
  (:func:`two_stage`): its error rate is not the one a single planned look promises, and the report labels it.
* **Holm families.** Which comparisons were corrected together (:func:`family_words`): two reports of the same runs
  with different families (a study alone; a study with its replication) can read "decided" and "undecided" for the
  same pair, and the report states its family so that a reader can tell why.
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

from sweeps.report.markdown import fmt, interval
from sweeps.spec import stats

MIN_TREND_POINTS = 3
UNDECIDED, NOT_SHOWN, HOLDS, LARGER, SMALLER, CHANGED = (
    "undecided",
    "not shown to differ",
    "holds",
    "larger",
    "smaller",
    "changed",
)


def pooled(*estimates: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Every earlier seed's value of one arm, from each member of a family (``{seed: value}`` each, seeds disjoint)."""
    out: dict[Hashable, float] = {}
    for values in estimates:
        shared = set(out) & set(values)
        if shared:
            raise ValueError(f"pooled: seed {sorted(map(str, shared))[0]} is in two members of the family")
        out.update(values)
    return out


def effects(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """A − B per seed, for the seeds both arms ran."""
    return {k: a[k] - b[k] for k in a if k in b}


def change(earlier: stats.Comparison, later: stats.Comparison) -> stats.Comparison:
    """later − earlier of two independent estimates of one difference (Welch's approximation of the degrees of
    freedom): for budgets run on different seeds. (Budgets run on the same seeds: ``stats.compare`` of their
    per-seed effects, :func:`effects`, is the paired test.)"""
    diff = later.diff - earlier.diff
    if not (earlier.judged and later.judged):
        return stats.Comparison(diff, math.nan, math.nan, "none (no spread at a budget)", min(earlier.n, later.n))
    va, vb = later.se**2, earlier.se**2
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / later.df + vb**2 / earlier.df) if se > 0 else later.df + earlier.df
    return stats.Comparison(diff, se, df, f"Welch t of two estimates ({later.test}; {earlier.test})", later.n)


def budget_word(earlier: stats.Comparison, later: stats.Comparison, moved: stats.Comparison, delta: float) -> str:
    """What a later budget says of an effect (A − B; its sign is the direction): ``moved`` is the test of the
    change between the budgets (:func:`change`, or the paired one). Undecided where the later CI crosses 0; larger,
    smaller or changed (the sign flipped) only where ``moved`` is significant at α; holds where the change is shown
    inside ±δ (TOST at α); else not shown to differ."""
    lo, hi = later.ci()
    if not later.judged or lo <= 0 <= hi:
        return UNDECIDED
    if moved.p_value < stats.ALPHA:
        if (later.diff > 0) != (earlier.diff > 0):
            return CHANGED
        return LARGER if abs(later.diff) > abs(earlier.diff) else SMALLER
    if moved.tost_p(delta) < stats.ALPHA:
        return HOLDS
    return NOT_SHOWN


def matches(c: stats.Comparison, delta: float) -> bool:
    """Whether two arms match: the equivalence test (TOST) of A − B inside ±δ at α."""
    return c.tost_p(delta) < stats.ALPHA


def matches_words(c: stats.Comparison, delta: float) -> str:
    """How the report words two arms' closeness: "matches within ±δ (TOST p)" only when :func:`matches`."""
    lo, hi = c.ci(1 - 2 * stats.ALPHA)
    shown = f"A − B {fmt(c.diff)}, 90 % CI {interval(lo, hi)}"
    if matches(c, delta):
        return f"matches within ±{fmt(delta)} ({shown}, TOST p = {fmt(c.tost_p(delta))})"
    return f"not shown to match within ±{fmt(delta)} ({shown})"


def trend_words(x: Sequence[float], y: Sequence[float], what: str) -> str:
    """A trend of ``y`` over ``x`` (e.g. log10 n/k): the fit, its slope's 95 % CI and each point's residual, from
    at least :data:`MIN_TREND_POINTS` points; else the points alone, and why no trend is given."""
    points = ", ".join(f"({fmt(a)}, {fmt(b)})" for a, b in zip(x, y))
    if len(x) < MIN_TREND_POINTS or len(set(x)) < MIN_TREND_POINTS:
        return f"{what}: the points {points}; no trend from fewer than {MIN_TREND_POINTS} distinct points"
    t = stats.trend(x, y)
    lo, hi = t.slope_ci()
    residuals = ", ".join(fmt(b - t.at(a)) for a, b in zip(x, y))
    return (
        f"{what}: y = {fmt(t.intercept)} + {fmt(t.slope)}·x (slope 95 % CI {interval(lo, hi)}, {t.n} points; "
        f"residuals {residuals})"
    )


def two_stage(added_seeds: Sequence[int]) -> bool:
    """Whether a study's verdicts were decided in two looks: seeds were added (``--add-seeds``) after it ran."""
    return len(added_seeds) > 0


def two_stage_words(added_seeds: Sequence[int]) -> str:
    """The label of a two-stage study's verdicts ("" for a single planned look)."""
    if not two_stage(added_seeds):
        return ""
    return (
        f"two-stage: seeds {', '.join(map(str, added_seeds))} were added after the study had been read, so each "
        "verdict here was decided at a second look; its error rate is above the α a single planned look promises"
    )


def family_words(labels: Sequence[str], kind: str = "'better'") -> str:
    """The Holm family of a report's ``kind`` tests, named comparison by comparison."""
    if not labels:
        return f"no {kind} tests"
    return f"{len(labels)} {kind} test(s) corrected together: " + "; ".join(labels)
