"""A running study's bookkeeping (sweeps/run/storage.py): what the trial budget counts."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from sweeps import stored
from sweeps.run import storage


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
