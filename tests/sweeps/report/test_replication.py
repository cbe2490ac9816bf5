"""A study replicated on fresh seeds (issue 48): ``sweep --replicate`` runs the arms and the control again on seeds
disjoint from every seed the design saw, as a study of its own beside the original, and ``report --replicate`` says of
each decided verdict of the original whether the fresh seeds replicate it, leave it undecided or contradict it."""

from __future__ import annotations

import csv

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from studies import write_study

from experiments import cli
from foundation.errors import ConfigError
from sweeps import stored
from sweeps.report.command import seeds_words, write_report
from sweeps.run import command as sweep
from sweeps.run.storage import RunStorage
from sweeps.spec.schema import ADDED_SEEDS, SWEEPS_DIR
from sweeps.spec.study import load_study

ARMS = {"a": {"optim.lr": 1e-3}, "b": {"optim.lr": 2e-3}, "c": {"optim.lr": 3e-3}}
CONTROL = {"reference": {"optim.lr": 1e-3}, "degraded": {"optim.lr": 5e-3}}  # reference = arm a
NO_CONTEXT = 3.1


def study_file(tmp_path, tiny_overrides, seeds=(0, 1, 2, 3), control=CONTROL, **keys):
    return write_study(
        tmp_path,
        tiny_overrides,
        "rep",
        {"seed": {"type": "categorical", "choices": list(seeds)}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=control,
        verdict={"delta": {"val/loss": 0.05}},
        **keys,
    )


def add(ostudy: optuna.Study, params: dict, value: float, **metrics) -> None:
    dists = {p: IntDistribution(0, 999) if p == "seed" else CategoricalDistribution([v]) for p, v in params.items()}
    ostudy.add_trial(
        optuna.trial.create_trial(
            params=params, distributions=dists, value=value, user_attrs={"metrics": {"val/loss": value, **metrics}}
        )
    )


def fill(study, values: dict[str, list[float]]) -> None:
    """The study's trials at its seeds with these val/loss values per arm; its control's degraded arm at the
    no-context level (the reference, arm a, is reused from the study)."""
    ostudy, ocontrol = sweep.open_study(RunStorage(study, None)), sweep.open_study(RunStorage(study.control, None))
    for arm, vs in values.items():
        for seed, v in zip(study.seeds, vs):
            add(ostudy, {"seed": seed, "arm": arm}, v)
    for seed in study.control.seeds:
        add(ocontrol, {"control": "degraded", "seed": seed}, NO_CONTEXT + 0.001 * (seed % 3))


def statuses(path) -> dict[tuple[str, str, str], dict]:
    with path.open() as fh:
        return {(r["claim"], r["first"], r["second"]): r for r in csv.DictReader(fh)}


# --------------------------------------------------------------------------------------- the fresh seeds
def test_a_replication_runs_on_the_next_hundred_as_a_study_of_its_own_beside_the_original(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    original, replica = load_study(path), load_study(path, replicate=True)
    assert original.seeds == [0, 1, 2, 3] and original.control.seeds == [0, 1, 2, 3]
    assert replica.seeds == [100, 101, 102, 103] and replica.control.seeds == [100, 101, 102, 103]
    assert replica.name == "rep_replicate" and replica.control.name == "rep_replicate_control"
    assert replica.root == original.root.with_name("rep_replicate")
    assert replica.file_args.endswith("rep.yaml --replicate")
    # the same arms and trial configs but the seed: a replication asks the original's question again
    for arm in ARMS:
        a, b = original.config({"seed": 0, "arm": arm}), replica.config({"seed": 100, "arm": arm})
        a.seed = b.seed
        assert a == b


def test_the_fresh_seeds_avoid_every_seed_of_the_file_and_its_presets(tmp_path, tiny_overrides):
    path = study_file(
        tmp_path,
        tiny_overrides,
        presets={"p": {"control": {"seeds": [7, 8]}}, "q": {"space": {"seed": {"choices": [0, 150]}}}},
    )
    replica = load_study(path, "p", replicate=True)
    assert replica.seeds == [200, 201, 202, 203] and replica.control.seeds == [200, 201]


def test_the_study_file_fixes_the_fresh_seeds_and_the_control_may_have_more(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [40, 41, 42], "control_seeds": [40, 41, 42, 43]})
    replica = load_study(path, replicate=True)
    assert replica.seeds == [40, 41, 42] and replica.control.seeds == [40, 41, 42, 43]
    assert load_study(path).seeds == [0, 1, 2, 3]  # the original is what it was


@pytest.mark.parametrize(
    "replicate, message",
    [
        ({"seeds": [3, 100]}, "replicate.seeds: seed 3 of study rep_replicate was seen by study rep "),
        ({"control_seeds": [1, 2]}, "replicate.control_seeds: seed 1 (and 1 more: 2) of study rep_replicate was seen"),
        ({"seeds": [100]}, "replicate.seeds: at least 2 distinct seeds are needed for a spread, got [100]"),
        ({"seeds": [100, "x"]}, "replicate.seeds: Value 'x' of type 'str' could not be converted to Integer"),
    ],
)
def test_seeds_the_design_saw_are_refused_in_one_line_and_nothing_is_written(
    tmp_path, tiny_overrides, capsys, replicate, message
):
    path = study_file(tmp_path, tiny_overrides, replicate=replicate)
    assert cli.main(["sweep", str(path), "--replicate", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "runs").exists()


def test_an_open_study_cannot_be_replicated(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "open",
        {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2}},
        sampler={"kind": "random"},
        budget={"n_trials": 2},
    )
    with pytest.raises(ConfigError, match="replicate: a replication reruns a grid's arms on fresh seeds"):
        load_study(path, replicate=True)


def test_seeds_added_to_the_original_are_not_fresh(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [4, 5]})
    ostudy = sweep.open_study(RunStorage(load_study(path), None))
    ostudy.set_user_attr(ADDED_SEEDS, [4])  # `sweep --add-seeds 1` took seed 4
    assert cli.main(["sweep", str(path), "--replicate"]) == 2
    err = capsys.readouterr().err
    assert "replicate.seeds: seed 4 of study rep_replicate is also a seed of study rep:" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "runs" / "rep_replicate").exists()


