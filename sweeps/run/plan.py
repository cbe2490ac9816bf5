"""The cost of a study before it spends: its projected wall time, device-hours and CPU-hours and its largest arm's
peak memory, from the preflight's measurements (:mod:`sweeps.run.preflight`), printed before the first trial and
written beside the study as ``plan.json``; at the end of the sweep, the measured wall time against the projection.

A trial's projected seconds, from its shape's measurements::

    set-up + first step (compile, warm-up) + (steps − 1) × seconds per step
           + validations × (one validation's seconds + one checkpoint save's)

(under a length curriculum, its short steps at their own measured seconds per step, the rest at the full length's).

The trials left run in order (the control's first) on W worker slots, each trial on the slot that frees first,
after each worker's start (one process start and import, measured once). On the CPU each worker has cores/W torch
threads, as the sweep sets them, and the preflight measured at that count. Trials sharing one GPU (more workers than
GPUs, as the sweep deals them) are assumed to gain nothing over one at a time: their device time is multiplied by
the workers per GPU (unmeasured; a shared GPU may do better). Device-hours count the GPUs held for the wall time;
CPU-hours the cores the workers use for the wall time. What the projection leaves out: checkpoint and TensorBoard
writes, the data's first preparation by several workers at once, and a trial that is pruned or fails early.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from foundation.atomic import write_json
from lightning_modules.attention import attention_class
from sweeps.run.preflight import Shape
from sweeps.spec import budgets
from sweeps.spec.study import Study
from training.console import clock

PLAN = "plan.json"
OFF = 0.25  # a measured wall time this far from the projection (either way) is explained at the end
# A tokens/s ratio this close to 1 (either way) is not read as faster or slower: over six preflights at n = 512 on
# one machine, the same pair of shapes (no context against full attention) read 2.92× to 3.25×, a spread of 11 %
# (docs/benchmarks.md, "How far a preflight's ratio moves"); the band is wider than that.
SAME_SPEED = 0.15


def trial_seconds(measured: dict, steps: int, n_validations: int) -> float:
    """One trial's projected seconds (module docstring), one worker's start aside; under a length curriculum its
    first ``short_steps`` (the compiling first step among them) at ``short_step_s``, the rest at ``step_s``."""
    short = min(steps, measured.get("short_steps", 0))
    per_step = (max(0, short - 1) * measured["short_step_s"] + (steps - short) * measured["step_s"]) if short else None
    return (
        measured["setup_s"]
        + measured["first_step_s"]
        + (per_step if per_step is not None else max(0, steps - 1) * measured["step_s"])
        + n_validations * (measured["validation_s"] + measured.get("checkpoint_s", 0.0))
    )


def schedule(durations: list[float], workers: int, start_s: float) -> float:
    """The wall time of trials run in order on ``workers`` slots, each on the slot that frees first, every slot
    starting after ``start_s``."""
    slots = [start_s] * max(1, workers)
    for d in durations:
        i = min(range(len(slots)), key=slots.__getitem__)
        slots[i] += d
    return max(slots) if durations else 0.0


def project(
    study: Study,
    shapes: list[Shape],
    workers: int,
    threads: int,
    gpus: int,
    left: Optional[dict[tuple[str, str], tuple[float, ...]]] = None,
    gated: bool = False,
) -> dict[str, Any]:
    """The plan: the projection of the trials ``left`` (``(study name, repr of params)`` -> the budgets of a curve it
    has already run, whose steps are not counted again; None: every trial, from the start) at
    ``workers`` workers of ``threads`` threads and ``gpus`` visible GPUs (0: trials on the CPU). ``gated``: the
    control's trials run first, to the last, then workers start again for the arms (:mod:`sweeps.run.gate`)."""
    order = {s.name: i for i, s in enumerate(study.studies)}
    factors = {s.name: s.budgets for s in study.studies}
    sharing = max(1.0, workers / gpus) if gpus else 1.0
    runs: list[tuple[int, float]] = []
    for shape in shapes:
        m = shape.measured
        for name, params, steps, n_val in shape.trials:
            if left is not None:
                key = (name, _point_key(params))
                if key not in left:
                    continue
                if left[key]:  # a curve trial extended: the trunk's new steps and new cooldowns
                    steps, n_val = budgets.work(shape.cfg, factors[name], left[key])
            device = trial_seconds(m, steps, n_val) - m["setup_s"]  # what the GPU's sharers slow down
            runs.append((order.get(name, 0), m["setup_s"] + device * sharing))
    runs = _open_at_mean(study, runs)
    durations = [d for _, d in sorted(runs, key=lambda r: r[0])]  # the control's first; stable within a study
    start_s = max(s.measured["start_s"] for s in shapes)
    first = [d for i, d in runs if i == 0] if gated and len(order) > 1 else []
    rest = durations[len(first) :]
    wall = sum(schedule(part, min(workers, max(1, len(part))), start_s) for part in (first, rest) if part)
    largest = max(shapes, key=lambda s: s.measured["peak_mb"])
    held = min(workers, gpus) if gpus else 0
    return {
        "study": study.name,
        "preset": study.preset,
        "trials": len(durations),
        "workers": workers,
        "threads_per_worker": threads,
        "gpus": held,
        "gpu_sharing": sharing if gpus else None,
        "wall_s": wall,
        "device_hours": wall * held / 3600 if gpus else 0.0,
        "cpu_hours": wall * workers * threads / 3600,
        "largest_peak_mb": largest.measured["peak_mb"],
        "largest_peak_arm": f"{largest.label} [{largest.setting}]",
        "total_mb": largest.measured["total_mb"],
        "memory": largest.measured["memory"],
        "shapes": [{"arm": s.label, "setting": s.setting, "trials": len(s.trials), **s.measured} for s in shapes],
        "projected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"curve": budgets.cost_line(study.budgets, *_steps_and_fraction(study))} if study.budgets else {}),
        **({"curve_left": _extensions(study, left)} if study.budgets and left else {}),
        "against_full": against_full(shapes),
    }


