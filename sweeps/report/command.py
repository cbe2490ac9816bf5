"""``linformer-lab report STUDY.yaml [--preset P] [--storage URL] [--replicate]``: what a study found.

Writes ``<output_dir>/<study>_<preset>/report/``:

* ``trials.csv``: one row per trained trial, the control's included (number, state, objective values, params,
  arm, fail reason, duration, every scalar of its metrics.json);
* ``summary.md``: first the reference's context gain over a model without context (a study with a control,
  :class:`sweeps.control.ContextGain`): below the study's ``verdict.context_gain``, or with a CI holding 0, the
  only answer is "uninformative" and no verdict follows. Then the answer to the study's question in one sentence
  per objective (from the study's own arms), the δ used, the multiplicity (Holm) statement and how the
  validation sampling error is measured; the control's power check (:func:`sweeps.spec.stats.power_check`); per arm
  (the control's two arms included), each objective's mean ± std over replicates (seeds), n, the no-context
  baselines beside it (the unigram on the same targets, ``trivial_loss`` / ``trivial_accuracy``) and its success
  rate where the study file sets a threshold; every pair of the study's own arms on every objective with a 95 %
  CI, one of three verdicts (:mod:`sweeps.spec.stats`, docs/verdicts.md: better, on par within ±δ, or undecided with
  the seeds that would decide it) and its validation sampling error; quality against speed; failed trials and
  their reasons; the best parameters of open (non-grid) studies;
* PNG plots (:mod:`sweeps.report.figures`, with Optuna's): optimisation history, parameter importances (when
  at least 2 params vary), parallel coordinates, the Pareto front (2 objectives), and the validation
  loss against step of every trial, coloured by arm, read from the trials' TensorBoard events.
* a ladder study (``ladder:`` in the study file, docs/scale.md): arms are compared only within a rung; the
  answer and a scale section give each arm's gap to the reference per rung with its verdict and its trend
  over size, time to target, and the reference's attention rank across sizes, with ``gap_vs_size.png``,
  ``rank_vs_size.png`` and ``time_to_target_vs_size.png`` (:mod:`sweeps.report.scale`).

``--replicate`` reports the study's replication on fresh seeds (``sweep --replicate``, :mod:`sweeps.spec.replication`)
under ``<output_dir>/<study>_<preset>_replicate/report/``: its summary opens with each decided verdict of the original
beside the fresh seeds' own, replicated, not decided (with the seeds to add) or contradicted
(:mod:`sweeps.report.replication`, also ``replication.csv``), followed by the fresh seeds' own report.

The report is built in layers: numbers (:mod:`sweeps.spec.stats`, :mod:`sweeps.report.findings`, computed once
per report), and one module per section that owns its words, tables and figure (the control's power check
:mod:`sweeps.report.power`, the comparisons and their verdicts :mod:`sweeps.report.comparisons`, the context gain
:mod:`sweeps.report.context`, quality against speed :mod:`sweeps.report.efficiency`, a ladder's
:mod:`sweeps.report.scale`), over the formats of :mod:`sweeps.report.markdown`; the trials' figures are
:mod:`sweeps.report.figures`. This module puts them together. Everything but the learning curves comes from the
storage, so a report of a study run on several machines needs only the storage URL.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Optional

import optuna
from optuna.trial import TrialState

from foundation.atomic import atomic_text, atomic_write_text
from foundation.errors import ConfigError
from sweeps import stored
from sweeps.control import Row, control_label, reused_rows, rows_of, run_baselines, value
from sweeps.report import budget_curves, claims, comparisons, context, efficiency, figures, markdown, replication, scale
from sweeps.report.comparisons import comparisons_table, pair_sentence, seeds_advice
from sweeps.report.findings import Findings, findings
from sweeps.report.power import has_power, power_section
from sweeps.spec import budget, stats
from sweeps.spec.schema import ADDED_SEEDS, REPLICATE_SUFFIX
from sweeps.spec.study import Study, load_study
from sweeps.stored import check_objective

TRIVIAL = {"trivial_loss": "trivial loss", "trivial_accuracy": "trivial accuracy"}


# --------------------------------------------------------------------------------------- trials.csv
def write_csv(study: Study, rows: list[Row], path: Path) -> None:
    params = list(dict.fromkeys(p for r in rows for p in r.trial.params))
    metric_keys = sorted({k for r in rows for k in r.metrics} - set(study.metrics))
    header = ["number", "state", *study.metrics, "arm", *(f"params_{p}" for p in params), "fail_reason", "duration_s"]
    with atomic_text(path) as fh:
        w = csv.writer(fh)
        w.writerow(header + metric_keys + ["run_dir"])
        for r in rows:
            t = r.trial
            values = t.values if r.complete else [None] * len(study.metrics)
            w.writerow(
                [
                    t.number,
                    t.state.name,
                    *values,
                    r.arm,
                    *(t.params.get(p) for p in params),
                    t.user_attrs.get("fail_reason") or "",
                    round(t.duration.total_seconds(), 1) if t.duration else None,
                    *(r.metrics.get(k) for k in metric_keys),
                    t.user_attrs.get("run_dir", ""),
                ]
            )


# --------------------------------------------------------------------------------------- summary.md


def _open_answer(study: Study, ostudy: optuna.Study, found: Findings) -> list[str]:
    complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
    kind = study.spec.sampler.kind
    if not complete:
        return ["Open study: no complete trial yet."]
    if len(study.metrics) > 1:
        return [
            f"Open study ({kind}): {len(ostudy.best_trials)} Pareto-optimal trials of "
            f"{len(complete)} (below); it has no arms to compare."
        ]
    best = ostudy.best_trial
    return [
        f"Open study ({kind}): the best of {len(complete)} trials, {best.number}, reached "
        f"{study.metrics[0]} = {markdown.fmt(best.value)}{context.best_gain(study, best.value, found)} "
        "(parameters below); it has no arms to compare."
    ]


def control_progress(study: Study, control_rows: list[Row]) -> Optional[str]:
    """``1 of 6 control trials finished``, or ``none of the 6 control trials has finished``; None for a study without
    a control. Its points that are the study's own trials (reused) are not counted."""
    if study.control is None:
        return None
    ran, planned = sum(not r.reused for r in control_rows), study.control.n_trials
    return (
        f"{ran} of {planned} control trials finished" if ran else f"none of the {planned} control trials has finished"
    )


