"""Budget curves: a study asked at several training budgets from one trunk per seed and arm
(``linformer-lab sweep STUDY --preset P --budgets 1,2,4,8,16``).

A verdict taken at one budget mixes how good a variant is with how soon it gets there. Asking it again at F × the steps
(``--budget F``, :mod:`sweeps.spec.budget`) costs a whole study per budget: ×1, ×4 and ×16 cost 21 × one study. Here,
as in scaling-law practice (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
Durations"; MiniCPM's warmup–stable–decay), each seed of each arm (and of the control) trains **once**, as a *trunk*
at a constant learning rate after the recipe's warm-up, and each budget's point is a short *cooldown* branched off the
trunk (``training/branch.py``).

**What a budget's point is.** At F × the study's ``trainer.max_steps`` = S, the point is the final validation of a
warmup–stable–decay run of round(F·S) steps whose cooldown takes its last ``optim.cooldown_fraction`` (default 0.2),
shaped by ``optim.cooldown_shape`` (default linear; both keys of the study's base or overrides): the trunk keeps its
checkpoint at that run's :func:`~lightning_modules.optim.cooldown_start`, round(F·S) − round(fraction · F·S), and the
cooldown trains from there to round(F·S). It computes what one uninterrupted ``wsd`` run of round(F·S) steps would (a
test checks it to the bit), so each point is a run of its budget, at the compute of that budget. The warm-up keeps the
study's own ``optim.warmup_steps`` at every budget (a trunk has one warm-up), and a length curriculum its own
``optim.short_steps``; nothing else of the recipe changes.

**What it costs.** The trunk trains to the largest budget's branch step, (1 − fraction) · F_max · S; each cooldown
trains fraction · F · S: in all (1 − fraction) · F_max + fraction · ΣF times a study's steps, per seed and arm. For
1, 2, 4, 8, 16 at 20 %: 12.8 + 6.2 = 19 × (a study per budget: 31 ×). :func:`cost` states it; the plan and the
preflight's projection print it.

**The factors.** Sorted, strictly increasing, each at least 1 and at most :data:`~sweeps.spec.budget.MAX_FACTOR`
with at most two decimals (it names a folder, ``cooldown_x<F>``), and each giving more steps than the one before
(:func:`check_factors`). A later ``sweep`` may list more budgets: the trunk trains on from its last checkpoint and
budgets already run are not run again; a budget whose branch step the trunk has already passed without keeping a
checkpoint is refused (``sweeps/run/trunks.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from foundation.errors import ConfigError
from lightning_modules.optim import cooldown_start
from sweeps.spec.budget import MAX_FACTOR
from sweeps.spec.replication import CURVE_SUFFIX
from training.config import MAX_STEPS, check_cooldown

SUFFIX = CURVE_SUFFIX  # a curve study's name: <study>_<preset>_curve
POINTS = "budget_points"  # user attr of a curve trial: budget name (x1, x2, ...) -> that cooldown's scalar metrics
CURVE_DIR = "curve_dir"  # user attr of a curve trial: the folder of its trunk and cooldowns
SEED_FACTOR = 1000  # its fresh seeds start at 1000 × the replication's default start: past any --budget study's


def parse(text: Any) -> list[float]:
    """``--budgets 1,2,4``: the comma-separated factors as numbers (checked by :func:`check_factors`)."""
    if isinstance(text, (list, tuple)):
        return list(text)
    items = [item.strip() for item in str(text).split(",")]
    try:
        return [float(item) for item in items]
    except ValueError:
        raise ConfigError(
            f"--budgets: {text!r} is not a comma-separated list of numbers of times the study's steps, e.g. 1,2,4,8,16"
        ) from None


def check_factors(factors: Sequence[Any], steps: int, minimum: int = 2) -> tuple[float, ...]:
    """The factors of ``--budgets`` at a study of ``steps`` steps: at least ``minimum`` (two make a curve), sorted and
    strictly increasing, each in [1, :data:`MAX_FACTOR`] with at most two decimals, each giving more steps than the
    one before."""
    if len(factors) < minimum:
        raise ConfigError(f"--budgets: at least {minimum} budgets make a curve, got {list(factors)}")
    out = []
    for f in factors:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 1 <= f <= MAX_FACTOR:
            raise ConfigError(f"--budgets: {f!r} is not a number in [1, {MAX_FACTOR}] (times the study's steps)")
        if abs(f * 100 - round(f * 100)) > 1e-9:
            raise ConfigError(f"--budgets: {f!r} has more than two decimals (it names a folder, cooldown_x<F>)")
        out.append(round(f * 100) / 100)
    if out != sorted(out) or len(set(out)) != len(out):
        raise ConfigError(f"--budgets: {','.join(f'{f:g}' for f in out)} must be sorted and distinct, smallest first")
    counts = [int(round(f * steps)) for f in out]
    same = next((i for i in range(1, len(out)) if counts[i] <= counts[i - 1]), None)
    if same is not None:
        raise ConfigError(
            f"--budgets: ×{out[same]:g} gives {counts[same]} steps, as many as ×{out[same - 1]:g} at "
            f"trainer.max_steps={steps}; each budget must change the step count"
        )
    return tuple(out)


def name(factor: float) -> str:
    """A budget's folder and label: ``x4``, ``x2.5``."""
    return f"x{factor:g}"


