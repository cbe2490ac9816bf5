"""The control first, as a gate: a study with a control runs the control's trials before any arm, then judges them
by the report's rule (:mod:`sweeps.control`): the reference's context gain reaches the study's threshold with a CI
above 0, and the power check passes (the reference leaves the trivial baseline and beats its degraded arm). When it
does not, the sweep stops before the arms with one paragraph (the gain, what it needs, the report's command, the
levers) and exit code :data:`EXIT_GATED`; ``--no-gate`` runs the arms anyway. A budget-curve study's control is
judged at each budget, on its cooldown points there: the arms run when it certifies one budget at least, and the
line names those where it does not (every verdict there reads uninformative in the report).

The decision is stored on the study (user attr ``control_gate``: the decision, the control's trial numbers it was
taken on and the rule it was taken by), so a resumed study keeps it unless the control changed (trials added by
``--add-seeds``, or a trial retried), the decision was taken by an earlier rule (:data:`RULE`), or the stored
decision is not one (``passed`` not a bool: an edited ``"false"`` would read as true): then it is taken again. A
control that is not yet judged (fewer than 2 complete trials of an arm, its trials failed) stops the arms too: the
paragraph says so.
"""

from __future__ import annotations

import os
from typing import Optional

import optuna
from optuna.trial import FrozenTrial, TrialState

from foundation.errors import EXIT_GATED as EXIT_GATED  # the sweep returns it
from sweeps import control
from sweeps.spec.study import Study

# user attr of the study: {"passed": bool, "on": [control trial numbers], "why": str, "rule": int}
GATE = "control_gate"
# The rule a decision was taken by: 2 judges a curve study's control at each budget (1 read its trunks' ends only).
# A decision taken by another rule is taken again.
RULE = 2


def judged_on(trials: list[FrozenTrial]) -> list[int]:
    """The control's complete trials a decision rests on (their numbers, sorted)."""
    return sorted(t.number for t in trials if t.state == TrialState.COMPLETE)


def first_points(study: Study) -> list[dict]:
    """The study's own grid points the control reuses (its reference or degraded arm is one of the study's arms):
    they run with the control, before the gate."""
    if study.control is None or not study.is_grid:
        return []
    own = {repr(sorted(p.items())) for p in (study.points or [])[: study.n_trials]}
    return [params for _, params in study.control.reused if repr(sorted(params.items())) in own]


def verdict(study: Study, trials: list[FrozenTrial], own: list[FrozenTrial]) -> tuple[bool, str]:
    """Whether the control lets the arms run, and what it found: one line when it does, the paragraph that stops
    the sweep when it does not. ``trials``: the control's; ``own``: the study's (the points the control reuses)."""
    rows = control.rows_of(study.control, trials)
    rows += control.reused_rows(study, control.rows_of(study, own))
    if study.budgets:
        return _curve_verdict(study, rows)
    gain, power = control.context_of(study, rows), control.power_of(study, rows)
    if control.certifies(study, rows):
        return True, _passed(gain, "", "the arms start")
    return False, paragraph(study, gain, power)


def _passed(gain: control.ContextGain, where: str, then: str) -> str:
    lo, hi = gain.comparison.ci()
    return (
        f"the control passed{where}: the reference gains {gain.gain:.4g} on {gain.metric} over a model without context "
        f"(95 % CI {lo:.4g} to {hi:.4g}; needs ≥ {gain.threshold:.4g}) and beats its degraded arm: {then}"
    )


def _curve_verdict(study: Study, rows: list[control.Row]) -> tuple[bool, str]:
    """A budget-curve study's gate: the control judged at each budget on its cooldown points. The arms run when it
    certifies at least one budget; the line names the budgets it does not certify, where every verdict will read
    uninformative (:func:`sweeps.control.certified_budgets`)."""
    certified = control.certified_budgets(study, rows)
    names = ", ".join(f"×{f:g}" for f in study.budgets if f not in certified)
    if certified:
        gain = control.context_of(study, control.at_budget(study.control, rows, certified[0]))
        then = "the arms start"
        if names:
            then += f"; it does not certify {names}, where every verdict will read uninformative"
        return True, _passed(gain, f" at ×{certified[0]:g}", then)
    smallest = control.at_budget(study.control, rows, study.budgets[0])
    gain, power = control.context_of(study, smallest), control.power_of(study, smallest)
    return False, paragraph(study, gain, power, f" at no budget ({names}; the numbers: ×{study.budgets[0]:g})")


def paragraph(study: Study, gain: Optional[control.ContextGain], power: Optional[object], where: str = "") -> str:
    """The one paragraph of a stopped sweep (``where``: at which budgets, for a curve study)."""
    metric = study.metrics[0]
    threshold, _ = study.context_gain(metric)
    if gain is None:
        found = (
            f"the control could not be judged: its reference or its model without context has fewer than 2 complete "
            f"trials on {metric}"
        )
    else:
        lo, hi = gain.comparison.ci()
        found = (
            f"the reference gains {gain.gain:.4g} on {metric} over a model without context (95 % CI {lo:.4g} to "
            f"{hi:.4g}); the study needs ≥ {threshold:.4g} with a CI above 0"
        )
        if power is not None and not power.has_power:
            found += (
                "; and the control's power check fails (the reference does not beat its degraded arm, or the "
                "trivial baseline, beyond the seed spread)"
            )
    return (
        f"the sweep stopped before the arms{where}: {found}. At this budget no arm's verdict could be trusted, so "
        f"none was run. The control's numbers: linformer-lab report {study.file_args}. Levers: more steps "
        "(trainer.max_steps in the preset), the recipe (learning rate, warm-up, masking, positions: "
        f"docs/results.md), more control seeds (linformer-lab sweep {study.file_args} --add-seeds N); or --no-gate "
        "to run the arms anyway."
    )


def decide(study: Study, ostudy: optuna.Study, control_trials: list[FrozenTrial]) -> tuple[bool, str]:
    """The gate's decision, stored on ``ostudy`` (the study's storage); a stored one is kept while the control's
    complete trials are the ones it was taken on."""
    own = ostudy.get_trials(deepcopy=False)
    reused = {repr(sorted(p.items())) for p in first_points(study)}
    on = judged_on(control_trials) + judged_on([t for t in own if repr(sorted(t.params.items())) in reused])
    stored = ostudy.user_attrs.get(GATE)
    if kept(stored, on):
        return stored["passed"], stored["why"]
    passed, why = verdict(study, control_trials, own)
    ostudy.set_user_attr(GATE, {"passed": passed, "on": on, "why": why, "rule": RULE})
    return passed, why


def kept(stored: object, on: list[int]) -> bool:
    """Whether a stored decision stands: taken on the control's trials ``on`` by this :data:`RULE`, and read strictly,
    ``passed`` a bool and ``why`` a string (an edited ``"passed": "false"`` is no decision, and the control is judged
    again)."""
    return (
        isinstance(stored, dict)
        and stored.get("on") == on
        and stored.get("rule") == RULE
        and isinstance(stored.get("passed"), bool)
        and isinstance(stored.get("why"), str)
    )


def turned_off() -> bool:
    """``LINFORMER_LAB_GATE=0`` (as ``--no-gate``)."""
    return os.environ.get("LINFORMER_LAB_GATE", "1").strip().lower() in ("0", "false", "no", "off")
