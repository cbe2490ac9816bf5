"""A study re-asked at a larger budget (issue 56): ``report --budget F`` says of each verdict of the original whether it
holds at ×F, is smaller in the same direction, or changed, with both estimates and CIs, and whether the arms were
still improving at the end; the report re-checks from both journals that the seeds are fresh (issue 55); and
fixed_k_vary_n's ladder over n reads Linformer's gap to full attention against n/k beside the paper's claim."""

from __future__ import annotations

import csv
import json
import math
import types

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from studies import write_study

from experiments import cli
from sweeps import stored
from sweeps.report import replication
from sweeps.report.command import write_report
from sweeps.run import command as sweep
from sweeps.run.storage import RunStorage
from sweeps.spec.schema import ADDED_SEEDS, SWEEPS_DIR
from sweeps.spec.study import load_study

ARMS = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}, "c": {"optim.lr": 3e-3}, "d": {"optim.lr": 4e-3}}
CONTROL = {"reference": {"optim.lr": 1e-3}, "degraded": {"optim.lr": 5e-3}}
NO_CONTEXT = 3.1


def study_file(tmp_path, tiny_overrides, schedule: str = "constant"):
    """The study over four arms; its runs train at a ``schedule`` learning rate (constant: their ends can be read)."""
    return write_study(
        tmp_path,
        tiny_overrides,
        "bud",
        {"seed": {"type": "categorical", "choices": [0, 1, 2, 3]}, "arm": {"choices": ARMS}},
        {"optim.schedule": schedule},
        arms=["arm"],
        control=CONTROL,
        verdict={"delta": {"val/loss": 0.05}},
    )


def curve(final: float, fall: float, points: int = 20) -> tuple[list[int], list[float]]:
    """A sample curve ``(steps, values)`` of a loss falling linearly by ``fall`` per fifth of training to ``final``."""
    steps = [10 * t for t in range(1, points + 1)]
    return steps, [final + fall * (points - t) / (points / 5) for t in range(1, points + 1)]


def fill(study, values: dict[str, list[float]], tmp_path, falls: dict[str, float] = (), full_only=()) -> None:
    """Trials at the study's seeds with these val/loss values per arm (and, for arms in ``falls``, a run folder whose
    TensorBoard events hold a sample curve of val/loss falling that much over the last fifth; for arms in
    ``full_only``, the full validations alone: two points); the control's degraded arm at the no-context level."""
    from torch.utils.tensorboard import SummaryWriter

    ostudy, ocontrol = sweep.open_study(RunStorage(study, None)), sweep.open_study(RunStorage(study.control, None))
    for arm, vs in values.items():
        for seed, v in zip(study.seeds, vs):
            attrs = {"metrics": {"val/loss": v}}
            if arm in dict(falls):
                run = tmp_path / "curves" / study.name / f"{arm}_{seed}"
                writer = SummaryWriter(str(run))
                steps, points = curve(v, dict(falls)[arm])
                if arm in full_only:  # the full validations: halfway and at the end
                    steps, points = [steps[9], steps[-1]], [points[9], points[-1]]
                for step, point in zip(steps, points):
                    writer.add_scalar("val/loss" if arm in full_only else "val_sample/loss", point, step)
                writer.add_scalar("val/loss", points[-1], steps[-1])
                writer.close()
                attrs["run_dir"] = str(run)
            add(ostudy, {"seed": seed, "arm": arm}, v, attrs)
    for seed in study.control.seeds:
        add(ocontrol, {"control": "degraded", "seed": seed}, NO_CONTEXT, {"metrics": {"val/loss": NO_CONTEXT}})


def add(ostudy, params, value, attrs):
    dists = {p: IntDistribution(0, 999) if p == "seed" else CategoricalDistribution([v]) for p, v in params.items()}
    ostudy.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value, user_attrs=attrs))


def rows_of(path) -> dict[tuple[str, str], dict]:
    with path.open() as fh:
        return {(r["first"], r["second"]): r for r in csv.DictReader(fh)}


