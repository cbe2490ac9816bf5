"""Comparing a study's arms over replicates (seeds), and the verdict a researcher can act on.

For arms A and B with values a_i, b_j of one metric, the difference A − B, its standard error and
degrees of freedom are

* paired (both arms ran the same seeds, n ≥ 2 pairs): d_i = a_i − b_i, se = s_d / √n, ν = n − 1;
* otherwise Welch: d = ā − b̄, se = √(s_a²/n_a + s_b²/n_b),
  ν = se⁴ / ((s_a²/n_a)²/(n_a−1) + (s_b²/n_b)²/(n_b−1)) (Welch–Satterthwaite, an approximation).

Each pair of arms gets one of three verdicts (docs/verdicts.md):

* **better**: the two-sided t test of A = B, T = d / se ~ t_ν, rejects at the Holm-adjusted level: the
  family of all "better" tests of one report keeps a family-wise error rate of ``ALPHA``. Shown with the
  95 % CI d ± t_{0.975, ν} · se.
* **on par within ±δ**: two one-sided tests (TOST) of |A − B| ≥ δ, p = max(P(t_ν ≥ (d + δ)/se),
  P(t_ν ≤ (d − δ)/se)), reject at the Holm-adjusted level of a second family: for one test this is the
  90 % CI d ± t_{0.95, ν} · se lying inside [−δ, δ].
* **undecided**: neither; with the seeds per arm that would decide it at ``POWER``, planned for the
  observed difference and spread at the level Holm's step applies to the pair now: the two-sided t
  test's power from the noncentral t, P(|T'| > t_{1−α/2, ν}) with T' ~ t_ν(nc = d / se(n)), and the
  TOST's power at true difference d, bounded below by P(T₁ > t_{1−α, ν}) + P(T₂ < −t_{1−α, ν}) − 1 with
  T₁ ~ t_ν((d + δ)/se(n)), T₂ ~ t_ν((d − δ)/se(n)) (so its seed count errs on the safe side).

A trend over a ladder of model sizes (docs/scale.md) is the least-squares line y = a + b·x through points
(x_i, y_i), with x̄, ȳ the means, S_xx = Σ(x_i − x̄)², S_xy = Σ(x_i − x̄)(y_i − ȳ):

    b = S_xy / S_xx,  a = ȳ − b·x̄,  s² = Σ(y_i − a − b·x_i)² / (n − 2),  se(b) = √(s² / S_xx),

and the slope's 95 % CI b ± t_{0.975, n−2} · se(b) (n ≥ 3 points at ≥ 2 distinct x).

Runs whose outcome splits into "solved" and "stuck" (recall near 1 or on a plateau) are counted against
a threshold: the success rate k/n with its exact (Clopper–Pearson) 95 % interval, and two arms' rates
compared with Boschloo's exact test (uniformly more powerful than Fisher's), a member of the "better"
family. Every distribution and test here is SciPy's.

Everything here is numbers (frozen dataclasses); each section of the report phrases them (e.g.
:mod:`sweeps.report.comparisons`, :mod:`sweeps.report.power`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Sequence

import numpy as np
from scipy import stats as sp

LEVEL = 0.95  # confidence of the interval shown beside a difference
ALPHA = 0.05  # family-wise error rate of the "better" verdicts of one report, and of its "on par" ones
POWER = 0.80  # the power seed counts are planned for
MAX_SEEDS = 1000  # seed counts are searched up to this many per arm

BETTER, ON_PAR, UNDECIDED = "better", "on par", "undecided"


# --------------------------------------------------------------------------------------- summaries
@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float  # sample standard deviation (n − 1); nan when n < 2


def summarize(values: Sequence[float]) -> Summary:
    n = len(values)
    mean = float(np.mean(values)) if n else math.nan
    std = float(np.std(values, ddof=1)) if n >= 2 else math.nan
    return Summary(n, mean, std)


# --------------------------------------------------------------------------------------- A − B
@dataclass(frozen=True)
class Comparison:
    diff: float  # mean(A) − mean(B)
    se: float  # standard error of diff; nan when an arm has fewer than 2 replicates
    df: float  # degrees of freedom of its t distribution; nan likewise
    test: str  # "paired t (n=3)", "Welch t (3 vs 2)" or "none (1 vs 3 replicates)"
    n: int  # replicates per arm: pairs (paired) or the smaller arm's (Welch)
    paired: bool = False
    sd_a: float = math.nan  # the spreads seed counts are planned from: paired, s_d (and sd_b nan);
    sd_b: float = math.nan  # Welch, each arm's standard deviation

    @property
    def judged(self) -> bool:
        """Whether there is a spread to judge by (at least 2 replicates per arm)."""
        return math.isfinite(self.se)

    def ci(self, level: float = LEVEL) -> tuple[float, float]:
        """Two-sided ``level`` confidence interval of A − B (nan, nan when not judged)."""
        if not self.judged:
            return math.nan, math.nan
        hw = float(sp.t.ppf((1 + level) / 2, self.df)) * self.se if self.se > 0 else 0.0
        return self.diff - hw, self.diff + hw

    @property
    def half_width(self) -> float:
        """Of the 95 % CI; nan when there is no spread to judge by."""
        lo, hi = self.ci()
        return (hi - lo) / 2

    @property
    def distinguishable(self) -> bool:
        """The 95 % CI excludes 0 (one test, no multiplicity correction: the power check's rule)."""
        return self.judged and abs(self.diff) > self.half_width

    @property
    def p_value(self) -> float:
        """Two-sided p of the t test of A = B (1 when not judged: no evidence)."""
        if not self.judged:
            return 1.0
        if self.se == 0:
            return 0.0 if self.diff != 0 else 1.0
        return float(2 * sp.t.sf(abs(self.diff) / self.se, self.df))

    def tost_p(self, delta: float) -> float:
        """p of the equivalence test |A − B| < δ by two one-sided t tests (1 when not judged)."""
        if not self.judged:
            return 1.0
        if self.se == 0:
            return 0.0 if abs(self.diff) < delta else 1.0
        above = sp.t.sf((self.diff + delta) / self.se, self.df)  # H0: A − B ≤ −δ
        below = sp.t.cdf((self.diff - delta) / self.se, self.df)  # H0: A − B ≥ δ
        return float(max(above, below))

    def a_better(self, direction: str) -> bool:
        """Whether A's mean is the better one under ``direction`` (not whether that is beyond noise)."""
        return (self.diff < 0) == (direction == "minimize")


def compare(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> Comparison:
    """A − B for values keyed by replicate (e.g. seed): paired when both have the same replicates."""
    if set(a) == set(b) and len(a) >= 2:
        d = summarize([a[k] - b[k] for k in a])
        return Comparison(d.mean, d.std / math.sqrt(d.n), d.n - 1, f"paired t (n={d.n})", d.n, True, d.std)
    sa, sb = summarize(list(a.values())), summarize(list(b.values()))
    diff, n = sa.mean - sb.mean, min(sa.n, sb.n)
    if n < 2:
        return Comparison(diff, math.nan, math.nan, f"none ({sa.n} vs {sb.n} replicates)", n)
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1)) if se > 0 else sa.n + sb.n - 2
    return Comparison(diff, se, df, f"Welch t ({sa.n} vs {sb.n})", n, False, sa.std, sb.std)