def tokens_per_s(shape: Shape) -> float:
    """A shape's measured training tokens per second: a step's batch of ``model.max_len``-token blocks over its
    seconds per step (a length curriculum's short steps train the same tokens)."""
    cfg = shape.cfg
    return cfg.data.batch_size * cfg.model.max_len / shape.measured["step_s"]


def _exact(shape: Shape) -> bool:
    """The shape's attention is full attention (the kind that declares itself ``exact``)."""
    return attention_class(shape.cfg.model).exact


def against_full(shapes: list[Shape]) -> list[dict[str, Any]]:
    """Each measured shape whose attention is not full attention, against full attention's measured shape at the
    same sequence length n: ``ratio`` = its tokens per second ÷ full attention's (above 1: faster per token). A shape
    with no full attention at its n is left out. From the preflight's one process per shape, so the ratio carries
    both measurements' noise: ``reading`` says ``faster`` or ``slower`` only beyond :data:`SAME_SPEED`, else
    ``within noise``; ``quadratic`` where the kind scores all n keys, slower than full attention by construction."""
    full = {s.cfg.model.max_len: s for s in shapes if s.measured and _exact(s)}
    out = []
    for shape in shapes:
        n = shape.cfg.model.max_len
        if not shape.measured or _exact(shape) or n not in full:
            continue
        ratio = tokens_per_s(shape) / tokens_per_s(full[n])
        out.append({"arm": shape.label, "setting": shape.setting, "n": n, "ratio": ratio,
                    "reading": _reading(ratio), "quadratic": attention_class(shape.cfg.model).quadratic})  # fmt: skip
    return out


def _reading(ratio: float) -> str:
    """``faster``, ``slower`` or ``within noise``: a ratio of tokens/s read against :data:`SAME_SPEED`."""
    if abs(ratio - 1) <= SAME_SPEED:
        return "within noise"
    return "faster" if ratio > 1 else "slower"


def _ratio_text(a: dict[str, Any]) -> str:
    """``k=256 at n = 512: 0.88× (within ±15% of 1, …: not shown to differ)``: the plan's words for one ratio."""
    note = ""
    if a.get("quadratic"):
        note = " (scores all n keys: slower by construction)"
    elif a.get("reading") == "within noise":
        note = f" (within ±{SAME_SPEED:.0%} of 1, the noise between preflights: not shown to differ)"
    return f"{a['arm']} at n = {a['n']}: {a['ratio']:.2f}×{note}"


def _extensions(study: Study, left: dict[tuple[str, str], tuple[float, ...]]) -> list[str]:
    """What is left of each curve the trials ``left`` extend, one line per set of budgets they have already run."""
    done = sorted({ran for ran in left.values() if ran})
    return [budgets.extension_line(study.budgets, ran, *_steps_and_fraction(study)) for ran in done]


def _steps_and_fraction(study: Study) -> tuple[int, float]:
    return study.shared.trainer.max_steps, study.shared.optim.cooldown_fraction


