"""``python -m experiments.summarize RUN_OR_EXPERIMENT_DIR ...``: print runs' final metrics side by side.

Each argument is a run directory (holding ``metrics.json``) or an experiment directory, whose newest
``version_*`` run is taken.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("val/ppl", "val/loss", "val/accuracy", "tokens_per_sec", "train_time_s", "peak_mem_mb", "parameters")


def newest_metrics(path: Path) -> Path:
    if (path / "metrics.json").is_file():
        return path / "metrics.json"
    runs = sorted(path.glob("version_*/metrics.json"), key=lambda p: int(p.parent.name.removeprefix("version_")))
    if not runs:
        raise FileNotFoundError(f"{path}: no metrics.json (has the run finished?)")
    return runs[-1]


def table(paths: list[Path]) -> str:
    rows = [("run", *COLUMNS)]
    for path in paths:
        m = json.loads(newest_metrics(path).read_text())
        rows.append((str(path), *(f"{m[c]:.4g}" if isinstance(m.get(c), (int, float)) else "-" for c in COLUMNS)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]]))
