"""Comparing a study's arms over replicates (seeds): mean ± std, differences with 95 % confidence
intervals, and a verdict in words.

For arms A and B with values a_i, b_j of one metric:

* paired (both arms ran the same seeds, n ≥ 2 pairs): d_i = a_i − b_i,
  CI = d̄ ± t_{0.975, n−1} · s_d / √n;
* otherwise Welch: d = ā − b̄, se = √(s_a²/n_a + s_b²/n_b),
  ν = se⁴ / ((s_a²/n_a)²/(n_a−1) + (s_b²/n_b)²/(n_b−1)), CI = d ± t_{0.975, ν} · se.

The verdict names the better arm only when the interval excludes 0; otherwise it says the arms are not
distinguishable at this budget. With fewer than 2 replicates per arm there is no spread to judge by:
never distinguishable. Student's t quantile is computed here (no SciPy dependency) from the
regularised incomplete beta function: P(|T| ≤ t) = 1 − I_{ν/(ν+t²)}(ν/2, 1/2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

LEVEL = 0.95


# --------------------------------------------------------------------------------------- Student's t
def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by its continued fraction (modified Lentz), 1e-14 accurate."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below the mean; use symmetry above it
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """x with P(T_df ≤ x) = p, by bisection on :func:`t_cdf`."""
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2


# --------------------------------------------------------------------------------------- summaries
@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float  # sample standard deviation (n − 1); nan when n < 2


def summarize(values: Sequence[float]) -> Summary:
    n = len(values)
    mean = sum(values) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n >= 2 else math.nan
    return Summary(n, mean, std)


@dataclass(frozen=True)
class Comparison:
    diff: float  # mean(A) − mean(B)
    half_width: float  # of the 95 % CI; nan when there is no spread to judge by
    test: str  # "paired t (n=3)", "Welch t (3 vs 2)" or "none (1 vs 3 replicates)"

    @property
    def distinguishable(self) -> bool:
        return math.isfinite(self.half_width) and abs(self.diff) > self.half_width

    def a_better(self, direction: str) -> bool:
        """Whether A's mean is the better one under ``direction`` (not whether that is beyond noise)."""
        return (self.diff < 0) == (direction == "minimize")


def compare(a: Mapping[Hashable, float], b: Mapping[Hashable, float], level: float = LEVEL) -> Comparison:
    """A − B for values keyed by replicate (e.g. seed): paired when both have the same replicates."""
    q = (1 + level) / 2
    if set(a) == set(b) and len(a) >= 2:
        d = summarize([a[k] - b[k] for k in a])
        hw = t_quantile(q, d.n - 1) * d.std / math.sqrt(d.n) if d.std > 0 else 0.0
        return Comparison(d.mean, hw, f"paired t (n={d.n})")
    sa, sb = summarize(list(a.values())), summarize(list(b.values()))
    if sa.n < 2 or sb.n < 2:
        return Comparison(sa.mean - sb.mean, math.nan, f"none ({sa.n} vs {sb.n} replicates)")
    va, vb = sa.std ** 2 / sa.n, sb.std ** 2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Comparison(sa.mean - sb.mean, 0.0, f"Welch t ({sa.n} vs {sb.n})")
    df = (va + vb) ** 2 / (va ** 2 / (sa.n - 1) + vb ** 2 / (sb.n - 1))
    return Comparison(sa.mean - sb.mean, t_quantile(q, df) * se, f"Welch t ({sa.n} vs {sb.n})")


def fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.3g}"


def verdict(name_a: str, name_b: str, c: Comparison, direction: str, advice: str = "run the GPU preset") -> str:
    """'A better than B by x ± y' when the 95 % CI of the difference excludes 0, else
    'not distinguishable at this budget: <advice>'."""
    if not c.distinguishable:
        return f"not distinguishable at this budget: {advice}"
    better, worse = (name_a, name_b) if c.a_better(direction) else (name_b, name_a)
    return f"{better} better than {worse} by {fmt(abs(c.diff))} ± {fmt(c.half_width)}"


@dataclass(frozen=True)
class PowerCheck:
    leaves_trivial: bool  # the reference arm is better than the trivial baseline beyond the seed spread
    separates: bool  # the reference arm is better than the degraded arm beyond the seed spread
    lines: tuple[str, ...]  # the findings, in words

    @property
    def has_power(self) -> bool:
        return self.leaves_trivial and self.separates


def power_check(reference: Mapping[Hashable, float], degraded: Mapping[Hashable, float],
                trivial: Mapping[Hashable, float], direction: str, advice: str = "run the GPU preset") -> PowerCheck:
    """Whether a study can see an effect at its budget, from its control contrast (values keyed by seed):

    1. the reference (baseline) arm leaves the trivial baseline: reference − trivial, paired by seed;
    2. the reference is better than the degraded arm, a variant known to be worse: reference − degraded.

    Each holds only when its 95 % CI excludes 0 on the better side. ``trivial`` empty: 1. is not judged.
    """
    lines = []
    if trivial:
        c = compare(reference, trivial)
        leaves = c.distinguishable and c.a_better(direction)
        means = f"{fmt(summarize(list(reference.values())).mean)} vs {fmt(summarize(list(trivial.values())).mean)}"
        found = f"({means}; difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test})"
        lines.append(f"The reference arm leaves the trivial baseline {found}." if leaves else
                     f"The reference arm does NOT leave the trivial baseline {found}: nothing was learned at this "
                     f"budget; {advice}.")
    else:
        leaves = True
        lines.append("No trivial baseline for this metric: only the contrast is judged.")
    c = compare(reference, degraded)
    separates = c.distinguishable and c.a_better(direction)
    gap = f"{fmt(abs(c.diff))} ± {fmt(c.half_width)}, {c.test}"
    if separates:
        lines.append(f"The control separates: the reference is better than the degraded arm by {gap}. The study "
                     "can see an effect of this size at this budget; a smaller one may still go unseen.")
    elif c.distinguishable:
        lines.append(f"The control is REVERSED: the degraded arm is better than the reference by {gap}. The "
                     "control is not the contrast it was meant to be here; check its arms before reading on.")
    else:
        lines.append(f"The control does NOT separate (difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test}): "
                     f"this study has no power at this budget, so no verdict below can be trusted; {advice}.")
    return PowerCheck(leaves, separates, tuple(lines))