def waiting_for(study: Study, rows: list[Row], found: Findings, progress: Optional[str]) -> Optional[str]:
    """The answer while a grid study designed with two arms or more has fewer than two with a finished trial: how many
    of its own trials (and of its control's, which runs first) have finished; None otherwise."""
    designed = {study.arm_label(p) for p in (study.points or [])[: study.n_trials]}
    if len(found.own) >= 2 or len(designed) < 2:
        return None
    first = f" (its control runs first: {progress})" if progress is not None else ""
    return (
        f"Nothing to compare yet: {len(rows)} of {study.n_trials} of the study's own trials finished, "
        f"{len(found.own)} of its {len(designed)} arms so far{first}; the verdicts wait for them."
    )


def answer(
    study: Study, ostudy: optuna.Study, found: Findings, ladder: Optional[scale.Ladder], waiting: Optional[str] = None
) -> list[str]:
    """The answer to the study's question, one sentence per objective metric, from its own arms (``waiting``: the
    answer while the arms have not run, :func:`waiting_for`)."""
    if not study.is_grid:
        return _open_answer(study, ostudy, found)
    if ladder is not None and found.own:
        return scale.answer(ladder)
    if waiting is not None:
        return [waiting]
    if len(found.own) < 2:
        what = f"one arm ({found.own[0]})" if found.own else "no arm"
        return [f"Nothing to compare: the study has {what} of its own; the control's arms are compared below."]
    lines = []
    for metric in study.metrics:
        mine = found.of(metric)
        left = found.blind_on(metric)
        if len(mine) == 1 and not left:
            lines.append(pair_sentence(study, mine[0], found) + ".")
            continue
        groups = []
        par = f"on par within ±{markdown.fmt(study.delta(metric)[0])}"
        for kind, title in ((stats.BETTER, "better"), (stats.ON_PAR, par), (stats.UNDECIDED, "undecided")):
            these = [comparisons.short(c) for c in mine if c.verdict.kind == kind]
            if these:
                groups.append(f"{title}: {', '.join(these)}")
        if left:
            groups.append(comparisons.blind(left, found.arm_context))
        lines.append(f"Of the {len(mine) + len(left)} pairs of arms on {metric}: {'; '.join(groups)}.")
    return lines


