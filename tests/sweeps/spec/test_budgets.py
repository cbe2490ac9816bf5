"""Budget curves (sweeps/spec/budgets.py): the factors, each budget's steps and branch step, what a curve costs, and
``sweep --budgets ... --check`` on every shipped CPU study."""

import pytest
from studies import ARMS, write_study

from experiments import cli
from foundation.errors import ConfigError
from sweeps.spec import budgets
from sweeps.spec.study import load_study, shipped_studies


def test_each_budget_branches_off_the_trunk_at_its_cooldowns_start_and_costs_the_trunk_plus_the_cooldowns():
    """At 600 steps and 20 %: ×1 branches at 480 and cools down 120 steps, ×16 (9,600 steps) at 7,680; the trunk
    trains to 7,680 and the five cooldowns 120 + 240 + 480 + 960 + 1,920 = 3,720: 11,400 steps, 19 × the study's
    (12.8 + 0.2 × 31), against 31 × for a study per budget."""
    curve = budgets.points((1, 2, 4, 8, 16), 600, 0.2)
    assert [(p.steps, p.branch, p.cooldown_steps) for p in curve] == [
        (600, 480, 120),
        (1200, 960, 240),
        (2400, 1920, 480),
        (4800, 3840, 960),
        (9600, 7680, 1920),
    ]
    cost = budgets.cost(curve, 600)
    assert (cost["trunk_steps"], cost["cooldown_steps"], cost["steps"]) == (7680, 3720, 11400)
    assert cost["times"] == pytest.approx(19.0) and cost["separate_times"] == pytest.approx(31.0)
    assert "a trunk of 7680 steps and cooldowns of 3720" in budgets.cost_line((1, 2, 4, 8, 16), 600, 0.2)
    assert "19 × the study's 600 steps, against 31 × for a study per budget" in budgets.cost_line(
        (1, 2, 4, 8, 16), 600, 0.2
    )


def test_an_extension_is_priced_as_the_trunks_new_steps_and_the_new_cooldowns_the_trial_would_train():
    """A curve run to ×1, ×2 at 600 steps and 20 %, listed to ×4: the trunk goes on from 960 to 1,920 and ×4 cools
    down 480 steps, 1,440 steps (2.4 ×), which is what the trial itself is counted to train."""
    from training import config as run_config

    line = budgets.extension_line((1, 2, 4), (1, 2), 600, 0.2)
    assert "run to ×1, ×2: the trunk from step 960 to 1920 and the cooldowns of ×4 (480 steps)" in line
    assert "1440 steps per seed and arm (2.4 × the study's 600 steps)" in line
    cfg = run_config.load(None, ["trainer.max_steps=600", "optim.cooldown_fraction=0.2"])
    assert budgets.work(cfg, (1, 2, 4), (1, 2))[0] == 1440
    # a listed budget below the largest one run: no new trunk steps, its cooldown only
    assert "no trunk steps and the cooldowns of ×1.5 (180 steps), 180 steps" in budgets.extension_line(
        (1, 1.5, 2), (1, 2), 600, 0.2
    )


def test_a_curve_trial_counts_the_validations_of_its_trunk_and_of_each_cooldown():
    """100 steps validated every 25, ×1 and ×2 at 20 %: the trunk to 160 validates at 25 … 150 and at its end
    (7), the ×1 cooldown 80 → 100 at 100 (1), the ×2 one 160 → 200 at 175 and 200 (2)."""
    from training import config as run_config

    cfg = run_config.load(None, ["trainer.max_steps=100", "trainer.val_check_interval=25", "optim.warmup_steps=10"])
    assert budgets.work(cfg, (1, 2)) == (160 + 20 + 40, 7 + 1 + 2)


def test_an_extended_curve_counts_only_the_trunks_new_steps_and_the_new_cooldowns():
    """100 steps validated every 25, at 20 %: ×1 and ×2 ran (the trunk to 160). Listing ×4 (400 steps, branch 320)
    trains the trunk on 160 → 320 (validated at 175 … 300 and its end: 7) and one cooldown 320 → 400 (4): the sum of
    the whole curve's work less what ran. A list that adds nothing is no work."""
    from training import config as run_config

    cfg = run_config.load(None, ["trainer.max_steps=100", "trainer.val_check_interval=25", "optim.warmup_steps=10"])
    assert budgets.work(cfg, (1, 2, 4), done=(1, 2)) == (160 + 80, 7 + 4)
    assert budgets.work(cfg, (1, 2, 4))[0] - budgets.work(cfg, (1, 2))[0] == 160 + 80
    assert budgets.work(cfg, (1, 2), done=(1, 2)) == (0, 0)
    assert budgets.factor_of(budgets.name(2.5)) == 2.5