def test_each_verdict_holds_is_smaller_or_changed_at_the_larger_budget_by_a_test_between_budgets(
    tmp_path, tiny_overrides
):
    path = study_file(tmp_path, tiny_overrides)
    # the original: a better than b by 0.3, than c by 0.3, than d by 0.3
    fill(
        load_study(path),
        {
            "a": [2.00, 2.02, 1.98, 2.01],
            "b": [2.30, 2.31, 2.29, 2.31],
            "c": [2.30, 2.32, 2.28, 2.31],
            "d": [2.30, 2.31, 2.30, 2.31],
        },
        tmp_path,
        falls={"a": 0.001},
    )
    # at ×4: a − b still 0.3 (holds: the change shown inside ±δ); a − c 0.1 (smaller: the change significant); d now
    # better than a (changed)
    fill(
        load_study(path, factor=4),
        {
            "a": [1.70, 1.71, 1.69, 1.70],
            "b": [2.00, 2.01, 1.99, 2.01],
            "c": [1.80, 1.81, 1.79, 1.81],
            "d": [1.50, 1.51, 1.49, 1.50],
        },
        tmp_path,
        falls={"a": 0.2, "b": 0.001, "c": 0.2},
        full_only=("c",),
    )
    out = write_report(load_study(path, factor=4))
    rows = rows_of(out / "replication.csv")
    assert rows[("a", "b")]["at_budget"] == "holds"
    assert rows[("a", "c")]["at_budget"] == "smaller"
    assert rows[("a", "d")]["at_budget"] == "changed"
    assert float(rows[("a", "c")]["original_estimate"]) == pytest.approx(0.3, abs=0.01)
    assert float(rows[("a", "c")]["fresh_estimate"]) == pytest.approx(0.1, abs=0.01)
    summary = (out / "summary.md").read_text()
    assert "## bud re-asked at ×4 the budget" in summary
    # b, c, d were on par at ×1; at ×4 d is far ahead of both and c of b: changed
    assert "**At ×4: of the original's 6 decided verdicts, 1 holds, 1 smaller, 4 changed.**" in summary
    assert "set against the pooled estimate of every earlier seed of the family" in summary
    assert "| a better than c on val/loss | 0.3 [0.3, 0.3] (n = 4) | 0.103 [0.0945, 0.11] (n = 4) |" in summary
    # whether the arms were still improving: a fell 0.2 over the last fifth at ×4, far beyond its seed spread
    line_a = next(line for line in summary.splitlines() if line.startswith("| a |"))
    assert "still improving: improved 0.2 " in line_a and line_a.count("no curve") == 0
    line_b = next(line for line in summary.splitlines() if line.startswith("| b |"))
    assert "no curve of two validations" in line_b and "flat" in line_b  # ×1 had no curve; ×4 flat
    # a run without a sample curve is read from its two full validations: the second half's slope over a fifth
    line_c = next(line for line in summary.splitlines() if line.startswith("| c |"))
    assert "still improving: improved 0.2 " in line_c


def test_runs_whose_learning_rate_decays_to_their_end_are_not_judged_still_improving(tmp_path, tiny_overrides):
    """The loss falls where a linear schedule decays to 0, at any budget: the last fifth of such runs says nothing."""
    path = study_file(tmp_path, tiny_overrides, schedule="linear")
    fill(load_study(path), {"a": [2.0, 2.02, 1.98, 2.01], "b": [2.3, 2.31, 2.29, 2.31]}, tmp_path, falls={"a": 0.2})
    fill(load_study(path, factor=4), {"a": [1.7, 1.71, 1.69, 1.7], "b": [2.0, 2.01, 1.99, 2.01]}, tmp_path)
    summary = (write_report(load_study(path, factor=4)) / "summary.md").read_text()
    line_a = next(line for line in summary.splitlines() if line.startswith("| a |"))
    assert line_a.count("not judged: the learning rate decays to 0") == 2 and "still improving" not in line_a


