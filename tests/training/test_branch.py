"""A cooldown branched off a constant-rate trunk's checkpoint (training/branch.py): what a straight wsd run computes."""

import json

import pytest
import torch
from tiny import REPO

from foundation.checkpoint import read_checkpoint
from foundation.errors import ConfigError
from training import config as run_config
from training.branch import BRANCH, KeepCheckpoints, kept_checkpoint
from training.train import train

CONFIGS = REPO / "experiments" / "configs"
COOLDOWN = ["optim.schedule=wsd", "optim.cooldown_fraction=0.5", "trainer.max_steps=6"]


def _run(tiny_overrides, tmp_path, name, extra, callbacks=()):
    cfg = run_config.load(CONFIGS / "base.yaml", [*tiny_overrides.args, f"run_dir={tmp_path / name}", *extra])
    return train(cfg, callbacks=list(callbacks))


def _weights(run_dir):
    return read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


def test_a_cooldown_off_the_trunk_ends_where_a_straight_wsd_run_ends_to_the_bit(tiny_overrides, tmp_path):
    """A trunk at constant lr keeps its step-3 checkpoint; a 6-step wsd run with its cooldown over the last half
    starts its decay at step 3: branched there, the cooldown ends with the straight run's weights and validation."""
    straight = _run(tiny_overrides, tmp_path, "straight", COOLDOWN)
    trunk_dir = tmp_path / "trunk"
    _run(
        tiny_overrides,
        tmp_path,
        "trunk",
        ["optim.schedule=constant", "trainer.max_steps=8"],
        [KeepCheckpoints(trunk_dir, [3])],
    )
    assert kept_checkpoint(trunk_dir, 3).is_file()
    branched = _run(tiny_overrides, tmp_path, "cooldown", [*COOLDOWN, f"branch_from={kept_checkpoint(trunk_dir, 3)}"])
    assert branched["global_step"] == straight["global_step"] == 6
    assert branched["val/loss"] == straight["val/loss"]
    for name, tensor in _weights(tmp_path / "straight").items():
        assert torch.equal(tensor, _weights(tmp_path / "cooldown")[name]), name
    record = json.loads((tmp_path / "cooldown" / BRANCH).read_text())
    assert record["step"] == 3 and record["branch_from"] == str(kept_checkpoint(trunk_dir, 3))
    assert record["trunk_run_id"] == json.loads((trunk_dir / "metrics.json").read_text())["run_id"]
    assert branched["run_id"] != record["trunk_run_id"]  # a run of its own


@pytest.mark.parametrize(
    "trunk_schedule, extra, message",
    [
        ("linear", COOLDOWN, "is of a run with optim.schedule='linear'"),
        ("constant", ["optim.schedule=linear", "trainer.max_steps=6"], "a cooldown off a trunk is 'wsd'"),
        ("constant", [*COOLDOWN, "optim.lr=0.01"], "was saved by a run of another config (optim.lr"),
        ("constant", [*COOLDOWN, "trainer.max_steps=4"], "holds step 3, outside this run's stable phase (steps 2 to 2"),
    ],
)
def test_a_branch_is_refused_in_one_line_before_anything_is_written(
    tiny_overrides, tmp_path, trunk_schedule, extra, message
):
    trunk_dir = tmp_path / "trunk"
    _run(tiny_overrides, tmp_path, "trunk", [f"optim.schedule={trunk_schedule}", "trainer.max_steps=3"])
    with pytest.raises(ConfigError) as err:
        _run(tiny_overrides, tmp_path, "cooldown", [*extra, f"branch_from={trunk_dir / 'checkpoints' / 'last.ckpt'}"])
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "cooldown").exists()
