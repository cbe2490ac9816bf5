"""The scale report of a model-size ladder (a study file with ``ladder:``; docs/scale.md).

A ladder study trains its arms (full attention, Linformer with k fixed, Linformer with k scaled …) at every
rung r of a ladder of model sizes, over seeds s. On the study's first objective metric m, the gap of an arm A
to the reference arm R (full attention) at rung r is

    gap_r = mean_s [m(A, r, s) − m(R, r, s)]      paired over seeds, with its 95 % CI (stats.compare)

and its verdict is the report's on the pair (A, R) at that rung (better / on par within ±δ / undecided with
the seeds that would decide it; Holm over the report's comparisons, which on a ladder are the pairs of arms
at the same rung). A rung's size is its reference runs' ``parameters`` N_r and training FLOPs C_r
(``train_flops`` of metrics.json: one training step counted, times the steps). The trend of the gap over size
is the least-squares line through every seed's gap (stats.trend),

    gap_{r,s} = a + b · log10(N_r)        (and the same against log10(C_r))

with the slope's 95 % CI: b is how much the gap changes per tenfold parameters (or compute).

Time to target (when the runs' metrics.json, beside them on this machine, hold ``ppl_vs_wallclock``): at each
rung the target is the highest mean final validation perplexity among the rung's arms, so that every arm
reaches it on average; each run's training seconds to reach it (:func:`training.curves.reach`); an arm's time
over the reference's is exp(mean_s [ln t(A, r, s) − ln t(R, r, s)]), with the 95 % CI of that paired mean
exponentiated, over the seeds where both reached it.

Spectrum across sizes: the spectrum :func:`training.analysis.analyze` measures, of the reference run of the lowest
seed of every rung (its ``analysis/summary.json`` is reused when newer than its checkpoint and measured at the same τ
and sample; else it is measured here, nothing written into the run's folder, and kept in the report's ``spectra/``),
and the effective rank of each layer's P at τ = 0.9 against the rung's parameters: does the rank of
attention grow with the model (the paper's Fig. 1 question, across scale)?

Figures (drawn here), in the report folder: ``gap_vs_size.png`` (the gap against parameters
and training FLOPs, log axes, one line per compared arm, with its fitted trend, the ±δ band and each rung's
verdict as its marker), ``rank_vs_size.png`` and ``time_to_target_vs_size.png``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
from optuna.trial import TrialState

from foundation.atomic import write_figure, write_json
from foundation.checked import read_json, read_run_config
from foundation.errors import ConfigError
from lightning_modules.attention import ATTENTION_KINDS
from sweeps.control import Row, run_metrics
from sweeps.report import claims, comparisons, efficiency, markdown
from sweeps.report.comparisons import verdict
from sweeps.report.findings import Compared, Findings, curve_of
from sweeps.report.markdown import fmt, signed, signed_interval
from sweeps.spec import stats
from sweeps.spec.study import Study

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ENERGY = 0.9  # τ of the effective rank across sizes
SAMPLES = 16  # validation sequences the spectrum is measured on
# The longest n whose spectrum the report measures: one n × n svdvals per head, layer and sequence costs ~8× more
# for each doubling of n (at n = 4,096 about 40 minutes on one CPU core for 16 sequences of a 2-layer, 4-head model).
SPECTRUM_MAX_LEN = 1024
# metrics.json key (or n_over_k: the rung's n over the compared arm's k) -> axis name
AXES = {"parameters": "parameters", "train_flops": "training FLOPs", "n_over_k": "n/k"}


# --------------------------------------------------------------------------------------- the ladder
@dataclass
class Cell:
    """One arm at one rung: its trials that count and its objective values by replicate (seed)."""

    rung: str
    line: str  # the arm without its rung ("k_fixed"): one line across the ladder
    arm: str  # the report's arm label ("2x32 k_fixed")
    rows: list[Row] = field(default_factory=list)
    values: dict = field(default_factory=dict)  # replicate -> value of the objective metric

    @property
    def complete(self) -> list[Row]:
        return [r for r in self.rows if r.trial.state == TrialState.COMPLETE]

    def mean(self, key: str) -> Optional[float]:
        """Mean of a metrics.json number over the cell's complete runs (None when none has it)."""
        xs = [r.metrics[key] for r in self.complete if isinstance(r.metrics.get(key), (int, float))]
        return float(np.mean(xs)) if xs else None


