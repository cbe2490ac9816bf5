"""Claims a reviewer accepts (sweeps/report/claims.py): a test between budgets before "smaller" or "changed", an
equivalence test before "holds" or "matches", "undecided" for a CI that crosses 0, trends only from three points."""

import math

import pytest

from sweeps.report import claims
from sweeps.spec import stats


def _estimate(diff: float, se: float, n: int = 5) -> stats.Comparison:
    return stats.Comparison(diff, se, n - 1, f"paired t (n={n})", n, True)


def test_the_change_between_two_independent_estimates_adds_their_variances():
    earlier, later = _estimate(0.2, 0.03), _estimate(0.1, 0.04)
    moved = claims.change(earlier, later)
    assert moved.diff == pytest.approx(-0.1) and moved.se == pytest.approx(0.05)
    assert moved.df == pytest.approx(0.05**4 / (0.04**4 / 4 + 0.03**4 / 4))


@pytest.mark.parametrize(
    "earlier, later, word",
    [
        ((0.2, 0.01), (0.05, 0.01), claims.SMALLER),  # a change far beyond noise
        ((0.2, 0.01), (0.4, 0.01), claims.LARGER),
        ((0.2, 0.01), (-0.2, 0.01), claims.CHANGED),  # the other arm ahead
        ((0.2, 0.05), (0.15, 0.05), claims.NOT_SHOWN),  # 0.05 apart, within noise: neither smaller nor holds
        ((0.2, 0.002), (0.201, 0.002), claims.HOLDS),  # the change shown inside ±δ
        ((0.2, 0.01), (0.004, 0.05), claims.UNDECIDED),  # a later CI across 0: never "same direction"
    ],
)
def test_a_later_budget_is_worded_only_from_a_test_between_the_budgets(earlier, later, word):
    e, l_ = _estimate(*earlier), _estimate(*later)
    assert claims.budget_word(e, l_, claims.change(e, l_), delta=0.02) == word


def test_the_earlier_estimate_pools_every_seed_of_the_family_and_refuses_a_seed_held_twice():
    design, replication = {(0,): 1.0, (1,): 1.2}, {(100,): 1.1}
    assert claims.pooled(design, replication) == {(0,): 1.0, (1,): 1.2, (100,): 1.1}
    with pytest.raises(ValueError, match="in two members"):
        claims.pooled(design, {(1,): 0.9})


def test_two_arms_match_only_through_an_equivalence_test():
    close_but_noisy = _estimate(0.01, 0.05)
    close_and_tight = _estimate(0.01, 0.002)
    assert not claims.matches(close_but_noisy, 0.05)
    assert claims.matches(close_and_tight, 0.05)
    assert claims.matches_words(close_but_noisy, 0.05).startswith("not shown to match within ±0.05")
    assert claims.matches_words(close_and_tight, 0.05).startswith("matches within ±0.05")


def test_a_trend_needs_three_distinct_points_and_is_shown_with_its_residuals():
    two = claims.trend_words([1, 2], [0.1, 0.3], "gap per log10 n/k")
    assert "no trend from fewer than 3 distinct points" in two and "y =" not in two
    three = claims.trend_words([1, 2, 3], [0.1, 0.3, 0.4], "gap per log10 n/k")
    assert "y = -0.0333 + 0.15·x" in three and "residuals -0.0167, 0.0333, -0.0167" in three


def test_verdicts_read_after_seeds_were_added_are_labelled_two_stage_and_families_are_named():
    assert claims.two_stage_words(()) == ""
    assert claims.two_stage_words((5, 6)).startswith("two-stage: seeds 5, 6 were added after the study had been read")
    assert claims.family_words(["a − b on val/loss", "a − c on val/loss"]) == (
        "2 'better' test(s) corrected together: a − b on val/loss; a − c on val/loss"
    )
    assert claims.effects({1: 2.0, 2: 3.0}, {1: 1.5, 3: 0.0}) == {1: 0.5}
    assert math.isnan(claims.change(_estimate(0.1, math.nan), _estimate(0.2, 0.1)).se)


def test_the_report_names_its_holm_families_comparison_by_comparison():
    from types import SimpleNamespace

    from sweeps.report.comparisons import family_line

    def compared(a, b, on_par=True):
        return SimpleNamespace(pair=SimpleNamespace(a=a, b=b, metric="val/loss", may_be_on_par=on_par))

    found = SimpleNamespace(compared=[compared("x", "y"), compared("x", "z", False)], rates=[])
    (line,) = family_line(found)
    assert "2 'better' test(s) corrected together: x − y on val/loss; x − z on val/loss" in line
    assert "1 'on par' test(s) corrected together: x − y on val/loss" in line
    assert family_line(SimpleNamespace(compared=[], rates=[])) == []
