"""The control first, as a gate (sweeps/run/gate.py): a control that cannot separate stops the sweep before any arm,
with one paragraph and exit code 4; the decision is kept on a resumed study; ``--no-gate`` runs the arms anyway."""

from __future__ import annotations

import optuna
import pytest
from studies import CONTROL, trials_of, write_study

from experiments import cli
from sweeps import stored
from sweeps.run import gate
from sweeps.spec.study import load_study

# Linformer arms beside a control whose arms are not the study's: the control runs alone before the gate. Six steps
# of a tiny model: the reference cannot leave the no-context level, so the control cannot separate.
SPACE = {
    "seed": {"type": "categorical", "choices": [0, 1]},
    "model.attention.options.k": {"type": "categorical", "choices": [4, 8]},
}
ARMED = dict(arms=["model.attention.options.k"], control={**CONTROL, "seeds": [0, 1]})


@pytest.mark.processes  # the sweep's workers
def test_a_control_that_cannot_separate_stops_the_sweep_before_any_arm(tmp_path, tiny, monkeypatch, capsys):
    monkeypatch.setenv("LINFORMER_LAB_GATE", "1")
    path = write_study(tmp_path, tiny, "gated", SPACE, {"model.attention.kind": "linformer"}, **ARMED)
    assert cli.main(["sweep", str(path)]) == gate.EXIT_GATED
    err = capsys.readouterr().err
    paragraph = [line for line in err.splitlines() if line.startswith("gate: ")]
    assert len(paragraph) == 1
    assert (
        "stopped before the arms" in paragraph[0]
        and "--add-seeds" in paragraph[0]
        and "linformer-lab report" in (paragraph[0])
    )
    study = load_study(path)
    control = optuna.load_study(study_name=study.control.name, storage=stored.open_storage(study.control, None))
    assert len([t for t in control.trials if t.state.is_finished()]) == 4  # the control ran, whole
    assert [t for t in trials_of(path) if t.state.is_finished()] == []  # and no arm
    decision = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).user_attrs[gate.GATE]
    assert decision["passed"] is False and len(decision["on"]) == 4

    # resumed: the decision is kept (the control did not change), no trial runs
    assert cli.main(["sweep", str(path)]) == gate.EXIT_GATED
    assert [t for t in trials_of(path) if t.state.is_finished()] == []
    # --no-gate: the arms run anyway
    assert cli.main(["sweep", str(path), "--no-gate"]) == 0
    assert len([t for t in trials_of(path) if t.state.is_finished()]) == 4


def test_a_stored_decision_is_kept_while_the_control_is_the_one_it_was_taken_on(tmp_path, tiny_overrides):
    path = write_study(tmp_path, tiny_overrides, "kept", SPACE, {"model.attention.kind": "linformer"}, **ARMED)
    study = load_study(path)
    ostudy = optuna.create_study()  # in memory: the storage's user attrs are all the gate reads
    ostudy.set_user_attr(gate.GATE, {"passed": True, "on": [], "why": "taken earlier"})
    assert gate.decide(study, ostudy, []) == (True, "taken earlier")
    # the control changed (a trial the decision did not rest on): judged again, on what there is (nothing yet)
    ostudy.set_user_attr(gate.GATE, {"passed": True, "on": [7], "why": "taken earlier"})
    passed, said = gate.decide(study, ostudy, [])
    assert not passed and "could not be judged" in said
    assert ostudy.user_attrs[gate.GATE] == {"passed": False, "on": [], "why": said}


@pytest.mark.parametrize("passed", ["false", 1, None, [True]])
def test_a_stored_decision_whose_passed_is_not_a_bool_is_judged_again(tmp_path, tiny_overrides, passed):
    path = write_study(tmp_path, tiny_overrides, "strict", SPACE, {"model.attention.kind": "linformer"}, **ARMED)
    study = load_study(path)
    ostudy = optuna.create_study()
    ostudy.set_user_attr(gate.GATE, {"passed": passed, "on": [], "why": "edited"})  # bool("false") is True
    decided, said = gate.decide(study, ostudy, [])
    assert decided is False and "could not be judged" in said
    assert ostudy.user_attrs[gate.GATE] == {"passed": False, "on": [], "why": said}


@pytest.mark.processes  # the sweep's workers
def test_the_arm_the_control_reuses_runs_with_the_control_and_no_other_arm_before_the_gate(
    tmp_path, tiny, monkeypatch, capsys
):
    from studies import ARMS

    monkeypatch.setenv("LINFORMER_LAB_GATE", "1")
    space = {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"type": "categorical", "choices": ARMS}}
    path = write_study(tmp_path, tiny, "reusing", space, arms=["arm"], control=CONTROL)  # reference = the full arm
    assert cli.main(["sweep", str(path)]) == gate.EXIT_GATED
    ran = [t.params["arm"] for t in trials_of(path) if t.state.is_finished()]
    assert ran == ["full", "full"]  # the control's reference, at seeds 0 and 1; Linformer not run