@dataclass
class Ladder:
    study: Study
    metric: str
    direction: str
    delta: float
    rungs: list[str]
    reference: str  # the reference arm's line ("full")
    lines: list[str]  # the compared arms' lines, in the study file's order
    cells: dict[tuple[str, str], Cell]
    verdicts: dict[tuple[str, str], Compared]  # (rung, line) -> the report's comparison with the reference
    blind: set = field(default_factory=set)  # (rung, line) left without a verdict: neither reaches the context gain
    n_over_k: dict = field(default_factory=dict)  # rung -> n / k of the first compared arm (ladder.axis n_over_k)

    def cell(self, rung: str, line: str) -> Optional[Cell]:
        return self.cells.get((rung, line))

    def size(self, rung: str, axis: str = "parameters") -> Optional[float]:
        """The rung's size on ``axis`` (a metrics.json key): its reference runs' mean; n_over_k: the rung's n/k."""
        if axis == "n_over_k":
            return self.n_over_k.get(rung)
        cell = self.cell(rung, self.reference)
        return cell.mean(axis) if cell is not None else None

    def gap(self, rung: str, line: str) -> Optional[stats.Comparison]:
        """``line`` − reference at ``rung``, paired over seeds; None when either has no complete run."""
        a, ref = self.cell(rung, line), self.cell(rung, self.reference)
        if a is None or ref is None or not a.values or not ref.values:
            return None
        return stats.compare(a.values, ref.values)

    def points(self, line: str, axis: str = "parameters") -> tuple[list[float], list[float]]:
        """(log10 size, gap) of every seed that ran both ``line`` and the reference, at every sized rung."""
        xs, ys = [], []
        for rung in self.rungs:
            size, a, ref = self.size(rung, axis), self.cell(rung, line), self.cell(rung, self.reference)
            if size is None or size <= 0 or a is None or ref is None:
                continue
            for replicate in sorted(set(a.values) & set(ref.values)):
                xs.append(math.log10(size))
                ys.append(a.values[replicate] - ref.values[replicate])
        return xs, ys

    def trend(self, line: str, axis: str = "parameters") -> Optional[stats.Trend]:
        """The gap's least-squares trend over log10 size; None with fewer than :data:`claims.MIN_TREND_POINTS`
        sized rungs (a line through two points is no trend: docs/verdicts.md, "Claims")."""
        xs, ys = self.points(line, axis)
        return stats.trend(xs, ys) if len(set(xs)) >= claims.MIN_TREND_POINTS else None

    def residuals(self, line: str, axis: str = "parameters") -> str:
        """Each sized rung's mean gap less the trend's value there, in order of size ("" without a trend)."""
        t, (xs, ys) = self.trend(line, axis), self.points(line, axis)
        if t is None:
            return ""
        by_x: dict[float, list[float]] = {}
        for x, y in zip(xs, ys):
            by_x.setdefault(x, []).append(y)
        return ", ".join(signed(sum(v) / len(v) - t.at(x)) for x, v in sorted(by_x.items()))

    def has_axis(self, axis: str) -> bool:
        """Whether some rung's reference runs recorded ``axis`` (a study still running may lack a rung)."""
        return any(self.size(rung, axis) for rung in self.rungs)

    def axes(self) -> list[str]:
        """The axes the gap is read against: a ladder over n (``ladder.axis: n_over_k``) n/k alone, its rungs
        differing in parameters and FLOPs by the length's few percent, which a slope per tenfold would extrapolate
        tenfold; any other ladder parameters and training FLOPs, where its runs recorded them."""
        if self.study.ladder.axis == "n_over_k" and self.has_axis("n_over_k"):
            return ["n_over_k"]
        return [axis for axis in ("parameters", "train_flops") if self.has_axis(axis)]


