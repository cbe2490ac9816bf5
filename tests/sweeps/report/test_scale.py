"""The scale report of a model-size ladder (sweeps/report/scale.py; sweeps/scale.yaml, docs/scale.md): each rung's
gap with its verdict and the trend over size, a tiny ladder swept and reported end to end, and the time figure."""

from __future__ import annotations

import json
import math
import types

import optuna
import pytest
from studies import LADDER_ARMS, RUNGS, ladder_study

from experiments import cli
from sweeps import stored
from sweeps.spec.study import load_study


# --------------------------------------------------------------------------------------- the scale report
def _add_trial(ostudy, seed: int, rung: str, arm: str, value: float, metrics: dict, **attrs) -> None:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    ostudy.add_trial(
        optuna.trial.create_trial(
            params={"seed": seed, "rung": rung, "arm": arm},
            distributions={
                "seed": IntDistribution(0, 1),
                "rung": CategoricalDistribution(list(RUNGS)),
                "arm": CategoricalDistribution(list(LADDER_ARMS)),
            },
            value=value,
            user_attrs={"metrics": {"val/loss": value, **metrics}, **attrs},
        )
    )


def test_the_scale_report_gives_each_rungs_gap_its_verdict_and_the_trend_over_size(tmp_path, tiny_overrides):
    """Stored trials with known numbers (no training): rungs of 10k, 100k and 1M parameters, the Linformer gap
    0.01·(rung + 1) ± 0.002 over two seeds, so the trend is +0.01 per tenfold parameters."""
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage
    from sweeps.spec import stats

    study = load_study(ladder_study(tmp_path, tiny_overrides, name="fake_ladder"))
    ostudy = open_study(RunStorage(study, None))
    for i, rung in enumerate(RUNGS):
        for seed, noise in ((0, 0.002), (1, -0.002)):
            full = 3.0 - 0.1 * i + 0.05 * seed
            size = {"parameters": 10 ** (4 + i), "train_flops": 6e9 * 10 ** (2 * i), "tokens": 1e6}
            _add_trial(ostudy, seed, rung, "full", full, size)
            _add_trial(ostudy, seed, rung, "linformer", full + 0.01 * (i + 1) + noise, size)
    out = write_report(study)
    summary = (out / "summary.md").read_text()
    lines = summary.splitlines()
    # the answer: the gap at every rung with its verdict, then the trend per tenfold parameters
    t = stats.trend([4, 4, 5, 5, 6, 6], [0.012, 0.008, 0.022, 0.018, 0.032, 0.028])
    lo, hi = t.slope_ci()
    assert t.slope == pytest.approx(0.01)
    assert lines[2].startswith(
        "**Answer:** linformer − full on val/loss: +0.01 at s1 (10k parameters; undecided), +0.02 at "
        "s2 (100k parameters; undecided), +0.03 at s3 (1M parameters; undecided); the gap changes by "
        f"+0.01 per tenfold parameters (95 % CI [{lo:+.3g}, {hi:+.3g}], least squares over 6 seeds' "
        "gaps): linformer loses ground to full as parameters grow (each rung's mean gap less the fit: "
    )  # three rungs: a trend, shown with its residuals
    # per rung and arm: parameters, FLOPs, tokens per parameter, the mean, the gap with its paired 95 % CI, verdict
    gap = stats.compare({0: 3.012, 1: 3.058}, {0: 3.0, 1: 3.05}).ci()
    assert (
        f"| s1 | linformer | 10k | 6G | 100 | 3.03 ± 0.0325 (2) | +0.01 [{gap[0]:+.3g}, {gap[1]:+.3g}] | "
        "undecided: 1 more seeds per arm would show 'better' |"
    ) in summary
    assert "| s3 | full | 1M | 60T | 1 | 2.82 ± 0.0354 (2) | - | - |" in summary
    # FLOPs grow 100× a rung, parameters 10×: half the slope per tenfold compute
    assert "- linformer: +0.005 per tenfold training FLOPs (95 % CI" in summary
    # only pairs at the same rung are compared: 3 tests in Holm's family, no s1 against s3
    assert "Holm's correction over the 3 'better' tests" in summary
    assert "| s1 full | s3 " not in summary and "| s1 full | s1 linformer |" in summary
    assert (out / "gap_vs_size.png").stat().st_size > 10_000
    assert "- skipped: rank_vs_size.png (no reference run with a checkpoint here)" in summary
    assert "- skipped: time_to_target_vs_size.png (no run's ppl_vs_wallclock curve here)" in summary