def test_a_replication_whose_file_changed_its_fresh_seeds_is_refused(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [100, 101]})
    sweep.open_study(RunStorage(load_study(path, replicate=True), None))
    study_file(tmp_path, tiny_overrides, replicate={"seeds": [100, 102]})
    with pytest.raises(ConfigError, match=r"replicate: .*'seeds': \[100, 101\].* there"):
        sweep.check_stored(load_study(path, replicate=True), None)


def test_every_shipped_study_with_verdicts_to_replicate_has_fresh_seeds_at_its_cpu_preset():
    for name in ("kv_side", "nonuniform_k", "projection_kind", "k_sweep", "init", "sharing", "random_vs_learned"):
        original = load_study(SWEEPS_DIR / f"{name}.yaml", "cpu")
        replica = load_study(SWEEPS_DIR / f"{name}.yaml", "cpu", replicate=True)
        assert not set(replica.seeds) & (set(original.seeds) | set(original.control.seeds)), name
        assert len(replica.seeds) >= len(original.seeds) and len(replica.control.seeds) >= len(original.control.seeds)


# --------------------------------------------------------------------------------------- the report
def test_each_verdict_of_the_original_is_replicated_not_decided_or_contradicted(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    # the original: a better than b and c (by ~0.3), b and c on par (within ±0.05)
    fill(
        load_study(path),
        {
            "a": [2.00, 2.02, 1.98, 2.01],
            "b": [2.30, 2.31, 2.29, 2.30],
            "c": [2.30, 2.32, 2.28, 2.30],
        },
    )
    # the fresh seeds: a better than b again; c now better than a (contradicted); b vs c far apart but noisy
    fill(
        load_study(path, replicate=True),
        {
            "a": [2.00, 2.01, 1.99, 2.00],
            "b": [2.30, 2.32, 2.28, 2.31],
            "c": [1.80, 1.81, 1.79, 1.80],
        },
    )
    out = write_report(load_study(path, replicate=True))
    rows = statuses(out / "replication.csv")
    assert rows[("better", "a", "b")]["status"] == "replicated"
    assert rows[("better", "a", "c")]["status"] == "contradicted"
    assert rows[("on par", "b", "c")]["status"] == "contradicted"  # c better than b by 0.5, far beyond δ
    assert float(rows[("on par", "b", "c")]["fresh_estimate"]) == pytest.approx(0.5025, abs=1e-6)  # b − c, as A − B
    original = rows[("better", "a", "b")]
    assert float(original["original_estimate"]) == pytest.approx(0.2975, abs=1e-6)
    assert float(original["fresh_estimate"]) == pytest.approx(0.3025, abs=1e-6)
    summary = (out / "summary.md").read_text()
    assert summary.index("## Replication of rep on fresh seeds") < summary.index("**Context gain:**")
    assert "**Replication: of the original's 3 decided verdicts, 1 replicated, 0 not decided, 2 contradicted.**" in (
        summary
    )
    assert "Fresh seeds seeds 100–103, control 100–103" not in summary
    assert "seeds 100–103, control 100–103" in summary and "(seeds 0–3, control 0–3)" in summary


def test_a_verdict_the_fresh_seeds_leave_undecided_says_how_many_seeds_to_add(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.00, 2.02, 1.98, 2.01], "b": [2.30, 2.31, 2.29, 2.30], "c": [2.6, 2.6, 2.6, 2.6]})
    # a − b: 0.1 on average but noisy on the fresh seeds
    fill(
        load_study(path, replicate=True),
        {"a": [2.00, 2.20, 1.90, 2.10], "b": [2.10, 2.10, 2.15, 2.15], "c": [2.6, 2.61, 2.6, 2.61]},
    )
    out = write_report(load_study(path, replicate=True))
    row = statuses(out / "replication.csv")[("better", "a", "b")]
    assert row["status"] == "not decided" and int(row["more_seeds"]) >= 1
    summary = (out / "summary.md").read_text()
    assert f"`linformer-lab sweep {path} --replicate --add-seeds {row['more_seeds']}`" in summary


