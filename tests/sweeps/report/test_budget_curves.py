"""A budget-curve study's report (sweeps/report/budget_curves.py): the settled rule, learning speed against the
quality reached, the end-of-training rule that a decaying learning rate cannot fool, the table and the figure."""

import dataclasses
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from studies import ARMS, write_study

from sweeps.control import certified_budgets, rows_of
from sweeps.report import budget_curves
from sweeps.spec import stats
from sweeps.spec.study import load_study


def test_a_verdict_settles_where_every_later_doubling_moves_the_arms_less_than_half_delta_and_keeps_the_verdict():
    factors = (1, 2, 4, 8, 16)
    assert budget_curves.settled_at(factors, ["a", "b", "b", "b", "b"], [False, True, True, True]) == 4
    assert budget_curves.settled_at(factors, ["b"] * 5, [True] * 4) == 2  # the first doubling already stable
    assert budget_curves.settled_at(factors, ["b"] * 5, [True, True, True, False]) is None  # the last one moved
    assert budget_curves.settled_at(factors, ["b", "b", "a", "b", "b"], [True] * 4) == 16  # flipped at 4, back at 8
    assert budget_curves.moved_little([(2.0, 2.04), (2.1, 2.12)], 0.1) and not budget_curves.moved_little(
        [(2.0, 2.06)], 0.1
    )


def test_an_arm_is_still_improving_only_when_its_last_doubling_improved_it_by_half_delta_beyond_seed_noise():
    """The change of the cooldown point over the last doubling, paired by seed: a loss that fell by 0.1 at every seed
    is still improving at δ = 0.1; not at δ = 0.3 (less than δ/2); one that fell by 0.1 on average but rose at one seed
    is not shown to."""
    before = {0: 2.0, 1: 2.1, 2: 2.2}
    fell = stats.compare({k: v - 0.1 + 0.001 * k for k, v in before.items()}, before)
    noisy = stats.compare({0: 1.7, 1: 2.2, 2: 2.1}, before)
    assert budget_curves.improving(fell, "minimize", 0.1) is True
    assert budget_curves.improving(fell, "minimize", 0.3) is False
    assert budget_curves.improving(noisy, "minimize", 0.1) is False
    assert budget_curves.improving(fell, "maximize", 0.1) is False  # a falling accuracy is not improving


SEEDS = [100000, 100001, 100002]
# mean objective per budget; the linformer arm trails by 0.3 at ×1 (learning speed), by ~0.01 from ×2 on
MEANS = {"full": [3.0, 2.5, 2.49], "linformer": [3.3, 2.51, 2.50]}


def _trial(arm: str, seed: int, number: int, metric: str, noise: float):
    points = {
        f"x{f}": {metric: MEANS[arm][i] + noise, "val/loss": MEANS[arm][i] + noise} for i, f in enumerate((1, 2, 4))
    }
    return optuna.trial.create_trial(
        params={"seed": seed, "arm": arm},
        distributions={"seed": CategoricalDistribution(SEEDS), "arm": CategoricalDistribution(list(ARMS))},
        values=[points["x4"][metric]],
        user_attrs={"budget_points": points, "metrics": points["x4"]},
    )


