"""The bench's outputs: ``results.csv``, ``table.md`` (the paper's Table 3 layout), ``scaling.png``
(Figure 2: time and memory against n on log-log axes, with each curve's fitted slope) and the same
numbers, figure and table in TensorBoard (the bench directory is the log directory).

A row is a dict with the keys of :data:`COLUMNS`; a skipped case is a row with only its identity
and ``note``.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional

from experiments.benchmarks.cases import BASELINE_LABELS, BASELINES
from foundation.atomic import atomic_text

COLUMNS = (
    "level",
    "mode",
    "variant",
    "k",
    "order",
    "order_used",
    "engine",
    "causal",
    "n",
    "batch",
    "dtype",
    "device",
    "threads",
    "repeats",
    "calls",
    "time_ms_median",
    "time_ms_min",
    "time_ms_max",
    "tokens_per_s",
    "peak_mem_mb",
    "gflop",
    "gflops_per_s",
    "gemm_peak_gflops",
    "efficiency",
    "efficiency_paired",
    "speedup_vs_sdpa",
    "speedup_vs_naive",
    "memory_saving_vs_sdpa",
    "memory_saving_vs_naive",
    "note",
)
MODE_NAMES = {"fwd": "forward (inference mode)", "fwdbwd": "forward + backward"}


def write_csv(path: Path, rows: list[dict], columns: Optional[list[str]] = None) -> None:
    """One row per dict; columns: ``COLUMNS`` (the bench's cases) unless given."""
    columns = columns or COLUMNS
    with atomic_text(path) as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _cell(row.get(c)) for c in columns})


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else value


def _x(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _timed(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("time_ms_median") is not None]


def _label(row: dict) -> str:
    if row["variant"] in BASELINES:
        return row["variant"] + (" causal" if row["causal"] else "")
    engine = row.get("engine", "auto")  # rows of an earlier results.csv have no engine: auto
    return (
        row["variant"]
        + ("" if row["order"] == "auto" else f" ({row['order']})")
        + ("" if engine == "auto" else f" engine={engine}")
    )


def _full_label(row: dict) -> str:
    """One curve: the variant with its k."""
    return _label(row) + ("" if row["k"] is None else f" k={row['k']}")


def _efficiency(row: dict) -> str:
    return f"{row['efficiency']:.0%} ({row['efficiency_paired']:.0%})"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in body]


def _variant_sections(rows: list[dict]) -> list[str]:
    """Table 3: per level, mode and variant, rows n and columns k, time and memory multipliers."""
    out: list[str] = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in _timed(rows):
        if r["level"] in ("layer", "model") and r["variant"] not in BASELINES:
            groups[(r["level"], r["mode"], _label(r))].append(r)
    for (level, mode, label), group in groups.items():
        ks = sorted({r["k"] for r in group})
        ns = sorted({r["n"] for r in group})
        cell = {(r["n"], r["k"]): r for r in group}
        used = sorted({r["order_used"] for r in group})
        out += [
            f"### {level} · {MODE_NAMES[mode]} · {label}",
            "",
            f"Evaluation order of E K used: {', '.join(used)}. Multipliers are baseline ÷ this variant (higher is "
            "better), medians of per-round paired ratios. Efficiency: achieved matrix FLOP/s ÷ the start-up "
            "GEMM peak, and in brackets ÷ the same peak GEMM timed again in the same rounds.",
            "",
        ]
        for base in BASELINES:
            header = ["n"] + [f"time k={k}" for k in ks] + [f"memory k={k}" for k in ks]
            if base == "sdpa":
                header += [f"efficiency k={k}" for k in ks]
            body = []
            for n in ns:
                line = [str(n)]
                line += [_x(cell[(n, k)].get(f"speedup_vs_{base}")) if (n, k) in cell else "–" for k in ks]
                line += [_x(cell[(n, k)].get(f"memory_saving_vs_{base}")) if (n, k) in cell else "–" for k in ks]
                if base == "sdpa":
                    line += [_efficiency(cell[(n, k)]) if (n, k) in cell else "–" for k in ks]
                body.append(line)
            out += [f"Over {BASELINE_LABELS[base]}:", ""] + _table(header, body) + [""]
    return out