def test_a_later_gain_is_set_against_every_earlier_seed_of_the_family_pooled():
    """The design's a − b 0.3 on seeds 0–1 and the replication's 0.1 on 100–101 pool to 0.2 on four seeds."""
    from sweeps.report.findings import Findings
    from sweeps.spec import stats

    pair = stats.Pair("a", "b", "val/loss", "minimize", 0.05, stats.compare({0: 2.0}, {0: 2.3}))
    original = types.SimpleNamespace(pair=pair)
    claim = replication.Claim(stats.BETTER, "val/loss", "a", "b", original)
    outcome = replication.Outcome(claim, None, replication.NOT_DECIDED, "")

    def found(a, b):
        return Findings(
            ["a", "b"], ["a", "b"], {("a", "val/loss"): a, ("b", "val/loss"): b}, [], [], None, None, {}, []
        )

    design = found({(0,): 2.0, (1,): 2.1}, {(0,): 2.3, (1,): 2.4})
    replica = found({(100,): 2.2, (101,): 2.25}, {(100,): 2.3, (101,): 2.35})
    earlier = replication.pooled_earlier(outcome, [design, replica])
    assert earlier.diff == pytest.approx(0.2) and earlier.n == 4 and earlier.paired


def test_a_verdict_the_larger_budget_cannot_judge_is_not_decided(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.0, 2.02, 1.98, 2.01], "b": [2.3, 2.31, 2.29, 2.31]}, tmp_path)
    fill(load_study(path, factor=4), {"a": [3.09, 3.1, 3.08, 3.09], "b": [3.2, 3.21, 3.2, 3.21]}, tmp_path)
    rows = rows_of(write_report(load_study(path, factor=4)) / "replication.csv")
    assert rows[("a", "b")]["at_budget"] == "not decided"  # the ×4 reference did not learn to use context


def test_pairs_undecided_at_x1_are_shown_beside_what_the_larger_budget_says(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.0, 2.5, 1.8, 2.4], "b": [2.3, 2.2, 2.35, 2.5]}, tmp_path)  # a ahead, undecided
    fill(load_study(path, factor=4), {"a": [1.70, 1.71, 1.69, 1.70], "b": [2.0, 2.01, 1.99, 2.01]}, tmp_path)
    summary = (write_report(load_study(path, factor=4)) / "summary.md").read_text()
    assert "**At ×4:** bud decided no verdict." in summary
    assert "| verdict of bud |" not in summary  # no empty table of verdicts
    row = next(line for line in summary.splitlines() if line.startswith("| a against b on val/loss |"))
    assert "| 0.163 [-0.409, 0.734] (n = 4) | 0.302 [" in row and row.endswith("| a better |")


def test_the_end_fall_reads_the_slope_of_the_last_points_in_the_objectives_direction():
    assert replication.end_fall(curve(2.0, 0.3)) == pytest.approx(0.3)
    assert replication.end_fall(curve(2.0, 0.0)) == pytest.approx(0.0, abs=1e-12)
    assert replication.end_fall(([10], [2.0])) is None  # one point: no slope
    assert replication.end_fall(([100, 200], [3.0, 2.0])) == pytest.approx(0.4)  # 1 per 100 steps, over 40
    steps, values = curve(0.5, 0.1)  # an accuracy that fell: worse where it is maximised
    assert replication.end_fall((steps, values), "maximize") == pytest.approx(-0.1)
    assert replication.end_fall((steps, [-v for v in values]), "maximize") == pytest.approx(0.1)
    assert replication.end_fall(([10, 20, 30], [2.0, math.nan, 1.0])) == pytest.approx(
        0.3
    )  # NaN skipped: 1 per 20 steps, over 6
    e = replication.ending("a", [curve(2.0, 0.3), curve(2.1, 0.1)], [2.0, 2.1, 2.2])
    assert e.fall == pytest.approx(0.2) and e.improving is True and e.runs == 2
    assert replication.ending("a", [curve(2.0, 0.01)], [2.0, 2.5]).improving is False


