"""Quality against speed, one point per arm: the time-to-target table of a study's report and its plot,
``pareto.png`` (:func:`pareto`).

For each arm (every seed of it): the objective's mean (quality at equal steps), the training throughput
(``tokens_per_sec`` of ``metrics.json``: tokens over training-step seconds) and, for tasks with a perplexity,
the wall-clock time to a target quality. The target is the quality every arm reaches: the worst arm's median
final validation perplexity, so that each arm's time answers "how long until it is as good as the weakest
arm at the end", and a fast arm that stops early is not rewarded. Times are training-step seconds
(:func:`training.curves.reach`, interpolated between validations), medians over the seeds that got there.

An arm is on the Pareto front when no other arm is both at least as fast and at least as good, and better in
one of the two.

Long sequences: the study trains at one n; where each kind pays off shows at others. ``kind_costs.json`` (written
by ``linformer-lab bench --levels layer --mode fwdbwd``, shipped beside this module) holds each attention kind's
layer cost, forward + backward, at n = 1,024 … 16,384 as multiples of full attention; the report shows it for
the arms named after a kind (:func:`long_sequence_section`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from foundation.atomic import write_figure
from sweeps.spec import stats
from training.answer import Objective
from training.curves import reach
from training.sample_curve import run_curve

THROUGHPUT = "tokens_per_sec"  # a run's training speed (metrics.json): tokens over training-step seconds

KIND_COSTS = Path(__file__).parents[1] / "kind_costs.json"  # sweeps/kind_costs.json


@dataclass
class ArmSpeed:
    arm: str
    quality: list[float]  # the objective of each seed
    tokens_per_sec: list[float]
    curves: list[list[list[float]]]  # ppl_vs_wallclock of each seed that has one
    no_context_ppl: list[float] = field(default_factory=list)  # each seed's no-context val ppl (no_context_ppl)

    @property
    def mean_quality(self) -> float:
        return statistics.fmean(self.quality)

    @property
    def mean_speed(self) -> float:
        return statistics.fmean(self.tokens_per_sec)


def _metrics_json(run_dir: Optional[str]) -> dict:
    if not run_dir:
        return {}
    try:
        loaded = json.loads((Path(run_dir) / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _curve(metrics: dict) -> Optional[list]:
    curve = metrics.get("ppl_vs_wallclock")
    return curve if isinstance(curve, list) and curve else None


def no_context_ppl(metrics: dict) -> Optional[float]:
    """The validation perplexity a model without context reaches on a run's data: exp of metrics.json's unigram
    loss on the same targets (``baselines`` ``unigram/loss``), else of its ``trivial_loss``; None without either."""
    baselines = metrics.get("baselines") if isinstance(metrics.get("baselines"), dict) else {}
    loss = baselines.get("unigram/loss", metrics.get("trivial_loss"))
    return math.exp(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else None


def no_context_floor(arms: Sequence[ArmSpeed]) -> Optional[float]:
    """The lowest no-context perplexity of these arms' runs (None when no run recorded one)."""
    floors = [p for a in arms for p in a.no_context_ppl]
    return min(floors) if floors else None


def in_error(metric: str) -> bool:
    """Whether a time to target reads ``metric`` itself (an accuracy or score, as its error 1 − value: lower is
    better, as a perplexity) rather than the validation perplexity (a loss objective)."""
    return Objective(metric).kind != "loss"


def error_curve(metric: str, run: dict) -> Optional[list]:
    """A run's ``[seconds, tokens, 1 − value]`` of ``metric`` at each point of its sample curve (training seconds
    and tokens pro rata of the step: the run's ``train_time_s`` and ``tokens`` over its steps); None without one."""
    steps, seconds, tokens = run.get("global_step"), run.get("train_time_s"), run.get("tokens")
    if not run.get("run_dir") or not all(isinstance(x, (int, float)) and x > 0 for x in (steps, seconds, tokens)):
        return None
    curve = run_curve(str(run["run_dir"]), metric) if Path(str(run["run_dir"])).is_dir() else None
    return [[s * seconds / steps, s * tokens / steps, 1.0 - v] for s, v in zip(*curve)] if curve else None