def test_the_report_reads_each_pair_at_every_budget_and_names_where_it_settled_and_what_it_is_about(
    tmp_path, tiny_overrides, monkeypatch
):
    """Two arms on three seeds: linformer trails by 0.3 at ×1 (a verdict), by 0.01 from ×2 on (within δ): the pair
    settles at ×4 on its ×2 verdict, which differs from ×1's: learning speed at ×1."""
    space = {"seed": {"type": "categorical", "choices": [0, 1, 2]}, "arm": {"type": "categorical", "choices": ARMS}}
    metric = load_study(write_study(tmp_path, tiny_overrides, "curves", space)).metrics[0]
    path = write_study(tmp_path, tiny_overrides, "curves", space, verdict={"delta": {metric: 0.05}})
    study = load_study(path, curve="1,2,4")
    trials = [
        _trial(arm, seed, i, metric, 0.01 * j * (1.2 if arm == "linformer" else 1))
        for i, (arm, (j, seed)) in enumerate((a, s) for a in ARMS for s in enumerate(SEEDS))
    ]
    found = budget_curves.curves(study, rows_of(study, trials))
    (pair,), arms = found.pairs, found.arms
    assert pair.factors == (1.0, 2.0, 4.0)
    assert [c.pair.comparison.diff for c in pair.compared] == pytest.approx([-0.3, -0.01, -0.01], abs=0.005)
    assert [budget_curves.said(c) for c in pair.compared] == ["full better", *["on par within ±0.05"] * 2]
    assert pair.settled == 4.0 and pair.about.startswith("learning speed at ×1 (full better")
    assert len(arms) == 2 and all(a.improving is False for a in arms)  # 0.01 over the last doubling
    assert found.control is None  # the study has no control: every budget is read
    lines = budget_curves.section(study, found, budget_curves.figure(found.pairs, tmp_path / "f.png"))
    text = "\n".join(lines)
    assert "| pair: A − B, 95 % CI, verdict | ×1 | ×2 | ×4 | settled | about |" in text
    assert "| full | 3.01 | 2.51 | 2.5 | improving by less than δ/2 = 0.025: -0.01 over the last doubling" in text
    assert "×4: on par within ±0.05" in text and (tmp_path / "f.png").stat().st_size > 0
    assert not any(math.isnan(m) for a in arms for m in a.means)

    # a second objective (tokens a second: another unit, effects 10⁵ times larger) is drawn on a panel of its own,
    # with its own δ, so that it does not flatten the quality pairs to a line at zero
    drawn = []
    monkeypatch.setattr(budget_curves, "write_figure", lambda path, fig, dpi: drawn.append(fig))
    speed = dataclasses.replace(pair, metric="tokens_per_sec", delta=3000.0)
    assert budget_curves.figure([pair, speed], tmp_path / "g.png")
    quality, throughput = drawn[0].axes
    assert metric in quality.get_ylabel() and "tokens_per_sec" in throughput.get_ylabel()
    dashed = [{line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"} for ax in drawn[0].axes]
    assert dashed == [{0.05, -0.05}, {3000.0, -3000.0}]


# the control's reference and degraded arm per budget: separated at ×1 and ×2, the degraded arm caught up by ×4;
# a model without context (the runs' trivial baseline) at 4.0 throughout
CONTROL_MEANS = {"reference": [2.0, 1.9, 1.85], "degraded": [3.0, 2.9, 1.86]}
NOISE = {"reference": [0.0, 0.01, 0.02], "degraded": [0.0, 0.04, -0.03]}  # per seed: no constant paired difference


def _control_trial(role: str, seed: int, metric: str, noise: float):
    points = {f"x{f}": {metric: CONTROL_MEANS[role][i] + noise, "trivial_loss": 4.0} for i, f in enumerate((1, 2, 4))}
    return optuna.trial.create_trial(
        params={"control": role, "seed": seed},
        distributions={
            "control": CategoricalDistribution(list(CONTROL_MEANS)),
            "seed": CategoricalDistribution(SEEDS),
        },
        values=[points["x4"][metric]],
        user_attrs={"budget_points": points, "metrics": points["x4"]},
    )


def _controlled_curve(tmp_path, tiny_overrides, name):
    """A study of two arms on three seeds with a control (its reference and degraded arm at two learning rates, the
    runs' trivial baseline as the no-context level), δ = 0.05, as budget curves ×1, ×2, ×4; and its metric."""
    space = {"seed": {"type": "categorical", "choices": [0, 1, 2]}, "arm": {"type": "categorical", "choices": ARMS}}
    control = {
        "reference": {"optim.lr": 0.001},
        "degraded": {"optim.lr": 0.005},
        "no_context": "baseline",
        "seeds": [0, 1, 2],
    }
    metric = load_study(write_study(tmp_path, tiny_overrides, name, space)).metrics[0]
    path = write_study(tmp_path, tiny_overrides, name, space, verdict={"delta": {metric: 0.05}}, control=control)
    return load_study(path, curve="1,2,4"), metric


def test_a_verdict_is_read_only_at_the_budgets_its_control_certifies(tmp_path, tiny_overrides):
    """The control separates at ×1 and ×2 and not at ×4 (its degraded arm learns with budget): the pair's ×4 cell
    is uninformative whatever its numbers, the doubling into ×4 is not judged, and the pair settles, or not, within
    ×1–×2, the settled cell saying so. Where the control certifies ×4 too, the same arms settle there."""
    study, metric = _controlled_curve(tmp_path, tiny_overrides, "certified")
    trials = [
        _trial(arm, seed, i, metric, 0.01 * j * (1.2 if arm == "linformer" else 1))
        for i, (arm, (j, seed)) in enumerate((a, s) for a in ARMS for s in enumerate(SEEDS))
    ]
    control_trials = [_control_trial(r, s, metric, NOISE[r][j]) for r in CONTROL_MEANS for j, s in enumerate(SEEDS)]
    control_rows = rows_of(study.control, control_trials)
    assert certified_budgets(study, control_rows) == (1.0, 2.0)

    found = budget_curves.curves(study, rows_of(study, trials), control_rows)
    (pair,) = found.pairs
    assert found.control.certified == pair.certified == (True, True, False) and pair.span == (0, 2)
    # ×1 → ×2 moved the arms by 0.5 and turned the verdict, and ×2 → ×4 is not judged: nothing settles by ×2
    assert pair.settled is None
    text = "\n".join(budget_curves.section(study, found, drawn=False))
    assert "uninformative: the control does not certify this budget" in text
    # the section opens with the control at each budget: its gain over the runs' no-context level (4.0), the
    # contrast with the degraded arm (1.0 at ×1, 0.01 at ×4), and which budgets it certifies
    assert text.index("| the control, on its cooldown points | ×1 | ×2 | ×4 |") < text.index("| pair: A − B")
    assert "| the reference's context gain [95 % CI] | 1.99 [1.97, 2.01] (needs ≥ 0.5) | 2.09 [" in text
    assert "| the reference against its degraded arm | reference better by 0.993 ± 0.1 | reference better by" in text
    assert "| does not separate (-0.00333 ± 0.1) |\n| certifies the verdicts | yes | yes | no |" in text
    assert "| not settled by ×2 (the control certifies ×1–×2) |" in text
    assert "A verdict is read only at a budget where the control certifies the study" in text
    # the same arms where the control certifies every budget: the doubling into ×4 counts, and the pair settles there
    CONTROL_MEANS["degraded"][2] = 2.9
    try:
        control_rows = rows_of(
            study.control, [_control_trial(r, s, metric, 0.01 * j) for r in CONTROL_MEANS for j, s in enumerate(SEEDS)]
        )
        (everywhere,) = budget_curves.curves(study, rows_of(study, trials), control_rows).pairs
    finally:
        CONTROL_MEANS["degraded"][2] = 1.86
    assert everywhere.certified == (True, True, True) and everywhere.settled == 4.0


def test_the_span_a_verdict_is_read_over_is_the_last_run_of_certified_budgets():
    assert budget_curves.certified_span([True, True, False, False]) == (0, 2)
    assert budget_curves.certified_span([False, True, True, True]) == (1, 4)
    assert budget_curves.certified_span([True, False, True, True]) == (2, 4)
    assert budget_curves.certified_span([False, False]) == (0, 0)


def test_a_throughput_verdict_is_not_sorted_into_learning_speed_or_quality_reached():
    """The same model steps at the same speed at every budget: a tokens/s pair that has not settled is not "learning
    speed", and one that settled is not "quality reached"; a loss pair under the same budgets still is."""
    unsettled = budget_curves.about([], [], (1.0, 2.0, 4.0), None, "tokens_per_sec")
    assert "learning speed" not in unsettled and "quality" not in unsettled and "×4" not in unsettled
    assert budget_curves.about([], [], (1.0, 2.0, 4.0), None, "val/loss") == (
        "not settled by ×4: still changing (learning speed)"
    )


def test_a_pair_whose_arms_are_both_blind_at_a_short_budget_is_kept_and_read_from_where_they_learn(
    tmp_path, tiny_overrides
):
    """Both arms on the no-context level (4.0) at ×1, so the report gives the pair no verdict there; at ×2 and ×4 full
    attention leads by 0.3 and neither arm moves by δ/2. The pair stays in the table (it was dropped, with every
    pair of a rung that learns late: Fig. 3d's n = 32 and 64), its ×1 cell says why it has no verdict, and it settles
    at ×4 on its ×2 verdict, read over ×2–×4."""
    study, metric = _controlled_curve(tmp_path, tiny_overrides, "late")
    means = {"full": [4.0, 2.0, 1.99], "linformer": [4.0, 2.3, 2.29]}
    roles = {"reference": [2.0, 1.9, 1.85], "degraded": [3.0, 2.9, 2.9]}

    def made(params, choices, series, noise):
        points = {f"x{f}": {metric: series[i] + noise[i], "trivial_loss": 4.0} for i, f in enumerate((1, 2, 4))}
        return optuna.trial.create_trial(
            params=params,
            distributions={k: CategoricalDistribution(choices[k]) for k in params},
            values=[points["x4"][metric]],
            user_attrs={"budget_points": points, "metrics": points["x4"]},
        )

    jitter = [[0.004, 0.01, 0.012], [-0.003, -0.01, -0.009], [0.001, 0.002, 0.001]]  # per seed, per budget
    trials = [
        made({"seed": s, "arm": a}, {"seed": SEEDS, "arm": list(ARMS)}, means[a], jitter[j])
        for a in ARMS
        for j, s in enumerate(SEEDS)
    ]
    control_trials = [
        made({"control": r, "seed": s}, {"control": list(roles), "seed": SEEDS}, roles[r], [0.01 * j] * 3)
        for r in roles
        for j, s in enumerate(SEEDS)
    ]
    found = budget_curves.curves(study, rows_of(study, trials), rows_of(study.control, control_trials))
    (pair,) = found.pairs
    assert pair.compared[0] is None and pair.span == (1, 3) and pair.settled == 4.0
    assert budget_curves.said(pair.compared[1]) == "full better"
    text = "\n".join(budget_curves.section(study, found, budget_curves.figure(found.pairs, tmp_path / "f.png")))
    assert "| no verdict: neither arm shown to leave the no-context level | -0.3" in text
    assert "×4: full better (read over ×2–×4: no verdict at ×1)" in text
