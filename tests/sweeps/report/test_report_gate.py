"""The report certifies its study before it judges (issue 22): the reference's context gain over a model without
context opens the report, and below the study's threshold no verdict is given; the control's arms stay out of the
Holm families; a control point that is one of the study's own trials is trained once and reused."""

from __future__ import annotations

import csv
import json

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from studies import write_study

from experiments import cli
from foundation.errors import ConfigError
from sweeps.report import markdown
from sweeps.report.command import write_report
from sweeps.run import command as sweep
from sweeps.run.storage import RunStorage
from sweeps.spec import stats
from sweeps.spec.study import load_study

ARMS = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}}
CONTROL = {"reference": {"optim.lr": 1e-3}, "degraded": {"optim.lr": 5e-3}}  # reference = arm a


def add(ostudy: optuna.Study, params: dict, value: float, **metrics) -> None:
    """A finished trial with these params and objective value (val/loss)."""
    dists = {p: IntDistribution(0, 99) if p == "seed" else CategoricalDistribution([v]) for p, v in params.items()}
    ostudy.add_trial(
        optuna.trial.create_trial(
            params=params, distributions=dists, value=value, user_attrs={"metrics": {"val/loss": value, **metrics}}
        )
    )


def study_with(tmp_path, tiny_overrides, a: list, b: list, degraded: list, **keys):
    """A study of arms a and b over seeds, whose control's reference is arm a, with these val/loss values."""
    path = write_study(
        tmp_path,
        tiny_overrides,
        "gated",
        {"seed": {"type": "categorical", "choices": list(range(len(a)))}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=CONTROL,
        **keys,
    )
    study = load_study(path)
    ostudy, ocontrol = sweep.open_study(RunStorage(study, None)), sweep.open_study(RunStorage(study.control, None))
    for arm, values in (("a", a), ("b", b)):
        for seed, v in enumerate(values):
            add(ostudy, {"seed": seed, "arm": arm}, v, trivial_loss=3.1)
    for seed, v in enumerate(degraded):
        add(ocontrol, {"control": "degraded", "seed": seed}, v)
    return study


def test_a_reference_on_the_plateau_is_reported_uninformative_with_no_verdict(tmp_path, tiny_overrides):
    # arm b beats a by 0.2 at every seed, but the reference (arm a) gains only ~0.02 over no context
    a, b = [3.07, 3.08, 3.06, 3.07], [2.87, 2.88, 2.86, 2.87]
    study = study_with(tmp_path, tiny_overrides, a, b, degraded=[3.09, 3.10, 3.08, 3.09])
    lines = (write_report(study) / "summary.md").read_text().splitlines()
    assert lines[2].startswith("**Context gain:** control reference (lr=0.001) gains 0.02 on val/loss")
    assert lines[2].endswith("the study needs ≥ 0.5: uninformative.")
    assert lines[4].startswith(
        "**Answer:** uninformative: the reference did not learn to use context (gain 0.02, needs ≥ 0.5)."
    )
    summary = "\n".join(lines)
    arms = summary[summary.index("## Arms") :]
    for verdict in ("better than", "on par within", "undecided", "## Comparisons", "add-seeds"):
        assert verdict not in arms and verdict not in "\n".join(lines[:5])
    assert "| a | 4 |" in arms and "| b | 4 |" in arms  # the arms are still listed


def test_a_gain_whose_interval_holds_zero_is_uninformative_even_above_the_threshold(tmp_path, tiny_overrides):
    # gains 1.5, -0.5, 1.6: mean 0.87 ≥ 0.5, but the paired 95 % CI over 3 seeds holds 0
    study = study_with(tmp_path, tiny_overrides, [2.0, 3.0, 2.0], [2.1, 3.1, 2.1], degraded=[3.5, 2.5, 3.6])
    summary = (write_report(study) / "summary.md").read_text()
    assert (
        "uninformative: the reference did not learn to use context (gain 0.867, needs ≥ 0.5; its 95 % CI holds 0)"
        in summary
    )


def test_a_reference_that_uses_context_opens_the_report_and_the_verdicts_follow(tmp_path, tiny_overrides):
    a, b = [2.07, 2.08, 2.06, 2.07], [1.87, 1.89, 1.86, 1.87]
    study = study_with(
        tmp_path, tiny_overrides, a, b, degraded=[3.09, 3.10, 3.08, 3.09], verdict={"context_gain": {"val/loss": 0.8}}
    )
    lines = (write_report(study) / "summary.md").read_text().splitlines()
    assert lines[2].startswith("**Context gain:** control reference (lr=0.001) gains 1.02 on val/loss")
    assert lines[2].endswith("the study needs ≥ 0.8: the reference uses its context.")
    assert lines[4].startswith("**Answer:** arm b is better than arm a") or lines[4].startswith(
        "**Answer:** b is better than a"
    )


def test_a_pair_needs_one_arm_that_uses_its_context_for_better_and_both_for_on_par(tmp_path, tiny_overrides):
    # The reference (arm a) uses its context. Below the study's 0.5, b and g gain ~0.06 over no context with CIs
    # clear of δ = 0.01 (they use it, a little); c and e sit on the no-context level (CIs holding 0).
    arms = {**ARMS, "c": {"optim.lr": 3e-3}, "e": {"optim.lr": 4e-3}, "g": {"optim.lr": 6e-3}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "blind",
        {"seed": {"type": "categorical", "choices": [0, 1, 2, 3]}, "arm": {"choices": arms}},
        arms=["arm"],
        control=CONTROL,
    )
    study = load_study(path)
    ostudy, ocontrol = sweep.open_study(RunStorage(study, None)), sweep.open_study(RunStorage(study.control, None))
    values = {
        "a": [2.07, 2.08, 2.06, 2.07],
        "b": [3.04, 3.06, 3.03, 3.04],
        "c": [3.10, 3.10, 3.10, 3.09],
        "e": [3.11, 3.10, 3.09, 3.11],
        "g": [3.042, 3.058, 3.031, 3.039],
    }
    for arm, vs in values.items():
        for seed, v in enumerate(vs):
            add(ostudy, {"seed": seed, "arm": arm}, v)
    for seed, v in enumerate([3.10, 3.11, 3.09, 3.10]):
        add(ocontrol, {"control": "degraded", "seed": seed}, v)
    summary = (write_report(study) / "summary.md").read_text()
    answer = next(line for line in summary.splitlines() if line.startswith("**Answer:**"))
    # one arm that uses its context is enough for "better", even below the study's threshold ...
    assert "b better than c by 0.055" in answer and "g better than e" in answer
    # ... both are needed for "on par" (b and g), and two arms on the plateau get no verdict (c vs e)
    assert "on par within ±0.01: b and g;" in answer
    assert "no verdict: neither arm demonstrably uses its context (1 pair: c vs e;" in answer
    assert "each needs a CI above δ = 0.01" in answer
    # c vs e is in neither Holm family; the 9 other pairs are 'better' tests, 3 of them (a-b, a-g, b-g) 'on par' ones
    assert "Holm's correction over the 9 'better' tests" in summary
    assert "the 3 'on par' tests" in summary
    table = summary[summary.index("## Comparisons") :].split("\n\n")[1]
    assert "| c | e |" not in table and "| b | c |" in table
    assert "(CI not above δ = 0.01) |" in summary


def test_verdict_within_compares_arms_only_at_equal_values_of_that_param(tmp_path, tiny_overrides, capsys):
    # arms = kind × task size: a at size 1 against b at size 2 answers no question; within keeps 2 of the 6 pairs
    space = {
        "seed": {"type": "categorical", "choices": [0, 1, 2]},
        "arm": {"choices": ARMS},
        "optim.warmup_steps": {"type": "categorical", "choices": [1, 2]},
    }
    keys = {"arms": ["arm", "optim.warmup_steps"], "verdict": {"within": ["optim.warmup_steps"]}}
    study = load_study(write_study(tmp_path, tiny_overrides, "within", space, **keys))
    ostudy = sweep.open_study(RunStorage(study, None))
    for (arm, warmup), base in {("a", 1): 2.0, ("b", 1): 2.5, ("a", 2): 1.5, ("b", 2): 1.6}.items():
        for seed in range(3):
            add(ostudy, {"seed": seed, "arm": arm, "optim.warmup_steps": warmup}, base + 0.01 * seed)
    summary = (write_report(study) / "summary.md").read_text()
    assert "Holm's correction over the 2 'better' tests" in summary
    table = summary[summary.index("## Comparisons") :].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| a") or line.startswith("| b")]
    pairs = [row.split(" | ")[:2] for row in rows]
    assert pairs == [["| a warmup_steps=1", "b warmup_steps=1"], ["| a warmup_steps=2", "b warmup_steps=2"]]
    # a param that is not an arm is refused before anything is written
    bad = write_study(tmp_path, tiny_overrides, "within_bad", space, arms=["arm"], verdict={"within": ["seed"]})
    assert cli.main(["sweep", str(bad), "--check"]) == 2
    assert "verdict.within[0]: 'seed' is not one of the study's arms (arm)" in capsys.readouterr().err


def test_the_control_arms_are_outside_both_holm_families(tmp_path, tiny_overrides):
    study = study_with(tmp_path, tiny_overrides, [2.07, 2.08, 2.06], [1.87, 1.89, 1.86], degraded=[3.09, 3.10, 3.08])
    summary = (write_report(study) / "summary.md").read_text()
    # one pair of the study's own arms: one 'better' test and one 'on par' test, nothing of the control's
    assert "Holm's correction over the 1 'better' test of this report (1 comparison of means)" in summary
    assert "the 1 'on par' test (TOST" in summary
    table = summary[summary.index("## Comparisons") :]
    assert "control" not in table.split("\n\n")[1]
    # the control's arms are listed beside the study's, the reference from arm a's own trials
    assert "| control reference (lr=0.001) | 3 |" in summary and "| control degraded (lr=0.005) | 3 |" in summary


def test_a_control_point_equal_to_a_study_trial_is_reused_not_planned(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "shared",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=CONTROL,
    )
    control = load_study(path).control
    assert control.points == [{"control": "degraded", "seed": 0}, {"control": "degraded", "seed": 1}]
    assert control.n_trials == 2
    assert control.reused == [
        ({"control": "reference", "seed": 0}, {"seed": 0, "arm": "a"}),
        ({"control": "reference", "seed": 1}, {"seed": 1, "arm": "a"}),
    ]


def test_the_reused_control_trial_is_trained_once(tmp_path, tiny_overrides, monkeypatch):
    import training.train

    trained = []

    def fake_train(cfg, callbacks=(), hparams=None, **log):
        trained.append((cfg.optim.lr, cfg.seed))
        return {"val/loss": 3.0 - 300 * cfg.optim.lr + 0.01 * cfg.seed, "trivial_loss": 3.1}

    monkeypatch.setattr(training.train, "train", fake_train)
    path = write_study(
        tmp_path,
        tiny_overrides,
        "once",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=CONTROL,
    )
    study = load_study(path)
    for one in study.studies:
        sweep.prepare(one, RunStorage(one, None))
    assert sweep.work(study, None, 1, 0, 1, None, None) == 0
    # arms a and b at 2 seeds, the control's degraded arm at 2 seeds; the control's reference is arm a
    assert sorted(trained) == sorted([(1e-3, 0), (1e-3, 1), (2e-3, 0), (2e-3, 1), (5e-3, 0), (5e-3, 1)])
    out = write_report(study)
    summary = (out / "summary.md").read_text()
    assert "| control reference (lr=0.001) | 2 |" in summary
    with (out / "trials.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 6  # every trained trial once


@pytest.mark.parametrize(
    "change, message",
    [
        ({"verdict": {"context_gain": {"val/loss": 0.0}}}, "verdict.context_gain.val/loss: the threshold must be > 0"),
        ({"verdict": {"context_gain": {"val/los": 0.5}}}, "verdict.context_gain.val/los: not an objective metric"),
        (
            {
                "objective": [{"metric": "val/accuracy", "direction": "maximize"}],
                "verdict": {"context_gain": {"val/accuracy": 10}},
            },
            "verdict.context_gain.val/accuracy: an accuracy is a fraction in [0, 1], so 0 < threshold < 1 "
            "(ten accuracy points is 0.1), got 10",
        ),
        (
            {
                "objective": [{"metric": "tokens_per_sec", "direction": "maximize"}],
                "verdict": {"delta": {"tokens_per_sec": 100}},
            },
            "verdict.context_gain.tokens_per_sec: the first objective 'tokens_per_sec' has no default context-gain "
            "threshold",
        ),
        (
            {"control": {**CONTROL, "no_context": "unigram"}},
            "control.no_context: 'unigram' is not one of degraded, baseline",
        ),
    ],
)
def test_a_bad_context_gain_threshold_is_one_line_and_exit_2(tmp_path, tiny_overrides, capsys, change, message):
    keys = {"control": CONTROL, **change}
    path = write_study(tmp_path, tiny_overrides, "bad", {"seed": {"type": "categorical", "choices": [0, 1]}}, **keys)
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        load_study(path)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_default_thresholds_are_half_a_nat_and_ten_accuracy_points(tmp_path, tiny_overrides):
    loss = load_study(write_study(tmp_path, tiny_overrides, "l", {"seed": {"choices": [0, 1]}}, control=CONTROL))
    assert loss.context_gain("val/loss") == (0.5, "default")
    accuracy = load_study(
        write_study(
            tmp_path,
            tiny_overrides,
            "acc",
            {"seed": {"choices": [0, 1]}},
            control=CONTROL,
            objective=[{"metric": "val/accuracy", "direction": "maximize"}],
            verdict={"context_gain": {"val/accuracy": 0.3}},
        )
    )
    assert accuracy.context_gain("val/accuracy") == (0.3, "study file")


def run_with_examples(tmp_path, name: str, values) -> str:
    """A run directory whose metrics.json holds per-example validation sums (one target per example)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    examples = {"loss": {"sum": [float(v) for v in values], "count": [1] * len(values)}}
    (run_dir / "metrics.json").write_text(json.dumps({"validation_examples": examples}))
    return str(run_dir)


def test_every_verdict_carries_the_validation_sampling_error_and_says_when_it_lies_inside(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "noisy",
        {"seed": {"type": "categorical", "choices": [0, 1, 2]}, "arm": {"choices": ARMS}},
        arms=["arm"],
    )
    study = load_study(path)
    ostudy = sweep.open_study(RunStorage(study, None))
    rng = np.random.default_rng(0)
    per_example = {arm: [] for arm in ARMS}
    for seed in range(3):
        base = rng.normal(3.0, 1.0, 50)
        shifted = base + rng.normal(0.05, 1.0, 50)  # B − A per example: 0.05 ± 1, over 50 examples
        for arm, examples in (("a", base), ("b", shifted)):
            per_example[arm].append((examples, np.ones(50)))
            value = 3.0 + 0.01 * seed + (0.05 if arm == "b" else 0.0)  # b worse by 0.05 at every seed
            ostudy.add_trial(
                optuna.trial.create_trial(
                    params={"seed": seed, "arm": arm},
                    distributions={"seed": IntDistribution(0, 99), "arm": CategoricalDistribution(["a", "b"])},
                    value=value,
                    user_attrs={
                        "metrics": {"val/loss": value},
                        "run_dir": run_with_examples(tmp_path, f"{arm}{seed}", examples),
                    },
                )
            )
    error = stats.validation_error(per_example["a"], per_example["b"])
    assert error > 0.05  # the validation set alone cannot resolve a 0.05 difference here
    summary = (write_report(study) / "summary.md").read_text()
    answer = summary.splitlines()[2]
    assert answer.startswith("**Answer:** a is better than b on val/loss by 0.05")
    assert answer.endswith(
        f"; validation sampling error ±{markdown.fmt(error)}: the difference lies inside it, so this validation set "
        "cannot tell the arms apart."
    )
    assert f"| ±{markdown.fmt(error)} | a better than b by 0.05" in summary
    assert "- Validation sampling error: the 95 % half-width of A − B from the validation set alone" in summary


def test_runs_without_per_example_sums_say_the_validation_error_is_not_available(tmp_path, tiny_overrides):
    study = study_with(tmp_path, tiny_overrides, [2.07, 2.08, 2.06], [1.87, 1.89, 1.86], degraded=[3.09, 3.10, 3.08])
    summary = (write_report(study) / "summary.md").read_text()
    assert (
        "- Validation sampling error: not available (the runs' metrics.json hold no per-example validation" in summary
    )


@pytest.mark.parametrize("best, short", [(3.02, True), (2.3, False)])
def test_an_open_studys_best_trial_is_measured_against_the_model_without_context(tmp_path, tiny_overrides, best, short):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "searched",
        {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        sampler={"kind": "random", "seed": 0},
        budget={"n_trials": 3},
        control=CONTROL,
    )
    study = load_study(path)
    ostudy, ocontrol = sweep.open_study(RunStorage(study, None)), sweep.open_study(RunStorage(study.control, None))
    for lr, v in ((1e-3, 3.06), (2e-3, best), (3e-3, 3.08)):
        add(ostudy, {"optim.lr": lr}, v)
    for seed, (ref, degraded) in enumerate([(2.0, 3.09), (2.1, 3.10), (2.05, 3.08)]):
        add(ocontrol, {"control": "reference", "seed": seed}, ref)
        add(ocontrol, {"control": "degraded", "seed": seed}, degraded)
    summary = (write_report(study) / "summary.md").read_text()
    answer = next(line for line in summary.splitlines() if line.startswith("**Answer:**"))
    gain = markdown.fmt(3.09 - best)
    assert f"reached val/loss = {markdown.fmt(best)}, a gain of {gain} over a model without context (3.09;" in answer
    assert ("short of it, so no setting this search tried learned to use its context" in answer) == short
