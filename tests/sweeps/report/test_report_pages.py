"""What summary.md shows while a study runs and after (sweeps/report/command.py, figures.py): figures shown where they
are read, no empty chart (skipped with the reason), a partial control said to be partial, an interrupted trial called
interrupted."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState
from studies import write_study

from sweeps import stored
from sweeps.report.command import write_report
from sweeps.run.command import open_study
from sweeps.run.storage import RunStorage
from sweeps.spec.study import load_study

ARMS = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}}
CONTROL = {"reference": {"optim.lr": 3e-3}, "degraded": {"optim.lr": 5e-3}}


def add(ostudy: optuna.Study, params: dict, value=None, state=TrialState.COMPLETE, **attrs) -> None:
    dists = {p: IntDistribution(0, 99) if p == "seed" else CategoricalDistribution([v]) for p, v in params.items()}
    metrics = {"metrics": {"val/loss": value, "trivial_loss": 3.1}} if value is not None else {}
    ostudy.add_trial(
        optuna.trial.create_trial(
            params=params, distributions=dists, value=value, state=state, user_attrs={**metrics, **attrs}
        )
    )


def three_seeds(tmp_path, tiny_overrides):
    """Arms a and b over seeds 0–2 (6 trials), with a control of 6 trials (its reference is none of the arms)."""
    path = write_study(
        tmp_path,
        tiny_overrides,
        "paged",
        {"seed": {"type": "categorical", "choices": [0, 1, 2]}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=CONTROL,
    )
    study = load_study(path)
    return study, open_study(RunStorage(study, None)), open_study(RunStorage(study.control, None))


def test_a_partial_control_is_reported_as_partial_and_no_empty_chart_is_drawn(tmp_path, tiny_overrides):
    study, _, control = three_seeds(tmp_path, tiny_overrides)
    assert study.control.n_trials == 6
    add(control, {"control": "degraded", "seed": 0}, 3.0)  # the control runs first: 1 of its 6 trials finished
    out = write_report(study)
    summary = (out / "summary.md").read_text()
    assert "the control has not run" not in summary and "no arm of its own" not in summary
    assert "**Context gain:** not judged yet (1 of 6 control trials finished)" in summary
    assert (
        "**Answer (power not judged yet: 1 of 6 control trials finished):** Nothing to compare yet: 0 of 6 of the "
        "study's own trials finished, 0 of its 2 arms so far (its control runs first: 1 of 6 control trials "
        "finished); the verdicts wait for them."
    ) in summary
    assert (
        "fewer than 2 complete trials (1 of 6 control trials finished; run the same `sweep` command again)" in summary
    )
    for chart in ("history.png", "parallel_coordinate.png"):
        assert not (out / chart).exists()
        assert f"- skipped: {chart} (no complete trial of the study yet)" in summary
        assert f"]({chart})" not in summary


def test_a_control_not_run_yet_is_said_so_with_its_count(tmp_path, tiny_overrides):
    study, ostudy, _ = three_seeds(tmp_path, tiny_overrides)
    add(ostudy, {"seed": 0, "arm": "a"}, 2.0)
    summary = (write_report(study) / "summary.md").read_text()
    assert "**Answer (power not judged yet: none of the 6 control trials has finished):**" in summary
    assert "**Context gain:** not judged yet (none of the 6 control trials has finished)" in summary
    assert "0 of 6 of the study's own trials" not in summary  # 1 of them finished: the answer counts it
    assert "1 of 6 of the study's own trials finished, 1 of its 2 arms so far" in summary


def test_figures_are_shown_in_summary_md_at_the_section_they_illustrate(tmp_path, tiny_overrides):
    study, ostudy, control = three_seeds(tmp_path, tiny_overrides)
    for seed, (a, b, degraded) in enumerate([(2.07, 1.87, 3.09), (2.08, 1.89, 3.10), (2.06, 1.86, 3.08)]):
        add(ostudy, {"seed": seed, "arm": "a"}, a)
        add(ostudy, {"seed": seed, "arm": "b"}, b)
        add(control, {"control": "degraded", "seed": seed}, degraded)
        add(control, {"control": "reference", "seed": seed}, a)
    out = write_report(study)
    summary = (out / "summary.md").read_text()
    figures = summary[summary.index("## Figures") :]
    for chart in ("history.png", "parallel_coordinate.png"):
        assert (out / chart).stat().st_size > 1000
        assert f"]({chart})" in figures and f"`{chart}`" not in summary
    assert "![val/loss of each trial in the order they ran, by arm" in figures
    assert "## Plots" not in summary


def test_an_interrupted_trial_is_reported_as_interrupted_not_failed(tmp_path, tiny_overrides):
    study, ostudy, _ = three_seeds(tmp_path, tiny_overrides)
    words = "terminated (SIGTERM): put back, trial 1 continues it"
    add(ostudy, {"seed": 0, "arm": "a"}, state=TrialState.FAIL, fail_reason="terminated", **{stored.INTERRUPTED: words})
    copy = optuna.trial.create_trial(
        params={"seed": 0, "arm": "a"},
        distributions={"seed": IntDistribution(0, 99), "arm": CategoricalDistribution(["a"])},
        state=TrialState.WAITING,
        system_attrs={"retry_history": [0], "failed_trial": 0},
    )
    ostudy.add_trial(copy)
    summary = (write_report(study) / "summary.md").read_text()
    assert "- interrupted (SIGTERM or Ctrl-C), not failed: trials 0, each put back and continued by a copy" in summary
    assert "## Failed trials" not in summary and "worker died" not in summary


def test_importance_ranks_the_arms_never_the_seed_and_names_an_arm_that_explains_nothing(
    tmp_path, tiny_overrides, monkeypatch
):
    """A replicate design: the seed moves every trial (it would explain most of the spread), the arm moves it
    beyond that; the figure draws the arm alone. Where the arms differ by no more than the seeds do, the report names
    the arm instead of drawing it."""
    import matplotlib

    matplotlib.use("Agg")
    from sweeps.report import figures

    study, ostudy, _ = three_seeds(tmp_path, tiny_overrides)
    for seed in range(3):
        add(ostudy, {"seed": seed, "arm": "a"}, 1.0 * seed + 2.0)
        add(ostudy, {"seed": seed, "arm": "b"}, 1.0 * seed + 1.8)
    drawn = []
    monkeypatch.setattr(figures, "write_figure", lambda path, fig, dpi: drawn.append(fig.axes[0]))
    assert figures.plot_importances(study, ostudy, 0, "val/loss", tmp_path / "i.png") == (True, "")
    assert [t.get_text() for t in drawn[0].get_yticklabels()] == ["arm"]

    (tmp_path / "alike").mkdir()
    study, ostudy, _ = three_seeds(tmp_path / "alike", tiny_overrides)
    for seed, (a, b) in enumerate([(2.0, 2.1), (3.1, 3.0), (4.0, 4.05)]):
        add(ostudy, {"seed": seed, "arm": "a"}, a)
        add(ostudy, {"seed": seed, "arm": "b"}, b)
    drawn_now, words = figures.plot_importances(study, ostudy, 0, "val/loss", tmp_path / "j.png")
    assert not drawn_now and words.startswith("arm (p = ") and "explains nothing beyond the seed spread" in words
