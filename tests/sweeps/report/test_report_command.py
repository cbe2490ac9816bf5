"""The ``report`` command (sweeps/report/command.py): every trial in trials.csv and in the summary, a failed one with
its reason, and the figures."""

from __future__ import annotations

import csv
import math

import pytest
from optuna.trial import TrialState
from studies import ARMS, trials_of, write_study

from experiments import cli
from sweeps.report import markdown


# --------------------------------------------------------------------------------------- report
@pytest.mark.processes  # the sweep command's workers
def test_a_diverging_trial_is_recorded_with_its_reason_and_the_report_holds_every_trial(tmp_path, tiny, capsys):
    diverges = {"optim.lr": 1.0e30, "optim.gradient_clip_val": 0.0}
    path = write_study(
        tmp_path,
        tiny,
        "report",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "arm": {"type": "categorical", "choices": {**ARMS, "diverges": diverges}},
        },
        overrides={"trainer.max_steps": 3},
        arms=["arm"],
    )
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    assert "exited with code" not in capsys.readouterr().out  # a failed trial leaves its worker running
    trials = {t.number: t for t in trials_of(path)}
    assert len(trials) == 6
    for t in trials.values():
        if t.params["arm"] == "diverges":
            assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"].startswith("diverged: train/loss=")
        else:
            assert t.state == TrialState.COMPLETE and math.isfinite(t.value)

    assert cli.main(["report", str(path)]) == 0
    out = tmp_path / "runs" / "report" / "report"
    with (out / "trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(int(r["number"]) for r in rows) == sorted(trials)
    for r in rows:
        t = trials[int(r["number"])]
        assert r["state"] == t.state.name and r["arm"] == t.params["arm"]
        if t.state == TrialState.COMPLETE:
            assert float(r["val/loss"]) == pytest.approx(t.value)
            assert float(r["trivial_loss"]) == pytest.approx(t.user_attrs["metrics"]["trivial_loss"])
        else:
            assert r["fail_reason"] == t.user_attrs["fail_reason"]
    summary = (out / "summary.md").read_text()
    full = [t.value for t in trials.values() if t.params["arm"] == "full"]
    mean = sum(full) / 2
    std = math.sqrt(sum((v - mean) ** 2 for v in full))
    assert f"| full | 2 | {markdown.fmt(mean)} ± {markdown.fmt(std)} |" in summary
    assert "trivial loss" in summary
    assert summary.count("| full | linformer |") == 1 and "paired t (n=2)" in summary
    assert "| diverges | 0 |" in summary and "## Failed trials" in summary
    for png in ("history.png", "parallel_coordinate.png", "learning_curves.png"):
        assert (out / png).stat().st_size > 1000


def test_a_report_advises_the_gpu_preset_only_where_the_study_file_has_one():
    from types import SimpleNamespace

    from sweeps.report.command import advice_of
    from sweeps.spec.schema import SWEEPS_DIR
    from sweeps.spec.study import load_study

    # the file's presets as the loaded study keeps them (the report does not read the file again)
    assert load_study(SWEEPS_DIR / "k_sweep.yaml").presets == ("cpu", "cpu_mqar", "gpu", "cpu_long", "cpu_long_window")
    assert advice_of(SimpleNamespace(presets=("cpu", "gpu"), preset="cpu")) == "run the GPU preset (--preset gpu)"
    assert advice_of(SimpleNamespace(presets=("cpu", "gpu"), preset="gpu")) == "add seeds or training steps"
    assert advice_of(SimpleNamespace(presets=(), preset=None)) == "add seeds or training steps"
