"""The figures of a study's trials: Optuna's plots (optimisation history, parallel coordinates, parameter importances,
the Pareto front of two objectives) and the learning curves by arm, read from the trials' TensorBoard events. The
sections draw their own: quality against speed in :mod:`sweeps.report.efficiency`, a ladder's three figures in
:mod:`sweeps.report.scale`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import optuna
from optuna.trial import TrialState

from foundation.atomic import write_figure
from sweeps.control import Row, arm_importance, no_context_key, run_baselines
from sweeps.report import markdown
from sweeps.spec.study import Study
from training.sample_curve import run_curve

CURVE_TAG = "val/loss"  # the curve of a study whose objective is not a validation metric (tokens_per_sec)
LEARNING_CURVES = "learning_curves.png"
# What each of Optuna's plots (by the name it is written under, less a metric suffix) shows, for summary.md.
CAPTIONS = {
    "history": "{metric} of each trial in the order they ran, by arm (the best so far where trials are not seeds)",
    "parallel_coordinate": "each complete trial's params and its {metric} (Optuna's parallel coordinates)",
    "param_importances": "how much of {metric}'s spread each arm param explains, seeds left out",
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


# What the no-context level is, by where metrics.json keeps it and the task: its label on the learning curves.
LEVEL_LABELS = {
    "unigram": "no context (unigram, same targets)",
    "recall": "chance (a model without context: 1 / values)",
    "trivial": "no context (majority class)",
}


def _no_context_level(rows: list[Row], metric: str) -> tuple[Optional[float], str]:
    """The mean over the complete trials of what a model without context reaches on ``metric`` (the unigram on the
    same targets, else the trivial baseline: :func:`sweeps.control.no_context_key`), as summary.md reads it, and
    where it came from (``unigram``, ``trivial``)."""
    levels, source = [], "trivial"
    for r in rows:
        metrics = {**r.metrics, **run_baselines(r)}
        if r.complete and (key := no_context_key(metric, metrics)) in metrics:
            levels.append(float(metrics[key]))
            source = "unigram" if "unigram" in key else "trivial"
    return (sum(levels) / len(levels) if levels else None), source


def plot_learning_curves(rows: list[Row], path: Path, metric: str = CURVE_TAG, task: str = "") -> bool:
    """``metric`` (the study's objective) of every trial against step, by arm, with the no-context level dashed and
    named for what it is on ``task`` (chance on recall, the unigram of a language model's targets)."""
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
    level, source = _no_context_level(rows, metric)
    if level is not None:
        label = LEVEL_LABELS["recall" if task == "recall" else source]
        ax.axhline(level, color="black", linestyle="--", linewidth=1, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of every trial, by arm")
    if len(curves) <= 12:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, not on them
    fig.tight_layout()
    write_figure(path, fig, dpi=110)
    plt.close(fig)
    return True


def _replicates(study: Study) -> bool:
    """Whether the study's trials repeat each arm over seeds (a grid with several): a best-so-far means nothing."""
    return study.is_grid and len(study.seeds) > 1


def plot_history(study: Study, rows: list[Row], index: int, metric: str, path: Path) -> bool:
    """``metric`` of each complete trial of the study in the order they ran, coloured by arm (Optuna's optimisation
    history drawn for a study of arms): the best so far only where trials are not replicates of their arm."""
    import matplotlib.pyplot as plt

    done = sorted((r for r in rows if r.complete and not r.role), key=lambda r: r.trial.number)
    if not done:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    arms = list(dict.fromkeys(r.arm or "trial" for r in done))
    palette = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
    for i, arm in enumerate(arms):
        mine = [r for r in done if (r.arm or "trial") == arm]
        ax.scatter([r.trial.number for r in mine], [r.trial.values[index] for r in mine], color=palette(i), label=arm)
    if not _replicates(study):
        maximize = study.directions[index] == "maximize"
        best, line = None, []
        for r in done:
            v = r.trial.values[index]
            best = v if best is None or (v > best if maximize else v < best) else best
            line.append(best)
        ax.step([r.trial.number for r in done], line, where="post", color="grey", label="best so far")
    ax.set_xlabel("trial number")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of each trial, by arm")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    write_figure(path, fig, dpi=110)
    plt.close(fig)
    return True


def plot_importances(study: Study, ostudy: optuna.Study, index: int, metric: str, path: Path) -> tuple[bool, str]:
    """The study's arm params by what they explain of ``metric``'s spread, seeds left out
    (:func:`sweeps.control.arm_importance`); the words for the params left out (or for no figure)."""
    import matplotlib.pyplot as plt

    found = arm_importance(study, ostudy.get_trials(deepcopy=False), index)
    if not found.importances:
        return False, found.words() or "no arm param varies"
    names = sorted(found.importances, key=found.importances.__getitem__)
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.5 * len(names)))
    ax.barh([n.rsplit(".", 1)[-1] for n in names], [found.importances[n] for n in names], color="tab:blue")
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of the spread of {metric} the arms explain (seeds are replicates, not params)")
    ax.set_title(f"Importance of the study's arms for {metric}")
    fig.tight_layout()
    write_figure(path, fig, dpi=110)
    plt.close(fig)
    return True, found.words()


def legible(fig: Any, names: Sequence[str] = ()) -> None:
    """Optuna's parallel coordinates made legible: lines on a colour map with no near-white end (its "Blues" draws
    the worst trials white on grey), each axis named by the last part of its param (Optuna cuts a long name to
    ``model.attention.o...``: one of ``names``), the figure's titles inside it."""
    from matplotlib.collections import LineCollection

    for ax in fig.axes[:1]:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        if labels:
            full = [next((n for n in names if n.startswith(t.removesuffix("..."))), t) for t in labels]
            ax.set_xticks(ax.get_xticks(), [n.rsplit(".", 1)[-1] if n in names else n for n in full], rotation=0)
    for ax in fig.axes:
        for collection in ax.collections:
            if isinstance(collection, LineCollection) and collection.get_array() is not None:
                collection.set_cmap("viridis")
                if collection.colorbar is not None:
                    collection.colorbar.update_normal(collection)
    fig.set_size_inches(9, 5)
    fig.tight_layout()


def write_plots(study: Study, ostudy: optuna.Study, rows: list[Row], out: Path) -> tuple[list[str], list[str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
    written, skipped = [], []
    for i, metric in enumerate(study.metrics if complete else ()):
        suffix = "_" + metric.replace("/", "_") if len(study.metrics) > 1 else ""
        if plot_history(study, rows, i, metric, out / f"history{suffix}.png"):
            written.append(f"history{suffix}.png")
        drawn, words = plot_importances(study, ostudy, i, metric, out / f"param_importances{suffix}.png")
        written += [f"param_importances{suffix}.png"] if drawn else []
        skipped += [f"param_importances{suffix}.png ({words})"] if words else []
        name = f"parallel_coordinate{suffix}.png"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                vis.plot_parallel_coordinate(ostudy, target_name=metric, target=lambda t, i=i: t.values[i])
            legible(plt.gcf(), list(study.spec.space))
            write_figure(out / name, plt.gcf(), dpi=110)
            written.append(name)
        except Exception as err:  # optuna refuses some plots on too few trials; say so, keep the rest
            skipped.append(f"{name} ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
        finally:
            plt.close("all")
    if len(study.metrics) == 2 and complete:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                vis.plot_pareto_front(ostudy, target_names=study.metrics)
            legible(plt.gcf())
            write_figure(out / "pareto_front.png", plt.gcf(), dpi=110)
            written.append("pareto_front.png")
        except Exception as err:  # as above
            skipped.append(f"pareto_front.png ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
        finally:
            plt.close("all")
    if not complete:  # Optuna would draw empty axes
        skipped += [f"{name}.png (no complete trial of the study yet)" for name in ("history", "parallel_coordinate")]
    if plot_learning_curves(rows, out / LEARNING_CURVES, study.metrics[0], str(study.shared.task)):
        written.append(LEARNING_CURVES)
    else:
        skipped.append(f"{LEARNING_CURVES} (no trial run directory with TensorBoard events here)")
    return written, skipped


# --------------------------------------------------------------------------------------- a ladder's figures
