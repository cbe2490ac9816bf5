"""``linformer-lab report STUDY.yaml [--preset P] [--storage URL]``: what a study found.

Writes ``<output_dir>/<study>_<preset>/report/``:

* ``trials.csv``: one row per trial, the control's included (number, state, objective values, params,
  arm, fail reason, duration, every scalar of its metrics.json);
* ``summary.md``: the power check of the study's control (:func:`sweeps.stats.power_check`: does the
  reference arm leave the trivial baseline, does the known contrast separate beyond the seed spread?
  If not, it says above every verdict that the study has no power at this budget); per arm (the
  control's two arms included), each objective's mean ± std over replicates (seeds), n, and the trivial
  baseline (``trivial_loss`` / ``trivial_accuracy`` of metrics.json) beside it; every pairwise
  comparison of arms with a 95 % CI and a verdict in words (:mod:`sweeps.stats`); failed trials and
  their reasons; the best parameters of open (non-grid) studies;
* PNG plots (``optuna.visualization.matplotlib``): optimisation history, parameter importances (when
  at least 2 params vary), parallel coordinates, the Pareto front (2 objectives), and the validation
  loss against step of every trial, coloured by arm, read from the trials' TensorBoard events.

Everything but the learning curves comes from the storage, so a report of a study run on several
machines needs only the storage URL.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import optuna
from optuna.trial import FrozenTrial, TrialState

from foundation.errors import ConfigError
from sweeps import stats, storage
from sweeps.study import CONTROL_PARAM, Study, load_study
from sweeps.sweep import check_objective

TRIVIAL = {"trivial_loss": "trivial loss", "trivial_accuracy": "trivial accuracy"}
CURVE_TAG = "val/loss"


@dataclass
class Row:
    trial: FrozenTrial
    arm: str  # "learned" or "k=32 share=none"; "" when the study has no arms
    replicate: tuple  # the values of the non-arm params (e.g. (seed,))
    role: str = ""  # control trials: "reference" or "degraded"

    @property
    def metrics(self) -> dict:
        return self.trial.user_attrs.get("metrics", {})


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def control_label(study: Study, role: str) -> str:
    """``control reference (kind=full)``: a control arm named by its role and what it sets."""
    bundle = study.spec.space[CONTROL_PARAM].choices[role]
    return f"control {role} ({' '.join(f'{_short(k)}={v}' for k, v in bundle.items())})"


def rows_of(study: Study, trials: list[FrozenTrial]) -> list[Row]:
    """Trials that count (retried and discarded ones left out), with their arm and replicate."""
    excluded = storage.excluded_numbers(trials)
    rows = []
    for t in trials:
        if t.number in excluded or t.state in (TrialState.WAITING, TrialState.RUNNING):
            continue
        replicate = tuple(v for p, v in t.params.items() if p not in study.arms)
        if study.parent is not None:
            role = t.params[CONTROL_PARAM]
            rows.append(Row(t, control_label(study, role), replicate, role))
            continue
        arm = " ".join(str(v) if study.is_bundle(p) else f"{_short(p)}={v}"
                       for p, v in t.params.items() if p in study.arms)
        rows.append(Row(t, arm, replicate))
    return rows


# --------------------------------------------------------------------------------------- trials.csv
def write_csv(study: Study, rows: list[Row], path: Path) -> None:
    params = list(dict.fromkeys(p for r in rows for p in r.trial.params))
    metric_keys = sorted({k for r in rows for k in r.metrics} - set(study.metrics))
    header = ["number", "state", *study.metrics, "arm", *(f"params_{p}" for p in params), "fail_reason", "duration_s",
              *metric_keys, "run_dir"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            t = r.trial
            values = t.values if t.state == TrialState.COMPLETE else [None] * len(study.metrics)
            w.writerow([t.number, t.state.name, *values, r.arm, *(t.params.get(p) for p in params),
                        t.user_attrs.get("fail_reason") or "",
                        round(t.duration.total_seconds(), 1) if t.duration else None,
                        *(r.metrics.get(k) for k in metric_keys), t.user_attrs.get("run_dir", "")])


# --------------------------------------------------------------------------------------- summary.md
def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def _value(r: Row, metric: str, study: Study) -> Optional[float]:
    if r.trial.state != TrialState.COMPLETE:
        return None
    if metric in study.metrics:
        return r.trial.values[study.metrics.index(metric)]
    return r.metrics.get(metric)


def _mean_std(values: list[float]) -> str:
    s = stats.summarize(values)
    return "-" if s.n == 0 else stats.fmt(s.mean) if s.n == 1 else f"{stats.fmt(s.mean)} ± {stats.fmt(s.std)}"


def trivial_key(metric: str) -> Optional[str]:
    """The metrics.json entry holding the trivial baseline of ``metric`` (val/loss -> trivial_loss)."""
    for suffix in ("loss", "accuracy"):
        if metric.endswith(suffix):
            return f"trivial_{suffix}"
    return None


def power_section(study: Study, control_rows: list[Row], advice: str) -> tuple[list[str], Optional[bool]]:
    """The control contrast of the first objective: (lines, whether the study has power; None: not run)."""
    metric, direction = study.metrics[0], study.directions[0]
    by_role: dict[str, dict] = {"reference": {}, "degraded": {}}
    trivial: dict = {}
    key = trivial_key(metric)
    for r in control_rows:
        if (v := _value(r, metric, study)) is not None:
            by_role[r.role][r.replicate] = v
            if r.role == "reference" and key in r.metrics:
                trivial[r.replicate] = r.metrics[key]
    c = study.control
    lines = ["## Power check (control contrast)", "",
             f"A contrast known to be real, run at every seed: {control_label(c, 'reference')} against "
             f"{control_label(c, 'degraded')}; metric {metric} ({direction}).", ""]
    missing = [role for role, values in by_role.items() if len(values) < 2]
    if missing:
        arms = f"{' and '.join(missing)} {'arms have' if len(missing) > 1 else 'arm has'}"
        return lines + [f"Not judged: the control's {arms} fewer than 2 complete trials "
                        f"(run the same `sweep` command again). Without it, nothing below says whether this "
                        "budget can see an effect at all.", ""], None
    check = stats.power_check(by_role["reference"], by_role["degraded"], trivial, direction, advice)
    return lines + [f"- {line}" for line in check.lines] + [""], check.has_power


def arm_section(study: Study, rows: list[Row], advice: str, has_power: Optional[bool] = None) -> list[str]:
    arms = list(dict.fromkeys(r.arm for r in rows))
    shown = list(study.metrics) + [m for m in ("val/accuracy",) if m not in study.metrics
                                   and any(m in r.metrics for r in rows)]
    trivial = [k for k in TRIVIAL if any(k in r.metrics for r in rows)]
    header = ["arm", "n", *[f"{m} mean ± std" for m in shown], *[TRIVIAL[k] for k in trivial], "pruned/failed"]
    body = []
    for arm in arms:
        mine = [r for r in rows if r.arm == arm]
        ok = [r for r in mine if r.trial.state == TrialState.COMPLETE]
        body.append([arm, str(len(ok)),
                     *[_mean_std([v for r in ok if (v := _value(r, m, study)) is not None]) for m in shown],
                     *[stats.fmt(stats.summarize([r.metrics[k] for r in ok if k in r.metrics]).mean) for k in trivial],
                     f"{sum(r.trial.state == TrialState.PRUNED for r in mine)}/"
                     f"{sum(r.trial.state == TrialState.FAIL for r in mine)}"])
    # an open study's own trials have no arms: then only the control's are here, replicated over seeds
    replicates = [p for p in study.spec.space if p not in study.arms] if study.arms else ["seed"]
    out = ["## Arms", "", f"Replicates: {', '.join(replicates) or 'none'}. "
           "The trivial baseline is what a model that ignores its input reaches (unigram loss, chance accuracy).",
           "", *_table(header, body), ""]
    if has_power is False:
        out += ["**The power check failed (above): at this budget every verdict below is uninformative; "
                f"{advice}.**", ""]
    for metric, direction in zip(study.metrics, study.directions):
        comparisons = []
        for a, b in itertools.combinations(arms, 2):
            va = {r.replicate: v for r in rows if r.arm == a and (v := _value(r, metric, study)) is not None}
            vb = {r.replicate: v for r in rows if r.arm == b and (v := _value(r, metric, study)) is not None}
            c = stats.compare(va, vb)
            lo, hi = c.diff - c.half_width, c.diff + c.half_width
            ci = f"[{stats.fmt(lo)}, {stats.fmt(hi)}]" if math.isfinite(c.half_width) else "-"
            comparisons.append([a, b, stats.fmt(c.diff), ci, c.test, stats.verdict(a, b, c, direction, advice)])
        if comparisons:
            out += [f"## Comparisons of {metric} ({direction}; A − B with its 95 % CI)", "",
                    *_table(["A", "B", "A − B", "95 % CI", "test", "verdict"], comparisons), ""]
            if len(comparisons) > 1:
                out += [f"Each interval is 95 %: of {len(comparisons)} comparisons of arms that do not differ, "
                        f"about {0.05 * len(comparisons):.2g} would separate by chance alone.", ""]
    return out


def best_section(study: Study, ostudy: optuna.Study) -> list[str]:
    complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
    if not complete:
        return ["## Best parameters", "", "no complete trial yet", ""]
    best = ostudy.best_trials if len(study.metrics) > 1 else [ostudy.best_trial]
    title = "## Pareto-optimal trials" if len(study.metrics) > 1 else "## Best parameters"
    lines = [title, ""]
    for t in best:
        values = ", ".join(f"{m} = {stats.fmt(v)}" for m, v in zip(study.metrics, t.values))
        params = ", ".join(f"`{p}` = {v}" for p, v in t.params.items())
        lines.append(f"- trial {t.number}: {values}; {params}")
    return lines + [""]


def summary_md(study: Study, ostudy: optuna.Study, rows: list[Row], control_rows: list[Row], url: Optional[str],
               plots: list[str], skipped: list[str]) -> str:
    counts = {s: sum(r.trial.state == s for r in rows)
              for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    advice = "add seeds or training steps" if study.preset == "gpu" else "run the GPU preset"
    retried = sorted(storage.retried_numbers(ostudy.get_trials(deepcopy=False)))
    lines = [f"# Study {study.name}", "",
             f"- study file: `{study.path}`" + (f", preset `{study.preset}`" if study.preset else ""),
             f"- storage: `{storage.storage_display(study, url)}`",
             f"- trials: {len(rows)} finished of {study.n_trials if study.n_trials is not None else 'an open budget'} "
             f"({', '.join(f'{v} {s.name.lower()}' for s, v in counts.items())})",
             *([f"- control: {len(control_rows)} finished of {study.control.n_trials} "
                f"(study `{study.control.name}`, storage `{storage.storage_display(study.control, url)}`)"]
               if study.control is not None else []),
             "- objective: " + ", ".join(f"{m} ({d})" for m, d in zip(study.metrics, study.directions)),
             *([f"- retried with the same params after their worker died or was interrupted: trials "
                f"{', '.join(map(str, retried))}"] if retried else []),
             f"- sampler: {study.spec.sampler.kind}, pruner: {study.spec.pruner.kind}", ""]
    has_power = None
    if study.control is not None:
        power, has_power = power_section(study, control_rows, advice)
        lines += power
    arm_rows = (rows if study.arms else []) + control_rows
    if arm_rows:
        lines += arm_section(study, arm_rows, advice, has_power)
    if not study.is_grid:
        lines += best_section(study, ostudy)
    failed = [r for r in rows + control_rows if r.trial.state == TrialState.FAIL]
    if failed:
        lines += ["## Failed trials", ""] + [
            f"- {'control ' if r.role else ''}trial {r.trial.number} "
            f"({', '.join(f'{p}={v}' for p, v in r.trial.params.items())}): "
            f"{r.trial.user_attrs.get('fail_reason') or 'worker died and its retries ran out'}" for r in failed] + [""]
    lines += ["## Plots", ""] + [f"- `{p}`" for p in plots] + [f"- skipped: {s}" for s in skipped] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- plots
def _curves(rows: list[Row]) -> dict[str, list[tuple[list[int], list[float]]]]:
    """val/loss against step of each trial from its TensorBoard events, grouped by arm."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list] = {}
    for r in rows:
        run_dir = r.trial.user_attrs.get("run_dir")
        if not run_dir or not Path(run_dir).is_dir():
            continue
        ea = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        ea.Reload()
        if CURVE_TAG in ea.Tags().get("scalars", []):
            events = ea.Scalars(CURVE_TAG)
            out.setdefault(r.arm or f"trial {r.trial.number}", []).append(
                ([e.step for e in events], [e.value for e in events]))
    return out


