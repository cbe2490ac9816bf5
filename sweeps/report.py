"""``linformer-lab report STUDY.yaml [--preset P] [--storage URL]``: what a study found.

Writes ``<output_dir>/<study>_<preset>/report/``:

* ``trials.csv``: one row per trial, the control's included (number, state, objective values, params,
  arm, fail reason, duration, every scalar of its metrics.json);
* ``summary.md``: the power check of the study's control (:func:`sweeps.stats.power_check`: does the
  reference arm leave the trivial baseline, does the known contrast separate beyond the seed spread?
  If not, it says above every verdict that the study has no power at this budget); per arm (the
  control's two arms included), each objective's mean ± std over replicates (seeds), n, and the trivial
  baseline (``trivial_loss`` / ``trivial_accuracy`` of metrics.json) beside it, and its success rate
  where the study file sets a threshold; every pairwise comparison of arms on every objective with a
  95 % CI and one of three verdicts (:mod:`sweeps.stats`, docs/verdicts.md): better, on par within ±δ,
  or undecided with the seeds that would decide it; failed trials and their reasons; the best
  parameters of open (non-grid) studies. Its first lines answer the study's question in one sentence
  (from the study's own arms), then give the δ used and the multiplicity (Holm) statement;
* PNG plots (``optuna.visualization.matplotlib``): optimisation history, parameter importances (when
  at least 2 params vary), parallel coordinates, the Pareto front (2 objectives), and the validation
  loss against step of every trial, coloured by arm, read from the trials' TensorBoard events.
* a ladder study (``ladder:`` in the study file, docs/scale.md): arms are compared only within a rung; the
  answer and a scale section give each arm's gap to the reference per rung with its verdict and its trend
  over size, time to target, and the reference's attention rank across sizes, with ``gap_vs_size.png``,
  ``rank_vs_size.png`` and ``time_to_target_vs_size.png`` (:mod:`sweeps.scale`).

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

from foundation.atomic import atomic_text, atomic_write_text, write_figure
from foundation.errors import ConfigError
from sweeps import efficiency, scale, stats, storage
from sweeps.study import ADDED_SEEDS, CONTROL_PARAM, Study, load_study
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
        rows.append(Row(t, study.arm_label(t.params), replicate))
    return rows


# --------------------------------------------------------------------------------------- trials.csv
def write_csv(study: Study, rows: list[Row], path: Path) -> None:
    params = list(dict.fromkeys(p for r in rows for p in r.trial.params))
    metric_keys = sorted({k for r in rows for k in r.metrics} - set(study.metrics))
    header = [
        "number",
        "state",
        *study.metrics,
        "arm",
        *(f"params_{p}" for p in params),
        "fail_reason",
        "duration_s",
        *metric_keys,
        "run_dir",
    ]
    with atomic_text(path) as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            t = r.trial
            values = t.values if t.state == TrialState.COMPLETE else [None] * len(study.metrics)
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
    lines = [
        "## Power check (control contrast)",
        "",
        f"A contrast known to be real, run at every seed: {control_label(c, 'reference')} against "
        f"{control_label(c, 'degraded')}; metric {metric} ({direction}).",
        "",
    ]
    missing = [role for role, values in by_role.items() if len(values) < 2]
    if missing:
        arms = f"{' and '.join(missing)} {'arms have' if len(missing) > 1 else 'arm has'}"
        return lines + [
            f"Not judged: the control's {arms} fewer than 2 complete trials "
            f"(run the same `sweep` command again). Without it, nothing below says whether this "
            "budget can see an effect at all.",
            "",
        ], None
    check = stats.power_check(by_role["reference"], by_role["degraded"], trivial, direction, advice)
    return lines + [f"- {line}" for line in check.lines] + [""], check.has_power


# --------------------------------------------------------------------------------------- verdicts
@dataclass
class Compared:
    """One comparison of the report: a pair of arms on one metric, with its verdict."""

    pair: stats.Pair
    verdict: stats.Verdict
    n_a: int  # replicates with a value, per arm
    n_b: int
    own: bool  # both arms are the study's own (not the control's)

    @property
    def seeds(self) -> str:
        return f"{self.n_a} seeds each" if self.n_a == self.n_b else f"{self.n_a} and {self.n_b} seeds"


@dataclass
class RatesCompared:
    metric: str
    threshold: float
    a: str
    b: str
    rate_a: stats.Rate
    rate_b: stats.Rate
    p: float  # Boschloo's two-sided p, and Holm-adjusted (a member of the "better" family)
    p_holm: float = math.nan

    @property
    def better(self) -> Optional[str]:
        """The arm that solves the task more often, when Boschloo's test shows it after Holm."""
        if self.p_holm >= stats.ALPHA:
            return None
        return self.a if self.rate_a.k / self.rate_a.n > self.rate_b.k / self.rate_b.n else self.b

    @property
    def text(self) -> str:
        return f"{self.better} solves it more often" if self.better else "undecided (no difference shown)"


