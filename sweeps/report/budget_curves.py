"""A budget-curve study's section (``linformer-lab report STUDY --preset P --budgets 1,2,4,8,16``): every verdict as a
curve over training budget, read where it stops changing (the study: :mod:`sweeps.spec.budgets`).

Each budget is judged as any study is (:func:`sweeps.report.findings.findings` over that budget's cooldown points:
Holm's families are the pairs at that budget, one family per budget). Then, per pair:

* **Settled** (:func:`settled_at`): the verdict settled at budget B_i when, from the doubling that ends at B_i on, at
  every doubling B_{j−1} → B_j both arms' mean cooldown points moved less than δ/2 and the verdict read the same at
  B_{j−1} and B_j. Its answer is its verdict at B_i. When the last doubling still moves, it is **not settled by ×N**
  (N the largest budget run).
* **About learning speed or the quality reached** (:func:`about`): a settled verdict that reads the same at the
  smallest budget, with an effect there not shown to differ from the settled one (a paired t test over seeds of the
  change of the effect), is about the **quality reached**; one that differs there is about **learning speed** at the
  small budget, and what it settles to is the quality reached.
* **Still improving** (:func:`improving`), per arm: its cooldown point improved between the last two budgets by at
  least δ/2, significantly (a paired t test over seeds at α). A cooldown ends each point at a learning rate of 0, so
  the change between two points is learning, not the decay of the learning rate (the slope of one run's last fifth,
  where the schedule decays to 0, falls at any budget).

Numbers first (:func:`curves`, frozen dataclasses), then the words, the table and ``budget_curves.png`` (the effect of
each pair against budget on a log axis, with its 95 % CI and ±δ drawn: :func:`section`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from foundation.atomic import write_figure
from sweeps.control import ContextGain, Row, at_budget, certified
from sweeps.report import claims
from sweeps.report.efficiency import THROUGHPUT
from sweeps.report.findings import Compared, Findings, findings
from sweeps.report.markdown import fmt, interval, p_is, signed, signed_interval, table
from sweeps.report.replication import said
from sweeps.spec import stats
from sweeps.spec.study import Study

FIGURE = "budget_curves.png"
# a pair's cell at a budget where the report gives it no verdict (both arms blind there)
NO_VERDICT = "no verdict: neither arm shown to leave the no-context level"


# --------------------------------------------------------------------------------------- numbers
@dataclass(frozen=True)
class PairCurve:
    """One pair over the budgets: its comparison at each budget (A − B), where it settled, and what it is about."""

    a: str
    b: str
    metric: str
    delta: float
    factors: tuple[float, ...]
    # per budget: A − B and its verdict; None where the report gives the pair no verdict (neither arm leaves the
    # no-context level there: two models that ignore their input, :func:`sweeps.report.findings.findings`)
    compared: tuple[Optional[Compared], ...]
    settled: Optional[float]  # the budget it settled at (None: not settled by the largest certified one)
    about: str
    certified: tuple[bool, ...] = ()  # per budget: the control certifies it (() : every budget, no control)

    def certifies(self, i: int) -> bool:
        return not self.certified or self.certified[i]

    @property
    def span(self) -> tuple[int, int]:
        """[i, j): the budgets the verdict is read over (:func:`read_span`)."""
        return read_span(self.certified, self.compared)


@dataclass(frozen=True)
class ArmCurve:
    """One arm's mean cooldown point at each budget, and the paired change between its last two."""

    arm: str
    means: tuple[float, ...]
    last: Optional[stats.Comparison]  # last − previous, paired over seeds (None: fewer than two budgets)
    direction: str
    delta: float

    @property
    def improving(self) -> Optional[bool]:
        return improving(self.last, self.direction, self.delta)


@dataclass(frozen=True)
class ControlCurve:
    """The control at each budget, judged on its cooldown points there: the reference's context gain and the power
    check (None: not judged at that budget yet)."""

    gains: tuple[Optional[ContextGain], ...]
    powers: tuple[Optional[stats.PowerCheck], ...]

    @property
    def certified(self) -> tuple[bool, ...]:
        """Per budget: the control certifies the study there (:func:`sweeps.control.certified`)."""
        return tuple(certified(g, p) for g, p in zip(self.gains, self.powers))


@dataclass(frozen=True)
class Curves:
    """A curve study's numbers: the budgets every trial has run, the control over them (None: the study has none),
    every pair and every arm."""

    factors: tuple[float, ...]
    control: Optional[ControlCurve]
    pairs: list[PairCurve]
    arms: list[ArmCurve]