def target_words(metric: str, target: float) -> str:
    """``val ppl ≤ 3.1``, or for an accuracy ``val/accuracy ≥ 0.92``: a target in the objective's own units."""
    return f"{metric} ≥ {1.0 - target:.4g}" if in_error(metric) else f"val ppl ≤ {target:.4g}"


def arm_speeds(rows: Sequence, metric: str) -> list[ArmSpeed]:
    """One entry per arm that has the metric and a throughput in every finished trial (report rows). Its curves are
    of validation perplexity, or of the objective's error for an accuracy or score (:func:`in_error`)."""
    arms: dict[str, ArmSpeed] = {}
    for r in rows:
        m = r.metrics
        if metric not in m or THROUGHPUT not in m or not math.isfinite(m[metric]):
            continue
        entry = arms.setdefault(r.arm, ArmSpeed(r.arm, [], [], []))
        entry.quality.append(float(m[metric]))
        entry.tokens_per_sec.append(float(m[THROUGHPUT]))
        run = _metrics_json(r.trial.user_attrs.get("run_dir"))
        if (curve := error_curve(metric, run) if in_error(metric) else _curve(run)) is not None:
            entry.curves.append(curve)
        level = Objective(metric).no_context({**m, **run}) if in_error(metric) else None
        if (floor := 1.0 - level if level is not None else no_context_ppl({**m, **run})) is not None:
            entry.no_context_ppl.append(floor)
    return list(arms.values())


def speed_p(arms: Sequence[ArmSpeed]) -> float:
    """Whether the arms' throughputs differ beyond their seeds' spread: the p-value of a one-way ANOVA over their
    seeds' tokens/s (:func:`sweeps.spec.stats.one_way_p`); arms of the same compute differ by noise alone."""
    return stats.one_way_p([a.tokens_per_sec for a in arms])


SPEED_NOISE = 0.1  # without seeds enough to measure their spread, mean speeds this far apart differ (one tenth)


def speeds_differ(arms: Sequence[ArmSpeed]) -> bool:
    """A front of speed against quality means something only when the speeds differ beyond their noise: the seeds'
    spread (:func:`speed_p`) where there are 2 degrees of freedom within the arms at least, else :data:`SPEED_NOISE`."""
    if sum(len(a.tokens_per_sec) - 1 for a in arms) >= 2:
        return speed_p(arms) < stats.ALPHA
    speeds = [a.mean_speed for a in arms]
    return max(speeds) > (1 + SPEED_NOISE) * min(speeds)


