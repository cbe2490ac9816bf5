"""Around one trial (sweeps/run/trials.py): a retried trial continues from its dead attempt's checkpoint."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState


def test_a_retry_continues_from_its_attempts_checkpoint_only_when_there_is_one(tmp_path):
    import torch

    from sweeps.run.trials import copy_attempt

    old = tmp_path / "trial_0"
    dead = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"run_dir": str(old)})
    dead.number = 0
    retry = optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"retry_history": [0]})
    retry.number = 1
    fresh = optuna.trial.create_trial(state=TrialState.WAITING)
    fresh.number = 2
    old.mkdir()
    (old / "events.out.tfevents.1").write_bytes(b"curve")
    assert copy_attempt([dead, retry], retry, tmp_path / "trial_1") is None  # killed before its checkpoint
    (old / "checkpoints").mkdir()
    torch.save({"state_dict": {}, "global_step": 9}, old / "checkpoints" / "last.ckpt")
    assert copy_attempt([dead, fresh], fresh, tmp_path / "trial_2") is None  # not a retry
    previous, step = copy_attempt([dead, retry], retry, tmp_path / "trial_1")
    assert previous.number == 0 and step == 9
    assert (tmp_path / "trial_1" / "events.out.tfevents.1").read_bytes() == b"curve"
    assert (tmp_path / "trial_1" / "checkpoints" / "last.ckpt").is_file() and (old / "checkpoints").is_dir()