def build(study: Study, rows: list[Row], found: Findings) -> Ladder:
    """The ladder of a study's own trials, with the report's values and verdicts (``found``)."""
    spec = study.ladder
    metric, direction = study.metrics[0], study.directions[0]
    rung_param = spec.rung
    reference = study.arm_label({p: spec.reference[p] for p in study.spec.space if p in spec.reference})
    cells: dict[tuple[str, str], Cell] = {}
    for r in rows:
        if r.role:
            continue
        key = (str(r.trial.params[rung_param]), study.arm_label(r.trial.params, without=[rung_param]))
        cells.setdefault(key, Cell(*key, arm=r.arm)).rows.append(r)
    for cell in cells.values():
        cell.values = dict(found.values.get((cell.arm, metric), {}))
    order = list(dict.fromkeys(study.arm_label(p, without=[rung_param]) for p in study.points or []))
    lines = [line for line in order if line != reference]
    by_arms = {frozenset((c.pair.a, c.pair.b)): c for c in found.compared if c.pair.metric == metric}
    left = {frozenset(pair) for pair in found.blind_on(metric)}
    verdicts, blind = {}, set()
    for (rung, line), cell in cells.items():
        ref = cells.get((rung, reference))
        if line != reference and ref is not None and frozenset((cell.arm, ref.arm)) in by_arms:
            verdicts[(rung, line)] = by_arms[frozenset((cell.arm, ref.arm))]
        if line != reference and ref is not None and frozenset((cell.arm, ref.arm)) in left:
            blind.add((rung, line))
    delta = study.delta(metric)[0]
    ladder = Ladder(study, metric, direction, delta, study.rungs, reference, lines, cells, verdicts, blind)
    if lines:  # n/k at each rung, of the first compared arm (the reference, full attention, has no k)
        for rung, k in arm_ks(ladder, lines[0]).items():
            model = study.config(dict(ladder.cell(rung, lines[0]).rows[0].trial.params)).model
            ladder.n_over_k[rung] = model.max_len / k
    return ladder


# --------------------------------------------------------------------------------------- words
def verdict_text(ladder: Ladder, rung: str, line: str, short: bool = False) -> str:
    """The report's verdict on ``line`` against the reference at ``rung``, in a few words."""
    cell = ladder.cell(rung, line)
    arm = cell.arm if cell is not None else line
    if (rung, line) in ladder.blind:
        return comparisons.BLIND
    return rung_verdict(ladder.verdicts.get((rung, line)), line, arm, ladder.reference, short)


def trend_text(ladder: Ladder, line: str, axis: str = "parameters") -> str:
    """The gap's slope per tenfold size with its 95 % CI, and what it means for ``line``."""
    text = trend(ladder.trend(line, axis), AXES[axis], line, ladder.reference, ladder.direction)
    residuals = ladder.residuals(line, axis)
    return text + (f" (each rung's mean gap less the fit: {residuals})" if residuals else "")


def _at(ladder: Ladder, rung: str, axis: str) -> str:
    """How a rung's size reads in the answer: ``2.6M parameters``, ``n/k = 4``."""
    if axis == "n_over_k":
        return f"n/k = {markdown.fmt(ladder.size(rung, axis))}"
    return f"{markdown.si(ladder.size(rung))} parameters"


def answer(ladder: Ladder) -> list[str]:
    """One sentence per compared arm: its gap at every rung with the verdict, and the trend over the ladder's axis
    (parameters, or n/k); the published claim (``ladder.claim``) stated beside it."""
    out, axis, claim = [], ladder.study.ladder.axis, ladder.study.ladder.claim
    for line in ladder.lines:
        gaps = [
            f"{markdown.signed(c.diff)} at {rung} ({_at(ladder, rung, axis)}; "
            f"{verdict_text(ladder, rung, line, short=True)})"
            for rung in ladder.rungs
            if (c := ladder.gap(rung, line)) is not None
        ]
        if not gaps:
            out.append(f"{line} − {ladder.reference} on {ladder.metric}: no rung has runs of both yet.")
            continue
        out.append(
            f"{line} − {ladder.reference} on {ladder.metric}: {', '.join(gaps)}; the gap changes by "
            f"{trend_text(ladder, line, axis)}" + (f" (the paper's claim: {claim.rstrip('.')})." if claim else ".")
        )
    return out


# --------------------------------------------------------------------------------------- time to target
@dataclass(frozen=True)
class Ratio:
    """An arm's time to target over the reference's: geometric mean over seeds, 95 % CI (nan with 1 seed)."""

    value: float
    lo: float
    hi: float
    seeds: int

    def __str__(self) -> str:
        return f"{self.value:.3g}" + (f" [{self.lo:.3g}, {self.hi:.3g}]" if math.isfinite(self.lo) else "")