def _baseline_section(rows: list[dict]) -> list[str]:
    base = [r for r in _timed(rows) if r["variant"] in BASELINES and r["level"] in ("layer", "model")]
    if not base:
        return []
    body = [
        [
            r["level"],
            r["mode"],
            _label(r),
            str(r["n"]),
            f"{r['time_ms_median']:.3g}",
            f"{r['time_ms_min']:.3g}–{r['time_ms_max']:.3g}",
            f"{r['peak_mem_mb']:.4g}",
            _efficiency(r),
        ]
        for r in sorted(base, key=lambda r: (r["level"], r["mode"], _label(r), r["n"]))
    ]
    return (
        ["## Baselines (absolute)", ""]
        + _table(["level", "mode", "baseline", "n", "median ms", "min–max ms", "peak MB", "efficiency"], body)
        + [""]
    )


def _decode_section(rows: list[dict]) -> list[str]:
    dec = _timed(r for r in rows if r["level"] == "decode")
    if not dec:
        return []
    labels = sorted({_full_label(r) for r in dec})
    cell = {(_full_label(r), r["n"]): r for r in dec}
    positions = sorted({r["n"] for r in dec})
    first = positions[0]
    body = []
    for p in positions:
        line = [str(p)]
        for lab in labels:
            r = cell.get((lab, p))
            line.append(
                "–"
                if r is None
                else f"{r['time_ms_median']:.3g} ms "
                f"({r['time_ms_median'] / cell[(lab, first)]['time_ms_median']:.2f}× of n={first})"
            )
        body.append(line)
    return (
        [
            "## Streaming decode: time per token at a position",
            "",
            "One token through `decode_step` with the state of all earlier tokens; causal Linformer keeps a "
            "fixed-size state, full attention a growing key/value cache. Median over the steps just before "
            "each position; in brackets, relative to the first position.",
            "",
        ]
        + _table(["position"] + labels, body)
        + [""]
    )


def _loop_section(rows: list[dict]) -> list[str]:
    loop = [r for r in rows if r["level"] == "loop"]
    if not loop:
        return []
    body = [
        [
            r["variant"],
            str(r["n"]),
            str(r["batch"]),
            f"{r['time_ms_median']:.4g}" if r.get("time_ms_median") else "–",
            r.get("note") or "",
        ]
        for r in loop
    ]
    return (
        ["## Lightning loop vs bare PyTorch loop (same model, batches and optimiser)", ""]
        + _table(["loop", "n", "batch", "median ms/step", "note"], body)
        + [""]
    )


def _skipped_section(rows: list[dict]) -> list[str]:
    skipped = [r for r in rows if r.get("time_ms_median") is None and r["level"] != "loop"]
    if not skipped:
        return []
    return (
        ["## Skipped cases", ""]
        + [f"- {r['level']} {r['mode']} {_full_label(r)} n={r['n']}: {r['note']}" for r in skipped]
        + [""]
    )


def markdown(rows: list[dict], header: list[str]) -> str:
    lines = ["# Linformer efficiency bench", ""] + header + [""]
    lines += _variant_sections(rows) + _baseline_section(rows) + _decode_section(rows) + _loop_section(rows)
    lines += _skipped_section(rows)
    return "\n".join(lines).rstrip() + "\n"