@dataclass
class Findings:
    arms: list[str]
    values: dict  # (arm, metric) -> {replicate: value}
    compared: list[Compared]
    rates: list[RatesCompared]

    def family(self) -> tuple[int, int]:
        """(size of the "better" family, size of the "on par" family)."""
        return len(self.compared) + len(self.rates), len(self.compared)


def compared_pairs(study: Study, rows: list[Row], arms: list[str]) -> list[tuple[str, str]]:
    """The pairs of arms a report compares: every pair; on a ladder, only the study's own arms at the same rung,
    and the control's two arms (a 37k-parameter model against a 344k one answers no question of the study)."""
    pairs = list(itertools.combinations(arms, 2))
    if study.ladder is None:
        return pairs
    rung = {r.arm: (bool(r.role), r.trial.params.get(study.ladder.rung)) for r in rows}
    return [(a, b) for a, b in pairs if rung[a] == rung[b]]


def findings(study: Study, rows: list[Row]) -> Findings:
    """Every pair of arms on every objective metric, judged together (Holm over the report's tests)."""
    arms = list(dict.fromkeys(r.arm for r in rows))
    own = {r.arm for r in rows if not r.role}
    values = {
        (arm, m): {r.replicate: v for r in rows if r.arm == arm and (v := _value(r, m, study)) is not None}
        for arm in arms
        for m in study.metrics
    }
    pairs, rates = [], []
    for metric, direction in zip(study.metrics, study.directions):
        delta, _ = study.delta(metric)
        threshold = study.success(metric)
        for a, b in compared_pairs(study, rows, arms):
            va, vb = values[(a, metric)], values[(b, metric)]
            pairs.append(
                (
                    stats.Pair(a, b, metric, direction, delta, stats.compare(va, vb)),
                    len(va),
                    len(vb),
                    a in own and b in own,
                )
            )
            if threshold is not None:
                ra, rb = (stats.success_rate(list(v.values()), threshold, direction) for v in (va, vb))
                rates.append(RatesCompared(metric, threshold, a, b, ra, rb, stats.compare_rates(ra, rb)))
    verdicts, rate_p = stats.judge([p for p, *_ in pairs], [r.p for r in rates])
    for r, p in zip(rates, rate_p):
        r.p_holm = p
    compared = [Compared(pair, v, n_a, n_b, own_pair) for (pair, n_a, n_b, own_pair), v in zip(pairs, verdicts)]
    return Findings(arms, values, compared, rates)


def _add_seeds_command(study: Study, n: int) -> str:
    preset = f" --preset {study.preset}" if study.preset else ""
    return f"`linformer-lab sweep {study.path}{preset} --add-seeds {n}`"


def _at_or_beyond(direction: str) -> str:
    return "≥" if direction == "maximize" else "≤"


