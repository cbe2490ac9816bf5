"""How much of a paired difference between two runs is validation-sampling noise, as a function of the size of
the validation set: ``python -m experiments.validation_noise RUN_A RUN_B [--metric masked_loss] [--sizes …]``.

Both runs must have scored the same validation examples (``metrics.json``'s ``validation_examples``: one sum and
one target count per example, in the same order for every run of a data config). For each size m, the m examples
evenly spaced through the set (as ``data.max_val_blocks`` = m chooses them) are resampled with replacement, the
difference of the token-weighted means

    d* = Σ_i* sum_A / Σ_i* count − Σ_i* sum_B / Σ_i* count

is computed for each resample, and the table gives d on the m examples, the bootstrap standard error of d and the
half-width of its 95 % percentile interval.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def examples(run: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(sums, counts) of ``metric`` per validation example of a run directory."""
    entry = json.loads((run / "metrics.json").read_text())["validation_examples"][metric]
    return np.asarray(entry["sum"], dtype=np.float64), np.asarray(entry["count"], dtype=np.float64)


def paired_noise(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], size: int, resamples: int, seed: int = 0
) -> tuple[float, float, float]:
    """(d, bootstrap standard error of d, half-width of its 95 % interval) on ``size`` evenly spaced examples."""
    n = len(a[0])
    chosen = (np.arange(size) * n) // size
    (sa, ca), (sb, cb) = (tuple(x[chosen] for x in run) for run in (a, b))
    picks = np.random.default_rng(seed).integers(0, size, (resamples, size))  # (R, m) examples of each resample
    diffs = sa[picks].sum(1) / ca[picks].sum(1) - sb[picks].sum(1) / cb[picks].sum(1)  # (R,)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(sa.sum() / ca.sum() - sb.sum() / cb.sum()), float(diffs.std(ddof=1)), float((high - low) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--metric", default="masked_loss")
    parser.add_argument("--sizes", type=int, nargs="+", default=[640, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    a, b = examples(args.run_a, args.metric), examples(args.run_b, args.metric)
    if not np.array_equal(a[1], b[1]):
        raise SystemExit(f"error: the two runs did not score the same {args.metric} targets")
    print("| validation blocks | targets | A − B | bootstrap s.e. | 95 % half-width |\n|---|---|---|---|---|")
    for size in [m for m in args.sizes if m <= len(a[0])]:
        d, se, half = paired_noise(a, b, size, args.resamples)
        targets = int(a[1][(np.arange(size) * len(a[0])) // size].sum())
        print(f"| {size:,} | {targets:,} | {d:+.4f} | {se:.4f} | {half:.4f} |")


if __name__ == "__main__":
    main()