def improving(last: Optional[stats.Comparison], direction: str, delta: float) -> Optional[bool]:
    """Still improving: the change of the cooldown point over the last doubling is in the metric's favour,
    significant at α, and at least δ/2 (what keeps a verdict from settling); None: no spread to judge by."""
    if last is None or not last.judged:
        return None
    return last.p_value < stats.ALPHA and last.a_better(direction) and abs(last.diff) >= delta / 2


def moved_little(values: Sequence[float], delta: float) -> bool:
    """Both arms' means moved less than δ/2 over one doubling (``values``: before and after, per arm)."""
    return all(abs(after - before) < delta / 2 for before, after in values)


def settled_at(factors: Sequence[float], verdicts: Sequence[str], moves: Sequence[bool]) -> Optional[float]:
    """The budget a verdict settled at: the smallest B_i (i ≥ 1) such that at every doubling from B_{i−1} → B_i on,
    the arms moved less than δ/2 (``moves[j]``: over B_{j} → B_{j+1}) and the verdict read the same on both sides;
    None when the last doubling fails that (not settled by the largest budget)."""
    settled = None
    for j in range(len(factors) - 1, 0, -1):
        if not (moves[j - 1] and verdicts[j - 1] == verdicts[j]):
            break
        settled = factors[j]
    return settled


def certified_span(certified: Sequence[bool]) -> tuple[int, int]:
    """[i, j): the last run of consecutive True in ``certified`` ((0, 0) when there is none). A verdict is read only
    where the control certifies it, and a doubling is judged only between two such budgets."""
    j = max((k + 1 for k, c in enumerate(certified) if c), default=0)
    i = j
    while i > 0 and certified[i - 1]:
        i -= 1
    return i, j


def read_span(certified: Sequence[bool], compared: Sequence[Optional[Compared]]) -> tuple[int, int]:
    """[i, j): the budgets a pair's verdict is read over, the last run of consecutive budgets that the control
    certifies (``certified``; () without a control: all of them) and where the pair has a verdict."""
    return certified_span([(not certified or certified[k]) and c is not None for k, c in enumerate(compared)])


def about(
    compared: Sequence[Compared],
    effects: Sequence[dict],
    factors: Sequence[float],
    settled: Optional[float],
    metric: str = "",
) -> str:
    """Whether a pair's verdict on ``metric`` is about the quality reached or about learning speed (the module's
    docstring), over the certified budgets it is given. Training throughput is neither: the same model steps at the
    same speed at every budget, so its verdicts are read per budget and not sorted into the two."""
    if not factors:
        return "no budget the control certifies"
    if len(factors) == 1:
        return f"read at ×{factors[0]:g} alone: not judged over budget"
    if metric == THROUGHPUT:
        return "a training step's speed: not learned, read at each budget"
    if settled is None:
        return f"not settled by ×{factors[-1]:g}: still changing (learning speed)"
    i = list(factors).index(settled)
    moved = stats.compare(effects[i], effects[0])  # the change of A − B from the smallest budget, paired by seed
    same = said(compared[0]) == said(compared[i]) and not (moved.judged and moved.p_value < stats.ALPHA)
    if same:
        return f"quality reached: the same from ×{factors[0]:g} on"
    return (
        f"learning speed at ×{factors[0]:g} ({said(compared[0])}, A − B {signed(compared[0].pair.comparison.diff)}); "
        f"the quality reached: {said(compared[i])} by ×{settled:g} (change {signed(moved.diff)}, {p_is(moved.p_value)})"
    )


def _pair_curve(
    found: list[Findings], factors: tuple[float, ...], key: tuple[str, str, str], certified: tuple[bool, ...]
) -> PairCurve:
    """The pair ``key`` (A, B, metric) at every budget; a budget where the report left it out (both arms blind
    there, as a short budget's arms can be) has no comparison, and the verdict is read over the budgets after it."""
    compared = tuple(next((c for c in f.compared if (c.pair.a, c.pair.b, c.pair.metric) == key), None) for f in found)
    a, b, metric = key
    delta = next(c for c in compared if c is not None).pair.delta
    means = [[stats.summarize(list(f.values[(arm, metric)].values())).mean for f in found] for arm in (a, b)]
    moves = [moved_little([(m[j], m[j + 1]) for m in means], delta) for j in range(len(factors) - 1)]
    verdicts = [said(c) if c is not None else NO_VERDICT for c in compared]
    effects = [claims.effects(f.values[(a, metric)], f.values[(b, metric)]) for f in found]
    i, j = read_span(certified, compared)
    settled = settled_at(factors[i:j], verdicts[i:j], moves[i : j - 1]) if j - i >= 2 else None
    said_about = about(compared[i:j], effects[i:j], factors[i:j], settled, metric)
    return PairCurve(a, b, metric, delta, factors, compared, settled, said_about, certified)