@dataclass
class TimeToTarget:
    targets: dict[str, float]  # rung -> validation perplexity every arm of the rung reaches on average
    seconds: dict[tuple[str, str], dict]  # (rung, line) -> {replicate: training seconds to the target}
    runs: dict[tuple[str, str], int]  # (rung, line) -> runs with a curve
    # rung -> the no-context val ppl of a rung whose target a model without context reaches: not timed
    refused: dict[str, float] = field(default_factory=dict)

    def ratio(self, rung: str, line: str, reference: str) -> Optional[Ratio]:
        """``line``'s time to the rung's target over the reference's, paired over the seeds both reached it."""
        a, ref = self.seconds.get((rung, line), {}), self.seconds.get((rung, reference), {})
        both = sorted(set(a) & set(ref))
        if not both:
            return None
        c = stats.compare({k: math.log(a[k]) for k in both}, {k: math.log(ref[k]) for k in both})
        lo, hi = c.ci()
        return Ratio(math.exp(c.diff), math.exp(lo), math.exp(hi), len(both))  # exp(nan) is nan


def time_to_target(ladder: Ladder, no_context: Sequence[efficiency.ArmSpeed] = ()) -> Optional[TimeToTarget]:
    """Training seconds to each rung's target (see the module docstring); None when no run has a curve here. A
    rung whose target a model without context reaches (its unigram, or ``no_context``, the control's degraded
    arm trained beside the ladder: :func:`efficiency.no_context_reaches`) is not timed."""
    from training.curves import reach

    curves = {
        key: {r.replicate: c for r in cell.complete if (c := curve_of(r)) is not None}
        for key, cell in ladder.cells.items()
    }
    if not any(curves.values()):
        return None
    targets, seconds, refused = {}, {}, {}
    for rung in ladder.rungs:
        finals = [float(np.mean([c[-1][2] for c in cs.values()])) for (r, _), cs in curves.items() if r == rung and cs]
        if not finals:
            continue
        targets[rung] = max(finals)
        floor = efficiency.no_context_reaches(targets[rung], _no_context_ppl(ladder, rung), no_context)
        if floor is not None:
            refused[rung] = floor[0]
            continue
        for (r, line), cs in curves.items():
            if r == rung:
                reached = {k: reach(c, targets[rung]) for k, c in cs.items()}
                seconds[(rung, line)] = {k: s for k, hit in reached.items() if hit is not None and (s := hit[0]) > 0}
    return TimeToTarget(targets, seconds, {key: len(cs) for key, cs in curves.items()}, refused)


def _no_context_ppl(ladder: Ladder, rung: str) -> Optional[float]:
    """The lowest no-context val ppl of the rung's reference runs (efficiency.no_context_ppl); None without one."""
    cell = ladder.cell(rung, ladder.reference)
    floors = [
        p for r in (cell.complete if cell else []) if (p := efficiency.no_context_ppl({**r.metrics, **run_metrics(r)}))
    ]
    return min(floors) if floors else None


# --------------------------------------------------------------------------------------- spectrum across sizes
@dataclass
class RungSpectrum:
    rung: str
    parameters: float
    run_dir: str
    effective_rank: list[int]  # per layer, at τ = ENERGY
    length: int  # n, the sequence length P is over


def _measured(run_dir: Path) -> dict[str, Any]:
    """The spectrum's summary entries ``linformer-lab analyze`` gives a run at τ = ENERGY on SAMPLES validation
    sequences (the effective rank per layer), measured here without writing anything into the run's folder."""
    from lightning_modules.analysis import measure_spectrum, validation_sample
    from training.analysis import load_module, read_run
    from training.train import build_datamodule

    run = read_run(run_dir)
    datamodule = build_datamodule(run.cfg)
    datamodule.setup("validate")
    module = load_module(run, datamodule)
    sample = validation_sample(datamodule.val_dataloader(), SAMPLES)
    try:
        spectrum = measure_spectrum(module.encoder, sample)
    except ValueError as err:  # a kind that forms no softmax matrix (SelfAttention.context_matrix)
        raise ConfigError(f"analyze {run.run_dir}: {err}") from None
    return {
        "run_dir": str(run.run_dir),
        "samples": sum(len(b["input_ids"]) for b in sample),
        "energy": ENERGY,
        "spectrum": {"effective_rank": spectrum.effective_ranks(ENERGY)},
    }


