"""Every figure of a study's report, drawn from the numbers of :mod:`sweeps.report.findings`,
:mod:`sweeps.report.efficiency` and :mod:`sweeps.report.scale`: Optuna's plots (optimisation history, parallel
coordinates, parameter importances, the Pareto front of two objectives), the learning curves by arm, quality against
speed (``pareto.png``) and a ladder's ``gap_vs_size.png``, ``rank_vs_size.png`` and ``time_to_target_vs_size.png``."""

from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np
import optuna
from optuna.trial import TrialState

from foundation.atomic import write_figure
from sweeps.report import efficiency, scale, stats
from sweeps.report.findings import Row, no_context_key, run_baselines
from sweeps.report.words import fmt, signed, signed_interval
from sweeps.spec.study import Study

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CURVE_TAG = "val/loss"  # the curve of a study whose objective is not a validation metric (tokens_per_sec)
GAP_FIGURE, RANK_FIGURE, TIME_FIGURE = "gap_vs_size.png", "rank_vs_size.png", "time_to_target_vs_size.png"
# the verdict of a rung as the marker of its point: (marker, filled)
MARKERS = {stats.BETTER: ("o", True), stats.ON_PAR: ("s", False), stats.UNDECIDED: ("X", True)}


# --------------------------------------------------------------------------------------- the study's plots
def _curves(rows: list[Row], tag: str = CURVE_TAG) -> dict[str, list[tuple[list[int], list[float]]]]:
    """``tag`` (val/loss) against step of each trial from its TensorBoard events, grouped by arm.

    A resumed run has one events file per process, read in the order of their names, which need not be the order
    they were written in (``….9`` after ``….10``): points are put in step order, and a step written twice (trained
    again after a resume) keeps the value written last."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list] = {}
    for r in rows:
        run_dir = r.trial.user_attrs.get("run_dir")
        if not run_dir or not Path(run_dir).is_dir():
            continue
        ea = EventAccumulator(run_dir, size_guidance={"scalars": 0}, purge_orphaned_data=False)
        ea.Reload()
        if tag in ea.Tags().get("scalars", []):
            latest = {e.step: e.value for e in sorted(ea.Scalars(tag), key=lambda e: e.wall_time)}
            steps = sorted(latest)
            out.setdefault(r.arm or f"trial {r.trial.number}", []).append((steps, [latest[s] for s in steps]))
    return out


def _no_context_level(rows: list[Row], metric: str) -> Optional[float]:
    """The mean over the complete trials of what a model without context reaches on ``metric`` (the unigram on the
    same targets, else the trivial baseline: :func:`sweeps.report.findings.no_context_key`), as summary.md reads it."""
    levels = []
    for r in rows:
        metrics = {**r.metrics, **run_baselines(r)}
        if r.complete and (key := no_context_key(metric, metrics)) in metrics:
            levels.append(float(metrics[key]))
    return sum(levels) / len(levels) if levels else None


def plot_learning_curves(rows: list[Row], path: Path, metric: str = CURVE_TAG) -> bool:
    """``metric`` (the study's objective) of every trial against step, by arm, with the no-context level dashed."""
    import matplotlib.pyplot as plt

    metric = metric if metric.startswith("val/") else CURVE_TAG
    curves = _curves(rows, metric)
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, lines) in enumerate(curves.items()):
        for j, (steps, values) in enumerate(lines):
            ax.plot(
                steps,
                values,
                color=colors[i % len(colors)],
                alpha=0.8,
                marker=".",
                label=arm if j == 0 and len(curves) <= 12 else None,
            )
    if (level := _no_context_level(rows, metric)) is not None:
        ax.axhline(level, color="black", linestyle="--", linewidth=1, label="no context (unigram, same targets)")
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of every trial, by arm")
    if len(curves) <= 12:
        ax.legend(fontsize="small")
    fig.tight_layout()
    write_figure(path, fig, dpi=110)
    plt.close(fig)
    return True