def curves(study: Study, rows: Sequence[Row], control_rows: Sequence[Row] = ()) -> Curves:
    """Every pair and every arm of a curve study over its budgets (the budgets every trial has run), and its control
    judged at each of them."""
    factors = tuple(f for f in study.budgets if at_budget(study, rows, f))
    if len(factors) < 2:
        return Curves(factors, None, [], [])
    found = [
        findings(study, at_budget(study, rows, f), at_budget(study.control, control_rows, f) if study.control else [])
        for f in factors
    ]
    control = ControlCurve(tuple(f.context for f in found), tuple(f.power for f in found)) if study.control else None
    marks = control.certified if control else (True,) * len(factors)
    # every pair judged at some budget, in the largest budget's order: a pair whose arms are both blind at a short
    # budget is judged from where one leaves the level, not dropped
    keys = dict.fromkeys((c.pair.a, c.pair.b, c.pair.metric) for f in reversed(found) for c in f.compared)
    pairs = [_pair_curve(found, factors, key, marks) for key in keys]
    metric, direction = study.metrics[0], study.directions[0]
    arms = []
    for arm in found[-1].own:
        values = [f.values.get((arm, metric), {}) for f in found]
        means = tuple(stats.summarize(list(v.values())).mean for v in values)
        arms.append(ArmCurve(arm, means, stats.compare(values[-1], values[-2]), direction, study.delta(metric)[0]))
    return Curves(factors, control, pairs, arms)


# --------------------------------------------------------------------------------------- words
def _cell(p: PairCurve, i: int) -> str:
    c = p.compared[i]
    if c is None:
        return NO_VERDICT
    lo, hi = c.pair.comparison.ci()
    words = said(c) if p.certifies(i) else "uninformative: the control does not certify this budget"
    return f"{signed(c.pair.comparison.diff)} {signed_interval(lo, hi)} {words}"


def _arm_cell(a: ArmCurve) -> str:
    if a.last is None or not a.last.judged:
        return "no spread to judge"
    if a.improving:
        words = "still improving"
    elif a.last.p_value < stats.ALPHA and a.last.a_better(a.direction):
        words = f"improving by less than δ/2 = {fmt(a.delta / 2)}"
    else:
        words = "not shown to improve"
    return f"{words}: {signed(a.last.diff)} over the last doubling ({p_is(a.last.p_value)}, {a.last.test})"


def section(study: Study, found: Curves, drawn: bool) -> list[str]:
    """The report's section: the settled rule, the control at each budget, the pairs' table and figure, the arms'
    table."""
    pairs, arms = found.pairs, found.arms
    x = [f"×{f:g}" for f in (found.factors if pairs else study.budgets)]
    out = [
        f"## {study.original_name} as training goes on: budgets {', '.join(x)}",
        "",
        "Each point is a cooldown branched off one constant-learning-rate trunk per seed and arm (its last "
        f"{fmt(study.shared.optim.cooldown_fraction * 100)} % of the budget's steps, the learning rate to 0). "
        "A verdict settled at the budget from whose doubling on both arms' mean points moved less than δ/2 at "
        "every doubling and the verdict read the same; it is about the quality reached when it reads the same at "
        "the smallest budget with an effect not shown to differ there (a paired t test over seeds), else about "
        "learning speed. Holm's families: the pairs at each budget, one family per budget (docs/verdicts.md). A "
        "verdict is read only at a budget where the control certifies the study (the reference gains its context "
        "and beats its degraded arm on their cooldown points there), and a doubling is judged only between two "
        "such budgets.",
        "",
    ]
    if not pairs:
        return out + ["No pair has a point at two budgets yet.", ""]
    if found.control is not None:
        out += control_table(found.control, x)
    body = [
        [
            f"{p.a} − {p.b} on {p.metric} (δ {fmt(p.delta)})",
            *(_cell(p, i) for i in range(len(p.factors))),
            _settled_cell(p),
            p.about,
        ]
        for p in pairs
    ]
    out += [*table(["pair: A − B, 95 % CI, verdict", *x, "settled", "about"], body), ""]
    if drawn:
        out += [f"![each pair's A − B against budget, 95 % CIs, ±δ dashed]({FIGURE})", ""]
    rows = [[a.arm, *map(fmt, a.means), _arm_cell(a)] for a in arms]
    out += [*table([f"arm: mean {study.metrics[0]}", *x, "at the end"], rows), ""]
    return out