def _analysis(run_dir: Path, cache: Path) -> dict[str, Any]:
    """The spectrum of a run at τ = ENERGY on SAMPLES sequences: the run's own ``analysis/summary.json``
    (``linformer-lab analyze``) or the report's ``cache`` file when up to date, else measured and kept in ``cache``
    (the report writes only into its own folder, never into a run's)."""
    from foundation.rundir import CHECKPOINT

    for kept in (run_dir / "analysis" / "summary.json", cache):
        if kept.is_file() and kept.stat().st_mtime >= (run_dir / CHECKPOINT).stat().st_mtime:
            summary = read_json(kept)
            if summary.get("energy") == ENERGY and summary.get("samples") == SAMPLES:
                return summary
    summary = _measured(run_dir)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_json(cache, summary)
    return summary


def spectrum_across_sizes(ladder: Ladder, cache: Path) -> list[RungSpectrum]:
    """The effective rank per layer of the reference arm's P at every rung up to n = SPECTRUM_MAX_LEN (its lowest
    seed's run that has a checkpoint here); each run's spectrum kept in ``cache/<run folder>.json``."""
    from foundation.rundir import CHECKPOINT

    out = []
    for rung in ladder.rungs:
        cell = ladder.cell(rung, ladder.reference)
        runs = sorted(cell.complete, key=lambda r: r.replicate) if cell is not None else []
        run_dir = next(
            (Path(d) for r in runs if (d := r.trial.user_attrs.get("run_dir")) and (Path(d) / CHECKPOINT).is_file()),
            None,
        )
        if run_dir is None or _max_len(run_dir) > SPECTRUM_MAX_LEN:
            continue
        summary = _analysis(run_dir, cache / f"{run_dir.name}.json")
        out.append(
            RungSpectrum(
                rung,
                ladder.size(rung) or math.nan,
                str(run_dir),
                [int(r) for r in summary["spectrum"]["effective_rank"]],
                _max_len(run_dir),
            )
        )
    return out


def _max_len(run_dir: Path) -> int:
    config = read_run_config(run_dir)
    return int(config.get("model", {}).get("max_len", 0))


def arm_ks(ladder: Ladder, line: str) -> dict[str, float]:
    """rung -> the compressed length k (mean over layers) of ``line``'s model there, for an arm whose kind has one
    (Linformer's k); {} otherwise."""
    out = {}
    for rung in ladder.rungs:
        cell = ladder.cell(rung, line)
        if cell is None or not cell.rows:
            continue
        model = ladder.study.config(dict(cell.rows[0].trial.params)).model
        ks = ATTENTION_KINDS[model.attention.kind].compressed_lengths(model)
        if ks is not None:
            out[rung] = float(np.mean(ks))
    return out


# --------------------------------------------------------------------------------------- summary.md
def section(ladder: Ladder, ttt: Optional[TimeToTarget], spectra: list[RungSpectrum], written: list[str]) -> list[str]:
    """The scale section of summary.md."""
    out = [
        f"## Scale: {', '.join(ladder.lines)} against {ladder.reference} across model sizes",
        "",
        f"Rungs ({ladder.study.ladder.rung}), smallest first: {', '.join(ladder.rungs)}. Gap = arm − "
        f"{ladder.reference} on {ladder.metric} ({ladder.direction}), paired over seeds, with its 95 % CI; the "
        f"verdict is the comparison's below (δ = ±{markdown.fmt(ladder.delta)}). Parameters, training FLOPs (forward + "
        "backward matrix products, metrics.json `train_flops`) and tokens per parameter are the reference runs' means.",
        "",
        *_gap_table(ladder),
        *_trend_lines(ladder),
        *(_time_lines(ladder, ttt) if ttt is not None else []),
        *(_spectrum_lines(ladder, spectra) if spectra else []),
    ]
    shown = [line for f in written for line in (markdown.figure(f, CAPTIONS.get(f, f)), "")]
    return out + (shown or ["No figure of the scale drawn (the reasons are under Figures below).", ""])