def header_section(
    study: Study, answered: list[str], found: Findings, advice: str, progress: Optional[str] = None
) -> list[str]:
    """The first lines of summary.md: the reference's context gain (a study with a control; ``progress``: how far the
    control has run, :func:`control_progress`), the answer, the δ used, the Holm statement. A reference that did not
    learn to use context leaves one answer: uninformative."""
    reference = control_label(study.control, "reference") if study.control else ""
    out = [context.line(found.context, reference, progress), ""] if study.control else []
    if not found.informative:
        return out + [f"**Answer:** {context.uninformative(found.context)}", ""]
    label = "**Answer:**"
    if has_power(found) is False:
        label = f"**Answer (uninformative: the control's power check below failed; {advice}):**"
    elif found.power is None and study.control is not None:
        label = f"**Answer (power not judged yet: {progress}):**"
    out += [f"{label} {line}" for line in answered] + [""]
    deltas = [f"{m} ±{markdown.fmt(d)} ({source})" for m in study.metrics for d, source in [study.delta(m)]]
    out.append(f"- δ, the margin within which two arms are on par: {', '.join(deltas)}.")
    out += comparisons.holm_line(found) + comparisons.family_line(found)
    out += comparisons.noise_line(found)
    for m, direction in zip(study.metrics, study.directions):
        if (threshold := study.success(m)) is not None:
            out.append(
                f"- Success: a run with {m} {markdown.at_or_beyond(direction)} {markdown.fmt(threshold)} "
                "solved the task (study file); success rates with exact (Clopper–Pearson) 95 % intervals, "
                "compared by Boschloo's exact test."
            )
    return out + [""]


def _numbers(r: Row) -> dict:
    """The trial's numbers with its run's no-context baselines (``baselines/unigram/<metric>``) beside them."""
    return {**r.metrics, **run_baselines(r)}


def _arm_row(study: Study, arm: str, rows: list[Row], found: Findings, shown: list[str], trivial: list[str]) -> list:
    mine = [r for r in rows if r.arm == arm]
    ok = [r for r in mine if r.complete]
    successes = [(m, d, t) for m, d in zip(study.metrics, study.directions) if (t := study.success(m)) is not None]
    return [
        arm,
        str(len(ok)),
        *[markdown.mean_std([v for r in ok if (v := value(r, m, study)) is not None]) for m in shown],
        *[str(stats.success_rate(list(found.values[(arm, m)].values()), t, d)) for m, d, t in successes],
        *[markdown.fmt(stats.summarize([m[k] for m in map(_numbers, ok) if k in m]).mean) for k in trivial],
        *([context.gain_cell(found, arm, mine)] if found.arm_context else []),
        "/".join(str(sum(r.trial.state == s for r in mine)) for s in (TrialState.PRUNED, TrialState.FAIL)),
    ]


def arms_table(study: Study, rows: list[Row], found: Findings) -> list[str]:
    """Per arm: n, each objective's mean ± std, success rates, the trivial baseline, pruned/failed."""
    shown = list(study.metrics) + [
        m for m in ("val/accuracy",) if m not in study.metrics and any(m in r.metrics for r in rows)
    ]
    numbers = [_numbers(r) for r in rows]
    unigram = [f"baselines/unigram/{m.removeprefix('val/')}" for m in study.metrics]
    trivial = [k for k in unigram if any(k in n for n in numbers)] + [
        k for k in TRIVIAL if any(k in n for n in numbers)
    ]
    header = [
        "arm",
        "n",
        *[f"{m} mean ± std" for m in shown],
        *[
            f"{m} {markdown.at_or_beyond(d)} {markdown.fmt(t)}: solved [95 % CI]"
            for m, d in zip(study.metrics, study.directions)
            if (t := study.success(m)) is not None
        ],
        *[TRIVIAL.get(k, k.removeprefix("baselines/").replace("/", " ")) for k in trivial],
        *([f"context gain on {study.metrics[0]} [95 % CI]"] if found.arm_context else []),
        "pruned/failed",
    ]
    body = [_arm_row(study, arm, rows, found, shown, trivial) for arm in found.arms]
    # an open study's own trials have no arms: then only the control's are here, replicated over seeds
    replicates = [p for p in study.spec.space if p not in study.arms] if study.arms else ["seed"]
    return [
        "## Arms",
        "",
        f"Replicates: {', '.join(replicates) or 'none'}. "
        "The no-context baselines are what a model that ignores its context reaches: the unigram on the same "
        "targets (metrics.json `baselines`), the trivial loss and accuracy (unigram loss, chance accuracy).",
        "",
        *markdown.table(header, body),
        "",
    ]


