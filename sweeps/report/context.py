"""The context gain, as the report says it: the reference's gain over a model without context (the report's first
line, and its only answer when the reference did not learn to use its context), each arm's gain in the arms table,
and an open study's best trial against the model without context. The numbers are
:class:`sweeps.control.ContextGain`."""

from __future__ import annotations

from typing import Optional

from sweeps.control import ContextGain, Row, gain_order
from sweeps.report import markdown
from sweeps.report.findings import Findings
from sweeps.report.markdown import fmt, interval
from sweeps.spec.study import Study


def line(gain: Optional[ContextGain], reference: str, progress: Optional[str] = None) -> str:
    """The report's first line: the reference's context gain, its CI and the threshold it is held to (``progress``:
    how far the control has run, said while it is not judged)."""
    if gain is None:
        return (
            f"**Context gain:** not judged yet{f' ({progress})' if progress else ''}: the control needs at least 2 "
            "complete runs of the reference and of the model without context; until then nothing below says whether "
            "the reference uses its context."
        )
    c = gain.comparison
    lo, hi = c.ci()
    source = "the degraded arm" if gain.source == "degraded" else "the no-context baseline of its runs"
    verdict = "the reference uses its context" if gain.informative else "uninformative"
    return (
        f"**Context gain:** {reference} gains {fmt(gain.gain)} on {gain.metric} over a model without context "
        f"({source}: {fmt(gain.no_context_mean)} vs {fmt(gain.reference_mean)}; 95 % CI {interval(lo, hi)}, "
        f"{c.test}); the study needs ≥ {fmt(gain.threshold)}: {verdict}."
    )


def uninformative(gain: ContextGain) -> str:
    """The report's only answer when the reference did not learn to use context."""
    lo, hi = gain.comparison.ci()
    holds_zero = "; its 95 % CI holds 0" if not gain.comparison.judged or lo <= 0 <= hi else ""
    return (
        f"uninformative: the reference did not learn to use context (gain {fmt(gain.gain)}, needs ≥ "
        f"{fmt(gain.threshold)}{holds_zero}). No verdict is given: arms that ignore their context answer no question "
        "about attention."
    )


def best_gain(study: Study, value: float, found: Findings) -> str:
    """The best trial's gain over the control's model without context (one run: no interval), and whether it
    reaches the study's context gain; "" without a judged control."""
    context = found.context
    if context is None or not context.comparison.judged:
        return ""
    a, b = gain_order(study.directions[0], value, context.no_context_mean)
    gain = a - b
    said = (
        f", a gain of {markdown.fmt(gain)} over a model without context "
        f"({markdown.fmt(context.no_context_mean)}; the study needs ≥ {markdown.fmt(context.threshold)})"
    )
    if gain < context.threshold:
        said += ": short of it, so no setting this search tried learned to use its context as the reference does"
    return said


def gain_cell(found: Findings, arm: str, rows: list[Row]) -> str:
    """An arm's context gain with its 95 % CI and what it is held to: the control's reference, the study's
    threshold (its power); the study's own arms, a CI above δ (whether the arm demonstrably uses its context)."""
    reference = any(r.role == "reference" for r in rows)
    gain = found.context if reference else found.arm_context.get(arm)
    if gain is None:
        return "-"
    lo, hi = gain.comparison.ci()
    if reference:
        mark = "" if gain.informative else f" (below {markdown.fmt(gain.threshold)})"
    else:
        mark = "" if gain.uses_context else f" (CI not above δ = {markdown.fmt(gain.floor)})"
    return f"{markdown.fmt(gain.gain)} {markdown.interval(lo, hi)}{mark}"
