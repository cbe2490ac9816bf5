"""Quality against wall-clock time: where a run's validation curve first reaches a target.

A run's ``metrics.json`` holds ``ppl_vs_wallclock``: one ``[seconds, tokens, val ppl]`` per validation, the
seconds being training-step seconds (validation excluded). Between two validations the curve is taken as
linear, so the time to a target is interpolated rather than rounded up to the next validation.
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
