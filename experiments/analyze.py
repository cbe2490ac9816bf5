"""``linformer-lab analyze RUN_DIR_OR_CKPT [--samples N] [--energy 0.9] [--index K] [--reference FULL_RUN]``.

Loads a trained run and writes into ``<run>/analysis/`` the spectrum of its attention (paper Fig. 1), a
suggested per-layer k, what E/F encode (Linformer) and ``summary.json``; the work is
:func:`training.analysis.analyze` (docs/analysis.md), the maths :mod:`lightning_modules.analysis`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.analysis import analyze, report

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run directory (runs/<experiment>/version_<i>) or a checkpoint file")
    parser.add_argument("--samples", type=int, default=16, help="validation sequences to average over (default 16)")
    parser.add_argument(
        "--energy",
        type=float,
        default=0.9,
        help="cumulative singular value share that defines effective rank and suggested k (default 0.9)",
    )
    parser.add_argument(
        "--index",
        type=int,
        default=None,
        help="index k at which the heatmap reads the curves (default: each layer's k for full "
        "attention, k/2 for Linformer)",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="a full-attention run on the same data: align E/F with its P's top singular vectors",
    )


def main(args: argparse.Namespace) -> int:
    summary = analyze(args.run, args.samples, args.energy, args.index, args.reference)
    print(report(summary))
    out = Path(summary["run_dir"]) / "analysis"
    print(
        f"written: {out}/ ({', '.join(summary['figures'])}, summary.json, k_schedule.yaml); "
        f"TensorBoard images under analysis/ in {summary['run_dir']}"
    )
    return 0