def arm_section(study: Study, rows: list[Row], found: Findings, advice: str) -> list[str]:
    out = arms_table(study, rows, found)
    if has_power(found) is False:
        out += [
            f"**The power check failed (above): at this budget every verdict below is uninformative; {advice}.**",
            "",
        ]
    if not found.informative:
        return out + ["No comparisons: the reference did not learn to use context (above), so no verdict is given.", ""]
    for metric, direction in zip(study.metrics, study.directions):
        if found.of(metric):
            out += comparisons_table(found, metric, direction)
        if left := found.blind_on(metric):
            out += [f"Left out of the comparisons on {metric}: {comparisons.blind(left, found.arm_context)}.", ""]
    return out + seeds_advice(study, found)


def best_section(study: Study, ostudy: optuna.Study) -> list[str]:
    complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
    if not complete:
        return ["## Best parameters", "", "no complete trial yet", ""]
    best = ostudy.best_trials if len(study.metrics) > 1 else [ostudy.best_trial]
    title = "## Pareto-optimal trials" if len(study.metrics) > 1 else "## Best parameters"
    lines = [title, ""]
    for t in best:
        values = ", ".join(f"{m} = {markdown.fmt(v)}" for m, v in zip(study.metrics, t.values))
        params = ", ".join(f"`{p}` = {v}" for p, v in t.params.items())
        lines.append(f"- trial {t.number}: {values}; {params}")
    return lines + [""]