@pytest.mark.processes  # the sweep command's workers
def test_a_tiny_ladder_swept_and_reported_end_to_end_writes_the_gap_rank_and_time_figures(tmp_path, tiny):
    """Three tiny rungs × {full, linformer} × 2 seeds, 6 steps each, two workers; then the report (its time to
    target refused: 6 steps never leave the plateau a model without context reaches)."""
    path = ladder_study(tmp_path, tiny, name="tiny_ladder")
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).get_trials()
    flops = {t.params["rung"]: t.user_attrs["metrics"]["train_flops"] for t in trials if t.params["arm"] == "full"}
    assert flops["s1"] < flops["s2"] < flops["s3"]
    assert cli.main(["report", str(path)]) == 0
    out = tmp_path / "runs" / "tiny_ladder" / "report"
    summary = (out / "summary.md").read_text()
    assert summary.splitlines()[2].startswith("**Answer:** linformer − full on val/loss: ")
    assert "## Scale: linformer against full across model sizes" in summary
    for rung in RUNGS:
        assert f"| {rung} | linformer |" in summary  # gap and verdict per rung
    # the spectrum of full attention at every rung: 1, 2 and 2 layers at n = 32
    table = summary.split("### Spectrum across sizes")[1].split("\n\n")[2].splitlines()[2:]
    cells = [row.strip("| ").split(" | ") for row in table]
    assert [(c[0], c[2], len(c[3].split(", "))) for c in cells] == [("s1", "32", 1), ("s2", "32", 2), ("s3", "32", 2)]
    # 6 steps leave every rung above the unigram's perplexity: no time to a target a model without context reaches
    assert "### Time to target" in summary
    for rung in RUNGS:
        assert (
            f"| {rung} | " in summary
            and "| every arm | - | not timed: a model without context reaches val ppl" in summary
        )
    assert (
        "- skipped: time_to_target_vs_size.png (no rung's target is above what a model without context reaches)"
        in summary
    )
    for png in ("gap_vs_size.png", "rank_vs_size.png"):
        assert (out / png).stat().st_size > 10_000, png


def test_the_time_figure_draws_each_timed_rung_and_leaves_out_the_refused_ones():
    from sweeps.report import scale

    sizes = {"s1": 1e4, "s2": 3e4, "s3": 9e4}
    ladder = types.SimpleNamespace(
        lines=["linformer"], rungs=list(sizes), reference="full", size=lambda rung, axis="parameters": sizes[rung]
    )
    seconds = {("s1", "full"): {(0,): 10.0, (1,): 12.0}, ("s1", "linformer"): {(0,): 5.0, (1,): 6.0}}
    seconds |= {("s2", "full"): {(0,): 20.0, (1,): 22.0}, ("s2", "linformer"): {(0,): 30.0, (1,): 33.0}}
    ttt = scale.TimeToTarget({"s1": 40.0, "s2": 30.0, "s3": 90.0}, seconds, {}, refused={"s3": 60.0})
    assert ttt.ratio("s1", "linformer", "full").value == pytest.approx(0.5)  # exp(mean(ln 5/10, ln 6/12))
    assert ttt.ratio("s3", "linformer", "full") is None
    fig = scale.figure_time(ladder, ttt)
    (line,) = [c for c in fig.axes[0].containers]  # one errorbar series: the linformer arm
    assert list(line.lines[0].get_xdata()) == [1e4, 3e4]
    assert scale.figure_time(types.SimpleNamespace(**{**vars(ladder), "lines": []}), ttt) is None