def plot_learning_curves(rows: list[Row], path: Path) -> bool:
    import matplotlib.pyplot as plt

    curves = _curves(rows)
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, lines) in enumerate(curves.items()):
        for j, (steps, values) in enumerate(lines):
            ax.plot(steps, values, color=colors[i % len(colors)], alpha=0.8, marker=".",
                    label=arm if j == 0 and len(curves) <= 12 else None)
    trivial = [r.metrics["trivial_loss"] for r in rows if "trivial_loss" in r.metrics]
    if trivial:
        ax.axhline(sum(trivial) / len(trivial), color="black", linestyle="--", linewidth=1, label="trivial baseline")
    ax.set_xlabel("training step")
    ax.set_ylabel(CURVE_TAG)
    ax.set_title("validation loss of every trial, by arm")
    if len(curves) <= 12:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
            plt.gcf().savefig(out / name, dpi=110)
            written.append(name)
        except Exception as err:  # optuna refuses some plots on too few trials; say so, keep the rest
            skipped.append(f"{name} ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
        finally:
            plt.close("all")
    if plot_learning_curves(rows, out / "learning_curves.png"):
        written.append("learning_curves.png")
    else:
        skipped.append("learning_curves.png (no trial run directory with TensorBoard events here)")
    return written, skipped


# --------------------------------------------------------------------------------------- command
def load(study: Study, url: Optional[str]) -> optuna.Study:
    if url is None and not (study.root / storage.JOURNAL).is_file():
        raise ConfigError(f"{study.root / storage.JOURNAL}: no study journal here; "
                          f"run `linformer-lab sweep {study.path}` first")
    try:
        ostudy = optuna.load_study(study_name=study.name, storage=storage.open_storage(study, url))
    except KeyError:
        raise ConfigError(f"study {study.name}: not in {storage.storage_display(study, url)}; run the sweep first") from None
    check_objective(study, ostudy, url)
    return ostudy


def write_report(study: Study, url: Optional[str] = None) -> Path:
    ostudy = load(study, url)
    rows = rows_of(study, ostudy.get_trials(deepcopy=False))
    control_rows: list[Row] = []
    if study.control is not None:
        try:
            control_rows = rows_of(study.control, load(study.control, url).get_trials(deepcopy=False))
        except ConfigError:  # not run yet (e.g. a sweep interrupted before it began): the report says so
            pass
    out = study.root / "report"
    out.mkdir(parents=True, exist_ok=True)
    write_csv(study, rows + control_rows, out / "trials.csv")
    plots, skipped = write_plots(study, ostudy, rows + control_rows, out)
    (out / "summary.md").write_text(summary_md(study, ostudy, rows, control_rows, url, plots, skipped))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study file, e.g. sweeps/random_vs_learned.yaml")
    parser.add_argument("--preset", help="preset of the study file (default: cpu when it has one)")
    parser.add_argument("--storage", help="Optuna RDB URL the study ran on (default: its journal file)")


def main(args: argparse.Namespace) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study, args.preset)
    out = write_report(study, args.storage)
    print((out / "summary.md").read_text())
    print(f"report: {out}/ (summary.md, trials.csv, *.png)")
    return 0