def study_lines(study: Study, ostudy: optuna.Study, rows: list[Row], control_rows: list[Row], url) -> list[str]:
    """What was run: the file, the storage, the trials, the objective, retries, added seeds, sampler."""
    counts = {
        s: sum(r.trial.state == s for r in rows) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    trials = ostudy.get_trials(deepcopy=False)
    retried = sorted(stored.retried_numbers(trials))
    interrupted = [t.number for t in trials if t.number in retried and stored.INTERRUPTED in t.user_attrs]
    out = [
        f"- study file: `{study.path}`" + (f", preset `{study.preset}`" if study.preset else ""),
        f"- storage: `{stored.storage_display(study, url)}`",
        f"- trials: {len(rows)} finished of {study.n_trials if study.n_trials is not None else 'an open budget'} "
        f"({', '.join(f'{v} {s.name.lower()}' for s, v in counts.items())})",
    ]
    if study.control is not None:
        reused = sum(r.reused for r in control_rows)
        out.append(
            f"- control: {len(control_rows) - reused} finished of {study.control.n_trials} "
            f"(study `{study.control.name}`, storage `{stored.storage_display(study.control, url)}`)"
            + (f"; {reused} more are the study's own trials, reused" if reused else "")
        )
    out.append("- objective: " + ", ".join(f"{m} ({d})" for m, d in zip(study.metrics, study.directions)))
    if interrupted:
        out.append(
            "- interrupted (SIGTERM or Ctrl-C), not failed: trials "
            + ", ".join(map(str, interrupted))
            + ", each put back and continued by a copy from its last checkpoint (not counted)"
        )
    if died := [n for n in retried if n not in interrupted]:
        out.append("- retried with the same params after their worker died: trials " + ", ".join(map(str, died)))
    if study.added_seeds:
        out.append(f"- seeds added by `sweep --add-seeds`: {', '.join(map(str, study.added_seeds))}")
        out.append(f"- verdicts {claims.two_stage_words(study.added_seeds)}")
    if study.replicate is None and url is None and (replica_root(study) / stored.JOURNAL).is_file():
        out.append(f"- replicated on fresh seeds: `linformer-lab report {study.file_args} --replicate`")
    if study.replicate is None and url is None:
        for name in stored.family_names(study):
            factor = name.removeprefix(study.name + budget.SUFFIX)
            if name.startswith(study.name + budget.SUFFIX) and (study.root.with_name(name) / stored.JOURNAL).is_file():
                out.append(
                    f"- re-asked at ×{factor} the budget: `linformer-lab report {study.file_args} --budget {factor}`"
                )
    return out + [f"- sampler: {study.spec.sampler.kind}, pruner: {study.spec.pruner.kind}", ""]


def replica_root(study: Study) -> Path:
    """Where the study's replication (``sweep --replicate``) lies, beside it."""
    return study.root.with_name(study.root.name + REPLICATE_SUFFIX)


def failed_section(rows: list[Row]) -> list[str]:
    failed = [r for r in rows if r.trial.state == TrialState.FAIL]
    if not failed:
        return []
    return (
        ["## Failed trials", ""]
        + [
            f"- {'control ' if r.role else ''}trial {r.trial.number} "
            f"({', '.join(f'{p}={v}' for p, v in r.trial.params.items())}): "
            f"{r.trial.user_attrs.get('fail_reason') or 'worker died and its retries ran out'}"
            for r in failed
        ]
        + [""]
    )


def advice_of(study: Study) -> str:
    """What to do when the study cannot answer: its GPU preset where its file has one it is not run at, else more
    seeds or steps."""
    if study.preset != "gpu" and "gpu" in study.presets:
        return "run the GPU preset (--preset gpu)"
    return "add seeds or training steps"


def summary_md(
    report: "Report", plots: list[str], skipped: list[str], scale_lines: list[str] = (), replicated: list[str] = ()
) -> str:
    """The report's summary; ``replicated``: a replication's section (:func:`replication_lines`), which opens it."""
    study, found, advice = report.study, report.found, advice_of(report.study)
    arm_rows = (report.rows if study.arms else []) + report.control_rows
    progress = control_progress(study, report.control_rows)
    answered = answer(study, report.ostudy, found, report.ladder, waiting_for(study, report.rows, found, progress))
    curves = [figures.embed(figures.LEARNING_CURVES, study), ""] if figures.LEARNING_CURVES in plots else []
    lines = [
        f"# Study {study.name}",
        "",
        *replicated,
        *(own_report_heading(study) if replicated else []),
        *header_section(study, answered, found, advice, progress),
        *study_lines(study, report.ostudy, report.rows, report.control_rows, report.url),
        *(power_section(study, found, advice, progress) if study.control is not None else []),
        *scale_lines,
        *(arm_section(study, arm_rows, found, advice) + curves if arm_rows else []),
        *efficiency.section(
            speeds_of(study, report.rows), study.metrics[0], study.directions[0] == "maximize", report.blind
        ),
        *(best_section(study, report.ostudy) if not study.is_grid else []),
        *failed_section(report.rows + [r for r in report.control_rows if not r.reused]),
    ]
    return "\n".join(lines + figures_section(study, plots, skipped, "\n".join(lines)))


def own_report_heading(study: Study) -> list[str]:
    """The heading under a replication's or a curve's section, above the study's own report: a curve study's reads
    its trials at the largest budget, the control judged there, where the section above reads each budget."""
    if not study.budgets:
        return ["## The fresh seeds' own report", ""]
    largest = f"×{study.budgets[-1]:g}"
    return [
        f"## At the largest budget, {largest}: the fresh seeds' own report",
        "",
        f"Below, every trial reads as its cooldown at {largest}, and the control is judged there alone; the section "
        "above reads each budget, and its verdicts are the study's answer.",
        "",
    ]


def figures_section(study: Study, plots: list[str], skipped: list[str], above: str) -> list[str]:
    """The figures not already shown in the section they illustrate (``above``: summary.md so far), each with what it
    shows, and those not drawn with the reason."""
    rest = [p for p in plots if f"]({p})" not in above]
    if not rest and not skipped:
        return []
    shown = [line for p in rest for line in (figures.embed(p, study), "")]
    return ["## Figures", "", *shown, *[f"- skipped: {s}" for s in skipped], ""]


def speeds_of(study: Study, rows: list[Row]) -> list[efficiency.ArmSpeed]:
    """Quality and speed of each arm of the study's own complete trials (none for a study without arms)."""
    complete = [r for r in rows if r.complete]
    return efficiency.arm_speeds(complete, study.metrics[0]) if study.arms else []


# --------------------------------------------------------------------------------------- replication
def seeds_words(study: Study) -> str:
    """``seeds 0–4, control 0–2``: the seeds a study ran, those ``--add-seeds`` added included and named
    (``…; 5, 6 added by `sweep --add-seeds```)."""
    control = f", control {replication.seed_range(study.control.seeds)}" if study.control is not None else ""
    added = f"; {replication.seed_range(study.added_seeds)} added by `sweep --add-seeds`" if study.added_seeds else ""
    return f"seeds {replication.seed_range(study.seeds)}{control}{added}"


def _gain_words(found: Findings) -> str:
    gain = found.context
    if gain is None:
        return "not judged yet"
    words = f"{markdown.fmt(gain.gain)} {markdown.interval(*gain.comparison.ci())}"
    return words if gain.informative else f"{words} (below the {markdown.fmt(gain.threshold)} it needs: uninformative)"


def replication_lines(report: "Report", out: Path) -> list[str]:
    """A derived study's section (:mod:`sweeps.report.replication`): each verdict of the original beside the fresh
    seeds' own (a replication), or what it is at F × the budget (``--budget F``), also written to
    ``replication.csv``; one line when the original has not run."""
    fresh = report.study
    title = (
        f"## Replication of {fresh.original_name} on fresh seeds"
        if fresh.factor is None
        else f"## {fresh.original_name} re-asked at ×{fresh.factor:g} the budget"
    )
    try:
        original = Report(load_study(fresh.path, fresh.preset), report.url)
    except ConfigError as err:
        return [
            title,
            "",
            f"**Context gain of the reference:** {_gain_words(report.found)} on the fresh seeds.",
            "",
            f"Nothing to compare yet: {err}.",
            "",
        ]
    outcomes = replication.replicate(original.found, report.found, fresh.control is not None)
    earlier = [original.found, *_replica_found(fresh, report.url)]  # every earlier seed of the family, pooled
    at = [replication.at_budget(o, replication.pooled_earlier(o, earlier)) for o in outcomes] if fresh.factor else None
    replication.write_csv(outcomes, out / "replication.csv", at)
    gains = f"{_gain_words(original.found)} on the design's seeds, {_gain_words(report.found)} on the fresh ones"
    if fresh.factor is not None:
        return replication.budget_section(
            original.study.name,
            fresh.factor,
            outcomes,
            gains,
            endings(original, report),
            seeds_words(fresh),
            replication.undecided_at_budget(original.found, report.found),
            at,
        )
    return replication.section(
        original.study.name,
        seeds_words(original.study),
        seeds_words(fresh),
        outcomes,
        gains,
        replication.undecided(original.found),
        f"`linformer-lab sweep {fresh.file_args} --add-seeds {{n}}`",
    )


def _replica_found(fresh: Study, url: Optional[str]) -> list:
    """The replication's findings where it has run (its seeds pool with the design's as the earlier estimate)."""
    try:
        return [Report(load_study(fresh.path, fresh.preset, replicate=True), url).found]
    except ConfigError:
        return []


def endings(original: "Report", larger: "Report") -> list[tuple[str, str, str]]:
    """Per arm of the study: whether its runs were still improving at their end, at ×1 and at ×F
    (:func:`sweeps.report.replication.ending`), from the trials' curves of the first objective (the sample curve,
    :func:`sweeps.report.figures.step_curves`) and its seed spread."""
    metric, sense, out = larger.study.metrics[0], larger.study.directions[0], []
    if larger.study.shared.optim.schedule != "constant":  # the loss falls where the learning rate decays, at any budget
        return [(arm, replication.DECAYING, replication.DECAYING) for arm in larger.found.own]
    for arm in larger.found.own:
        cells = []
        for report in (original, larger):
            rows = [r for r in report.rows if r.arm == arm and r.complete]
            curves = [c for lines in figures.step_curves(rows, metric).values() for c in lines]
            finals = list(report.found.values.get((arm, metric), {}).values())
            cells.append(replication.ending_cell(replication.ending(arm, curves, finals, sense)))
        out.append((arm, *cells))
    return out


# --------------------------------------------------------------------------------------- command
def load(study: Study, url: Optional[str]) -> optuna.Study:
    if url is None and not (study.root / stored.JOURNAL).is_file():
        raise ConfigError(
            f"{study.root / stored.JOURNAL}: no study journal here; run `linformer-lab sweep {study.file_args}` first"
        )
    try:
        ostudy = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, url, create=False))
    except KeyError:
        raise ConfigError(
            f"study {study.name}: not in {stored.storage_display(study, url)}; run `linformer-lab sweep "
            f"{study.file_args} --storage URL` first"
        ) from None
    check_objective(study, ostudy, url)
    return ostudy


