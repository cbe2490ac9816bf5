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


def test_an_interrupted_trial_is_put_back_and_marked_interrupted_not_failed(tmp_path, tiny_overrides):
    from studies import ARMS, write_study

    from foundation.errors import Terminated
    from sweeps import stored
    from sweeps.run.command import _describe
    from sweeps.run.trials import record_failure
    from sweeps.spec.study import load_study

    path = write_study(tmp_path, tiny_overrides, "stopped", {"arm": {"choices": ARMS}}, arms=["arm"])
    study = load_study(path)
    ostudy = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = ostudy.ask({"arm": optuna.distributions.CategoricalDistribution(["full", "linformer"])})
    record_failure(trial, Terminated("SIGTERM"))
    ostudy.tell(trial, state=TrialState.FAIL)  # what Optuna does with the trial whose objective raised
    first, copy = ostudy.get_trials()
    assert (
        copy.state == TrialState.WAITING and copy.params == first.params and stored.INTERRUPTED not in copy.user_attrs
    )
    assert first.user_attrs[stored.INTERRUPTED] == "terminated (SIGTERM): put back, trial 1 continues it"
    assert stored.excluded_numbers(ostudy.get_trials()) == {0}  # it counts for nothing
    line = _describe(first, study)
    assert "INTERRUPTED" in line and "FAIL" not in line and "trial 1 continues it" in line

    second = ostudy.ask()  # the copy, run and interrupted by Ctrl-C in turn
    record_failure(second, KeyboardInterrupt())
    ostudy.tell(second, state=TrialState.FAIL)
    assert ostudy.get_trials()[1].user_attrs[stored.INTERRUPTED].startswith("interrupted (Ctrl-C): put back, trial 2")