def _p(p: float) -> str:
    text = stats.fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def _pair_sentence(study: Study, c: Compared, rates: list[RatesCompared]) -> str:
    pair, v, comparison = c.pair, c.verdict, c.pair.comparison
    metric, delta = pair.metric, stats.fmt(pair.delta)
    if v.kind == stats.ON_PAR:
        text = (
            f"{pair.a} and {pair.b} are on par within ±{delta} {metric} "
            f"(TOST {_p(v.tost_p_holm)} after Holm, {c.seeds})"
        )
    elif v.kind == stats.BETTER:
        a_wins = comparison.a_better(pair.direction)
        better, worse = (pair.a, pair.b) if a_wins else (pair.b, pair.a)
        sign = 1 if a_wins == (pair.direction == "maximize") else -1
        lo, hi = sorted(sign * x for x in comparison.ci())
        text = (
            f"{better} is better than {worse} on {metric} by {stats.fmt(abs(comparison.diff))} (95 % CI "
            f"[{stats.fmt(lo)}, {stats.fmt(hi)}], Holm-adjusted {_p(v.p_holm)}, {c.seeds})"
        )
    elif v.more_seeds is not None:
        if v.deciding == stats.BETTER:
            other = (
                f"'on par' would need {v.more(v.seeds_on_par)} more"
                if v.seeds_on_par is not None
                else f"parity within ±{delta} is out of reach"
                if abs(comparison.diff) >= pair.delta
                else f"'on par' would need over {stats.MAX_SEEDS} seeds per arm"
            )
        else:
            other = (
                f"'better' would need {v.more(v.seeds_better)} more"
                if v.seeds_better is not None
                else "no difference was observed to plan 'better' for"
                if comparison.diff == 0
                else f"'better' would need over {stats.MAX_SEEDS} seeds per arm"
            )
        text = (
            f"{pair.a} vs {pair.b} on {metric} is undecided after {c.seeds}: {v.more_seeds} more seeds per arm "
            f"would show '{v.deciding}'"
            + (f" within ±{delta}" if v.deciding == stats.ON_PAR else "")
            + f" at {stats.PCT} power if the observed difference ({stats.fmt(comparison.diff)}) and spread hold "
            f"({other})"
        )
    else:
        text = (
            f"{pair.a} vs {pair.b} on {metric} is undecided at ±{delta} after {c.seeds}: "
            f"{v.text.removeprefix('undecided: ')}"
        )
    for r in rates:
        if (r.metric, r.a, r.b) == (metric, pair.a, pair.b):
            text += (
                f"; runs reaching {metric} {_at_or_beyond(pair.direction)} {stats.fmt(r.threshold)}: "
                f"{r.rate_a.k}/{r.rate_a.n} vs {r.rate_b.k}/{r.rate_b.n}, Boschloo {_p(r.p_holm)} after Holm"
                + (f": {r.better} solves it more often" if r.better else "")
            )
    if v.kind == stats.UNDECIDED and v.more_seeds is not None:
        text += f"; plan the seeds now and add them all with {_add_seeds_command(study, v.more_seeds)}"
    return text


def _short_verdict(c: Compared) -> str:
    pair, v = c.pair, c.verdict
    if v.kind == stats.BETTER:
        return v.text
    if v.kind == stats.ON_PAR:
        return f"{pair.a} and {pair.b}"
    more = f"{v.more_seeds} more seeds" if v.more_seeds is not None else "no plan yet"
    return f"{pair.a} vs {pair.b} ({more})"


def answer(study: Study, ostudy: optuna.Study, found: Findings, rows: list[Row]) -> list[str]:
    """The answer to the study's question, one sentence per objective metric, from its own arms."""
    own = [a for a in found.arms if any(r.arm == a and not r.role for r in rows)]
    if not study.is_grid:
        complete = [t for t in ostudy.trials if t.state == TrialState.COMPLETE]
        if not complete:
            return ["Open study: no complete trial yet."]
        if len(study.metrics) > 1:
            return [
                f"Open study ({study.spec.sampler.kind}): {len(ostudy.best_trials)} Pareto-optimal trials of "
                f"{len(complete)} (below); it has no arms to compare."
            ]
        best = ostudy.best_trial
        return [
            f"Open study ({study.spec.sampler.kind}): the best of {len(complete)} trials, {best.number}, reached "
            f"{study.metrics[0]} = {stats.fmt(best.value)} (parameters below); it has no arms to compare."
        ]
    if study.ladder is not None and own:
        return scale.answer(scale.build(study, rows, found))
    if len(own) < 2:
        what = f"one arm ({own[0]})" if own else "no arm"
        return [f"Nothing to compare: the study has {what} of its own; the control's arms are compared below."]
    lines = []
    for metric in study.metrics:
        mine = [c for c in found.compared if c.own and c.pair.metric == metric]
        rates = [r for r in found.rates if r.metric == metric]
        if len(mine) == 1:
            lines.append(_pair_sentence(study, mine[0], rates) + ".")
            continue
        groups = []
        par = f"on par within ±{stats.fmt(mine[0].pair.delta)}"
        for kind, title in ((stats.BETTER, "better"), (stats.ON_PAR, par), (stats.UNDECIDED, "undecided")):
            these = [_short_verdict(c) for c in mine if c.verdict.kind == kind]
            if these:
                groups.append(f"{title}: {', '.join(these)}")
        lines.append(f"Of the {len(mine)} pairs of arms on {metric}: {'; '.join(groups)}.")
    return lines