def fitted_slope(ns: list[float], ys: list[float]) -> Optional[float]:
    """Least-squares slope of log y against log n (the exponent of y ∝ nᵖ); None under two points."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if n > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return None if sxx == 0 else sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def _curves(rows: list[dict], level: str, mode: str, metric: str) -> dict[str, tuple[list, list]]:
    curves: dict[str, tuple[list, list]] = {}
    for r in sorted(_timed(rows), key=lambda r: r["n"]):
        if r["level"] == level and r["mode"] == mode and r.get(metric) is not None:
            label = _full_label(r)
            xs, ys = curves.setdefault(label, ([], []))
            xs.append(r["n"])
            ys.append(r[metric])
    return curves


def figure(rows: list[dict]) -> Any:
    """Figure 2: per level and mode, time (left) and peak memory (right) against n, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = ("layer", "model", "decode")  # the loop case is one point, not a curve
    panels = sorted(
        {(r["level"], r["mode"]) for r in _timed(rows) if r["level"] in order}, key=lambda p: (order.index(p[0]), p[1])
    )
    fig, axes = plt.subplots(
        max(1, len(panels)), 2, figsize=(17, 4.5 * max(1, len(panels))), squeeze=False, layout="constrained"
    )
    for (level, mode), row_axes in zip(panels, axes):
        y_names = (("time_ms_median", "ms per token" if level == "decode" else "ms"), ("peak_mem_mb", "peak MB"))
        for ax, (metric, unit) in zip(row_axes, y_names):
            colours = iter(plt.cm.tab20.colors * 4)
            for label, (xs, ys) in _curves(rows, level, mode, metric).items():
                slope = fitted_slope(xs, ys)
                base = label.split()[0] in BASELINES  # baselines: thick black/grey, dashed when causal
                style = (
                    {
                        "color": "black" if label.startswith("naive") else "grey",
                        "linewidth": 2.2,
                        "linestyle": "--" if "causal" in label else "-",
                    }
                    if base
                    else {"color": next(colours)}
                )
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    markersize=3,
                    **style,
                    label=f"{label} (slope {slope:.2f})" if slope is not None else label,
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("position" if level == "decode" else "sequence length n")
            ax.set_ylabel(unit)
            ax.set_title("streaming decode, per token" if level == "decode" else f"{level} · {MODE_NAMES[mode]}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
            else:
                ax.set_visible(False)  # decode has no memory curve
    return fig


def tensorboard(log_dir: Path, rows: list[dict], png: Path, table: str) -> None:
    """Scalars (x axis: n), the figure (the saved PNG: drawing it again is slow) and the table."""
    import matplotlib.pyplot as plt
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    metrics = (
        "time_ms_median",
        "peak_mem_mb",
        "efficiency",
        "efficiency_paired",
        "speedup_vs_sdpa",
        "speedup_vs_naive",
        "memory_saving_vs_sdpa",
        "memory_saving_vs_naive",
        "tokens_per_s",
    )
    for r in _timed(rows):
        label = _full_label(r).replace(" ", "_")
        for m in metrics:
            if r.get(m) is not None:
                writer.add_scalar(f"{r['level']}_{r['mode']}/{m}/{label}", r[m], global_step=int(r["n"]))
    writer.add_image("scaling", plt.imread(png)[..., :3], dataformats="HWC")
    writer.add_text("table", table)
    writer.close()


def kind_costs(rows: list[dict], command: str, machine: str, date: str) -> dict:
    """The long-sequence cost of each attention kind for the study reports (``sweeps.report.efficiency``): its layer's
    forward + backward time and peak memory at every n, and both as multiples of full attention (SDPA) in the
    same rounds; one variant per kind, the first the run lists (baselines: ``sdpa`` as the kind ``full``)."""
    from experiments.benchmarks.cases import attention_config

    kinds: dict[str, dict] = {}
    for r in rows:
        if r.get("level") != "layer" or r.get("mode") != "fwdbwd" or r.get("time_ms_median") is None:
            continue
        if r["variant"] == "naive" or r.get("causal") or r.get("engine", "auto") != "auto":
            continue
        kind = attention_config(r["variant"], r["k"], "auto", r["n"])["kind"]
        entry = kinds.setdefault(kind, {"kind": kind, "variant": r["variant"], "k": r["k"], "by_n": {}})
        if entry["variant"] != r["variant"]:
            continue
        entry["by_n"][str(r["n"])] = {
            "time_ms": r["time_ms_median"],
            "peak_mb": r["peak_mem_mb"],
            "time_vs_full": 1.0 if r["variant"] == "sdpa" else r.get("speedup_vs_sdpa"),
            "memory_vs_full": 1.0 if r["variant"] == "sdpa" else r.get("memory_saving_vs_sdpa"),
        }
    return {"command": command, "machine": machine, "date": date, "kinds": list(kinds.values())}