def test_a_fresh_reference_that_did_not_learn_decides_nothing(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.00, 2.02, 1.98, 2.01], "b": [2.30, 2.31, 2.29, 2.30], "c": [2.6, 2.6, 2.6, 2.6]})
    fill(
        load_study(path, replicate=True),
        {"a": [3.09, 3.10, 3.08, 3.09], "b": [3.2, 3.21, 3.2, 3.21], "c": [3.3, 3.31, 3.3, 3.31]},
    )
    rows = statuses(write_report(load_study(path, replicate=True)) / "replication.csv")
    assert {r["status"] for r in rows.values()} == {"not decided"}
    assert {r["fresh_shows"] for r in rows.values()} == {
        "the reference did not learn to use context on the fresh seeds"
    }


def first_line(summary: str) -> str:
    """The report's first line below the study's and the replication's headings."""
    return next(line for line in summary.splitlines() if line and not line.startswith("#"))


def test_a_replication_report_opens_with_the_references_context_gains(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path), {"a": [2.00, 2.02, 1.98, 2.01], "b": [2.30, 2.31, 2.29, 2.30], "c": [2.6, 2.6, 2.6, 2.6]})
    fresh = load_study(path, replicate=True)
    fill(fresh, {"a": [3.09, 3.10, 3.08, 3.09], "b": [3.2, 3.21, 3.2, 3.21], "c": [3.3, 3.31, 3.3, 3.31]})
    line = first_line((write_report(fresh) / "summary.md").read_text())
    assert line.startswith("**Context gain of the reference:** 1.1 [") and "on the design's seeds" in line
    assert line.endswith("on the fresh ones.") and "it needs: uninformative)" in line  # the fresh reference's gain