def factor_of(label: str) -> float:
    """The factor a budget's label names: ``x2.5`` -> 2.5 (the inverse of :func:`name`)."""
    return float(label[1:])


@dataclass(frozen=True)
class Point:
    """One budget of a curve: its factor, its steps (round(F·S)), and the trunk step its cooldown branches at."""

    factor: float
    steps: int
    branch: int

    @property
    def cooldown_steps(self) -> int:
        return self.steps - self.branch


def points(factors: Sequence[float], steps: int, fraction: float) -> list[Point]:
    """Each budget's steps and branch step at a study of ``steps`` steps."""
    out = []
    for f in factors:
        total = int(round(f * steps))
        out.append(Point(f, total, cooldown_start(total, fraction)))
    return out


def trunk_steps(curve: Sequence[Point]) -> int:
    """How far the trunk trains: the largest budget's branch step."""
    return max(p.branch for p in curve)


def cost(curve: Sequence[Point], steps: int) -> dict[str, float]:
    """What a curve costs, per seed and arm, in steps and in multiples of the study's ``steps``: the trunk, the
    cooldowns, their sum, and what a separate study per budget would cost."""
    trunk, cooldowns = trunk_steps(curve), sum(p.cooldown_steps for p in curve)
    separate = sum(p.steps for p in curve)
    return {
        "trunk_steps": trunk,
        "cooldown_steps": cooldowns,
        "steps": trunk + cooldowns,
        "times": (trunk + cooldowns) / steps,
        "separate_times": separate / steps,
    }


