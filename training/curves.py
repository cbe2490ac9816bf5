"""The wall-clock curve a run records, and when it reaches a target.

Every run's ``metrics.json`` holds ``ppl_vs_wallclock``: [(training seconds, tokens, val ppl), ...], one
point per validation (``lightning_modules.callbacks.RunMetrics``). Read by ``linformer-lab time-to-target``
and by the scale report (:mod:`sweeps.scale`).
"""

from __future__ import annotations

from typing import Optional, Sequence


def reach(curve: Sequence[Sequence[float]], target: float) -> Optional[tuple[float, float]]:
    """(seconds, tokens) at which the curve first gets to val ppl ≤ target; None if it never does."""
    previous = None
    for seconds, tokens, ppl in curve:
        if ppl <= target:
            if previous is None or previous[2] == ppl:
                return float(seconds), float(tokens)
            s0, t0, p0 = previous
            f = (p0 - target) / (p0 - ppl)
            return s0 + f * (seconds - s0), t0 + f * (tokens - t0)
        previous = (float(seconds), float(tokens), float(ppl))
    return None