class Report:
    """A study's trials read from its storage, and what they found (computed once)."""

    def __init__(self, study: Study, url: Optional[str]) -> None:
        ostudy = load(study, url)
        added = [int(s) for s in ostudy.user_attrs.get(ADDED_SEEDS, []) if int(s) not in study.added_seeds]
        if added:  # the grid and budget as `sweep --add-seeds` grew them (the file is not read again)
            study = study.with_seeds(added)
        self.study, self.ostudy, self.url = study, ostudy, url
        self.rows = rows_of(study, ostudy.get_trials(deepcopy=False))
        self.control_rows: list[Row] = []
        if study.control is not None:
            try:
                self.control_rows = rows_of(study.control, load(study.control, url).get_trials(deepcopy=False))
            except ConfigError:  # not run yet (e.g. a sweep interrupted before it began): the report says so
                pass
            self.control_rows += reused_rows(study, self.rows)
        self.found = findings(study, self.rows if study.arms else [], self.control_rows)
        own = [r for r in self.rows if not r.role]
        self.ladder = scale.build(study, own, self.found) if study.ladder is not None and self.found.own else None
        # The control's degraded arm as a model without context trained beside the arms (none when the study's
        # no-context level is a baseline): what a time to target must beat.
        degraded = [r for r in self.control_rows if r.role == "degraded" and r.complete]
        self.blind = efficiency.arm_speeds(degraded, study.metrics[0]) if study.no_context_source == "degraded" else []