def _gap_row(ladder: Ladder, rung: str, line: str, cell: Cell) -> list[str]:
    s = stats.summarize(list(cell.values.values()))
    params, tokens = cell.mean("parameters"), cell.mean("tokens")
    c = ladder.gap(rung, line) if line != ladder.reference else None
    return [
        rung,
        line,
        markdown.si(params),
        markdown.si(cell.mean("train_flops")),
        f"{tokens / params:.3g}" if tokens and params else "-",
        f"{markdown.mean_std(list(cell.values.values()))} ({s.n})",
        "-" if c is None else f"{markdown.signed(c.diff)} {markdown.signed_interval(*c.ci())}",
        "-" if c is None else verdict_text(ladder, rung, line),
    ]


def _gap_table(ladder: Ladder) -> list[str]:
    body = [
        _gap_row(ladder, rung, line, cell)
        for rung in ladder.rungs
        for line in [ladder.reference, *ladder.lines]
        if (cell := ladder.cell(rung, line)) is not None
    ]
    header = ["rung", "arm", "parameters", "training FLOPs", "tokens/param", f"{ladder.metric} mean ± sd (seeds)"]
    return markdown.table(header + [f"gap to {ladder.reference} [95 % CI]", "verdict"], body) + [""]


def _trend_lines(ladder: Ladder) -> list[str]:
    out = ["Trend of the gap over size (gap = a + b·log10(size), every seed's gap a point):", ""]
    for line in ladder.lines:
        out += [f"- {line}: {trend_text(ladder, line, axis)}." for axis in ladder.axes() or ["parameters"]]
    return out + [""]


def _time_lines(ladder: Ladder, ttt: TimeToTarget) -> list[str]:
    rows = []
    for rung in (rung for rung in ladder.rungs if rung in ttt.targets):
        if rung in ttt.refused:
            no = f"not timed: a model without context reaches val ppl {ttt.refused[rung]:.4g}"
            rows.append([rung, f"{ttt.targets[rung]:.4g}", "every arm", "-", no])
            continue
        for line in ladder.lines:
            r = ttt.ratio(rung, line, ladder.reference)
            reached = f"{len(ttt.seconds.get((rung, line), {}))}/{ttt.runs.get((rung, line), 0)}"
            rows.append([rung, f"{ttt.targets[rung]:.4g}", line, reached, "-" if r is None else str(r)])
    return [
        f"### Time to target ({ladder.reference}'s and each arm's training seconds)",
        "",
        "Target per rung: the highest mean final validation perplexity among its arms. Ratio = arm / "
        f"{ladder.reference}, geometric mean over the seeds where both reached it, with its 95 % CI.",
        "",
        *markdown.table(["rung", "target val ppl", "arm", "reached", f"time / {ladder.reference} [95 % CI]"], rows),
        "",
    ]


def _spectrum_lines(ladder: Ladder, spectra: list[RungSpectrum]) -> list[str]:
    rows = [
        [
            s.rung,
            markdown.si(s.parameters),
            str(s.length),
            ", ".join(map(str, s.effective_rank)),
            f"{np.mean(s.effective_rank):.3g}",
            f"`{s.run_dir}`",
        ]
        for s in spectra
    ]
    return [
        f"### Spectrum across sizes ({ladder.reference} attention, one seed per rung)",
        "",
        f"Effective rank of P (the smallest r keeping {ENERGY:g} of the cumulative singular value, "
        f"`linformer-lab analyze`) per layer, first to last, on {SAMPLES} validation sequences; rungs at n above "
        f"{SPECTRUM_MAX_LEN:,} are not measured (an n × n SVD per head and sequence).",
        "",
        *markdown.table(["rung", "parameters", "n", "effective rank per layer", "mean", "run"], rows),
        "",
    ]


GAP_FIGURE, RANK_FIGURE, TIME_FIGURE = "gap_vs_size.png", "rank_vs_size.png", "time_to_target_vs_size.png"
CAPTIONS = {
    GAP_FIGURE: "each arm's gap to the reference against parameters and training FLOPs, with its trend and the ±δ band",
    RANK_FIGURE: "the reference's effective rank of P per layer against parameters",
    TIME_FIGURE: "each arm's training time to the target over the reference's, against parameters",
}


# the verdict of a rung as the marker of its point: (marker, filled)
MARKERS = {stats.BETTER: ("o", True), stats.ON_PAR: ("s", False), stats.UNDECIDED: ("X", True)}


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


def _gap_points(ax: "Axes", ladder: Ladder, line: str, sized: list, color: str, shift: float) -> None:
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


