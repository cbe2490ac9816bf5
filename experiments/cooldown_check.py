"""Does a budget curve's cooldown point answer as a run of its budget would? ``python -m experiments.cooldown_check
CONFIG [key=value ...] --seeds 0,1 --budgets 1,4 [--output-dir runs/cooldown_check] [--threads 1] [--schedule linear]``.

For each seed, the config trains as a budget curve (``sweeps/run/trunks.py``: one trunk at a constant learning rate,
a cooldown branched off it per budget, its last ``optim.cooldown_fraction`` of that budget's steps) and, beside it,
as a separate run of the **stretched schedule** at each budget (``sweep --budget F``'s recipe, :mod:`sweeps.spec.
budget`: every step count × F; ``--schedule``: its decay, linear to 0 at the new end by default, whatever the config's
own). Both end at the same number of steps.
The table gives, per budget, each seed's two objective values, the mean paired difference (cooldown − stretched)
with its 95 % CI over seeds, the seed spread (standard deviation) of each method, and :func:`agreement`.
Runs go to ``<output-dir>/<config name>/seed=<s>/{trunk,cooldown_x<F>,stretched_x<F>}`` and are resumed where they
exist; the table is also written there as ``comparison.md`` and ``comparison.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from foundation.atomic import atomic_write_text, write_json
from foundation.errors import ConfigError
from sweeps.report.markdown import fmt, interval, signed, table
from sweeps.run.trunks import train_curve
from sweeps.spec import budget, budgets, stats
from training import config as run_config
from training.train import run_objective, train


def stretched(cfg: Any, factor: float, run_dir: Path, schedule: str = "linear") -> Any:
    """``cfg`` at ``factor`` × its steps with a ``schedule`` decay (linear by default) stretched to the new end, in
    ``run_dir`` (resumed there)."""
    out = cfg.copy()
    out.optim.schedule = schedule
    if factor != 1:
        budget.scale_config(out, factor)
    out.run_dir = str(run_dir)
    out.resume = run_dir.is_dir()
    run_config.check(out)
    return out


def compare_seed(
    cfg: Any, folder: Path, factors: Sequence[float], metric: str, schedule: str = "linear"
) -> dict[str, tuple[float, float]]:
    """One seed: budget name -> (its cooldown point, the stretched run's final value) of ``metric``."""
    points = train_curve(cfg, folder, factors)
    out = {}
    for f in factors:
        name = budgets.name(f)
        separate = train(stretched(cfg, f, folder / f"stretched_{name}", schedule))
        out[name] = (float(points[name][metric]), float(separate[metric]))
    return out


def summary(results: dict[int, dict[str, tuple[float, float]]], factors: Sequence[float]) -> list[list[str]]:
    """The table's rows: per budget, each seed's values, the paired difference with its 95 % CI, the seed spreads."""
    rows = []
    for f in factors:
        name = budgets.name(f)
        cool = {s: r[name][0] for s, r in results.items()}
        sep = {s: r[name][1] for s, r in results.items()}
        c = stats.compare(cool, sep)
        lo, hi = c.ci()
        spreads = [stats.summarize(list(v.values())).std for v in (cool, sep)]
        seeds = "; ".join(f"{s}: {fmt(cool[s])} / {fmt(sep[s])}" for s in sorted(results))
        rows.append(
            [f"×{f:g}", seeds, f"{signed(c.diff)} {interval(lo, hi)}", *map(fmt, spreads), agreement(c, spreads)]
        )
    return rows


def agreement(c: stats.Comparison, spreads: Sequence[float]) -> str:
    """How the two methods compare at a budget: they **differ** where the 95 % CI of the paired difference excludes 0;
    agree **within seed noise** where it holds 0 and the mean difference is at most the smaller seed spread; else they
    are **not shown to agree** (more seeds would tell)."""
    noise = min(spreads)
    if not c.judged or not math.isfinite(noise):
        return "not judged (one seed)"
    lo, hi = c.ci()
    if not lo <= 0 <= hi:
        return "differs"
    return "within seed noise" if abs(c.diff) <= noise else f"not shown to agree ({c.n} seeds)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--budgets", default="1,4", help="comma-separated budgets, times the steps (default 1,4)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/cooldown_check"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument(
        "--schedule",
        default="linear",
        choices=["linear", "cosine", "constant"],
        help="the decay of the separate runs (default linear: Hägele et al.'s comparison; the config's own is ignored)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        seeds = [int(s) for s in str(args.seeds).split(",")]
        base = run_config.load(args.config, [*args.overrides, f"trainer.cpu_threads={args.threads}"])
        factors = budgets.check_factors(budgets.parse(args.budgets), base.trainer.max_steps, minimum=1)
        budgets.check_curve(base, factors, minimum=1)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    metric = run_objective(base).metric
    root = args.output_dir / args.config.stem
    results = {}
    for seed in seeds:
        cfg = base.copy()
        cfg.seed = seed
        results[seed] = compare_seed(cfg, root / f"seed={seed}", factors, metric, args.schedule)
    header = [
        "budget",
        "seed: cooldown / stretched",
        "cooldown − stretched, 95 % CI",
        "sd cooldown",
        "sd stretched",
        "",
    ]
    lines = [
        f"{metric} of {args.config.name} {' '.join(args.overrides)}",
        "",
        *table(header, summary(results, factors)),
    ]
    atomic_write_text(root / "comparison.md", "\n".join(lines) + "\n", root)
    write_json(root / "comparison.json", {str(s): r for s, r in results.items()}, root)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