def test_the_report_refuses_a_derived_study_whose_journal_shares_a_seed_with_the_original(
    tmp_path, tiny_overrides, capsys
):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.0, 2.02, 1.98, 2.01], "b": [2.3, 2.31, 2.29, 2.31]}, tmp_path)
    replica = load_study(path, replicate=True)
    fill(replica, {"a": [2.0, 2.02, 1.98, 2.01], "b": [2.3, 2.31, 2.29, 2.31]}, tmp_path)
    # the original grew onto the replication's seed 101 behind the sweep's back (an older version, a hand edit)
    sweep.open_study(RunStorage(load_study(path), None)).set_user_attr(ADDED_SEEDS, [101])
    assert cli.main(["report", str(path), "--replicate"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and "report --replicate: seed 101 of study bud_replicate is also a seed of study bud" in err
    )
    assert not (replica.root / "report").exists()


def test_fixed_k_vary_n_answers_with_the_gap_to_full_attention_at_each_n_and_its_trend_over_n_over_k():
    study = load_study(SWEEPS_DIR / "fixed_k_vary_n.yaml", "cpu")
    assert study.ladder.rung == "n" and dict(study.ladder.reference) == {"arm": "full"}
    assert study.ladder.axis == "n_over_k" and "does not grow with n" in study.ladder.claim
    kinds = {(p["n"], study.config(p).model.attention.kind) for p in study.points}
    assert kinds == {(n, k) for n in ("n=16", "n=32", "n=64") for k in ("full", "linformer")}
    assert [r[0] for r in study.control.reused] and study.control.n_trials == 3  # the reference at n = 32 is reused


def test_a_ladder_over_n_reports_each_gap_at_its_n_over_k_beside_the_claim(tmp_path, tiny_overrides):
    lengths = {f"n={n}": {"model.max_len": n} for n in (16, 32)}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "lengths",
        {
            "seed": {"type": "categorical", "choices": [0, 1, 2]},
            "arm": {
                "choices": {
                    "linformer": {"model.attention.kind": "linformer"},
                    "full": {"model.attention.kind": "full"},
                }
            },
            "n": {"choices": lengths},
        },
        arms=["n", "arm"],
        ladder={"rung": "n", "reference": {"arm": "full"}, "axis": "n_over_k", "claim": "the gap does not grow"},
    )
    study = load_study(path)
    ostudy = sweep.open_study(RunStorage(study, None))
    for n, gap in (("n=16", 0.1), ("n=32", 0.3)):
        for seed in (0, 1, 2):
            flops = {"train_flops": 3.0e12 * (1 + 0.05 * int(n[2:]) / 16), "parameters": 121_000}
            add(
                ostudy,
                {"seed": seed, "arm": "full", "n": n},
                2.0 + 0.01 * seed,
                {"metrics": {"val/loss": 2.0, **flops}},
            )
            add(ostudy, {"seed": seed, "arm": "linformer", "n": n}, 2.0 + gap + 0.011 * seed, {"metrics": flops})
    summary = (write_report(study) / "summary.md").read_text()
    assert "at n=16 (n/k = 2;" in summary and "at n=32 (n/k = 4;" in summary
    # two lengths make no trend (a line through two points): the gaps alone, beside the claim
    assert "no trend: fewer than 3 rungs with n/k recorded (the rungs' gaps alone)" in summary
    assert "per tenfold n/k" not in summary and "(the paper's claim: the gap does not grow)." in summary
    assert "rungs with parameters recorded" not in summary  # a ladder over n reads its trend over n/k alone:
    assert "per tenfold training FLOPs" not in summary and "per tenfold parameters" not in summary  # not the few %


@pytest.mark.processes  # the sweep command's workers
def test_sweep_budget_trains_fresh_seeds_at_twice_the_steps_beside_the_original(tmp_path, tiny, capsys):
    path = write_study(
        tmp_path,
        tiny,
        "longer",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "model.attention.kind": {"choices": ["full"]}},
        overrides={"trainer.max_steps": 2, "trainer.val_check_interval": 1},
    )
    assert cli.main(["sweep", str(path), "--budget", "2"]) == 0
    larger = load_study(path, factor=2)
    trials = optuna.load_study(study_name=larger.name, storage=stored.open_storage(larger, None)).trials
    assert sorted(t.params["seed"] for t in trials) == [200, 201]
    for t in trials:
        run = json.loads((tmp_path / t.user_attrs["run_dir"] / "metrics.json").read_text())
        assert len(run["ppl_vs_wallclock"]) == 2  # validations at steps 2 and 4 of 4: the same count as at ×1
        assert "max_steps: 4" in (tmp_path / t.user_attrs["run_dir"] / "config.yaml").read_text()
    assert not load_study(path).root.exists()  # the original's folder: never touched
    assert cli.main(["report", str(path), "--budget", "2"]) == 0
    summary = (larger.root / "report" / "summary.md").read_text()
    assert "## longer re-asked at ×2 the budget" in summary
    assert f"Nothing to compare yet: {larger.root.with_name('longer') / 'journal.log'}" in summary
    assert f"run `linformer-lab sweep {path}` first" in summary