def _gap_trend(ax: "Axes", ladder: Ladder, line: str, axis: str, sizes: list, color: str) -> None:
    """The fitted trend of ``line``'s gap, dashed, labelled with its slope per tenfold size."""
    t = ladder.trend(line, axis)
    label = line
    if t is not None and math.isfinite(t.slope):
        xx = np.logspace(math.log10(min(sizes)), math.log10(max(sizes)), 50)
        ax.plot(xx, t.intercept + t.slope * np.log10(xx), "--", color=color, linewidth=1.2)
        label += f": {signed(t.slope)} per 10× {signed_interval(*t.slope_ci())}"
    ax.plot([], [], "--", color=color, label=label)


def _gap_legend(ax: "Axes", ladder: Ladder, sized: list) -> None:
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


def figure_gap(ladder: Ladder) -> Optional["Figure"]:
    """The gap against parameters and training FLOPs, or n/k (log x; :meth:`Ladder.axes`), one line per compared
    arm: each rung's paired mean gap with its 95 % CI, the verdict as the marker, the fitted trend dashed, the ±δ
    band shaded."""
    axes = ladder.axes()
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
            xlabel=f"{AXES[axis]} (log)",
            ylabel=f"{ladder.metric}: arm − {ladder.reference}",
            title=f"gap to {ladder.reference} against {AXES[axis]}",
        )
        ax.grid(alpha=0.3, which="both")
        _gap_legend(ax, ladder, sized)
    return fig


def figure_rank(ladder: Ladder, spectra: list[RungSpectrum]) -> Optional["Figure"]:
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
        ks = arm_ks(ladder, line)
        shown = [(s.parameters, ks[s.rung]) for s in spectra if s.rung in ks]
        if shown:
            ax.plot(*zip(*shown), ":", color=colors[(i + 4) % len(colors)], label=f"k of {line}")
    for s in spectra:
        _label_x(ax, f"{s.rung} ({len(s.effective_rank)} layers)", s.parameters, at_top=False)
    n = max(s.length for s in spectra)
    ax.set(
        xlabel="parameters (log)",
        ylabel=f"effective rank of P at τ = {ENERGY:g}",
        title=f"{ladder.reference} attention's rank across sizes (n = {n}, one seed per rung)",
        ylim=(0, None),
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def figure_time(ladder: Ladder, ttt: TimeToTarget) -> Optional["Figure"]:
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


def write_ladder(ladder: Ladder, ttt: Optional[TimeToTarget], spectra: list, out: Path) -> tuple[list[str], list[str]]:
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


def rung_verdict(c: Optional[Compared], line: str, arm: str, reference: str, short: bool = False) -> str:
    """A ladder's verdict on ``line`` (report arm ``arm``) against the reference at one rung, in a few words."""
    if c is None:
        return "-"
    v, pair = c.verdict, c.pair
    if v.kind == stats.BETTER:
        name = line if pair.gain().better == arm else reference
        return f"{name} better" + ("" if short else f" by {fmt(abs(pair.comparison.diff))}")
    if v.kind == stats.ON_PAR:
        return "on par" + ("" if short else f" within ±{fmt(pair.delta)}")
    if short:
        return "undecided"
    if v.more_seeds is not None:
        return f"undecided: {v.more_seeds} more seeds per arm would show '{v.deciding}'"
    return "undecided: " + verdict(pair, v).removeprefix("undecided: ").split(";")[0]


def trend(t: Optional[stats.Trend], what: str, line: str, reference: str, direction: str) -> str:
    """A gap's slope per tenfold size with its 95 % CI, and what it means for ``line``."""
    if t is None:
        return f"no trend: fewer than {claims.MIN_TREND_POINTS} rungs with {what} recorded (the rungs' gaps alone)"
    lo, hi = t.slope_ci()
    ci = signed_interval(lo, hi)
    fit = f"{signed(t.slope)} per tenfold {what} (95 % CI {ci}, least squares over {t.n} seeds' gaps)"
    if not math.isfinite(lo):
        return fit + ": too few points for an interval"
    if lo <= 0 <= hi:
        return fit + ": no trend shown (the interval holds 0)"
    worse_up = (lo > 0) == (direction == "minimize")  # the gap moves toward "line worse"
    return fit + f": {line} {'loses ground to' if worse_up else 'gains on'} {reference} as {what} grow"
