"""``linformer-lab time-to-target DIR... --target PPL``: wall-clock seconds and tokens each variant
needed to reach a validation perplexity (the comparison the paper leaves out).

Every run's ``metrics.json`` holds ``ppl_vs_wallclock``: [(training seconds, tokens, val ppl), ...],
one point per full validation (TensorBoard draws ``val/ppl`` against time with its "Relative" x axis). A run
reaches the target at its first validation with ppl ≤ target; seconds and tokens are interpolated
linearly in ppl between that validation and the one before it (the first validation itself if it
already reaches the target). Runs are grouped into variants by the config values that differ
between them (seed, names and paths excluded), or by the keys given with ``--by``; a variant's
numbers are medians over its runs, with how many runs reached the target.

Each DIR is a run directory or any folder above runs (an experiment, a sweep study): every
``metrics.json`` below it with a ``config.yaml`` beside it is one run.

A target that a model without context already reaches is refused: the lowest no-context perplexity of the runs
(exp of metrics.json's unigram loss on the same targets, ``baselines`` ``unigram/loss``, else ``trivial_loss``)
must lie above it, or a time to it measures no use of context.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

from foundation.atomic import atomic_write_text
from foundation.checked import read_json, read_run_config
from foundation.configfile import flatten
from foundation.errors import ConfigError, check_number
from foundation.paths import check_path
from sweeps.report.efficiency import no_context_ppl
from training.curves import reach

# Keys that differ between runs of the same variant.
PER_RUN_KEYS = ("seed", "experiment", "run_dir", "output_dir", "resume", "data.cache_dir")


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Run directories (holding metrics.json and config.yaml) at or below ``paths``."""
    runs: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise ConfigError(f"{path}: not a directory")
        found = [path] if (path / "metrics.json").is_file() else sorted(p.parent for p in path.rglob("metrics.json"))
        runs += [r for r in found if (r / "config.yaml").is_file()]
    if not runs:
        raise ConfigError(f"{', '.join(map(str, paths))}: no run directory (metrics.json with config.yaml) found")
    return runs


def _load(run: Path) -> tuple[dict, list[tuple[float, float, float]], dict]:
    metrics = read_json(run / "metrics.json")
    config = flatten(read_run_config(run))
    curve = [tuple(float(v) for v in point) for point in metrics.get("ppl_vs_wallclock", [])]
    return config, curve, metrics


def variant_keys(configs: list[dict]) -> list[str]:
    """Config keys whose values differ between runs, per-run keys excluded."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if k not in PER_RUN_KEYS and len({json.dumps(c.get(k)) for c in configs}) > 1]


def rows(paths: Sequence[Path], target: float, by: Optional[Sequence[str]] = None) -> tuple[list[dict], list[str]]:
    """One row per variant: runs, how many reached ``target``, median seconds and tokens to reach
    it, median final val ppl and tokens/s. Also returns the keys that define the variants."""
    loaded = [(run, *_load(run)) for run in find_runs(paths)]
    keys = list(by) if by else variant_keys([c for _, c, _, _ in loaded])
    unknown = [k for k in keys if all(k not in c for _, c, _, _ in loaded)]
    if unknown:
        raise ConfigError(f"--by: {', '.join(unknown)} is not a config key of these runs")
    groups: dict[str, list] = defaultdict(list)
    for _run, config, curve, metrics in loaded:
        label = ", ".join(f"{k.removeprefix('model.')}={config.get(k)}" for k in keys) or "all runs"
        groups[label].append((curve, metrics))
    out = []
    for label, members in sorted(groups.items()):
        reached = [r for r in (reach(curve, target) for curve, _ in members) if r is not None]
        finals = [curve[-1][2] for curve, _ in members if curve]
        speeds = [float(m["tokens_per_sec"]) for _, m in members if "tokens_per_sec" in m]
        out.append(
            {
                "variant": label,
                "runs": len(members),
                "reached": len(reached),
                "seconds": _median([s for s, _ in reached]),
                "tokens": _median([t for _, t in reached]),
                "final_ppl": _median(finals),
                "tokens_per_s": _median(speeds),
            }
        )
    return out, keys


def _median(values: list[float]) -> Optional[float]:
    if not values:
        return None
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def _fmt(value: Optional[float], spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def markdown(table_rows: list[dict], target: float, keys: Sequence[str]) -> str:
    lines = [
        f"### Time to validation perplexity ≤ {target:g}",
        "",
        f"Variants differ in: {', '.join(keys) or 'nothing (one group)'}. Medians over the runs that reached "
        "the target; seconds are training-step seconds.",
        "",
        "| variant | runs | reached | seconds | tokens | final val ppl | tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table_rows:
        lines.append(
            f"| {r['variant']} | {r['runs']} | {r['reached']} | {_fmt(r['seconds'], '.1f')} | "
            f"{_fmt(r['tokens'], '.3g')} | {_fmt(r['final_ppl'], '.2f')} | {_fmt(r['tokens_per_s'], '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def check_targets(paths: Sequence[Path], targets: Sequence[float]) -> None:
    """Refuse a target that a model without context reaches on these runs' data (one line, exit 2)."""
    floors = [p for run in find_runs(paths) if (p := no_context_ppl(_load(run)[2])) is not None]
    if not floors:
        return
    for target in targets:
        if target >= min(floors):
            raise ConfigError(
                f"--target: {target:g} is reached by a model without context (val ppl {min(floors):.4g}, the "
                "unigram baseline of these runs): a time to it measures no use of context; give a target below it"
            )


def report(paths: Sequence[Path], targets: Sequence[float], by: Optional[Sequence[str]] = None) -> str:
    """The markdown tables, one per target (what the CLI prints and a study report can embed)."""
    check_targets(paths, targets)
    tables = []
    for target in targets:
        table_rows, keys = rows(paths, target, by)
        tables.append(markdown(table_rows, target, keys))
    return "\n".join(tables)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, help="run directories or folders above them")
    parser.add_argument("--target", required=True, help="validation perplexity to reach (comma-separated for several)")
    parser.add_argument(
        "--by",
        default=None,
        help="config keys that define a variant, comma-separated (default: every key that differs between the runs)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the tables to this markdown file")


def main(args: argparse.Namespace) -> int:
    try:
        targets = [float(t) for t in args.target.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--target: expected numbers, got {args.target!r}") from None
    if not targets:
        raise ConfigError(f"--target: expected positive perplexities, got {args.target!r}")
    for target in targets:
        check_number("--target", target, 0, None, low_open=True)
    if args.out is not None:
        check_path("--out", str(args.out))
        if args.out.is_dir():
            raise ConfigError(f"--out: {args.out} is a folder, not a markdown file")
    by = [k.strip() for k in args.by.split(",") if k.strip()] if args.by else None
    text = report(args.dirs, targets, by)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, text)
    return 0