def write_report(study: Study, url: Optional[str] = None) -> Path:
    if study.replicate is not None:  # a derived study's seeds, re-checked from what the family's storages hold
        stored.check_derived(study, url)
    report = Report(study, url)
    study = report.study
    out = study.root / "report"
    out.mkdir(parents=True, exist_ok=True)
    trained = report.rows + [r for r in report.control_rows if not r.reused]  # each trial once
    write_csv(study, trained, out / "trials.csv")
    plots, skipped = figures.write_plots(study, report.ostudy, trained, out)
    speeds = speeds_of(study, report.rows)
    if efficiency.pareto(speeds, study.metrics[0], study.directions[0] == "maximize", out / "pareto.png"):
        plots.append("pareto.png")
    scale_lines: list[str] = []
    if report.ladder is not None:  # the gap across sizes, its trend, the spectrum across sizes (sweeps/report/scale.py)
        ttt = scale.time_to_target(report.ladder, report.blind)
        spectra = scale.spectrum_across_sizes(report.ladder, out / "spectra")
        drawn, not_drawn = scale.write_ladder(report.ladder, ttt, spectra, out)
        scale_lines = scale.section(report.ladder, ttt, spectra, drawn)
        plots, skipped = plots + drawn, skipped + not_drawn
    replicated = replication_lines(report, out) if study.replicate is not None and not study.budgets else []
    if study.budgets:  # every verdict as a curve over budget (sweeps/report/budget_curves.py)
        replicated = budget_curves.report_lines(study, report.rows, report.control_rows, out)
    atomic_write_text(out / "summary.md", summary_md(report, plots, skipped, scale_lines, replicated))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study file, e.g. sweeps/random_vs_learned.yaml")
    parser.add_argument("--preset", help="preset of the study file (default: cpu when it has one)")
    parser.add_argument("--storage", help="Optuna RDB URL the study ran on (default: its journal file)")
    parser.add_argument(
        "--replicate",
        action="store_true",
        help="report the study's replication on fresh seeds (sweep --replicate): each verdict of the original "
        "beside the fresh seeds' own, replicated, not decided or contradicted",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="F",
        help="report the study re-asked at F times its steps (sweep --budget F): each verdict of the original "
        "holds, is smaller in the same direction, or changed; and whether the arms were still improving",
    )
    parser.add_argument(
        "--budgets",
        metavar="F1,F2,...",
        help="report the study's budget curves (sweep --budgets): each verdict's effect at every budget, where it "
        "settled, and whether it is about learning speed or the quality reached",
    )


def main(args: argparse.Namespace) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study, args.preset, replicate=args.replicate, factor=args.budget, curve=args.budgets)
    out = write_report(study, args.storage)
    print((out / "summary.md").read_text())
    print(f"report: {out}/ (summary.md, trials.csv, *.png)")
    return 0
