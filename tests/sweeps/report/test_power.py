"""The control's power check (sweeps/report/power.py): a study runs its control beside its trials and its report
judges the power; a control that has not run is not judged."""

from __future__ import annotations

import csv
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from studies import CONTROL, counted, trials_of, write_study

from experiments import cli
from sweeps import stored
from sweeps.report import power
from sweeps.spec import stats
from sweeps.spec.study import load_study


# --------------------------------------------------------------------------------------- power check
@pytest.mark.processes  # the sweep command's workers
def test_a_study_runs_its_control_beside_its_trials_and_reports_the_power_check(tmp_path, tiny):
    control = CONTROL
    path = write_study(
        tmp_path,
        tiny,
        "powered",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "model.attention.options.share": {"choices": ["headwise", "kv"]},
        },
        overrides={"model.attention.kind": "linformer", "trainer.max_steps": 3},
        control=control,
    )
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    main = counted(trials_of(path))
    root = tmp_path / "runs" / "powered"
    cstudy = load_study(path).control
    ctrials = optuna.load_study(study_name="powered_control", storage=stored.open_storage(cstudy, None)).get_trials()
    # the control is its own study: the main study's sampler and budget never see it
    assert len(main) == 4 and all("control" not in t.params for t in main)
    assert sorted((t.params["control"], t.params["seed"]) for t in ctrials) == [
        ("degraded", 0),
        ("degraded", 1),
        ("reference", 0),
        ("reference", 1),
    ]
    for t in ctrials:
        assert t.state == TrialState.COMPLETE and Path(t.user_attrs["run_dir"]).is_relative_to(root / "control")
        resolved = yaml.safe_load((Path(t.user_attrs["run_dir"]) / "config.yaml").read_text())
        assert resolved["model"]["attention"]["kind"] == ("full" if t.params["control"] == "reference" else "linformer")
        assert resolved["seed"] == t.params["seed"]

    assert cli.main(["report", str(path)]) == 0
    summary = (root / "report" / "summary.md").read_text()
    by_role = {
        role: {(t.params["seed"],): t.value for t in ctrials if t.params["control"] == role}
        for role in ("reference", "degraded")
    }
    trivial = {
        (t.params["seed"],): t.user_attrs["metrics"]["trivial_loss"]
        for t in ctrials
        if t.params["control"] == "reference"
    }
    check = stats.power_check(by_role["reference"], by_role["degraded"], trivial, "minimize")
    assert summary.index("## Power check") < summary.index("## Arms")
    # the advice a study file without a GPU preset gets (sweeps.report.command.advice_of)
    assert all(f"- {line}" in summary for line in power.phrase(check, "add seeds or training steps"))
    assert ("The power check failed" in summary) == (not check.has_power)
    # the control's arms sit in the table beside the study's own arms, and in none of the comparisons
    assert "| control reference (kind=full) | 2 |" in summary
    assert "| control degraded (kind=linformer k=1) | 2 |" in summary
    assert "| share=headwise | control reference (kind=full) |" not in summary
    with (root / "report" / "trials.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 8


def test_a_report_whose_control_has_not_run_says_the_power_was_not_judged(tmp_path, tiny_overrides):
    from optuna.distributions import CategoricalDistribution

    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    control = {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "unjudged",
        {"seed": {"type": "categorical", "choices": [0, 1]}},
        overrides={"model.attention.kind": "linformer"},
        control=control,
    )
    study = load_study(path)
    open_study(RunStorage(study, None)).add_trial(
        optuna.trial.create_trial(
            params={"seed": 0},
            distributions={"seed": CategoricalDistribution([0, 1])},
            value=3.0,
            user_attrs={"metrics": {"val/loss": 3.0, "trivial_loss": 3.1}},
        )
    )
    summary = (write_report(study) / "summary.md").read_text()
    assert "Not judged: the control's reference and degraded arms have fewer than 2 complete trials" in summary
    assert "The power check failed" not in summary
