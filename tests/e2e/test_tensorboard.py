"""What a researcher's browser shows, read through TensorBoard's own HTTP data API: two single runs (Linformer and
full attention) in one experiment folder and a study with two arms: run names, HPARAMS columns (the varied axis
first) and metrics, the objective's curve at every sample step, the no-context level, no NaN, no epoch card."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from studies import write_study
from tiny import child_env

from experiments import cli

STEPS = ["trainer.max_steps=10", "trainer.val_check_interval=10"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[str]:
    """A TensorBoard process on ``logdir`` at 127.0.0.1 and a free port; yields its address once it answers."""
    port = _free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--reload_interval", "1"],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                if _get(url, "/data/runs"):
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get(url: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _shown(url: str) -> dict:
    """Runs, scalar tags per run, the HPARAMS columns and metrics, and the custom-scalars layout, as served."""
    for _ in range(100):  # the first load of the event files
        runs = _get(url, "/data/runs")
        tags = _get(url, "/data/plugin/scalars/tags")
        if runs and all("val_sample/masked_loss" in tags.get(r, {}) for r in runs if r != "."):
            break
        time.sleep(0.1)
    experiment = _get(url, "/data/plugin/hparams/experiment", {"experimentName": ""})
    return {
        "runs": sorted(r for r in runs if r != "."),
        "tags": tags,
        "columns": [h["name"] for h in experiment["hparamInfos"]],
        "differs": [h["name"] for h in experiment["hparamInfos"] if h.get("differs")],
        "domains": {h["name"]: h.get("domainDiscrete") for h in experiment["hparamInfos"]},
        "metrics": [m["name"]["tag"] for m in experiment["metricInfos"]],
        "layout": _get(url, "/data/plugin/custom_scalars/layout"),
    }


def _check_curves(url: str, shown: dict, steps: int) -> None:
    for run in shown["runs"]:
        tags = shown["tags"][run]
        assert "epoch" not in tags and "val/ppl_vs_wallclock" not in tags
        for tag in ("val_sample/masked_loss", "no_context/masked_loss", "val/masked_loss", "hp/val_masked_loss"):
            points = _get(url, f"/data/plugin/scalars/scalars?run={run}&tag={tag}")
            assert not any(math.isnan(p[2]) for p in points), (run, tag)
            if tag.startswith(("val_sample/", "no_context/")):
                assert [p[1] for p in points] == list(range(1, steps + 1)), (run, tag)  # a point per step
    charts = [c for cat in shown["layout"]["category"] for c in cat["chart"]]
    (chart,) = [c for c in charts if c["title"].startswith("masked_loss")]
    # the sample curve and its level (the full set's two or three points, smoothed as a line, would mislead)
    assert chart["multiline"]["tag"] == ["^val_sample/masked_loss$", "^no_context/masked_loss$"]


@pytest.mark.processes
def test_tensorboard_shows_runs_by_what_differs_with_their_curves_and_hparams(tiny, tmp_path):
    train = ["train", str(tiny.config), *tiny.args, *STEPS]
    assert cli.main(train) == 0
    assert cli.main([*train, "model.attention.kind=full"]) == 0
    arms = {"model.attention.kind": {"type": "categorical", "choices": ["linformer", "full"]}}
    study = write_study(tmp_path, tiny, "arms", {**arms, "seed": {"type": "categorical", "choices": [0]}})
    assert cli.main(["sweep", str(study), "--workers", "1"]) == 0
    with tensorboard(tmp_path / "runs" / "tiny") as runs_url, tensorboard(tmp_path / "runs" / "arms") as study_url:
        single, swept = _shown(runs_url), _shown(study_url)
        _check_curves(runs_url, single, 10)
        _check_curves(study_url, swept, 6)
    # The overrides (the tiny model's and the attention kind) are the axes: listed first and ticked.
    assert "model.attention.kind" in single["differs"] and not {"task", "model.norm"} & set(single["differs"])
    assert single["columns"][: len(single["differs"])] == single["differs"]
    assert single["domains"]["model.attention.kind"] == ["full", "linformer"]
    assert single["metrics"][:2] == ["hp/val_masked_loss", "hp/context_gain"]
    assert swept["runs"] == ["kind=full/seed=0_trial_1", "kind=linformer/seed=0_trial_0"]
    assert swept["differs"][:2] == swept["columns"][:2] == ["model.attention.kind", "seed"]  # the study's parameters


def _sessions(url: str, columns: list[str]) -> list[dict]:
    """The session groups as the HPARAMS tab asks for them (every status, every column in the result, no filter)."""
    statuses = ["STATUS_FAILURE", "STATUS_RUNNING", "STATUS_SUCCESS", "STATUS_UNKNOWN"]
    request = {
        "experimentName": "",
        "allowedStatuses": statuses,
        "colParams": [{"hparam": c, "includeInResult": True} for c in columns],
        "startIndex": 0,
        "sliceSize": 1000,
    }
    return _get(url, "/data/plugin/hparams/session_groups", request)["sessionGroups"]


@pytest.mark.processes
def test_hparams_draws_every_trial_of_a_study_and_its_control_in_its_default_view(tiny, tmp_path):
    """A study whose arms and control set different keys (full attention has no ``k``; the arms have no control
    role): every trial has a value in every column, so the table and the parallel coordinates (which drop a trial
    without a value for a shown column) draw them all; the study's axes come first and are ticked; trial IDs are short
    (arm, seed, number)."""
    from studies import ARMS, CONTROL

    space = {"seed": {"type": "categorical", "choices": [0]}, "arm": {"choices": ARMS}}
    path = write_study(tmp_path, tiny, "mixed", space, arms=["arm"], control={**CONTROL, "seeds": [0, 1]})
    assert cli.main(["sweep", str(path), "--workers", "1", "--no-preflight", "--no-gate"]) == 0
    with tensorboard(tmp_path / "runs" / "mixed") as url:
        shown = _shown(url)
        groups = _sessions(url, shown["columns"])
    by_name = {g["name"]: g["hparams"] for g in groups}
    # 5 trials: the arms' 2, the control's reference at seed 1 and degraded at seeds 0 and 1 (its reference at seed 0
    # is the arm "full" at seed 0, trained once); each Trial ID its arm (a control's role), seed and number
    assert sorted(n.rsplit(" ", 2)[0] for n in by_name) == ["degraded", "degraded", "full", "linformer", "reference"]
    assert all(n.rsplit(" ", 2)[1] in ("s0", "s1") for n in by_name), sorted(by_name)
    for group in groups:
        assert set(group["hparams"]) == set(shown["columns"]), group["name"]  # a value in every column
    reference = next(h for n, h in by_name.items() if n.startswith("reference s1 #"))
    linformer = next(h for n, h in by_name.items() if n.startswith("linformer s0 #"))
    assert reference["model.attention.options.k"] == "–" and reference["arm"] == "–"
    assert linformer["control"] == "study" and linformer["model.attention.options.k"] == "8"
    # the study's axes (arm, control role, seed), the kind and k (8 for the arm, 1 for the degraded control): the
    # five the tab ticks; Linformer's other options (one value, or "–" for full attention) are not axes
    axes = ["arm", "control", "model.attention.kind", "model.attention.options.k", "seed"]
    assert shown["differs"] == axes, shown["differs"]
    assert "experiment" not in shown["differs"] and "sweep/trial" not in shown["differs"]


@pytest.mark.processes
def test_hparams_shows_a_curves_trunk_and_each_cooldown_as_a_session_of_its_own_with_its_seed_as_written(
    tiny, tmp_path
):
    """A budget-curve study (``--budgets 1,2``): each trial's trunk and its two cooldowns are three sessions, named by
    arm, seed, number and budget, each with its own budget and objective, so that filtering the tab by budget shows one
    budget's points side by side (one session per trial would show one of the three runs' values, whichever came
    first). The seed reads as written: as a number the tab would print 100000 and 100001 both as 1.0000e+5."""
    arms = {"model.attention.kind": {"type": "categorical", "choices": ["linformer", "full"]}}
    study = write_study(tmp_path, tiny, "arms", {**arms, "seed": {"type": "categorical", "choices": [0]}})
    assert cli.main(["sweep", str(study), "--workers", "1", "--budgets", "1,2"]) == 0
    with tensorboard(tmp_path / "runs" / "arms_curve") as url:
        shown = _shown(url)
        groups = _sessions(url, shown["columns"])
    by_name = {g["name"]: g for g in groups}
    assert sorted(by_name) == sorted(
        f"{kind} s100000 #{n} {budget}"
        for kind, n in (("linformer", 0), ("full", 1))
        for budget in ("trunk", "x1", "x2")
    ), sorted(by_name)
    for name, group in by_name.items():
        assert group["hparams"]["budget"] == name.rsplit(" ", 1)[1] and group["hparams"]["seed"] == "100000"
        (session,) = group["sessions"]
        assert any(m["name"]["tag"] == "hp/val_masked_loss" for m in session["metricValues"]), name
    values = {
        n: next(m["value"] for m in g["sessions"][0]["metricValues"] if m["name"]["tag"] == "hp/val_masked_loss")
        for n, g in by_name.items()
    }
    assert values["linformer s100000 #0 x1"] != values["linformer s100000 #0 x2"]  # each budget its own point
    assert "budget" in shown["differs"] and shown["domains"]["seed"] == ["100000"]