def header_section(
    study: Study, ostudy: optuna.Study, found: Findings, rows: list[Row], has_power: Optional[bool], advice: str
) -> list[str]:
    """The first lines of summary.md: the answer, the δ used, the Holm statement."""
    label = "**Answer:**"
    if has_power is False:
        label = f"**Answer (uninformative: the control's power check below failed; {advice}):**"
    elif has_power is None and study.control is not None:
        label = "**Answer (power not judged yet: the control has not run):**"
    out = [f"{label} {line}" for line in answer(study, ostudy, found, rows)] + [""]
    deltas = [f"{m} ±{stats.fmt(d)} ({source})" for m in study.metrics for d, source in [study.delta(m)]]
    out.append(f"- δ, the margin within which two arms are on par: {', '.join(deltas)}.")
    m_better, m_par = found.family()
    if m_par:
        n_rates = f", {len(found.rates)} comparisons of success rates" if found.rates else ""
        rate = f"{stats.ALPHA * 100:.0f} %"
        out.append(
            f"- Holm's correction over the {m_better} 'better' tests of this report ({m_par} comparisons of "
            f"means{n_rates}) keeps their family-wise error rate at {rate}; the {m_par} 'on par' tests "
            f"(TOST: the 90 % CI of A − B inside ±δ) are a second Holm family at {rate}. "
            f"Seed counts are planned at {stats.PCT} power for the observed difference and spread, at "
            "the level Holm applies to each test now. The control's power check is a design check outside "
            "both families."
        )
    for m, direction in zip(study.metrics, study.directions):
        if (threshold := study.success(m)) is not None:
            out.append(
                f"- Success: a run with {m} {_at_or_beyond(direction)} {stats.fmt(threshold)} "
                "solved the task (study file); success rates with exact (Clopper–Pearson) 95 % intervals, "
                "compared by Boschloo's exact test."
            )
    return out + [""]