def test_a_rung_whose_target_the_trained_model_without_context_reaches_is_not_timed(tmp_path, tiny_overrides):
    """Stored trials with curves: at every rung full ends at val ppl 12 and Linformer at 20, the unigram at 30.
    A model without context trained beside them (the control's degraded arm) at ppl 25 leaves the targets (20)
    timed; one at 18, which copies kept targets as the unigram cannot, reaches them: no rung is timed."""
    from sweeps.report import efficiency, scale
    from sweeps.report.command import Report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    study = load_study(ladder_study(tmp_path, tiny_overrides, name="timed_ladder"))
    ostudy = open_study(RunStorage(study, None))
    for rung in RUNGS:
        for seed in (0, 1):
            for arm, ppl in (("full", 12.0), ("linformer", 20.0)):
                run_dir = tmp_path / "runs_here" / f"{rung}_{arm}_{seed}"
                run_dir.mkdir(parents=True)
                curve = [[5.0 * (seed + 1), 100, 40.0], [10.0 * (seed + 1), 200, ppl]]
                metrics = {"ppl_vs_wallclock": curve, "baselines": {"unigram/loss": math.log(30.0)}}
                (run_dir / "metrics.json").write_text(json.dumps(metrics))
                _add_trial(ostudy, seed, rung, arm, math.log(ppl), {"parameters": 1e4}, run_dir=str(run_dir))
    ladder = Report(study, None).ladder

    def blind(final: float) -> list:
        return [efficiency.ArmSpeed("no_context", [0.0], [1.0], [[[10.0, 200, final]]])]

    timed = scale.time_to_target(ladder, blind(25.0))
    assert timed.refused == {} and timed.targets == {rung: 20.0 for rung in RUNGS}
    # full passes ppl 20 (interpolated) 5/7 of the way from 40 to 12, Linformer only at its last point
    assert timed.ratio(next(iter(RUNGS)), "linformer", "full").value == pytest.approx(1 / (0.5 + 0.5 * 20 / 28))
    refused = scale.time_to_target(ladder, blind(18.0))
    assert refused.refused == {rung: 18.0 for rung in RUNGS} and refused.seconds == {}
    assert scale.time_to_target(ladder).refused == {}  # the unigram alone (30) does not reach 20


def test_the_spectrum_across_sizes_measures_no_rung_longer_than_its_cap(tmp_path, monkeypatch):
    """A rung at n above SPECTRUM_MAX_LEN is left out without being measured (an n × n SVD per head and sequence);
    one at the cap is measured."""
    from foundation.rundir import CHECKPOINT
    from sweeps.report import scale

    SimpleNamespace = types.SimpleNamespace

    def run(n: int) -> SimpleNamespace:
        run_dir = tmp_path / f"n{n}"
        (run_dir / CHECKPOINT).parent.mkdir(parents=True)
        (run_dir / CHECKPOINT).write_bytes(b"")
        (run_dir / "config.yaml").write_text(f"model: {{max_len: {n}}}\n")
        return SimpleNamespace(replicate=0, trial=SimpleNamespace(user_attrs={"run_dir": str(run_dir)}))

    runs = {"short": run(scale.SPECTRUM_MAX_LEN), "long": run(2 * scale.SPECTRUM_MAX_LEN)}
    ladder = SimpleNamespace(
        rungs=["short", "long"],
        reference="full",
        cell=lambda rung, line: SimpleNamespace(complete=[runs[rung]]),
        size=lambda rung: 1000,
    )
    measured = []
    monkeypatch.setattr(
        scale, "_analysis", lambda d, c: measured.append(d.name) or {"spectrum": {"effective_rank": [3]}}
    )
    spectra = scale.spectrum_across_sizes(ladder, tmp_path / "spectra")
    assert measured == [f"n{scale.SPECTRUM_MAX_LEN}"]
    assert [(s.rung, s.length) for s in spectra] == [("short", scale.SPECTRUM_MAX_LEN)]
