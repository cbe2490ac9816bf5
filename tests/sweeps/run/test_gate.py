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
    ostudy.set_user_attr(gate.GATE, {"passed": True, "on": [], "why": "taken earlier", "rule": gate.RULE})
    assert gate.decide(study, ostudy, []) == (True, "taken earlier")
    # the same decision taken by an earlier rule (a curve study's control read at its trunks' ends): judged again
    ostudy.set_user_attr(gate.GATE, {"passed": True, "on": [], "why": "taken earlier"})
    assert gate.decide(study, ostudy, [])[0] is False
    # the control changed (a trial the decision did not rest on): judged again, on what there is (nothing yet)
    ostudy.set_user_attr(gate.GATE, {"passed": True, "on": [7], "why": "taken earlier", "rule": gate.RULE})
    passed, said = gate.decide(study, ostudy, [])
    assert not passed and "could not be judged" in said
    assert ostudy.user_attrs[gate.GATE] == {"passed": False, "on": [], "why": said, "rule": gate.RULE}


@pytest.mark.parametrize("passed", ["false", 1, None, [True]])
def test_a_stored_decision_whose_passed_is_not_a_bool_is_judged_again(tmp_path, tiny_overrides, passed):
    path = write_study(tmp_path, tiny_overrides, "strict", SPACE, {"model.attention.kind": "linformer"}, **ARMED)
    study = load_study(path)
    ostudy = optuna.create_study()
    edited = {"passed": passed, "on": [], "why": "edited", "rule": gate.RULE}
    ostudy.set_user_attr(gate.GATE, edited)  # bool("false") is True
    decided, said = gate.decide(study, ostudy, [])
    assert decided is False and "could not be judged" in said
    assert ostudy.user_attrs[gate.GATE] == {"passed": False, "on": [], "why": said, "rule": gate.RULE}


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


def _curve_control(means: dict, seeds: list[int]) -> list[optuna.trial.FrozenTrial]:
    """Control trials of a curve study: each role's val/loss per budget (×1, ×2, ×4), a spread over seeds, and the
    runs' trivial baseline (a model without context) at 4.0."""
    spread = {"reference": [0.0, 0.01, 0.02], "degraded": [0.0, 0.04, -0.03]}
    out = []
    for role, values in means.items():
        for j, seed in enumerate(seeds):
            points = {
                f"x{f}": {"val/loss": v + spread[role][j], "trivial_loss": 4.0} for f, v in zip((1, 2, 4), values)
            }
            out.append(
                optuna.trial.create_trial(
                    params={"control": role, "seed": seed},
                    distributions={
                        "control": optuna.distributions.CategoricalDistribution(list(means)),
                        "seed": optuna.distributions.CategoricalDistribution(seeds),
                    },
                    values=[points["x4"]["val/loss"]],
                    user_attrs={"budget_points": points, "metrics": points["x4"]},
                )
            )
    return out


def test_a_curve_studys_gate_judges_the_control_at_each_budget(tmp_path, tiny_overrides):
    """At the largest budget the degraded arm has caught up (×4): a gate that read only the trunk's end would stop
    the study. Judged per budget, it certifies ×1 and ×2, the arms start, and the line names ×4 as uninformative.
    A control that separates at no budget stops the study, saying so."""
    control = {**CONTROL, "no_context": "baseline", "seeds": [0, 1, 2]}
    space = {**SPACE, "seed": {"type": "categorical", "choices": [0, 1, 2]}}
    path = write_study(
        tmp_path,
        tiny_overrides,
        "curved",
        space,
        {"model.attention.kind": "linformer"},
        arms=["model.attention.options.k"],
        control=control,
    )
    study = load_study(path, curve="1,2,4")
    seeds = [s for (s,) in {(p["seed"],) for p in study.control.points}]
    caught_up = _curve_control({"reference": [2.0, 1.9, 1.85], "degraded": [3.0, 2.9, 1.86]}, sorted(seeds))
    passed, said = gate.verdict(study, caught_up, [])
    assert passed and said.startswith("the control passed at ×1: the reference gains 1.99 on val/loss")
    assert said.endswith("the arms start; it does not certify ×4, where every verdict will read uninformative")

    never = _curve_control({"reference": [2.0, 1.9, 1.85], "degraded": [2.01, 1.9, 1.86]}, sorted(seeds))
    passed, said = gate.verdict(study, never, [])
    assert not passed and said.startswith(
        "the sweep stopped before the arms at no budget (×1, ×2, ×4; the numbers: ×1)"
    )
    assert "power check fails" in said
