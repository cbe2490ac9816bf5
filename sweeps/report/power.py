"""The control's power check, as the report says it: does the reference leave the trivial baseline, and does the
control separate its reference from its degraded arm (:func:`sweeps.spec.stats.power_check`, on the control's
trials: :func:`sweeps.control.power_of`)? Its words and its section of summary.md."""

from __future__ import annotations

from typing import Optional

from sweeps.control import control_label
from sweeps.report.findings import Findings
from sweeps.report.markdown import fmt
from sweeps.spec import stats
from sweeps.spec.study import Study


def phrase(check: stats.PowerCheck, advice: str = "run the GPU preset") -> list[str]:
    """The control's power check, one line per finding."""
    lines = []
    if check.trivial is not None:
        c = check.trivial
        means = f"{fmt(check.reference_mean)} vs {fmt(check.trivial_mean)}"
        found = f"({means}; difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test})"
        lines.append(
            f"The reference arm leaves the trivial baseline {found}."
            if check.leaves_trivial
            else f"The reference arm does NOT leave the trivial baseline {found}: nothing was learned at this "
            f"budget; {advice}."
        )
    else:
        lines.append("No trivial baseline for this metric: only the contrast is judged.")
    c = check.contrast
    gap = f"{fmt(abs(c.diff))} ± {fmt(c.half_width)}, {c.test}"
    if check.separates:
        lines.append(
            f"The control separates: the reference is better than the degraded arm by {gap}. The study "
            "can see an effect of this size at this budget; a smaller one may still go unseen."
        )
    elif check.reversed:
        lines.append(
            f"The control is REVERSED: the degraded arm is better than the reference by {gap}. The "
            "control is not the contrast it was meant to be here; check its arms before reading on."
        )
    else:
        lines.append(
            f"The control does NOT separate (difference {fmt(c.diff)} ± {fmt(c.half_width)}, {c.test}): "
            f"this study has no power at this budget, so no verdict below can be trusted; {advice}."
        )
    return lines


def power_section(study: Study, found: Findings, advice: str, progress: Optional[str] = None) -> list[str]:
    """The control contrast of the first objective (``progress``: how far the control has run, said while it is not
    judged)."""
    c = study.control
    lines = [
        "## Power check (control contrast)",
        "",
        f"The control, run at every seed: {control_label(c, 'reference')} against "
        f"{control_label(c, 'degraded')}; metric {study.metrics[0]} ({study.directions[0]}).",
        "",
    ]
    if found.power is None:
        return lines + [
            "Not judged: the control's reference and degraded arms have fewer than 2 complete trials "
            f"({f'{progress}; ' if progress else ''}run the same `sweep` command again). Without it, nothing below "
            "says whether this "
            "budget can see an effect at all.",
            "",
        ]
    return lines + [f"- {line}" for line in phrase(found.power, advice)] + [""]


def has_power(found: Findings) -> Optional[bool]:
    """Whether the control's power check passed; None: not judged (no control, or not run yet)."""
    return None if found.power is None else found.power.has_power
