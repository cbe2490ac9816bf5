"""The figures of a study's trials: Optuna's plots (optimisation history, parallel coordinates, parameter importances,
the Pareto front of two objectives) and the learning curves by arm, read from the trials' TensorBoard events. The
sections draw their own: quality against speed in :mod:`sweeps.report.efficiency`, a ladder's three figures in
:mod:`sweeps.report.scale`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import optuna
from optuna.trial import TrialState

from foundation.atomic import write_figure
from sweeps.control import Row, no_context_key, run_baselines
from sweeps.report import markdown
from sweeps.spec.study import Study
from training.sample_curve import sample_tag

CURVE_TAG = "val/loss"  # the curve of a study whose objective is not a validation metric (tokens_per_sec)
LEARNING_CURVES = "learning_curves.png"
# What each of Optuna's plots (by the name it is written under, less a metric suffix) shows, for summary.md.
CAPTIONS = {
    "history": "{metric} of each trial in the order they ran, with the best so far (Optuna's optimisation history)",
    "parallel_coordinate": "each complete trial's params and its {metric} (Optuna's parallel coordinates)",
    "param_importances": "how much of {metric}'s spread each param explains (Optuna's parameter importances)",
    "pareto_front": "the trials on both objectives, the Pareto-optimal ones marked (Optuna's Pareto front)",
    "learning_curves": (
        "{metric} of every trial against training step (its fixed validation sample every twentieth of training "
        "where the run logged one), by arm, the no-context level dashed"
    ),
}


def curve_metric(metric: str) -> str:
    """The metric the learning curves draw: the objective where it is a validation metric, else val/loss."""
    return metric if metric.startswith("val/") else CURVE_TAG


def embed(name: str, study: Study) -> str:
    """The summary.md line that shows the figure ``name`` written by :func:`write_plots`, with what it shows."""
    stem = name.removesuffix(".png")
    key = next((k for k in CAPTIONS if stem.startswith(k)), None)
    if key is None:
        return markdown.figure(name, stem)
    suffix = stem[len(key) :].lstrip("_")
    metric = next((m for m in study.metrics if m.replace("/", "_") == suffix), study.metrics[0])
    if key == "learning_curves":
        metric = curve_metric(metric)
    return markdown.figure(name, CAPTIONS[key].format(metric=metric))


# --------------------------------------------------------------------------------------- the study's plots
def step_curves(rows: list[Row], metric: str = CURVE_TAG) -> dict[str, list[tuple[list[int], list[float]]]]:
    """``metric`` against step of each trial from its TensorBoard events, grouped by arm: the run's sample curve of
    it (``val_sample/<name>``, :mod:`training.sample_curve`, about 20 points a run) where the run logged one, else its
    full validations (two points at the CPU presets' steps).

    A resumed run has one events file per process, read in the order of their names, which need not be the order
    they were written in (``….9`` after ``….10``): points are put in step order, and a step written twice (trained
    again after a resume) keeps the value written last. Each run's events are read once a process
    (:func:`run_curve`)."""
    out: dict[str, list] = {}
    for r in rows:
        run_dir = r.trial.user_attrs.get("run_dir")
        if run_dir and Path(run_dir).is_dir() and (curve := run_curve(run_dir, metric)) is not None:
            out.setdefault(r.arm or f"trial {r.trial.number}", []).append(curve)
    return out


# A run's curves as read: a report draws them and then judges each arm's end from them (×F reports). The key holds the
# run's events files with their sizes and times, so a run that wrote more since is read again.
_READ: dict[tuple, Optional[tuple[list[int], list[float]]]] = {}


def run_curve(run_dir: str, metric: str) -> Optional[tuple[list[int], list[float]]]:
    """``(steps, values)`` of ``metric``'s sample curve in the run's events, else of its full validations (None: the
    run logged neither); in step order, a step written twice with its later value (:func:`step_curves`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(run_dir).glob("events.out.tfevents.*"))
    key = (str(run_dir), metric, tuple((f.name, st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]))
    if key not in _READ:
        ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        ea.Reload()
        tags = ea.Tags().get("scalars", [])
        tag = next((t for t in (sample_tag(metric), metric) if t in tags), None)
        curve = None
        if tag is not None:
            latest = {e.step: e.value for e in sorted(ea.Scalars(tag), key=lambda e: e.wall_time)}
            steps = sorted(latest)
            curve = steps, [latest[s] for s in steps]
        _READ[key] = curve
    return _READ[key]


def _no_context_level(rows: list[Row], metric: str) -> Optional[float]:
    """The mean over the complete trials of what a model without context reaches on ``metric`` (the unigram on the
    same targets, else the trivial baseline: :func:`sweeps.control.no_context_key`), as summary.md reads it."""
    levels = []
    for r in rows:
        metrics = {**r.metrics, **run_baselines(r)}
        if r.complete and (key := no_context_key(metric, metrics)) in metrics:
            levels.append(float(metrics[key]))
    return sum(levels) / len(levels) if levels else None


def plot_learning_curves(rows: list[Row], path: Path, metric: str = CURVE_TAG) -> bool:
    """``metric`` (the study's objective) of every trial against step, by arm, with the no-context level dashed."""
    import matplotlib.pyplot as plt

    metric = curve_metric(metric)
    curves = step_curves(rows, metric)
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    palette = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")  # one colour an arm: no arm shares another's
    colors = [palette(i % palette.N) for i in range(len(curves))]
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
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, not on them
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
    if not complete:  # Optuna would draw empty axes
        skipped += [f"{name} (no complete trial of the study yet)" for name, _, _ in plans]
        plans = []
    elif len(varying) < 2:
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
    if plot_learning_curves(rows, out / LEARNING_CURVES, study.metrics[0]):
        written.append(LEARNING_CURVES)
    else:
        skipped.append(f"{LEARNING_CURVES} (no trial run directory with TensorBoard events here)")
    return written, skipped


# --------------------------------------------------------------------------------------- a ladder's figures