# --------------------------------------------------------------------------------------- validation noise
BOOTSTRAP = 1000  # resamples of the validation examples
BOOTSTRAP_SEED = 0


def examples_metric(sums: np.ndarray, counts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The metric Σ sum / Σ count over each row of example indices ``idx`` (resamples × examples)."""
    return sums[idx].sum(axis=-1) / counts[idx].sum(axis=-1)


def validation_error(
    a: Sequence[tuple[Sequence[float], Sequence[float]]],
    b: Sequence[tuple[Sequence[float], Sequence[float]]],
    level: float = LEVEL,
    resamples: int = BOOTSTRAP,
    seed: int = BOOTSTRAP_SEED,
) -> float:
    """The sampling error of mean(A) − mean(B) that comes from the validation set, as the half-width of its
    ``level`` interval: z · the bootstrap standard error over validation examples.

    ``a``, ``b``: per seed of each arm, (sum, count) of the metric per validation example, examples in the same
    order for every run. Each resample draws the n example indices with replacement, once for all runs (the
    arms are scored on the same examples), and recomputes each run's metric Σ sum / Σ count over the drawn
    examples, then the difference of the arms' means over seeds."""
    runs = [(np.asarray(s, dtype=float), np.asarray(c, dtype=float)) for s, c in [*a, *b]]
    n = len(runs[0][0])
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.stack([examples_metric(s, c, idx) for s, c in runs])  # runs × resamples
    diff = values[: len(a)].mean(axis=0) - values[len(a) :].mean(axis=0)
    return float(sp.norm.ppf((1 + level) / 2) * diff.std(ddof=1))


# --------------------------------------------------------------------------------------- planning
def _design(c: Comparison, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(se, ν) of the same comparison with ``n`` replicates per arm, at the observed spread."""
    if c.paired:
        return c.sd_a / np.sqrt(n), n - 1.0
    va, vb = c.sd_a**2 / n, c.sd_b**2 / n
    return np.sqrt(va + vb), (va + vb) ** 2 / ((va**2 + vb**2) / (n - 1.0))


def power_better(c: Comparison, n: np.ndarray | int, alpha: float = ALPHA) -> np.ndarray:
    """Power of the two-sided t test at level ``alpha`` with ``n`` seeds per arm, if the true difference
    and spread are the observed ones."""
    n = np.asarray(n, dtype=float)
    se, df = _design(c, n)
    nc = c.diff / se
    crit = sp.t.ppf(1 - alpha / 2, df)
    return sp.nct.sf(crit, df, nc) + sp.nct.cdf(-crit, df, nc)


def power_on_par(c: Comparison, delta: float, n: np.ndarray | int, alpha: float = ALPHA) -> np.ndarray:
    """A lower bound on the power of the TOST at level ``alpha`` with ``n`` seeds per arm, if the true
    difference and spread are the observed ones."""
    n = np.asarray(n, dtype=float)
    se, df = _design(c, n)
    crit = sp.t.ppf(1 - alpha, df)
    both = sp.nct.sf(crit, df, (c.diff + delta) / se) + sp.nct.cdf(-crit, df, (c.diff - delta) / se) - 1
    return np.clip(both, 0.0, 1.0)


def _smallest(power: np.ndarray, ns: np.ndarray, target: float) -> Optional[int]:
    reached = np.flatnonzero(power >= target)
    return int(ns[reached[0]]) if reached.size else None


def _plannable(c: Comparison) -> bool:
    spreads = [c.sd_a] if c.paired else [c.sd_a, c.sd_b]
    return c.judged and all(math.isfinite(s) for s in spreads) and c.se > 0


def seeds_for_better(c: Comparison, alpha: float = ALPHA, power: float = POWER) -> Optional[int]:
    """Seeds per arm at which the t test would find the observed difference with ``power``; None when no
    count up to MAX_SEEDS does (no difference observed, or one far below the spread)."""
    if not _plannable(c) or c.diff == 0:
        return None
    ns = np.arange(2, MAX_SEEDS + 1)
    return _smallest(power_better(c, ns, alpha), ns, power)


def seeds_for_on_par(c: Comparison, delta: float, alpha: float = ALPHA, power: float = POWER) -> Optional[int]:
    """Seeds per arm at which the TOST would show parity within ±δ with ``power``; None when no count up
    to MAX_SEEDS does (the observed difference is at or beyond δ, or δ far below the spread)."""
    if not _plannable(c) or abs(c.diff) >= delta:
        return None
    ns = np.arange(2, MAX_SEEDS + 1)
    return _smallest(power_on_par(c, delta, ns, alpha), ns, power)


# --------------------------------------------------------------------------------------- multiplicity
def one_way_p(groups: Sequence[Sequence[float]]) -> float:
    """The p-value of a one-way ANOVA (SciPy's ``f_oneway``): do the groups' means differ beyond the spread within
    them (the seeds)? Groups without spread: 0 when their means differ, else 1."""
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if len(groups) < 2:
        return 1.0
    within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
    if within == 0.0 or sum(len(g) for g in groups) <= len(groups):
        return 0.0 if len({float(g.mean()) for g in groups}) > 1 else 1.0
    return float(sp.f_oneway(*groups).pvalue)


def blocked_p(cells: Mapping[tuple[Hashable, Hashable], float]) -> float:
    """Does the group explain the values beyond their blocks' spread? ``cells``: ``(group, block) → value``, a block
    being a replicate (a seed, with the other params of the trial): the p-value of the group in a two-way additive
    ANOVA over the blocks every group has (each block's own level taken out, as a paired comparison does), else of a
    one-way ANOVA (:func:`one_way_p`). Without spread left: 0 when the groups differ, else 1."""
    groups = sorted({g for g, _ in cells}, key=repr)
    blocks = [b for b in sorted({b for _, b in cells}, key=repr) if all((g, b) in cells for g in groups)]
    if len(groups) < 2:
        return 1.0
    if len(blocks) < 2:
        return one_way_p([[v for (g, _), v in cells.items() if g == group] for group in groups])
    y = np.array([[cells[(g, b)] for b in blocks] for g in groups], dtype=float)  # (groups, blocks)
    grand = y.mean()
    ss_group = len(blocks) * float(((y.mean(1) - grand) ** 2).sum())
    ss_block = len(groups) * float(((y.mean(0) - grand) ** 2).sum())
    ss_rest = float(((y - grand) ** 2).sum()) - ss_group - ss_block
    tiny = 1e-12 * max(1.0, float((y**2).sum()))
    if ss_rest <= tiny:
        return 0.0 if ss_group > tiny else 1.0
    df_group, df_rest = len(groups) - 1, (len(groups) - 1) * (len(blocks) - 1)
    return float(sp.f.sf((ss_group / df_group) / (ss_rest / df_rest), df_group, df_rest))


def between_ss(cells: Mapping[tuple[Hashable, Hashable], float]) -> float:
    """The spread the groups explain: the between-group sum of squares, Σ_g n_g (mean_g − mean)², of ``cells``
    (``(group, block) → value``)."""
    values = np.array(list(cells.values()), dtype=float)
    by_group: dict[Hashable, list[float]] = {}
    for (g, _), v in cells.items():
        by_group.setdefault(g, []).append(v)
    return float(sum(len(v) * (np.mean(v) - values.mean()) ** 2 for v in by_group.values()))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: sorted ascending, p_(i) · (m − i + 1), made monotone, capped at 1.
    A hypothesis is rejected at family-wise level α when its adjusted p is below α."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def holm_levels(p_values: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The level Holm's step applies to each test now: α / (m − rank + 1), rank 1 for the smallest p."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    levels = [alpha] * m
    for rank, i in enumerate(order):
        levels[i] = alpha / (m - rank)
    return levels


# --------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Pair:
    """One comparison of a report: arms ``a`` and ``b`` on ``metric``."""

    a: str
    b: str
    metric: str
    direction: str  # "minimize" or "maximize"
    delta: float  # the equivalence margin δ of the metric
    comparison: Comparison
    # False when only one arm of the pair uses its context: "better" can still be shown, "on par" cannot (a model
    # within δ of one that ignores its input says nothing about attention); the pair is then in no TOST family
    may_be_on_par: bool = True

    def gain(self, level: float = LEVEL) -> "Gain":
        """The better arm by its mean, and its gain over the other in the metric's favour with the ``level`` CI."""
        c = self.comparison
        a_wins = c.a_better(self.direction)
        sign = 1 if a_wins == (self.direction == "maximize") else -1  # A − B -> the gain, in the metric's units
        lo, hi = sorted(sign * x for x in c.ci(level))
        better, worse = (self.a, self.b) if a_wins else (self.b, self.a)
        return Gain(better, worse, abs(c.diff), lo, hi)


@dataclass(frozen=True)
class Gain:
    """The arm whose mean is better and by how much (≥ 0), with the CI of that gain (nan, nan when not judged)."""

    better: str
    worse: str
    size: float
    lo: float
    hi: float


NO_SEEDS, NO_SPREAD = "fewer than 2 seeds", "no spread"  # why an undecided pair has no plan


@dataclass(frozen=True)
class Verdict:
    kind: str  # BETTER, ON_PAR or UNDECIDED
    p: float  # two-sided p of A = B, and Holm-adjusted
    p_holm: float
    tost_p: float  # TOST p of |A − B| ≥ δ, and Holm-adjusted
    tost_p_holm: float
    n: int = 0  # seeds per arm now (pairs, or the smaller arm's)
    seeds_better: Optional[int] = None  # undecided: seeds per arm for each verdict at POWER
    seeds_on_par: Optional[int] = None
    unplannable: str = ""  # undecided without a plan: NO_SEEDS or NO_SPREAD

    def more(self, total: Optional[int]) -> Optional[int]:
        return None if total is None else max(total - self.n, 1)

    @property
    def more_seeds(self) -> Optional[int]:
        """Undecided: the fewest seeds per arm to add that would decide it (None: unknown)."""
        counts = [n for n in (self.seeds_better, self.seeds_on_par) if n is not None]
        return self.more(min(counts)) if counts else None

    @property
    def deciding(self) -> str:
        """Undecided: the verdict the fewest added seeds would reach ("better" or "on par"), if any."""
        if self.more_seeds is None:
            return ""
        return (
            BETTER if self.seeds_on_par is None or (self.seeds_better or MAX_SEEDS + 1) <= self.seeds_on_par else ON_PAR
        )


def _decide(pair: Pair, p_holm: float, level: float, tost_holm: float, tost_level: float) -> Verdict:
    c, delta = pair.comparison, pair.delta
    p, tost = c.p_value, c.tost_p(delta) if pair.may_be_on_par else math.nan
    if tost_holm < ALPHA:
        return Verdict(ON_PAR, p, p_holm, tost, tost_holm, c.n)
    if p_holm < ALPHA:
        return Verdict(BETTER, p, p_holm, tost, tost_holm, c.n)
    if not _plannable(c):
        return Verdict(UNDECIDED, p, p_holm, tost, tost_holm, c.n, unplannable=NO_SPREAD if c.judged else NO_SEEDS)
    n_par = seeds_for_on_par(c, delta, tost_level) if pair.may_be_on_par else None
    return Verdict(UNDECIDED, p, p_holm, tost, tost_holm, c.n, seeds_for_better(c, level), n_par)


def judge(pairs: Sequence[Pair], other_better_p: Sequence[float] = ()) -> tuple[list[Verdict], list[float]]:
    """The verdict of every pair of one report, with Holm's correction over the report's "better" tests
    (the pairs' t tests and ``other_better_p``, e.g. success-rate tests) and, as a second family, over
    the TOST tests of the pairs that may be on par (:attr:`Pair.may_be_on_par`). Returns (verdicts,
    Holm-adjusted ``other_better_p``)."""
    p = [pair.comparison.p_value for pair in pairs] + list(other_better_p)
    equivalence = [i for i, pair in enumerate(pairs) if pair.may_be_on_par]
    tost = [pairs[i].comparison.tost_p(pairs[i].delta) for i in equivalence]
    p_holm, levels = holm(p), holm_levels(p)
    tost_holm, tost_levels = [math.nan] * len(pairs), [math.nan] * len(pairs)
    for i, adjusted, level in zip(equivalence, holm(tost), holm_levels(tost)):
        tost_holm[i], tost_levels[i] = adjusted, level
    verdicts = [_decide(pair, p_holm[i], levels[i], tost_holm[i], tost_levels[i]) for i, pair in enumerate(pairs)]
    return verdicts, p_holm[len(pairs) :]


# --------------------------------------------------------------------------------------- success rates
@dataclass(frozen=True)
class Rate:
    k: int  # runs that solved the task
    n: int  # runs
    lo: float  # exact (Clopper–Pearson) 95 % interval of the success probability; nan when n = 0
    hi: float

    def __str__(self) -> str:
        return f"{self.k}/{self.n}" + (f" [{self.lo:.2f}, {self.hi:.2f}]" if self.n else "")


def solved(value: float, threshold: float, direction: str) -> bool:
    """A run solved the task: its value is at or beyond ``threshold`` in the objective's direction."""
    return value >= threshold if direction == "maximize" else value <= threshold


def success_rate(values: Sequence[float], threshold: float, direction: str, level: float = LEVEL) -> Rate:
    k, n = sum(solved(v, threshold, direction) for v in values), len(values)
    if n == 0:
        return Rate(0, 0, math.nan, math.nan)
    ci = sp.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return Rate(k, n, float(ci.low), float(ci.high))


def compare_rates(a: Rate, b: Rate) -> float:
    """Two-sided p of Boschloo's exact test of equal success probabilities (1 when an arm has no runs)."""
    if a.n == 0 or b.n == 0:
        return 1.0
    table = [[a.k, b.k], [a.n - a.k, b.n - b.k]]  # one column per arm
    p = sp.boschloo_exact(table, alternative="two-sided").pvalue
    return float(p) if math.isfinite(p) else 1.0


# --------------------------------------------------------------------------------------- trends
@dataclass(frozen=True)
class Trend:
    """The least-squares line y = intercept + slope·x through n points (see the module docstring)."""

    intercept: float
    slope: float
    slope_se: float  # nan with fewer than 3 points or a single x
    n: int

    @property
    def df(self) -> int:
        return self.n - 2

    def slope_ci(self, level: float = LEVEL) -> tuple[float, float]:
        """Two-sided ``level`` confidence interval of the slope (nan, nan when it has no spread to judge by)."""
        if not math.isfinite(self.slope_se):
            return math.nan, math.nan
        hw = float(sp.t.ppf((1 + level) / 2, self.df)) * self.slope_se
        return self.slope - hw, self.slope + hw

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def trend(x: Sequence[float], y: Sequence[float]) -> Trend:
    """Least-squares fit of y = a + b·x with the slope's standard error (nan when n < 3 or all x are equal;
    slope nan too when all x are equal)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    if n != len(ys) or n == 0:
        raise ValueError(f"trend: x and y must be non-empty and of one length, got {len(xs)} and {len(ys)}")
    sxx = float(((xs - xs.mean()) ** 2).sum())
    if sxx == 0:
        return Trend(float(ys.mean()), math.nan, math.nan, n)
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum()) / sxx
    intercept = float(ys.mean()) - slope * float(xs.mean())
    if n < 3:
        return Trend(intercept, slope, math.nan, n)
    residual = float(((ys - intercept - slope * xs) ** 2).sum()) / (n - 2)
    return Trend(intercept, slope, math.sqrt(residual / sxx), n)


# --------------------------------------------------------------------------------------- power check
@dataclass(frozen=True)
class PowerCheck:
    trivial: Optional[Comparison]  # reference − trivial baseline, paired by seed; None: no trivial baseline
    contrast: Comparison  # reference − degraded
    direction: str
    reference_mean: float
    trivial_mean: float  # nan without a trivial baseline

    @property
    def leaves_trivial(self) -> bool:
        """The reference is better than the trivial baseline beyond the seed spread (True when not judged)."""
        c = self.trivial
        return c is None or (c.distinguishable and c.a_better(self.direction))

    @property
    def separates(self) -> bool:
        """The reference is better than the degraded arm beyond the seed spread."""
        return self.contrast.distinguishable and self.contrast.a_better(self.direction)

    @property
    def reversed(self) -> bool:
        """The degraded arm is better than the reference beyond the seed spread."""
        return self.contrast.distinguishable and not self.contrast.a_better(self.direction)

    @property
    def has_power(self) -> bool:
        return self.leaves_trivial and self.separates


def power_check(
    reference: Mapping[Hashable, float],
    degraded: Mapping[Hashable, float],
    trivial: Mapping[Hashable, float],
    direction: str,
) -> PowerCheck:
    """Whether a study can see an effect at its budget, from its control contrast (values keyed by seed):

    1. the reference (baseline) arm leaves the trivial baseline: reference − trivial, paired by seed;
    2. the reference is better than the degraded arm, a variant known to be worse: reference − degraded.

    Each holds only when its 95 % CI excludes 0 on the better side (a design check, outside the report's
    Holm families). ``trivial`` empty: 1. is not judged.
    """
    mean = summarize(list(trivial.values())).mean if trivial else math.nan
    return PowerCheck(
        compare(reference, trivial) if trivial else None,
        compare(reference, degraded),
        direction,
        summarize(list(reference.values())).mean,
        mean,
    )
