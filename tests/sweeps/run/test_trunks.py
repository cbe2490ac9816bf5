"""A budget-curve study run by ``sweep --budgets`` (sweeps/run/trunks.py): one trunk per seed and arm, a cooldown per
budget branched off it, resumable and extendable without re-running anything."""

import json

import optuna
import pytest
from studies import counted, write_study

from experiments import cli
from foundation.errors import ConfigError
from sweeps import stored
from sweeps.run import trunks
from sweeps.spec.study import load_study
from training.branch import BRANCH


def _trials(path, curve):
    study = load_study(path, curve=curve)
    return optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).get_trials()


def _preflight_left(path, monkeypatch, capsys):
    """``sweep --budgets 1,2,4 --preflight`` with each shape's measurement stubbed: what its plan priced as left."""
    from sweeps.run import plan, preflight

    def runner(shape, steps, threads, gpus):
        shape.measured = {"setup_s": 1.0, "first_step_s": 1.0, "step_s": 1.0, "validation_s": 0.5, "start_s": 1.0,
                          "memory": "rss", "peak_mb": 1.0, "total_mb": 10.0}  # fmt: skip

    seen = []
    with monkeypatch.context() as patched:
        patched.setattr(preflight, "run_shape", runner)
        patched.setattr(preflight, "measured_line", lambda shape: "measured")
        patched.setattr(plan, "left_of", lambda *args, real=plan.left_of: seen.append(real(*args)) or seen[-1])
        capsys.readouterr()
        assert cli.main(["sweep", str(path), "--budgets", "1,2,4", "--preflight"]) == 0
    return seen[0]


def _steps(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())["global_step"]


@pytest.mark.processes  # the sweep command's worker
def test_a_curve_study_trains_one_trunk_per_point_and_a_cooldown_per_budget_then_extends_it(
    tmp_path, tiny, monkeypatch, capsys
):
    """6 steps at ×1, cooldown 20 %: ×1 branches at step 5, ×2 (12 steps) at 10, ×4 (24 steps) at 19. The trunk
    trains to 10 and keeps steps 5 and 10; each cooldown records its branch; the trial answers at ×2 and keeps each
    point. Listing ×4 later trains the trunk on to 19 and adds one cooldown: the others are not run again. The
    preflight of the longer list prices that extension (each point's ×1 and ×2 already run), not the whole curve."""
    path = write_study(
        tmp_path,
        tiny,
        "curves",
        {"seed": {"type": "categorical", "choices": [0, 1]}},
        overrides={"model.attention.kind": "linformer"},
    )
    assert cli.main(["sweep", str(path), "--budgets", "1,2"]) == 0
    trials = _trials(path, "1,2")
    assert sorted(t.params["seed"] for t in trials) == [100000, 100001]
    point = tmp_path / "runs" / "curves_curve" / "seed=100000"
    assert _steps(point / "trunk") == 10 and sorted(p.name for p in (point / "trunk" / "checkpoints").iterdir()) == [
        "last.ckpt",
        "step_10.ckpt",
        "step_5.ckpt",
    ]
    assert (_steps(point / "cooldown_x1"), _steps(point / "cooldown_x2")) == (6, 12)
    assert json.loads((point / "cooldown_x1" / BRANCH).read_text())["step"] == 5
    first = next(t for t in trials if t.params["seed"] == 100000)
    points = stored.points_of(first)
    assert set(points) == {"x1", "x2"} and first.value == points["x2"][load_study(path, curve="1,2").metrics[0]]
    assert first.user_attrs["curve_dir"] == str(point)  # the report reads each budget's run from there
    assert first.user_attrs["run_dir"] == str(point / "cooldown_x2")  # the run the trial answers with
    ended = {name: (point / name / "metrics.json").stat().st_mtime_ns for name in ("cooldown_x1", "cooldown_x2")}

    priced = _preflight_left(path, monkeypatch, capsys)
    out = capsys.readouterr().out
    assert sorted(priced.values()) == [(1.0, 2.0), (1.0, 2.0)] and "plan: 2 trial(s)" in out
    assert (
        "plan: left of the curve run to ×1, ×2: the trunk from step 10 to 19 and the cooldowns of ×4 (5 steps)" in out
    )

    assert cli.main(["sweep", str(path), "--budgets", "1,2,4"]) == 0
    trials = counted(_trials(path, "1,2,4"))
    assert len(trials) == 2 and all(set(stored.points_of(t)) == {"x1", "x2", "x4"} for t in trials)
    assert _steps(point / "trunk") == 19 and _steps(point / "cooldown_x4") == 24
    assert {name: (point / name / "metrics.json").stat().st_mtime_ns for name in ended} == ended
    assert _preflight_left(path, monkeypatch, capsys) == {} and "plan: 0 trial(s)" in capsys.readouterr().out
    assert cli.main(["report", str(path), "--budgets", "1,2,4"]) == 0
    summary = (tmp_path / "runs" / "curves_curve" / "report" / "summary.md").read_text()
    assert "## curves as training goes on: budgets ×1, ×2, ×4" in summary
    # the study's own report below it says at which budget it reads the trials
    assert summary.index("## At the largest budget, ×4: the fresh seeds' own report") > summary.index("budgets ×1")


def test_a_budget_the_trunk_passed_without_a_checkpoint_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """A trunk at step 10 kept steps 5 and 10: ×1.5 (9 steps, branch at 7) can no longer branch."""
    from sweeps.spec import budgets

    folder = tmp_path / "seed=0"
    (folder / "trunk" / "checkpoints").mkdir(parents=True)
    for step in (5, 10):
        (folder / "trunk" / "checkpoints" / f"step_{step}.ckpt").write_bytes(b"")
    curve = budgets.points((1, 1.5, 2), 6, 0.2)
    monkeypatch.setattr(trunks, "_trunk_step", lambda trunk: 10)  # the trunk's last checkpoint, without training one
    with pytest.raises(ConfigError) as err:
        trunks.check_extendable(folder, curve)
    assert "×1.5 branches at step 7, which the trunk" in str(err.value) and "passed (it is at step 10)" in str(
        err.value
    )