def work(cfg: DictConfig, factors: Sequence[float], done: Sequence[float] = ()) -> tuple[int, int]:
    """The steps a curve trial of config ``cfg`` (at ×1) trains, trunk and cooldowns, and its validations (every
    ``val_check_interval`` steps of each run, and one at each run's end that is not one of them). ``done``: the
    budgets it has already run (a curve extended by a longer list): its trunk goes on from their largest branch step
    and their cooldowns are not run again, so only what is new is counted."""
    curve, every = curve_of(cfg, factors), cfg.trainer.val_check_interval
    start, end, new = left_of_curve(curve, curve_of(cfg, done))
    runs = [(start, max(start, end))] + [(p.branch, p.steps) for p in new]
    runs = [(start, end) for start, end in runs if end > start]
    steps = sum(end - start for start, end in runs)
    validations = sum(end // every - start // every + (1 if end % every else 0) for start, end in runs)
    return steps, validations


def cost_line(factors: Sequence[float], steps: int, fraction: float) -> str:
    """The cost as the plan states it (see the module's docstring)."""
    c = cost(points(factors, steps, fraction), steps)
    shown = ", ".join(f"×{f:g}" for f in factors)
    return (
        f"budgets {shown}: a trunk of {c['trunk_steps']} steps and cooldowns of {c['cooldown_steps']} per seed and arm "
        f"({c['times']:.3g} × the study's {steps} steps, against {c['separate_times']:.3g} × for a study per budget)"
    )


def left_of_curve(curve: Sequence[Point], done: Sequence[Point]) -> tuple[int, int, list[Point]]:
    """What ``curve`` has left once the budgets ``done`` have run: the step its trunk goes on from (0 for none), the
    step it trains to, and the budgets whose cooldowns are new."""
    ran = {p.factor for p in done}
    return (trunk_steps(done) if done else 0), trunk_steps(curve), [p for p in curve if p.factor not in ran]


def extension_line(factors: Sequence[float], done: Sequence[float], steps: int, fraction: float) -> str:
    """What is left of a curve already run to the budgets ``done`` when it is listed to ``factors``, as the plan
    states it beside :func:`cost_line` (which prices the whole curve): the trunk's new steps and the new cooldowns."""
    start, end, new = left_of_curve(points(factors, steps, fraction), points(done, steps, fraction))
    cooldowns = sum(p.cooldown_steps for p in new)
    left = max(0, end - start) + cooldowns
    ran = ", ".join(f"×{f:g}" for f in done)
    trunk = f"the trunk from step {start} to {end}" if end > start else "no trunk steps"
    shown = ", ".join(f"×{p.factor:g}" for p in new) or "none"
    return (
        f"left of the curve run to {ran}: {trunk} and the cooldowns of {shown} ({cooldowns} steps), "
        f"{left} steps per seed and arm ({left / steps:.3g} × the study's {steps} steps)"
    )


def trunk_config(cfg: DictConfig, curve: Sequence[Point], run_dir: Optional[str]) -> DictConfig:
    """The trunk's run config: ``cfg`` (a trial's, at ×1) at a constant learning rate to :func:`trunk_steps`."""
    out = cfg.copy()
    out.optim.schedule = "constant"
    out.trainer.max_steps = trunk_steps(curve)
    out.run_dir = run_dir
    return out


def curve_of(cfg: DictConfig, factors: Sequence[float]) -> list[Point]:
    """The budgets of a trial's config ``cfg`` (at ×1): its steps and its cooldown fraction."""
    return points(factors, cfg.trainer.max_steps, cfg.optim.cooldown_fraction)


def cooldown_config(cfg: DictConfig, point: Point, branch_from: Optional[str], run_dir: Optional[str]) -> DictConfig:
    """A budget's cooldown config: ``cfg`` as a ``wsd`` run of ``point.steps`` steps, branched off ``branch_from``."""
    out = cfg.copy()
    out.optim.schedule = "wsd"
    out.trainer.max_steps = point.steps
    out.branch_from = branch_from
    out.run_dir = run_dir
    return out


def check_curve(cfg: DictConfig, factors: Sequence[float], minimum: int = 2) -> None:
    """A trial's config ``cfg`` can be run as a curve at ``factors``: each budget changes its step count, its trunk
    and largest budget stay within the steps a run may take, and each budget's cooldown is a valid ``wsd`` schedule
    (at least one step, after the warm-up: the smallest budget's decides)."""
    check_factors(factors, cfg.trainer.max_steps, minimum)
    curve = curve_of(cfg, factors)
    if curve[-1].steps > MAX_STEPS:
        raise ConfigError(f"--budgets: ×{curve[-1].factor:g} gives {curve[-1].steps} steps, more than {MAX_STEPS}")
    for point in curve:
        try:
            check_cooldown(cooldown_config(cfg, point, None, None).optim, point.steps)
        except ConfigError as err:
            raise ConfigError(f"--budgets: ×{point.factor:g}: {err}") from None
