"""Divergence, one rule for a plain run and a sweep's trial: a run whose training loss becomes non-finite stops at that
step in one line (step, loss, learning rate), keeps its last finite checkpoint, exits 3 and records ``diverged``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types

import pytest
import torch
from tiny import REPO, child_env

from experiments import cli
from foundation.errors import EXIT_DIVERGED, Diverged
from foundation.rundir import CHECKPOINT
from training.divergence import DivergenceGuard

# A tiny run at a learning rate that no model survives: its weights overflow within a few steps.
HUGE_LR = ["optim.lr=1e30", "optim.gradient_clip_val=0.0", "optim.warmup_steps=0"]


def diverging(tiny_overrides, run_dir, *extra: str) -> list[str]:
    args = [a for a in tiny_overrides.args if not a.startswith("optim.warmup_steps")]
    return ["train", str(tiny_overrides.config), *args, *HUGE_LR, f"run_dir={run_dir}", *extra]


def finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


def test_a_diverging_run_stops_in_one_line_keeps_its_last_finite_checkpoint_and_exits_3(
    tiny_overrides, tmp_path, capsys
):
    run_dir = tmp_path / "diverges"
    capsys.readouterr()
    code = cli.main(diverging(tiny_overrides, run_dir, "trainer.val_check_interval=1"))
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert code == EXIT_DIVERGED == 3 and len(lines) == 1, out.err[-2000:]
    recorded = json.loads((run_dir / "metrics.json").read_text())["diverged"]
    step = recorded["step"]
    assert f"at step {step}" in lines[0] and "learning rate" in lines[0] and "optim.lr=1e+30" in lines[0]
    assert "train longer" not in out.out + out.err
    assert isinstance(recorded["lr"], float) and recorded["lr"] > 1e20
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == step and not any(k.startswith("val/") for k in metrics)
    # the checkpoint kept is the last one saved before the step that diverged, and every weight of it is finite
    if metrics["checkpoint_step"] is None:
        assert not (run_dir / CHECKPOINT).exists()
    else:
        state = torch.load(run_dir / CHECKPOINT, weights_only=True)
        assert state["global_step"] == metrics["checkpoint_step"] < step and finite(state)
        assert f"its last finite checkpoint (step {metrics['checkpoint_step']}) kept" in lines[0]


def test_a_diverged_run_is_not_resumed_it_would_diverge_again(tiny_overrides, tmp_path, capsys):
    run_dir = tmp_path / "diverged"
    assert cli.main(diverging(tiny_overrides, run_dir)) == EXIT_DIVERGED
    before = {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    capsys.readouterr()
    assert cli.main([*diverging(tiny_overrides, run_dir), "resume=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this run diverged at step" in err[0] and "smaller optim.lr" in err[0]
    assert {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


class FakeModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))


def trainer_at(step: int, lr: float) -> types.SimpleNamespace:
    optimizer = types.SimpleNamespace(param_groups=[{"lr": lr}])
    return types.SimpleNamespace(global_step=step, log_every_n_steps=50, optimizers=[optimizer])


def test_on_the_cpu_the_guard_stops_at_the_very_step_naming_its_loss_and_learning_rate():
    guard = DivergenceGuard()
    losses = [2.0, 3.0, math.inf]
    with pytest.raises(Diverged) as stopped:
        for step, loss in enumerate(losses, start=1):
            guard.on_train_batch_start(trainer_at(step - 1, lr=0.1 * step), None, None, step - 1)
            guard.on_train_batch_end(trainer_at(step, lr=0.1 * step), None, torch.tensor(loss), None, step - 1)
    err = stopped.value
    assert (err.step, err.loss, err.lr) == (3, math.inf, pytest.approx(0.3))
    assert str(err) == "diverged: train/loss=inf at step 3 (learning rate 0.3 at that step)"


def test_no_checkpoint_is_saved_with_non_finite_weights_even_after_a_finite_loss():
    guard, module = DivergenceGuard(), FakeModule()
    guard.on_train_batch_start(trainer_at(0, lr=5.0), None, None, 0)
    guard.on_train_batch_end(trainer_at(1, lr=5.0), None, torch.tensor(1e9), None, 0)
    guard.check_before_saving(trainer_at(1, lr=5.0), module)  # finite: saving goes on
    with torch.no_grad():
        module.weight[1] = math.nan
    with pytest.raises(Diverged, match=r"the weights became non-finite at step 1 \(train/loss=1e\+09, learning rate 5"):
        guard.check_before_saving(trainer_at(1, lr=5.0), module)


@pytest.mark.processes
def test_the_train_command_at_a_huge_learning_rate_exits_3_with_one_line_and_no_traceback(tmp_path, data_cache):
    """``linformer-lab train experiments/configs/bytes_mlm.yaml optim.lr=1e4``, shortened: a real process."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "train",
            str(REPO / "experiments" / "configs" / "bytes_mlm.yaml"),
            "optim.lr=1e4",
            f"run_dir={tmp_path / 'run'}",
            f"data.cache_dir={data_cache}",
            "data.max_texts=300",
            "trainer.max_steps=40",
            "trainer.accelerator=cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert done.returncode == 3 and len(errors) == 1 and "diverged" in errors[0], done.stderr[-2000:]
    assert "train longer" not in done.stdout + done.stderr
    assert "diverged" in json.loads((tmp_path / "run" / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.processes  # strategy=ddp: rank 1 is a second process
def test_under_two_rank_ddp_every_rank_stops_at_the_same_step_and_the_command_exits_3(tiny_overrides, tmp_path):
    """The ranks agree on the first step any of them diverged at (a rank that stopped alone would leave the other
    waiting in a collective for good)."""
    run_dir = tmp_path / "ddp"
    command = [sys.executable, "-m", "experiments.cli", *diverging(tiny_overrides, run_dir)]
    command += ["trainer.strategy=ddp", "trainer.devices=2", "trainer.max_steps=30", "trainer.val_check_interval=5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode == EXIT_DIVERGED, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    recorded = json.loads((run_dir / "metrics.json").read_text())["diverged"]
    lines = {line for line in done.stderr.splitlines() if line.startswith("error: ")}
    assert len(lines) == 1 and f"at step {recorded['step']}" in lines.pop()  # each rank's line, the same