def arm_section(
    study: Study, rows: list[Row], found: Findings, advice: str, has_power: Optional[bool] = None
) -> list[str]:
    arms = found.arms
    shown = list(study.metrics) + [
        m for m in ("val/accuracy",) if m not in study.metrics and any(m in r.metrics for r in rows)
    ]
    trivial = [k for k in TRIVIAL if any(k in r.metrics for r in rows)]
    successes = [(m, d, t) for m, d in zip(study.metrics, study.directions) if (t := study.success(m)) is not None]
    header = [
        "arm",
        "n",
        *[f"{m} mean ± std" for m in shown],
        *[f"{m} {_at_or_beyond(d)} {stats.fmt(t)}: solved [95 % CI]" for m, d, t in successes],
        *[TRIVIAL[k] for k in trivial],
        "pruned/failed",
    ]
    body = []
    for arm in arms:
        mine = [r for r in rows if r.arm == arm]
        ok = [r for r in mine if r.trial.state == TrialState.COMPLETE]
        body.append(
            [
                arm,
                str(len(ok)),
                *[_mean_std([v for r in ok if (v := _value(r, m, study)) is not None]) for m in shown],
                *[str(stats.success_rate(list(found.values[(arm, m)].values()), t, d)) for m, d, t in successes],
                *[stats.fmt(stats.summarize([r.metrics[k] for r in ok if k in r.metrics]).mean) for k in trivial],
                f"{sum(r.trial.state == TrialState.PRUNED for r in mine)}/"
                f"{sum(r.trial.state == TrialState.FAIL for r in mine)}",
            ]
        )
    # an open study's own trials have no arms: then only the control's are here, replicated over seeds
    replicates = [p for p in study.spec.space if p not in study.arms] if study.arms else ["seed"]
    out = [
        "## Arms",
        "",
        f"Replicates: {', '.join(replicates) or 'none'}. "
        "The trivial baseline is what a model that ignores its input reaches (unigram loss, chance accuracy).",
        "",
        *_table(header, body),
        "",
    ]
    if has_power is False:
        out += [
            f"**The power check failed (above): at this budget every verdict below is uninformative; {advice}.**",
            "",
        ]
    for metric, direction in zip(study.metrics, study.directions):
        mine = [c for c in found.compared if c.pair.metric == metric]
        if not mine:
            continue
        table = []
        for c in mine:
            lo, hi = c.pair.comparison.ci()
            ci = f"[{stats.fmt(lo)}, {stats.fmt(hi)}]" if math.isfinite(lo) else "-"
            v = c.verdict
            table.append(
                [
                    c.pair.a,
                    c.pair.b,
                    stats.fmt(c.pair.comparison.diff),
                    ci,
                    c.pair.comparison.test,
                    f"{stats.fmt_p(v.p)} ({stats.fmt_p(v.p_holm)})",
                    f"{stats.fmt_p(v.tost_p)} ({stats.fmt_p(v.tost_p_holm)})",
                    f"±{stats.fmt(c.pair.delta)}",
                    v.text,
                ]
            )
        out += [
            f"## Comparisons of {metric} ({direction}; A − B with its 95 % CI)",
            "",
            *_table(["A", "B", "A − B", "95 % CI", "test", "p (Holm)", "TOST p (Holm)", "δ", "verdict"], table),
            "",
        ]
        rates = [r for r in found.rates if r.metric == metric]
        if rates:
            sign = _at_or_beyond(direction)
            out += [
                f"### Success rates ({metric} {sign} {stats.fmt(rates[0].threshold)}: solved)",
                "",
                *_table(
                    ["A", "B", "A solved", "B solved", "Boschloo p (Holm)", "verdict"],
                    [
                        [
                            r.a,
                            r.b,
                            str(r.rate_a),
                            str(r.rate_b),
                            f"{stats.fmt_p(r.p)} ({stats.fmt_p(r.p_holm)})",
                            r.text,
                        ]
                        for r in rates
                    ],
                ),
                "",
            ]
    undecided = [
        c.verdict.more_seeds
        for c in found.compared
        if c.own and c.verdict.kind == stats.UNDECIDED and c.verdict.more_seeds is not None
    ]
    if undecided:
        n = max(undecided)
        out += [
            f"To decide every undecided pair of the study's arms at {stats.PCT} power, add {n} seeds: "
            f"{_add_seeds_command(study, n)} (every arm and the control; the runs done are kept). Decide the "
            "count before running and run all of it: adding seeds until a verdict appears (optional stopping) "
            "inflates the error rates these verdicts promise (docs/verdicts.md).",
            "",
        ]
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