def write_plots(study: Study, ostudy: optuna.Study, rows: list[Row], out: Path) -> tuple[list[str], list[str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
    varying = [p for p in study.spec.space if len({str(t.params.get(p)) for t in complete}) > 1]
    plans: list[tuple[str, Callable[..., Any], dict]] = []
    for i, metric in enumerate(study.metrics):
        kwargs: dict[str, Any] = {"target_name": metric}
        suffix = ""
        if len(study.metrics) > 1:  # optuna plots one objective at a time
            kwargs["target"] = lambda t, i=i: t.values[i]
            suffix = "_" + metric.replace("/", "_")
        plans.append((f"history{suffix}.png", vis.plot_optimization_history, kwargs))
        plans.append((f"parallel_coordinate{suffix}.png", vis.plot_parallel_coordinate, kwargs))
        if len(varying) >= 2:
            plans.append((f"param_importances{suffix}.png", vis.plot_param_importances, kwargs))
    if len(study.metrics) == 2:
        plans.append(("pareto_front.png", vis.plot_pareto_front, {"target_names": study.metrics}))
    written, skipped = [], []
    if len(varying) < 2:
        skipped.append("param_importances.png (fewer than 2 params vary)")
    for name, fn, kwargs in plans:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn(ostudy, **kwargs)
            plt.gcf().set_size_inches(8, 5)
            plt.gcf().tight_layout()
            write_figure(out / name, plt.gcf(), dpi=110)
            written.append(name)
        except Exception as err:  # optuna refuses some plots on too few trials; say so, keep the rest
            skipped.append(f"{name} ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
        finally:
            plt.close("all")
    if plot_learning_curves(rows, out / "learning_curves.png", study.metrics[0]):
        written.append("learning_curves.png")
    else:
        skipped.append("learning_curves.png (no trial run directory with TensorBoard events here)")
    return written, skipped


def pareto(arms: Sequence[efficiency.ArmSpeed], metric: str, maximize: bool, path: Path) -> bool:
    """pareto.png: each arm's mean quality against its mean throughput, with seed spread as error bars."""
    if len(arms) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = set(efficiency.pareto_front([(a.mean_speed, a.mean_quality) for a in arms], maximize))
    with plt.style.context("default"):  # other report plots may have switched the style
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, a in enumerate(arms):
            sd_q = statistics.stdev(a.quality) if len(a.quality) > 1 else 0.0
            ax.errorbar(
                a.mean_speed,
                a.mean_quality,
                yerr=sd_q,
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


# --------------------------------------------------------------------------------------- a ladder's figures
def _figure(width: float, height: float) -> "Figure":
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _colors() -> list[str]:
    import matplotlib

    return matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


def _label_x(ax: "Axes", text: str, x: float, at_top: bool) -> None:
    """A small grey label at ``x``, along the top or the bottom of the axes."""
    where = (x, 1) if at_top else (x, 0)
    offset = (0, -10) if at_top else (0, 4)
    ax.annotate(
        text, where, xycoords=("data", "axes fraction"), textcoords="offset points", xytext=offset, ha="center",
        fontsize=7, color="0.4",
    )  # fmt: skip


def _gap_points(ax: "Axes", ladder: scale.Ladder, line: str, sized: list, color: str, shift: float) -> None:
    """Each rung's paired mean gap of ``line`` with its 95 % CI, the verdict as the marker."""
    for rung, size in sized:
        c = ladder.gap(rung, line)
        if c is None:
            continue
        lo, hi = c.ci()
        verdict = ladder.verdicts.get((rung, line))
        marker, filled = MARKERS[verdict.verdict.kind if verdict else stats.UNDECIDED]
        ax.errorbar(
            [size * shift],
            [c.diff],
            yerr=None if not math.isfinite(lo) else [[c.diff - lo], [hi - c.diff]],
            color=color,
            marker=marker,
            markersize=7,
            capsize=3,
            markerfacecolor=color if filled else "white",
            linestyle="none",
        )


def _gap_trend(ax: "Axes", ladder: scale.Ladder, line: str, axis: str, sizes: list, color: str) -> None:
    """The fitted trend of ``line``'s gap, dashed, labelled with its slope per tenfold size."""
    t = ladder.trend(line, axis)
    label = line
    if t is not None and math.isfinite(t.slope):
        xx = np.logspace(math.log10(min(sizes)), math.log10(max(sizes)), 50)
        ax.plot(xx, t.intercept + t.slope * np.log10(xx), "--", color=color, linewidth=1.2)
        label += f": {signed(t.slope)} per 10× {signed_interval(*t.slope_ci())}"
    ax.plot([], [], "--", color=color, label=label)


def _gap_legend(ax: "Axes", ladder: scale.Ladder, sized: list) -> None:
    """The rung names on top, and the markers' meaning in the legend."""
    from matplotlib.lines import Line2D

    for rung, size in sized:
        _label_x(ax, rung, size, at_top=True)
    handles, _ = ax.get_legend_handles_labels()
    better, par, undecided = (MARKERS[k][0] for k in (stats.BETTER, stats.ON_PAR, stats.UNDECIDED))
    handles += [
        Line2D([], [], color="0.3", marker=better, linestyle="none", label="a rung's verdict: better (either way)"),
        Line2D(
            [],
            [],
            color="0.3",
            marker=par,
            markerfacecolor="white",
            linestyle="none",
            label=f"on par within ±{fmt(ladder.delta)} (band)",
        ),  # fmt: skip
        Line2D([], [], color="0.3", marker=undecided, linestyle="none", label="undecided"),
    ]
    ax.legend(handles=handles, fontsize="x-small")


def figure_gap(ladder: scale.Ladder) -> Optional["Figure"]:
    """The gap against parameters and training FLOPs (log x), one line per compared arm: each rung's paired
    mean gap with its 95 % CI, the verdict as the marker, the fitted trend dashed, the ±δ band shaded."""
    axes = [axis for axis in scale.AXES if ladder.has_axis(axis)]
    if not axes or not ladder.lines:
        return None
    fig = _figure(5.5 * len(axes), 4.3)
    colors = _colors()
    for ax, axis in zip(fig.subplots(1, len(axes), squeeze=False)[0], axes):
        ax.set_xscale("log")
        ax.axhspan(-ladder.delta, ladder.delta, color="tab:green", alpha=0.12, linewidth=0, zorder=0)
        ax.axhline(0, color="0.5", linewidth=0.8, zorder=1)
        sized = [(rung, size) for rung in ladder.rungs if (size := ladder.size(rung, axis))]
        for i, line in enumerate(ladder.lines):
            color, shift = colors[i % len(colors)], 1.0 + 0.04 * (i - (len(ladder.lines) - 1) / 2)
            _gap_points(ax, ladder, line, sized, color, shift)
            _gap_trend(ax, ladder, line, axis, [size for _, size in sized], color)
        ax.set(
            xlabel=f"{scale.AXES[axis]} (log)",
            ylabel=f"{ladder.metric}: arm − {ladder.reference}",
            title=f"gap to {ladder.reference} against {scale.AXES[axis]}",
        )
        ax.grid(alpha=0.3, which="both")
        _gap_legend(ax, ladder, sized)
    return fig


def figure_rank(ladder: scale.Ladder, spectra: list[scale.RungSpectrum]) -> Optional["Figure"]:
    """Effective rank of the reference's P per layer (first, middle, last, mean) against parameters (log x),
    beside the k of each Linformer arm at each rung (dotted)."""
    if not spectra:
        return None
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    x = [s.parameters for s in spectra]
    picks = {
        "first layer": lambda r: r[0],
        "middle layer": lambda r: r[len(r) // 2] if len(r) >= 3 else math.nan,
        "last layer": lambda r: r[-1],
        "mean over layers": lambda r: float(np.mean(r)),
    }
    # ranks are integers and often coincide: markers shrink from the first layer on so that each shows
    for (name, pick), style, size in zip(picks.items(), ("o-", "s-", "^-", "D--"), (11, 8, 5, 4)):
        ax.plot(
            x,
            [pick(s.effective_rank) for s in spectra],
            style,
            label=name,
            markersize=size,
            color="black" if name.startswith("mean") else None,
        )
    colors = _colors()
    for i, line in enumerate(ladder.lines):
        ks = scale.arm_ks(ladder, line)
        shown = [(s.parameters, ks[s.rung]) for s in spectra if s.rung in ks]
        if shown:
            ax.plot(*zip(*shown), ":", color=colors[(i + 4) % len(colors)], label=f"k of {line}")
    for s in spectra:
        _label_x(ax, f"{s.rung} ({len(s.effective_rank)} layers)", s.parameters, at_top=False)
    n = max(s.length for s in spectra)
    ax.set(
        xlabel="parameters (log)",
        ylabel=f"effective rank of P at τ = {scale.ENERGY:g}",
        title=f"{ladder.reference} attention's rank across sizes (n = {n}, one seed per rung)",
        ylim=(0, None),
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def figure_time(ladder: scale.Ladder, ttt: scale.TimeToTarget) -> Optional["Figure"]:
    """Each compared arm's training time to the rung's target over the reference's, against parameters."""
    fig = _figure(6.5, 4.3)
    ax = fig.add_subplot()
    ax.set(xscale="log", yscale="log")
    ax.axhline(1, color="0.5", linewidth=0.8)
    colors, drawn = _colors(), False
    for i, line in enumerate(ladder.lines):
        pts = [
            (ladder.size(rung), r)
            for rung in ladder.rungs
            if (r := ttt.ratio(rung, line, ladder.reference)) is not None and ladder.size(rung)
        ]
        if not pts:
            continue
        drawn = True
        xs, ys = [x for x, _ in pts], [r.value for _, r in pts]
        err = [
            [r.value - r.lo if math.isfinite(r.lo) else 0.0 for _, r in pts],
            [r.hi - r.value if math.isfinite(r.hi) else 0.0 for _, r in pts],
        ]
        ax.errorbar(xs, ys, yerr=err, color=colors[i % len(colors)], marker="o", capsize=3, label=line)
    if not drawn:
        return None
    ax.set(
        xlabel="parameters (log)",
        ylabel=f"training time to target: arm / {ladder.reference}",
        title="time to each rung's target perplexity",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def write_ladder(
    ladder: scale.Ladder, ttt: Optional[scale.TimeToTarget], spectra: list, out: Path
) -> tuple[list[str], list[str]]:
    """A ladder's three figures into ``out``: (written, skipped with why)."""
    import matplotlib

    plans = {
        GAP_FIGURE: (lambda: figure_gap(ladder), "no rung has a gap yet"),
        RANK_FIGURE: (lambda: figure_rank(ladder, spectra), "no reference run with a checkpoint here"),
        TIME_FIGURE: (
            lambda: figure_time(ladder, ttt) if ttt is not None else None,
            "no run's ppl_vs_wallclock curve here"
            if ttt is None
            else "no rung's target is above what a model without context reaches"
            if ttt.refused and set(ttt.refused) == set(ttt.targets)
            else "no arm reached its rung's target",
        ),
    }
    written, skipped = [], []
    with matplotlib.style.context("default"):  # not the style the report's Optuna plots leave set
        for name, (draw, why) in plans.items():
            fig = draw()
            if fig is None:
                skipped.append(f"{name} ({why})")
                continue
            write_figure(out / name, fig, dpi=110)
            written.append(name)
    return written, skipped