@pytest.mark.parametrize(
    "factors, message",
    [
        ([1], "at least 2 budgets make a curve"),
        ([1, 0.5], "0.5 is not a number in [1, 100]"),
        ([1, 101], "101 is not a number in [1, 100]"),
        ([1, 2.125], "2.125 has more than two decimals"),
        ([2, 1], "2,1 must be sorted and distinct, smallest first"),
        ([1, 1], "must be sorted and distinct"),
        ([1, 1.01], "×1.01 gives 10 steps, as many as ×1 at trainer.max_steps=10; each budget must change the step"),
    ],
)
def test_bad_factors_are_refused_in_one_line_naming_the_flag(factors, message):
    with pytest.raises(ConfigError) as err:
        budgets.check_factors(factors, 10)
    assert message in str(err.value) and str(err.value).startswith("--budgets")


def test_the_flag_reads_a_comma_separated_list_and_refuses_anything_else():
    assert budgets.parse("1, 2,4.5") == [1.0, 2.0, 4.5]
    with pytest.raises(ConfigError, match="not a comma-separated list of numbers"):
        budgets.parse("1,two")


@pytest.mark.parametrize("flag", [["--budget", "4"], ["--replicate"]])
def test_budgets_with_budget_or_replicate_is_refused_in_one_line_and_writes_nothing(
    tmp_path, tiny_overrides, capsys, flag
):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "curves",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}},
    )
    assert cli.main(["sweep", str(path), "--budgets", "1,2", *flag, "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--budgets: a budget curve is a derived study of its own" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_curve_study_is_a_derived_study_on_fresh_seeds_whose_cooldown_must_follow_the_warm_up(
    tmp_path, tiny_overrides
):
    """Its name ends in _curve, its seeds are past any --budget study's, its control's are too; a ×1 cooldown
    that would start inside the warm-up (6 steps, 20 %: step 5, warm-up 2 → fine; warm-up 6 → refused) is refused."""
    space = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}}
    path = write_study(tmp_path, tiny_overrides, "curves", space)
    study = load_study(path, curve="1,2,4")
    assert study.name == "curves_curve" and study.budgets == (1.0, 2.0, 4.0)
    assert study.seeds == [100000, 100001] and study.derived_flag == "--budgets 1,2,4"
    bad = write_study(tmp_path, tiny_overrides, "warm", space, {"optim.warmup_steps": 6})
    with pytest.raises(ConfigError, match=r"--budgets: ×1: optim.cooldown_fraction: 0.2 of trainer.max_steps=6"):
        load_study(bad, curve="1,2")


@pytest.mark.parametrize("path", shipped_studies(), ids=lambda p: p.stem)
def test_every_shipped_cpu_study_validates_as_budget_curves(path, capsys):
    """``sweep <file> --preset cpu --budgets 1,2,4,8,16 --check``: every point of the study and its control, as a
    trunk and five cooldowns, checked; nothing written."""
    assert cli.main(["sweep", str(path), "--preset", "cpu", "--budgets", "1,2,4,8,16", "--check"]) == 0
    assert "study OK" in capsys.readouterr().out


def test_the_plan_projects_a_curve_trial_as_its_trunk_and_cooldowns_and_states_the_cost(tmp_path, tiny_overrides):
    """6 steps validated every 3, ×1 and ×2 at 20 %: the trunk trains 10 steps (validated at 3, 6, 9 and its end),
    the cooldowns 5 → 6 and 10 → 12 (one validation each): 13 steps and 6 validations a trial, and the plan says what
    the curve costs."""
    from sweeps.run import plan, preflight

    space = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}}
    study = load_study(write_study(tmp_path, tiny_overrides, "curves", space), curve="1,2")
    shapes = preflight.shapes_of(study)
    assert {t[2:] for s in shapes for t in s.trials} == {(13, 6)}
    for s in shapes:
        s.measured = {"setup_s": 1.0, "first_step_s": 1.0, "step_s": 1.0, "validation_s": 0.0, "start_s": 0.0,
                      "memory": "rss", "peak_mb": 1.0, "total_mb": 10.0}  # fmt: skip
    projected = plan.project(study, shapes, workers=1, threads=1, gpus=0)
    assert projected["wall_s"] == pytest.approx(4 * (1 + 1 + 12))
    assert "plan: budgets ×1, ×2: a trunk of 10 steps and cooldowns of 3 per seed and arm" in "\n".join(
        plan.lines(projected)
    )

    # the same curve extended to ×4 after ×1 and ×2 ran at every point: the trunk 10 → 19 and the ×4 cooldown 19 → 24
    # (validated at 12, 15, 18, 19 and 21, 24: 6), not the whole curve again
    left = {(n, repr(sorted(p.items()))): (1.0, 2.0) for s in shapes for n, p, _, _ in s.trials}
    extended = load_study(write_study(tmp_path, tiny_overrides, "curves", space), curve="1,2,4")
    shapes = preflight.with_trials_of(shapes, extended)
    assert plan.project(extended, shapes, workers=1, threads=1, gpus=0, left=left)["wall_s"] == pytest.approx(
        4 * (1 + 1 + (9 + 5 - 1))
    )