def test_a_replication_report_before_the_original_ran_says_so_in_one_line(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    fill(load_study(path, replicate=True), {"a": [2.0, 2.01, 2.0, 2.01], "b": [2.3] * 4, "c": [2.6] * 4})
    summary = (write_report(load_study(path, replicate=True)) / "summary.md").read_text()
    assert "Nothing to compare yet:" in summary and "no study journal here" in summary
    assert first_line(summary).startswith("**Context gain of the reference:** ")  # the fresh seeds', even so


def test_the_original_report_points_to_its_replication(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides)
    values = {"a": [2.00, 2.02, 1.98, 2.01], "b": [2.30, 2.31, 2.29, 2.30], "c": [2.6, 2.6, 2.6, 2.6]}
    fill(load_study(path), values)
    assert "--replicate" not in (write_report(load_study(path)) / "summary.md").read_text()
    fill(load_study(path, replicate=True), values)
    summary = (write_report(load_study(path)) / "summary.md").read_text()
    assert f"- replicated on fresh seeds: `linformer-lab report {path} --replicate`" in summary


@pytest.mark.processes  # the sweep command's workers
def test_sweep_replicate_trains_the_fresh_seeds_and_leaves_the_original_untouched(tmp_path, tiny, capsys):
    path = write_study(
        tmp_path,
        tiny,
        "fresh",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "model.attention.kind": {"choices": ["full"]}},
        overrides={"trainer.max_steps": 2, "trainer.val_check_interval": 2},
    )
    assert cli.main(["sweep", str(path), "--replicate"]) == 0
    out = capsys.readouterr().out
    assert f"report:      linformer-lab report {path} --replicate" in out
    replica = load_study(path, replicate=True)
    trials = optuna.load_study(study_name=replica.name, storage=stored.open_storage(replica, None)).trials
    assert sorted(t.params["seed"] for t in trials) == [100, 101]
    assert all(t.state.is_finished() for t in trials)
    assert not load_study(path).root.exists()  # the original's folder: never touched
    assert cli.main(["report", str(path), "--replicate"]) == 0
    assert "Nothing to compare yet" in (replica.root / "report" / "summary.md").read_text()


def test_a_fresh_control_that_does_not_separate_decides_nothing_and_plans_the_seeds_it_needs(tmp_path, tiny_overrides):
    # the no-context level is the runs' trivial baseline; the degraded arm is only the contrast known to be worse
    path = study_file(tmp_path, tiny_overrides, control={**CONTROL, "no_context": "baseline"})
    values = {"a": [2.00, 2.02, 1.98, 2.01], "b": [2.30, 2.31, 2.29, 2.30], "c": [2.6, 2.6, 2.6, 2.6]}
    # the degraded arm is as good as the reference at two fresh seeds: a contrast of 1.1, 0, 0.05, 1.0 (CI holds 0)
    for study, degraded in ((load_study(path), [3.1] * 4), (load_study(path, replicate=True), [3.1, 2.02, 2.03, 3.0])):
        ostudy = sweep.open_study(RunStorage(study, None))
        ocontrol = sweep.open_study(RunStorage(study.control, None))
        for arm, vs in values.items():
            for seed, v in zip(study.seeds, vs):
                add(ostudy, {"seed": seed, "arm": arm}, v, trivial_loss=NO_CONTEXT)
        for seed, v in zip(study.control.seeds, degraded):
            add(ocontrol, {"control": "degraded", "seed": seed}, v, trivial_loss=NO_CONTEXT)
    out = write_report(load_study(path, replicate=True))
    rows = statuses(out / "replication.csv")
    assert {r["status"] for r in rows.values()} == {"not decided"}
    assert {r["fresh_shows"] for r in rows.values()} == {"the control's power check failed on the fresh seeds"}
    more = {int(r["more_seeds"]) for r in rows.values()}
    assert len(more) == 1 and more.pop() >= 1
    summary = (out / "summary.md").read_text()
    assert "more seeds per arm would let the control separate at 80 % power" in summary


def test_seeds_added_to_a_replication_are_named_as_added_in_its_report(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, replicate={"seeds": [40, 41, 42], "control_seeds": [40, 41]})
    assert seeds_words(load_study(path, replicate=True)) == "seeds 40–42, control 40, 41"
    grown = load_study(path, replicate=True, added_seeds=[43])  # `sweep --replicate --add-seeds 1` after a first look
    assert seeds_words(grown) == "seeds 40–43, control 40, 41, 43; 43 added by `sweep --add-seeds`"
