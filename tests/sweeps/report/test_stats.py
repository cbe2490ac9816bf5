"""The report's statistics (sweeps/spec/stats.py) on fixed numbers: intervals, the three verdicts, Holm's
correction, seed counts at 80 % power, success rates, the control's power check, the validation noise and a ladder's gap trend."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as sp

from sweeps.report import comparisons, power
from sweeps.spec import stats


class Said:
    """A verdict with its words (sweeps/report/comparisons.py)."""

    def __init__(self, verdict: stats.Verdict, text: str) -> None:
        self.verdict, self.text = verdict, text

    def __getattr__(self, name):
        return getattr(self.verdict, name)


def one(a, b, direction="minimize", delta=0.01):
    """The verdict of a report holding this one comparison."""
    pair = stats.Pair("A", "B", "m", direction, delta, stats.compare(a, b))
    verdicts, _ = stats.judge([pair])
    return Said(verdicts[0], comparisons.verdict(pair, verdicts[0]))


def paired(diff: float, sd: float, n: int = 3) -> stats.Comparison:
    """A paired comparison with this mean difference and spread of the differences."""
    return stats.Comparison(diff, sd / math.sqrt(n), n - 1, f"paired t (n={n})", n, True, sd)


# --------------------------------------------------------------------------------------- A − B
def test_the_95_interval_uses_student_t_quantiles_of_the_tables():
    # t_{0.975, ν}: 12.706 (ν = 1), 4.303 (2), 2.776 (4); with s_d = 1 the half width is t / √n
    for n, t in [(2, 12.706), (3, 4.303), (5, 2.776)]:
        c = paired(0.0, 1.0, n)
        assert c.half_width == pytest.approx(t / math.sqrt(n), abs=1e-3)


def test_same_seeds_are_paired_and_the_interval_is_the_paired_t():
    a, b = {0: 3.0, 1: 3.1, 2: 2.9}, {0: 4.0, 1: 4.2, 2: 3.95}
    c = stats.compare(a, b)
    d = [a[k] - b[k] for k in a]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    assert c.test == "paired t (n=3)" and c.paired and c.n == 3
    assert c.diff == pytest.approx(-1.05) and c.half_width == pytest.approx(4.3027 * sd / math.sqrt(3), rel=1e-4)
    assert c.p_value == pytest.approx(2 * sp.t.sf(1.05 / (sd / math.sqrt(3)), 2))


def test_arms_with_different_seeds_are_compared_by_welch():
    c = stats.compare({0: 1.0, 1: 1.2}, {2: 2.0, 3: 2.1, 4: 1.9})
    va, vb = 0.02 / 2, 0.01 / 3  # s²/n of each arm
    df = (va + vb) ** 2 / (va**2 / 1 + vb**2 / 2)
    assert c.test == "Welch t (2 vs 3)" and not c.paired and c.n == 2
    assert c.diff == pytest.approx(-0.9) and c.df == pytest.approx(df) and df == pytest.approx(1.68, abs=0.01)
    assert c.half_width == pytest.approx(sp.t.ppf(0.975, df) * math.sqrt(va + vb))


def test_the_tost_rejects_exactly_when_the_90_interval_lies_inside_the_margin():
    for diff, sd, delta in [(0.002, 0.004, 0.01), (0.006, 0.004, 0.01), (-0.003, 0.01, 0.02), (0.0, 0.02, 0.01)]:
        c = paired(diff, sd, 6)
        lo, hi = c.ci(0.90)
        assert (c.tost_p(delta) < 0.05) == (-delta < lo and hi < delta)


# --------------------------------------------------------------------------------------- verdicts
def test_a_known_equal_pair_is_on_par_with_enough_seeds_and_undecided_with_two():
    # the arms differ by ±0.004 from seed to seed, never on average; δ = 0.01
    a8 = {s: 0.5 + 0.01 * s for s in range(8)}
    b8 = {s: a8[s] + (0.004 if s % 2 else -0.004) for s in range(8)}
    v = one(a8, b8, "maximize")
    assert v.kind == stats.ON_PAR
    assert v.text == "on par within ±0.01 (90 % CI of A − B [-0.00286, 0.00286])"
    two = one({0: a8[0], 1: a8[1]}, {0: b8[0], 1: b8[1]}, "maximize")  # 90 % CI ± 6.31 · 0.004: ±0.025
    assert two.kind == stats.UNDECIDED and two.tost_p == pytest.approx(0.1211, abs=1e-4)
    # planned: parity at 5 seeds per arm (3 more); 'better' cannot be planned without a difference
    assert (two.seeds_on_par, two.seeds_better, two.more_seeds, two.deciding) == (5, None, 3, stats.ON_PAR)
    assert two.text == (
        "undecided: 'better' cannot be planned: no difference observed; 'on par' needs 5 seeds per "
        "arm (3 more); at 80 % power"
    )


def test_a_known_different_pair_is_better_with_the_gain_and_its_interval():
    a, b = {0: 3.0, 1: 3.1, 2: 2.9}, {0: 4.0, 1: 4.2, 2: 3.95}  # a lower by 1.05 ± 0.124
    v = one(a, b, "minimize")
    assert v.kind == stats.BETTER and v.p_holm == pytest.approx(0.000755, rel=1e-3)
    assert v.text == "A better than B by 1.05 (95 % CI [0.926, 1.17])"
    flipped = one(a, b, "maximize")  # higher is better: B wins, by the same gain
    assert flipped.kind == stats.BETTER and flipped.text == "B better than A by 1.05 (95 % CI [0.926, 1.17])"


def test_a_real_difference_smaller_than_delta_is_on_par_and_says_so():
    a = {s: 2.0 + 0.01 * s for s in range(6)}
    b = {s: a[s] + 0.002 + (0.0005 if s % 2 else -0.0005) for s in range(6)}  # B higher by 0.002 ± 0.0005; δ 0.01
    v = one(a, b, "minimize")
    assert v.kind == stats.ON_PAR and v.p_holm < 0.05
    assert v.text.endswith("; A is better by 0.002, less than δ")


def test_identical_arms_are_on_par_and_arms_within_the_seed_noise_are_undecided():
    a = {0: 5.1, 1: 5.3, 2: 5.2}
    same = one(a, dict(a))
    assert same.kind == stats.ON_PAR and same.text == "on par within ±0.01 (90 % CI of A − B [0, 0])"
    noisy = one({0: 5.0, 1: 5.4, 2: 4.9}, {0: 5.1, 1: 5.2, 2: 5.1}, delta=0.01)
    assert noisy.kind == stats.UNDECIDED and noisy.seeds_better is not None and noisy.seeds_better > 3


def test_one_seed_per_arm_is_undecided_with_no_plan():
    v = one({0: 1.0}, {0: 9.0})
    assert v.kind == stats.UNDECIDED and v.more_seeds is None
    assert v.text.startswith("undecided: fewer than 2 seeds in an arm")


def test_an_observed_difference_beyond_delta_puts_parity_out_of_reach():
    v = one({0: 1.0, 1: 1.3, 2: 1.1}, {0: 1.2, 1: 1.2, 2: 1.3}, delta=0.01)  # diff −0.1, noisy
    assert v.kind == stats.UNDECIDED and v.seeds_on_par is None and v.deciding == stats.BETTER
    assert "'on par' is out of reach: |A − B| = 0.1 ≥ δ" in v.text


# --------------------------------------------------------------------------------------- Holm
def test_holm_adjusted_p_values_match_the_hand_computation():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> 0.06 (kept monotone)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm_levels([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.05 / 3, 0.05, 0.05 / 2, 0.05 / 4])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert stats.holm([0.02]) == pytest.approx([0.02])


def test_holm_turns_a_lone_better_into_undecided_in_a_family_of_three():
    a, b = {0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.1, 1: 1.15, 2: 1.2}  # d = −0.15, s_d = 0.05: t = 5.196, ν = 2
    pair = stats.Pair("A", "B", "m", "minimize", 0.01, stats.compare(a, b))
    alone, _ = stats.judge([pair])
    assert alone[0].kind == stats.BETTER and alone[0].p == pytest.approx(0.0351, abs=1e-4)
    crowded, others = stats.judge([pair], other_better_p=[0.2, 0.01])  # e.g. success-rate tests
    # sorted: 0.01·3 = 0.03, 0.0351·2 = 0.0702, 0.2·1 -> 0.2
    assert crowded[0].kind == stats.UNDECIDED and crowded[0].p_holm == pytest.approx(0.0702, abs=1e-4)
    assert others == pytest.approx([0.2, 0.03])


def test_a_pair_that_may_not_be_on_par_is_never_on_par_and_leaves_the_tost_family():
    same = {0: 2.0, 1: 2.1, 2: 2.2}
    near = {0: 2.001, 1: 2.099, 2: 2.2005}  # within ±0.01 at every seed: on par by TOST
    eligible = stats.Pair("A", "B", "m", "minimize", 0.01, stats.compare(same, near))
    (verdict,), _ = stats.judge([eligible])
    assert verdict.kind == stats.ON_PAR
    barred = dataclasses.replace(eligible, may_be_on_par=False)  # one arm ignores its context
    (verdict,), _ = stats.judge([barred])
    assert verdict.kind == stats.UNDECIDED and verdict.seeds_on_par is None and math.isnan(verdict.tost_p_holm)
    # beside an eligible pair, the barred one is no member of the TOST family: the eligible pair's TOST p is its own
    other = stats.Pair("C", "D", "m", "minimize", 0.01, stats.compare(same, near))
    alone, _ = stats.judge([other])
    (_, shared), _ = stats.judge([barred, other])
    assert shared.tost_p_holm == pytest.approx(alone[0].tost_p_holm)


# --------------------------------------------------------------------------------------- seeds needed
def test_seeds_for_better_match_the_power_tables():
    # paired (one-sample) t, α = 0.05 two-sided, 80 % power: d = 1 -> n = 10 (power 0.803), d = 0.5 -> 34 (0.808)
    assert stats.seeds_for_better(paired(1.0, 1.0)) == 10
    assert float(stats.power_better(paired(1.0, 1.0), 10)) == pytest.approx(0.8031, abs=1e-4)
    assert float(stats.power_better(paired(1.0, 1.0), 9)) < 0.8
    assert stats.seeds_for_better(paired(0.5, 1.0)) == 34
    # at a stricter Holm level the count grows
    assert stats.seeds_for_better(paired(1.0, 1.0), alpha=0.025) > 10


def test_seeds_for_on_par_match_a_hand_checked_case():
    # true difference 0, s_d = δ: TOST power (lower bound) 0.795 at n = 10, 0.849 at 11 (a simulation of
    # 20,000 studies gives 0.796 at 10); the normal approximation (z_0.95 + z_0.90)² = 8.6 ignores the t tails
    c = paired(0.0, 1.0)
    assert stats.seeds_for_on_par(c, 1.0) == 11
    assert [round(float(stats.power_on_par(c, 1.0, n)), 3) for n in (10, 11)] == [0.795, 0.849]


def test_seeds_needed_grow_with_the_spread():
    spreads = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0]
    better = [stats.seeds_for_better(paired(1.0, sd)) for sd in spreads]
    par = [stats.seeds_for_on_par(paired(0.0, sd), 1.0) for sd in spreads]
    for counts in (better, par):
        assert all(x is not None for x in counts)
        assert counts == sorted(counts) and counts[0] < counts[-1]
    assert better[2:] == [10, 20, 34, 73]
    welch = [
        stats.seeds_for_better(stats.compare({0: 0.0, 1: sd, 2: 2 * sd}, {3: 1.0, 4: 1 + sd, 5: 1 + 2 * sd}))
        for sd in spreads
    ]  # Welch, each arm's standard deviation sd
    assert all(x is not None for x in welch) and welch == sorted(welch) and welch[0] < welch[-1]


def test_no_seed_count_when_nothing_was_observed_to_plan_from():
    assert stats.seeds_for_better(paired(0.0, 1.0)) is None  # no difference
    assert stats.seeds_for_on_par(paired(0.02, 0.01), 0.01) is None  # observed beyond δ
    assert stats.seeds_for_better(paired(0.001, 10.0)) is None  # beyond MAX_SEEDS


# --------------------------------------------------------------------------------------- success rates
def test_success_rates_have_the_exact_clopper_pearson_interval():
    rate = stats.success_rate([1.0, 0.99, 0.26, 0.95, 0.3], 0.9, "maximize")
    ci = sp.binomtest(3, 5).proportion_ci(confidence_level=0.95, method="exact")
    assert (rate.k, rate.n) == (3, 5) and (rate.lo, rate.hi) == pytest.approx((ci.low, ci.high))
    assert (rate.lo, rate.hi) == pytest.approx((0.1466, 0.9473), abs=1e-4)
    assert str(rate) == "3/5 [0.15, 0.95]"
    low_loss = stats.success_rate([0.1, 0.5, 0.2], 0.25, "minimize")  # at or below the threshold
    assert (low_loss.k, low_loss.n) == (2, 3)
    assert stats.success_rate([], 0.9, "maximize").n == 0


def test_success_rates_are_compared_by_boschloos_exact_test():
    solved_all, solved_two = stats.Rate(6, 6, 0.54, 1.0), stats.Rate(2, 6, 0.04, 0.78)
    assert stats.compare_rates(solved_all, solved_two) == pytest.approx(0.0210, abs=1e-4)  # Fisher: 0.061
    assert stats.compare_rates(stats.Rate(3, 3, 0, 1), stats.Rate(3, 3, 0, 1)) == 1.0
    assert stats.compare_rates(stats.Rate(0, 0, math.nan, math.nan), solved_two) == 1.0


# --------------------------------------------------------------------------------------- power check
def test_a_control_that_separates_and_leaves_the_trivial_baseline_gives_the_study_power():
    check = stats.power_check(
        {0: 2.80, 1: 2.82, 2: 2.81}, {0: 3.08, 1: 3.09, 2: 3.10}, {0: 3.09, 1: 3.09, 2: 3.09}, "minimize"
    )
    assert check.leaves_trivial and check.separates and check.has_power
    assert power.phrase(check)[1].startswith(
        "The control separates: the reference is better than the degraded arm by 0.28 ± "
    )


def test_a_control_within_the_seed_noise_says_the_study_has_no_power():
    check = stats.power_check(
        {0: 2.9, 1: 3.1, 2: 3.0}, {0: 3.0, 1: 3.0, 2: 3.05}, {0: 3.09, 1: 3.09, 2: 3.09}, "minimize"
    )
    assert not check.separates and not check.has_power
    assert "does NOT separate" in power.phrase(check)[1]
    assert "no verdict below can be trusted; run the GPU preset" in power.phrase(check)[1]


def test_a_reference_on_the_trivial_plateau_is_caught_even_when_the_control_separates():
    # both arms learn nothing useful, the degraded one diverges a little: a "separation" without learning
    check = stats.power_check(
        {0: 3.09, 1: 3.10, 2: 3.08}, {0: 3.5, 1: 3.6, 2: 3.55}, {0: 3.09, 1: 3.09, 2: 3.09}, "minimize"
    )
    assert check.separates and not check.leaves_trivial and not check.has_power
    assert "does NOT leave the trivial baseline" in power.phrase(check)[0]


def test_a_reversed_control_is_named_as_such_and_accuracy_is_maximised():
    check = stats.power_check(
        {0: 0.30, 1: 0.31, 2: 0.29}, {0: 0.90, 1: 0.95, 2: 0.92}, {0: 0.0625, 1: 0.0625, 2: 0.0625}, "maximize"
    )
    assert check.leaves_trivial and not check.separates and "REVERSED" in power.phrase(check)[1]
    check = stats.power_check({0: 1.0, 1: 0.99, 2: 1.0}, {0: 0.30, 1: 0.35, 2: 0.28}, {}, "maximize")
    assert check.has_power and power.phrase(check)[0].startswith("No trivial baseline")


# --------------------------------------------------------------------------------------- validation noise
def test_the_validation_error_is_the_bootstrap_over_examples_computed_by_hand():
    # two arms, two seeds each, five validation examples with uneven target counts
    counts = [3, 1, 4, 2, 5]
    a = [([2.0, 1.5, 3.0, 0.4, 5.0], counts), ([2.2, 1.1, 2.8, 0.6, 4.5], counts)]
    b = [([2.5, 1.2, 3.6, 0.9, 5.5], counts), ([2.4, 1.4, 3.9, 0.8, 5.1], counts)]
    idx = np.random.default_rng(7).integers(0, 5, size=(200, 5))  # the draws validation_error makes
    diffs = []
    for row in idx:
        metric = [sum(s[i] for i in row) / sum(c[i] for i in row) for s, c in a + b]
        diffs.append((metric[0] + metric[1]) / 2 - (metric[2] + metric[3]) / 2)
    expected = sp.norm.ppf(0.975) * np.std(diffs, ddof=1)
    assert stats.validation_error(a, b, resamples=200, seed=7) == pytest.approx(expected, rel=1e-12)


def test_the_validation_error_of_per_example_values_is_their_paired_standard_error():
    # one target per example: the bootstrap standard error of mean(a − b) tends to sd(a − b) / √n
    rng = np.random.default_rng(0)
    a = rng.normal(3.0, 1.0, 2000)
    b = a + rng.normal(0.1, 0.3, 2000)
    ones = np.ones(2000)
    half_width = stats.validation_error([(a, ones)], [(b, ones)], resamples=2000)
    assert half_width == pytest.approx(1.96 * np.std(a - b) / np.sqrt(2000), rel=0.08)


# --------------------------------------------------------------------------------------- the trend
def test_the_gap_trend_and_its_slope_interval_match_scipy_linregress():
    from scipy import stats as sp

    from sweeps.spec import stats

    x = [4.57, 4.57, 4.57, 5.01, 5.01, 5.01, 5.54, 5.54, 5.54]  # log10 parameters, 3 seeds a rung
    y = [0.021, 0.018, 0.030, 0.034, 0.029, 0.041, 0.052, 0.047, 0.060]  # gaps
    t, ref = stats.trend(x, y), sp.linregress(x, y)
    assert (t.slope, t.intercept, t.slope_se) == pytest.approx((ref.slope, ref.intercept, ref.stderr), rel=1e-12)
    half = sp.t.ppf(0.975, len(x) - 2) * ref.stderr
    assert t.slope_ci() == pytest.approx((ref.slope - half, ref.slope + half), rel=1e-12)
    assert t.at(5.0) == pytest.approx(ref.intercept + 5.0 * ref.slope)
    # too few points for a spread, or a single size: no interval, and no slope without 2 sizes
    assert math.isnan(stats.trend([1.0, 2.0], [0.1, 0.3]).slope_ci()[0])
    assert math.isnan(stats.trend([1.0, 1.0, 1.0], [0.1, 0.2, 0.3]).slope)


def test_an_arm_explains_the_spread_beyond_its_seeds_when_each_seeds_own_level_is_taken_out():
    """Seeds 0-2 move both arms by a whole unit; arm b sits 0.2 below a at every seed. Grouped alone (one-way) the
    seeds' spread hides the arm; with the seeds as blocks (as the comparisons pair seeds) the arm explains it. A gap
    that changes sign from seed to seed explains nothing."""
    from sweeps.spec.stats import between_ss, blocked_p, one_way_p

    steady = {("a", s): 2.0 + s for s in range(3)} | {("b", s): 1.8 + s for s in range(3)}
    assert one_way_p([[2.0, 3.0, 4.0], [1.8, 2.8, 3.8]]) > 0.5
    assert blocked_p(steady) == 0.0  # no spread left once arm and seed are taken out
    noisy = {("a", s): 2.0 + s + e for s, e in enumerate((0.1, -0.05, 0.02))} | {("b", s): 1.8 + s for s in range(3)}
    assert blocked_p(noisy) < 0.05
    flips = {("a", 0): 2.0, ("a", 1): 3.1, ("a", 2): 4.0, ("b", 0): 2.1, ("b", 1): 3.0, ("b", 2): 4.05}
    assert blocked_p(flips) > 0.5
    assert between_ss(steady) == pytest.approx(6 * 0.1**2)  # each arm's mean 0.1 from the grand mean, 3 trials each