def pareto_front(points: Sequence[tuple[float, float]], maximize_quality: bool) -> list[int]:
    """Indices of the non-dominated (speed, quality) points: higher speed is better, quality in its direction."""
    sign = 1.0 if maximize_quality else -1.0
    front = []
    for i, (s_i, q_i) in enumerate(points):
        dominated = any(
            s_j >= s_i and sign * q_j >= sign * q_i and (s_j > s_i or sign * q_j > sign * q_i)
            for j, (s_j, q_j) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def final_ppl(arm: ArmSpeed) -> float:
    """The median over an arm's seeds of the last validation perplexity of each curve (the arm has curves)."""
    return statistics.median(c[-1][2] for c in arm.curves)


def target_ppl(arms: Sequence[ArmSpeed]) -> Optional[float]:
    """The worst arm's median final validation perplexity (None when an arm has no curve)."""
    finals = [final_ppl(a) for a in arms if a.curves]
    return max(finals) if finals and len(finals) == len(arms) else None


def time_to(arm: ArmSpeed, target: float) -> tuple[Optional[float], int]:
    """(median training seconds to val ppl ≤ target over the seeds that reached it, how many reached it)."""
    reached = [r[0] for r in (reach(c, target) for c in arm.curves) if r is not None]
    return (statistics.median(reached) if reached else None), len(reached)


def trivial_target(
    arms: Sequence[ArmSpeed], target: Optional[float], no_context: Sequence[ArmSpeed] = ()
) -> Optional[tuple[float, str]]:
    """(the no-context perplexity, what gives it) when ``target`` is one a model without context already reaches
    (then a time to it measures no use of context, and the report gives none); None otherwise. The unigram floor
    is that of the arms' runs (:func:`no_context_floor`); see :func:`no_context_reaches`."""
    return no_context_reaches(target, no_context_floor(arms), no_context)


def no_context_reaches(
    target: Optional[float], unigram: Optional[float], no_context: Sequence[ArmSpeed] = ()
) -> Optional[tuple[float, str]]:
    """(the no-context perplexity, what gives it) when a model without context reaches ``target``; None otherwise.
    The no-context level is the unigram baseline (``unigram``), or, lower, the median final perplexity of a model
    without context trained beside the arms (``no_context``: the control's degraded arm): on masked-LM data it
    copies the targets BERT leaves unchanged, which the unigram does not."""
    floors = []
    if unigram is not None:
        floors.append((unigram, "the unigram baseline"))
    trained = [final_ppl(a) for a in no_context if a.curves]
    if trained:
        floors.append((min(trained), "the model without context trained beside them"))
    reached = [f for f in floors if target is not None and target >= f[0]]
    return reached[0] if reached else None


def learned(arms: Sequence[ArmSpeed], no_context: Sequence[ArmSpeed] = ()) -> list[ArmSpeed]:
    """The arms that learned to use their context: each has curves, and its median final perplexity is one a
    model without context does not reach (:func:`trivial_target`)."""
    return [a for a in arms if a.curves and trivial_target(arms, final_ppl(a), no_context) is None]


def _row(a: ArmSpeed, front: bool, target: Optional[float], learner: bool, differ: bool = True) -> list[str]:
    sd = statistics.stdev(a.quality) if len(a.quality) > 1 else float("nan")
    cells = [a.arm or "(all trials)", str(len(a.quality)), f"{a.mean_quality:.4g} ± {sd:.2g}", f"{a.mean_speed:,.0f}"]
    cells += ["yes" if front else ""] if differ else []
    if target is not None and not learner:
        cells.append("— (ends at the no-context level)")
    elif target is not None:
        seconds, n = time_to(a, target)
        cells.append(f"{seconds:.1f} s ({n}/{len(a.curves)})" if seconds is not None else f"— (0/{len(a.curves)})")
    return cells


def section(arms: Sequence[ArmSpeed], metric: str, maximize: bool, no_context: Sequence[ArmSpeed] = ()) -> list[str]:
    """The report's markdown: quality at equal steps, throughput, time to target among the arms that learned
    (:func:`learned`: the target is the worst of their median final perplexities, one a model without context
    does not reach), Pareto membership."""
    if len(arms) < 2:
        return []
    differ = speeds_differ(arms)
    front = set(pareto_front([(a.mean_speed, a.mean_quality) for a in arms], maximize)) if differ else set()
    learners = learned(arms, no_context)
    target = target_ppl(learners) if len(learners) >= 2 else None
    quality, side = (metric, "above") if in_error(metric) else ("perplexity", "below")
    head = ["arm", "seeds", f"{metric} (mean ± sd)", "training tokens/s (mean)", *(["Pareto front"] if differ else [])]
    if target is not None:
        head.append(f"seconds to {target_words(metric, target)} (median, reached)")
    ordered = sorted(arms, key=lambda a: -a.mean_speed)
    body = [_row(a, arms.index(a) in front, target, a in learners, differ) for a in ordered]
    lines = [
        "## Quality against speed",
        "",
        f"Quality at equal training steps ({metric}) against training throughput, one row per arm, fastest first; "
        + (
            "an arm is on the Pareto front when no other arm is at least as fast and at least as good (and better "
            "in one)."
            if differ
            else f"the arms' speeds do not differ beyond their seeds' spread (one-way ANOVA over the seeds' tokens/s, "
            f"p = {speed_p(arms):.2g}), so no speed–quality front is drawn: at equal speed, quality decides."
        ),
    ]
    if target is not None:
        lines[-1] += (
            f" Time to target, among the {len(learners)} arms that learned to use their context (their median "
            f"final {quality} is {side} a model without context's): training-step seconds until "
            f"{target_words(metric, target)}, the worst of those arms' median final {quality} (a quality each of "
            "them reaches and a model without context does not)."
        )
    elif any(a.curves for a in arms):
        lines[-1] += (
            f" No time to target: {len(learners)} arm{'' if len(learners) == 1 else 's'} ended {side} the "
            f"{quality} of a model without context, and a time to target compares at least two arms that learned."
        )
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    figure = ["", "![quality against speed](pareto.png)"] if differ else []
    return lines + [*figure, "", *long_sequence_section([a.arm for a in arms])]


def kind_costs(path: Path = KIND_COSTS) -> Optional[dict]:
    """The bench's long-sequence costs per kind (module docstring), or None without a readable file."""
    try:
        costs = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return costs if isinstance(costs, dict) and isinstance(costs.get("kinds"), list) else None


def long_sequence_section(arms: Sequence[str], path: Path = KIND_COSTS) -> list[str]:
    """Markdown: for each arm named after a kind in the bench's costs, its layer's forward + backward time and
    peak memory as multiples of full attention at every measured n (nothing when fewer than two arms match)."""
    costs = kind_costs(path)
    if costs is None:
        return []
    rows = [c for c in costs["kinds"] if c["kind"] in arms]
    if len(rows) < 2:
        return []
    ns = sorted({int(n) for c in rows for n in c["by_n"]})

    def cell(entry: Optional[dict], key: str) -> str:
        value = None if entry is None else entry.get(key)
        return "—" if value is None else f"{value:.2g}×"

    head = ["kind", *(f"time n={n:,}" for n in ns), *(f"memory n={n:,}" for n in ns)]
    lines = [
        "### Long sequences",
        "",
        "Where each kind pays off: one attention layer's forward + backward against full attention (SDPA) at "
        "longer sequences than the study's, time and peak memory as full ÷ kind (> 1: cheaper than full; — where "
        f"it did not fit). Measured {costs.get('date', '?')} on {costs.get('machine', '?')}:",
        "",
        f"    {costs.get('command', '')}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for c in rows:
        by_n = {int(n): v for n, v in c["by_n"].items()}
        times = [cell(by_n.get(n), "time_vs_full") for n in ns]
        memory = [cell(by_n.get(n), "memory_vs_full") for n in ns]
        label = c["kind"] if c["k"] is None else f"{c['kind']} ({c['variant']}, k={c['k']})"
        lines.append("| " + " | ".join([label, *times, *memory]) + " |")
    return lines + [""]


def pareto(arms: Sequence[ArmSpeed], metric: str, maximize: bool, path: Path) -> bool:
    """pareto.png: each arm's mean quality against its mean throughput, with seed spread as error bars (kept within
    [0, 1] for an accuracy or score); none when the speeds do not differ beyond their noise (:func:`speeds_differ`)."""
    if len(arms) < 2 or not speeds_differ(arms):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = set(pareto_front([(a.mean_speed, a.mean_quality) for a in arms], maximize))
    with plt.style.context("default"):  # other report plots may have switched the style
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, a in enumerate(arms):
            sd_q = statistics.stdev(a.quality) if len(a.quality) > 1 else 0.0
            low, high = sd_q, sd_q
            if in_error(metric):  # an accuracy's bar stops at 0 and 1
                low, high = min(sd_q, a.mean_quality), min(sd_q, 1.0 - a.mean_quality)
            ax.errorbar(
                a.mean_speed,
                a.mean_quality,
                yerr=[[low], [high]],
                fmt="o" if i in front else "s",
                capsize=3,
                color="tab:blue" if i in front else "tab:gray",
            )
            ax.annotate(
                a.arm or "(all)",
                (a.mean_speed, a.mean_quality),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize="small",
            )
        on_front = sorted((arms[i] for i in front), key=lambda a: a.mean_speed)
        ax.plot(
            [a.mean_speed for a in on_front],
            [a.mean_quality for a in on_front],
            color="tab:blue",
            linewidth=1,
            label="Pareto front",
        )
        ax.set_xscale("log")
        ax.set_xlabel("training tokens/s (mean over seeds, log)")
        ax.set_ylabel(f"{metric} ({'higher' if maximize else 'lower'} is better; bars: sd over seeds)")
        ax.set_title("quality at equal steps against training speed, per arm")
        ax.legend(fontsize="small")
        fig.tight_layout()
        write_figure(path, fig, dpi=110)
    plt.close(fig)
    return True
