"""A running study's bookkeeping (sweeps/run/storage.py): what the trial budget counts, and the lock Optuna's own
writer leaves behind, recovered by the sweep that owns the study."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileSymlinkLock
from optuna.trial import TrialState
from studies import CONTROL, trials_of, write_study

from experiments import cli
from sweeps import stored
from sweeps.run import storage
from sweeps.run.command import open_study
from sweeps.spec.study import load_study


# --------------------------------------------------------------------------------------- budget
def _trial(number, state, **attrs):
    return optuna.trial.create_trial(
        state=state,
        value=1.0 if state == TrialState.COMPLETE else None,
        user_attrs=attrs.get("user_attrs", {}),
        system_attrs=attrs.get("system_attrs", {}),
    ), number


def test_the_budget_counts_finished_trials_but_not_retried_or_discarded_ones():
    made = [
        _trial(0, TrialState.COMPLETE),
        _trial(1, TrialState.FAIL),
        _trial(2, TrialState.PRUNED),
        _trial(3, TrialState.COMPLETE, system_attrs={"retry_history": [1]}),
        _trial(4, TrialState.PRUNED, user_attrs={stored.DISCARDED: "budget met"}),
        _trial(5, TrialState.RUNNING),
    ]
    trials = []
    for t, number in made:
        t.number = number
        trials.append(t)
    assert storage.budget_state(trials) == storage.BudgetState(finished=3, running=1)  # 0, 2, 3 finished; 5 running
    assert storage.budget_position(trials, 5) == 3


# --------------------------------------------------------------------------------------- Optuna's own lock
def leave_optunas_lock(journal: Path) -> Path:
    """What a writer with Optuna's default lock leaves when it is killed mid-append, the journal named relatively
    (as ``runs/`` is by default): its symbolic link lock (to the relative name: it dangles) and half a record."""
    relative = Path(os.path.relpath(journal))
    assert JournalFileSymlinkLock(str(relative)).acquire()  # Optuna's lock, taken and never released
    with open(journal, "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "killed", "trial_id": 0, "par')
    lock = journal.parent / stored.OPTUNA_LOCK
    assert lock.is_symlink() and not lock.exists()  # dangling
    return lock


@pytest.mark.processes  # the sweep command's worker
def test_the_sweep_that_owns_a_study_recovers_the_lock_optunas_killed_writer_left_and_completes(
    tmp_path, tiny, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    path = write_study(
        tmp_path,
        tiny,
        "left_lock",
        {"seed": {"type": "categorical", "choices": [0]}},
        overrides={"output_dir": "runs", "trainer.max_steps": 2, "trainer.val_check_interval": 2},
    )
    study = load_study(path)
    open_study(storage.RunStorage(study, None))
    lock = leave_optunas_lock(study.root / stored.JOURNAL)
    capsys.readouterr()
    assert cli.main(["sweep", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{lock}: removed Optuna's journal lock, left by a process that died" in err
    assert "removed a torn last line" in err
    assert not os.path.lexists(lock)
    trials = trials_of(path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] and trials[0].params == {"seed": 0}


def test_the_owner_of_a_study_removes_optunas_locks_of_its_control_too_and_never_what_they_name(
    tmp_path, tiny_overrides, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    path = write_study(
        tmp_path, tiny_overrides, "both", {"seed": {"type": "categorical", "choices": [0, 1]}}, control=CONTROL
    )
    study = load_study(path)
    for one in study.studies:
        open_study(storage.RunStorage(one, None))
    locks = [leave_optunas_lock(one.root / stored.JOURNAL) for one in study.studies]
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    locks[0].unlink()
    locks[0].symlink_to(victim)  # a lock that names a file: only the link goes
    storage.RunStorage(study, None).check_folder()  # Optuna's locks pass the folder's check (no other link would)
    with storage.RunStorage(study, None).own():
        assert not any(os.path.lexists(lock) for lock in locks)
    assert victim.read_text() == "someone else's file\n"
    assert capsys.readouterr().err.count("removed Optuna's journal lock") == 2