def _open_at_mean(study: Study, runs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """An open study's range ends stand for its ``n_trials`` sampled trials, each at their mean duration."""
    out = []
    for i, s in enumerate(study.studies):
        mine = [d for j, d in runs if j == i]
        if s.is_grid or not mine:
            out += [(i, d) for d in mine]
        else:
            out += [(i, sum(mine) / len(mine))] * (s.n_trials or len(mine))
    return out


def lines(plan: dict[str, Any]) -> list[str]:
    """The plan as the sweep prints it before its first trial."""
    where = "GPU memory" if plan["memory"] == "cuda" else "peak RSS growth, of the machine's memory"
    device = (
        f", {plan['device_hours']:.2f} GPU-hours on {plan['gpus']} GPU(s)"
        + (
            f" shared by {plan['gpu_sharing']:g} worker(s) each (assumed no faster than one at a time)"
            if plan["gpu_sharing"] and plan["gpu_sharing"] > 1
            else ""
        )
        if plan["gpus"]
        else ""
    )
    return [
        f"plan: {plan['trials']} trial(s) on {plan['workers']} worker(s) × {plan['threads_per_worker']} thread(s): "
        f"about {clock(plan['wall_s'])} wall time{device}, {plan['cpu_hours']:.2f} CPU-hours",
        f"plan: largest peak memory {plan['largest_peak_mb']:.0f} MB of {plan['total_mb']:.0f} MB ({where}), "
        f"{plan['largest_peak_arm']}",
        *([f"plan: {plan['curve']}"] if plan.get("curve") else []),
        *(f"plan: {line}" for line in plan.get("curve_left", [])),
        *(
            [
                "plan: tokens/s against full attention at the same n: "
                + "; ".join(_ratio_text(a) for a in plan["against_full"])
            ]
            if plan.get("against_full")
            else []
        ),
    ]


def write(study: Study, plan: dict[str, Any]) -> None:
    """``<study dir>/plan.json``, atomically."""
    study.root.mkdir(parents=True, exist_ok=True)
    write_json(study.root / PLAN, plan, study.root)


def measured_line(plan: dict[str, Any], elapsed_s: float) -> str:
    """The sweep's end: its measured wall time against the projection, and their ratio."""
    projected = plan["wall_s"]
    ratio = f" ({elapsed_s / projected:.2f} × the projection)" if projected > 0 else ""
    return (
        f"plan: measured {clock(elapsed_s)} wall time for {plan['trials']} trial(s), projected "
        f"{clock(projected)}{ratio}"
    )


def why_off(plan: dict[str, Any], elapsed_s: float, took: list[tuple[str, float, float]]) -> list[str]:
    """When the sweep's wall time is more than :data:`OFF` away from the projection, why, from ``took``: (shape
    label, projected, measured seconds) of each trial this sweep ran. The shape whose trials were furthest from
    their projection, the noise its preflight measured, and the machine's load average then and now."""
    if plan["wall_s"] <= 0 or abs(elapsed_s / plan["wall_s"] - 1) <= OFF or not took:
        return []
    by_shape: dict[str, list[float]] = {}
    for label, projected, measured in took:
        pair = by_shape.setdefault(label, [0.0, 0.0, 0])
        pair[0], pair[1], pair[2] = pair[0] + projected, pair[1] + measured, pair[2] + 1
    ratios = {label: m / p for label, (p, m, _) in by_shape.items() if p > 0}
    if not ratios:
        return []
    worst = max(ratios, key=lambda label: abs(ratios[label] - 1))
    shape = next((s for s in plan["shapes"] if s["arm"] == worst), {})
    noise = f", measured to ±{50 * shape['step_noise']:.0f} %" if "step_noise" in shape else ""
    loads = [s["load"] for s in plan["shapes"] if "load" in s]
    then = f"{max(loads):.1f} at its preflight, " if loads else ""
    alike = all(abs(r - ratios[worst]) <= OFF * ratios[worst] for r in ratios.values())
    cause = (
        "every shape alike: the machine's other load changed"
        if alike and len(ratios) > 1
        else f"{worst}'s trials most ({by_shape[worst][2]} trial(s), {ratios[worst]:.2f}× their projection; "
        f"its preflight {shape.get('step_s', 0):.3g} s/step{noise})"
    )
    return [
        f"plan: off by more than {OFF:.0%}: {cause}; the machine's load average {then}"
        f"{os.getloadavg()[0]:.1f} now (other processes share its cores)"
    ]


def _point_key(params: dict[str, Any]) -> str:
    """A grid point as the plan keys it: its parameters, sorted by name, as text."""
    return repr(sorted(params.items()))


def left_of(study: Study, trials: dict[str, list]) -> Optional[dict[tuple[str, str], tuple[float, ...]]]:
    """The grid points of the study and its control that no counted trial has finished (``trials``: each study's
    stored trials, by name), as ``(study name, repr of sorted params)``, each with the budgets of a curve that it
    has already run (a curve extended by a longer ``--budgets``: its finished trial lacks a listed budget, or was put
    back for it, and only the new trunk steps and cooldowns are left); None for an open study (all projected)."""
    from sweeps import stored

    if not all(s.is_grid for s in study.studies):
        return None
    left: dict[tuple[str, str], tuple[float, ...]] = {}
    for s in study.studies:
        excluded = stored.excluded_numbers(trials[s.name])
        done: set[str] = set()
        ran: dict[str, set[float]] = {}
        for t in trials[s.name]:
            if not t.state.is_finished():
                continue
            if t.number in excluded or stored.short_of(t, s.budgets or ()):  # put back, or to be, for a longer curve
                ran.setdefault(_point_key(t.params), set()).update(map(budgets.factor_of, stored.points_of(t)))
            else:
                done.add(_point_key(t.params))
        for p in (s.points or [])[: s.n_trials]:
            if (key := _point_key(p)) not in done:
                left[(s.name, key)] = tuple(sorted(ran.get(key, set())))
    return left
