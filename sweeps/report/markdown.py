"""How a report writes its numbers: significant figures, p-values, intervals, SI prefixes, mean ± std and markdown
tables. Nothing here phrases a result: each section of the report does (:mod:`sweeps.report.power`,
:mod:`sweeps.report.comparisons`, :mod:`sweeps.report.context`, :mod:`sweeps.report.efficiency`,
:mod:`sweeps.report.ladder`)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from sweeps.spec import stats

PCT = f"{stats.POWER * 100:.0f} %"


def fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.3g}"


def fmt_p(p: float) -> str:
    return "-" if not math.isfinite(p) else "< 0.001" if p < 0.001 else f"{p:.2g}"


def p_is(p: float) -> str:
    """``p < 0.001`` or ``p = 0.03``."""
    text = fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def interval(lo: float, hi: float) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def signed(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.3g}"


def signed_interval(lo: float, hi: float) -> str:
    return "-" if not math.isfinite(lo) else f"[{signed(lo)}, {signed(hi)}]"


def si(x: Optional[float]) -> str:
    """37300 -> 37.3k, 9.2e7 -> 92M, 1.2e15 -> 1.2P."""
    if x is None or not math.isfinite(x):
        return "-"
    for power, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10**power:
            return f"{x / 10**power:.3g}{prefix}"
    return f"{x:.3g}"


def table(header: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def at_or_beyond(direction: str) -> str:
    return "≥" if direction == "maximize" else "≤"


def mean_std(values: Sequence[float]) -> str:
    s = stats.summarize(values)
    return "-" if s.n == 0 else fmt(s.mean) if s.n == 1 else f"{fmt(s.mean)} ± {fmt(s.std)}"


def figure(file: str, caption: str) -> str:
    """A figure of the report folder shown in summary.md where it is read: ``![caption](file)``."""
    return f"![{caption}]({file})"


def counted(n: int, noun: str, plural: str = "") -> str:
    """``1 comparison``, ``2 comparisons``: a count with its noun in the number it takes."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
