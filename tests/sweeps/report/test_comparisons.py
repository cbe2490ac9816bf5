"""The comparisons of a study's arms (sweeps/report/comparisons.py): the report opens with the answer, the margin δ
and Holm's statement; success rates with exact intervals."""

from __future__ import annotations

from typing import Optional

import optuna
import pytest
from studies import write_study

from sweeps.spec.study import load_study


def _add(ostudy, params: dict, value: float, metrics: Optional[dict] = None) -> None:
    """A finished trial with these params (seed an int range, as the sweep asks it)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dists = {
        p: IntDistribution(0, 99) if p == "seed" else CategoricalDistribution(sorted({v, "a", "b"}))
        for p, v in params.items()
    }
    ostudy.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions=dists,
            value=value,
            user_attrs={"metrics": {"val/loss": value, **(metrics or {})}},
        )
    )


@pytest.mark.parametrize(
    "a, b, first",
    [
        # B lower by 0.2 at every seed, spread 0.01
        (
            [3.0, 3.1, 2.9, 3.05],
            [2.8, 2.91, 2.69, 2.86],
            "**Answer:** arm b is better than arm a on val/loss by 0.198 (95 % CI [0.182, 0.213], Holm-adjusted p < 0.001, "
            "4 seeds each).",
        ),
        # equal on average, ±0.002 from seed to seed, 8 seeds
        (
            [3.0 + 0.01 * s for s in range(8)],
            [3.0 + 0.01 * s + (0.002 if s % 2 else -0.002) for s in range(8)],
            "**Answer:** arm a and arm b are on par within ±0.01 val/loss (TOST p < 0.001 after Holm, 8 seeds each).",
        ),
        # two seeds, differing by ±1/256 (exactly 0 on average): undecided, with the seeds to add
        (
            [3.0, 3.0078125],
            [2.99609375, 3.01171875],
            "**Answer:** arm a vs arm b on val/loss is undecided after 2 seeds each: 3 more seeds per arm would show 'on par' "
            "within ±0.01 at 80 % power if the observed difference (0) and spread hold (no difference was observed to plan "
            "'better' for); plan the seeds now and add them all with `linformer-lab sweep {path} --add-seeds 3`.",
        ),
    ],
)
def test_the_report_opens_with_the_answer_the_delta_and_the_holm_statement(tmp_path, tiny_overrides, a, b, first):
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    arms = {"arm a": {"optim.lr": 1e-3}, "arm b": {"optim.lr": 2e-3}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "answered",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": arms}},
        arms=["arm"],
        sampler={"kind": "grid"},
    )
    study = load_study(path)
    ostudy = open_study(RunStorage(study, None))
    for arm, values in (("arm a", a), ("arm b", b)):
        for seed, value in enumerate(values):
            _add(ostudy, {"seed": seed, "arm": arm}, value)
    lines = (write_report(study) / "summary.md").read_text().splitlines()
    assert lines[0] == "# Study answered" and lines[2] == first.format(path=path)
    assert lines[4] == "- δ, the margin within which two arms are on par: val/loss ±0.01 (default)."
    assert lines[5].startswith("- Holm's correction over the 1 'better' test of this report (1 comparison of means)")


def test_a_recall_study_reports_success_rates_with_exact_intervals(tmp_path, tiny_overrides):
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    arms = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "recall",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": arms}},
        arms=["arm"],
        objective=[{"metric": "val/accuracy", "direction": "maximize"}],
        verdict={"success": {"val/accuracy": 0.9}},
    )
    study = load_study(path)
    ostudy = open_study(RunStorage(study, None))
    for arm, values in (("a", [1.0, 0.99, 1.0, 0.98, 1.0, 1.0]), ("b", [1.0, 0.26, 0.99, 0.3, 0.28, 1.0])):
        for seed, value in enumerate(values):
            _add(ostudy, {"seed": seed, "arm": arm}, value, {"val/accuracy": value})
    summary = (write_report(study) / "summary.md").read_text()
    # per arm: 6/6 [0.54, 1.00] and 3/6 [0.12, 0.88] (Clopper-Pearson); compared by Boschloo's test
    assert "| a | 6 | 0.995 ± 0.00837 | 6/6 [0.54, 1.00] |" in summary
    assert "| b | 6 | 0.638 ± 0.393 | 3/6 [0.12, 0.88] |" in summary
    # Boschloo p = 0.068 for 6/6 vs 3/6 (Fisher's: 0.18), doubled by Holm with the t test's p = 0.074
    assert "runs reaching val/accuracy ≥ 0.9: 6/6 vs 3/6, Boschloo p = 0.14 after Holm" in summary.splitlines()[2]
    assert "| a | b | 6/6 [0.54, 1.00] | 3/6 [0.12, 0.88] | 0.068 (0.14) | undecided (no difference shown) |" in summary
    assert "(1 comparison of means, 1 comparison of success rates)" in summary
    assert "- Success: a run with val/accuracy ≥ 0.9 solved the task (study file)" in summary