def summary_md(
    study: Study,
    ostudy: optuna.Study,
    rows: list[Row],
    control_rows: list[Row],
    url: Optional[str],
    plots: list[str],
    skipped: list[str],
    scale_lines: list[str] = (),
) -> str:
    counts = {
        s: sum(r.trial.state == s for r in rows) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    advice = "add seeds or training steps" if study.preset == "gpu" else "run the GPU preset"
    retried = sorted(storage.retried_numbers(ostudy.get_trials(deepcopy=False)))
    has_power, power = None, []
    if study.control is not None:
        power, has_power = power_section(study, control_rows, advice)
    arm_rows = (rows if study.arms else []) + control_rows
    found = findings(study, arm_rows)
    lines = [
        f"# Study {study.name}",
        "",
        *header_section(study, ostudy, found, arm_rows, has_power, advice),
        f"- study file: `{study.path}`" + (f", preset `{study.preset}`" if study.preset else ""),
        f"- storage: `{storage.storage_display(study, url)}`",
        f"- trials: {len(rows)} finished of {study.n_trials if study.n_trials is not None else 'an open budget'} "
        f"({', '.join(f'{v} {s.name.lower()}' for s, v in counts.items())})",
        *(
            [
                f"- control: {len(control_rows)} finished of {study.control.n_trials} "
                f"(study `{study.control.name}`, storage `{storage.storage_display(study.control, url)}`)"
            ]
            if study.control is not None
            else []
        ),
        "- objective: " + ", ".join(f"{m} ({d})" for m, d in zip(study.metrics, study.directions)),
        *(
            [
                f"- retried with the same params after their worker died or was interrupted: trials "
                f"{', '.join(map(str, retried))}"
            ]
            if retried
            else []
        ),
        *(
            [f"- seeds added by `sweep --add-seeds`: {', '.join(map(str, study.added_seeds))}"]
            if study.added_seeds
            else []
        ),
        f"- sampler: {study.spec.sampler.kind}, pruner: {study.spec.pruner.kind}",
        "",
        *power,
        *scale_lines,
    ]
    if arm_rows:
        lines += arm_section(study, arm_rows, found, advice, has_power)
    lines += efficiency.section(speeds_of(study, rows), study.metrics[0], study.directions[0] == "maximize")
    if not study.is_grid:
        lines += best_section(study, ostudy)
    failed = [r for r in rows + control_rows if r.trial.state == TrialState.FAIL]
    if failed:
        lines += (
            ["## Failed trials", ""]
            + [
                f"- {'control ' if r.role else ''}trial {r.trial.number} "
                f"({', '.join(f'{p}={v}' for p, v in r.trial.params.items())}): "
                f"{r.trial.user_attrs.get('fail_reason') or 'worker died and its retries ran out'}"
                for r in failed
            ]
            + [""]
        )
    lines += ["## Plots", ""] + [f"- `{p}`" for p in plots] + [f"- skipped: {s}" for s in skipped] + [""]
    return "\n".join(lines)


def speeds_of(study: Study, rows: list[Row]) -> list[efficiency.ArmSpeed]:
    """Quality and speed of each arm of the study's own complete trials (none for a study without arms)."""
    complete = [r for r in rows if r.trial.state == TrialState.COMPLETE]
    return efficiency.arm_speeds(complete, study.metrics[0]) if study.arms else []


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
                ([e.step for e in events], [e.value for e in events])
            )
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
            ax.plot(
                steps,
                values,
                color=colors[i % len(colors)],
                alpha=0.8,
                marker=".",
                label=arm if j == 0 and len(curves) <= 12 else None,
            )
    trivial = [r.metrics["trivial_loss"] for r in rows if "trivial_loss" in r.metrics]
    if trivial:
        ax.axhline(sum(trivial) / len(trivial), color="black", linestyle="--", linewidth=1, label="trivial baseline")
    ax.set_xlabel("training step")
    ax.set_ylabel(CURVE_TAG)
    ax.set_title("validation loss of every trial, by arm")
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
    if plot_learning_curves(rows, out / "learning_curves.png"):
        written.append("learning_curves.png")
    else:
        skipped.append("learning_curves.png (no trial run directory with TensorBoard events here)")
    return written, skipped


# --------------------------------------------------------------------------------------- command
def load(study: Study, url: Optional[str]) -> optuna.Study:
    if url is None and not (study.root / storage.JOURNAL).is_file():
        raise ConfigError(
            f"{study.root / storage.JOURNAL}: no study journal here; run `linformer-lab sweep {study.path}` first"
        )
    try:
        ostudy = optuna.load_study(study_name=study.name, storage=storage.open_storage(study, url, create=False))
    except KeyError:
        raise ConfigError(
            f"study {study.name}: not in {storage.storage_display(study, url)}; run the sweep first"
        ) from None
    check_objective(study, ostudy, url)
    return ostudy


def write_report(study: Study, url: Optional[str] = None) -> Path:
    ostudy = load(study, url)
    added = [int(s) for s in ostudy.user_attrs.get(ADDED_SEEDS, [])]
    if added and tuple(added) != study.added_seeds:  # the grid and budget as `sweep --add-seeds` grew them
        study = load_study(study.path, study.preset, added_seeds=added)
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
    if efficiency.plot(speeds_of(study, rows), study.metrics[0], study.directions[0] == "maximize", out / "pareto.png"):
        plots.append("pareto.png")
    scale_lines: list[str] = []
    if study.ladder is not None:  # the gap across sizes, its trend, the spectrum across sizes (sweeps/scale.py)
        scale_lines, drawn, not_drawn = scale.write(study, rows, findings(study, rows + control_rows), out)
        plots, skipped = plots + drawn, skipped + not_drawn
    atomic_write_text(
        out / "summary.md", summary_md(study, ostudy, rows, control_rows, url, plots, skipped, scale_lines)
    )
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