def control_table(control: ControlCurve, x: list[str]) -> list[str]:
    """The control at each budget, above the verdicts it opens: the reference's context gain, the contrast with its
    degraded arm, and whether it certifies that budget."""

    def gain(g: Optional[ContextGain]) -> str:
        if g is None:
            return "not judged yet"
        return f"{fmt(g.gain)} {interval(*g.comparison.ci())} (needs ≥ {fmt(g.threshold)})"

    def power(p: Optional[stats.PowerCheck]) -> str:
        if p is None:
            return "not judged yet"
        c = p.contrast
        gap = f"{fmt(abs(c.diff))} ± {fmt(c.half_width)}"
        words = (
            f"reference better by {gap}"
            if p.separates
            else f"REVERSED: degraded better by {gap}"
            if p.reversed
            else f"does not separate ({signed(c.diff)} ± {fmt(c.half_width)})"
        )
        return words + ("" if p.leaves_trivial else "; the reference does not leave the trivial baseline")

    rows = [
        ["the reference's context gain [95 % CI]", *map(gain, control.gains)],
        ["the reference against its degraded arm", *map(power, control.powers)],
        ["certifies the verdicts", *("yes" if c else "no" for c in control.certified)],
    ]
    return [*table(["the control, on its cooldown points", *x], rows), ""]


def _settled_cell(p: PairCurve) -> str:
    i, j = p.span
    blind = [f"×{f:g}" for k, f in enumerate(p.factors) if p.certifies(k) and p.compared[k] is None]
    if j - i < 2:
        if blind:
            return f"not judged: no two consecutive budgets with a verdict (none at {', '.join(blind)})"
        return "not judged: the control certifies no two consecutive budgets"
    if (i, j) == (0, len(p.factors)):
        limited = ""
    elif all(p.certifies(k) for k in range(len(p.factors))):
        limited = f" (read over ×{p.factors[i]:g}–×{p.factors[j - 1]:g}: no verdict at {', '.join(blind)})"
    else:
        limited = f" (the control certifies ×{p.factors[i]:g}–×{p.factors[j - 1]:g})"
    if p.settled is None:
        return f"not settled by ×{p.factors[j - 1]:g}{limited}"
    return f"×{p.settled:g}: {said(p.compared[p.factors.index(p.settled)])}{limited}"


def figure(pairs: list[PairCurve], path: Path) -> bool:
    """budget_curves.png: each pair's A − B against budget (log axis), its 95 % CI as bars, ±δ dashed; one panel per
    metric (a study with two objectives, quality and tokens a second, has effects of other units and sizes)."""
    if not pairs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(dict.fromkeys(p.metric for p in pairs))
    hollow = any(not c for p in pairs for c in p.certified)
    with plt.style.context("default"):
        fig, axes = plt.subplots(len(metrics), 1, figsize=(7, 4.5 * len(metrics)), sharex=True, squeeze=False)
        for ax, metric in zip(axes[:, 0], metrics):
            _panel(ax, [p for p in pairs if p.metric == metric])
        axes[0, 0].set_title(
            "each verdict's effect as training goes on"
            + ("\n(hollow: a budget the control does not certify)" if hollow else "")
        )
        axes[-1, 0].set_xlabel("training budget (times the study's steps, log)")
        fig.tight_layout()
        write_figure(path, fig, dpi=110)
        plt.close(fig)
    return True


def _panel(ax: Any, pairs: list[PairCurve]) -> None:
    """One metric's pairs on one axis: A − B at each budget, side by side, with ±δ and 0 drawn."""
    for k, p in enumerate(pairs):
        shift = 1 + 0.03 * (k - (len(pairs) - 1) / 2)  # side by side at each budget
        shown = [k for k, c in enumerate(p.compared) if c is not None]  # no point where the pair has no verdict
        xs = [p.factors[k] * shift for k in shown]
        ys = [p.compared[k].pair.comparison.diff for k in shown]
        cis = [p.compared[k].pair.comparison.ci() for k in shown]
        err = [[y - lo for y, (lo, _) in zip(ys, cis)], [hi - y for y, (_, hi) in zip(ys, cis)]]
        line = ax.errorbar(xs, ys, yerr=err, capsize=3, label=f"{p.a} − {p.b}")
        colour = line[0].get_color()
        for k, x, y in zip(shown, xs, ys):  # hollow: a budget the control does not certify (drawn, not read)
            face = colour if p.certifies(k) else "white"
            ax.plot([x], [y], "o", markerfacecolor=face, markeredgecolor=colour, zorder=3)
    delta = pairs[0].delta
    for d in (delta, -delta):
        ax.axhline(d, color="gray", linestyle="--", linewidth=1)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(pairs[0].factors), [f"×{f:g}" for f in pairs[0].factors])
    ax.set_ylabel(f"A − B on {pairs[0].metric} (95 % CI; ±δ dashed)")
    ax.legend(fontsize="small")


def report_lines(study: Study, rows: Sequence[Row], control_rows: Sequence[Row], out: Path) -> list[str]:
    """The section of a curve study's report, its figure written to ``out``."""
    found = curves(study, rows, control_rows)
    return section(study, found, figure(found.pairs, out / FIGURE))
