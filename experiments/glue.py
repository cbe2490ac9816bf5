"""``linformer-lab glue-download DIR``: the hub's GLUE saved once, for ``data.source`` offline.

It (needs internet, once) saves ``nyu-mll/glue`` as ``DIR/<task>/<split>.parquet``, one file per split under the
hub's split names and with its columns and class names, so that
``linformer-lab train experiments/configs/glue/<task>.yaml data.source=DIR/<task>`` runs offline. Equivalent
one-liner: ``python -c "from datasets import load_dataset as l; [d.to_parquet(f'DIR/cola/{s}.parquet') for s, d in
l('nyu-mll/glue', 'cola').items()]"``. Without internet, ``linformer-lab glue-standin`` writes a stand-in of the
same layout (``experiments/glue_standin.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from foundation.errors import ConfigError
from training import config as run_config

GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
HUB_ID = "nyu-mll/glue"


def task_config(task: str):
    """The shipped config of a GLUE task."""
    return run_config.load(run_config.CONFIG_DIR / "glue" / f"{task}.yaml")


def check_tasks(names: list[str]) -> list[str]:
    unknown = [t for t in names if t not in GLUE_TASKS]
    if unknown:
        raise ConfigError(f"--tasks: {unknown[0]!r} is not a GLUE task; choose among {', '.join(GLUE_TASKS)}")
    return names


# ------------------------------------------------------------------------------------- download
def download(folder: Path, tasks: list[str]) -> list[Path]:
    """Save every task's hub splits as ``folder/<task>/<split>.parquet``; returns the files written."""
    from datasets import load_dataset

    written = []
    for task in tasks:
        try:
            splits = load_dataset(HUB_ID, task)
        except (OSError, ValueError) as err:  # offline (ConnectionError), unknown subset
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(
                f"glue-download: cannot load {HUB_ID!r} (subset {task!r}): {reason}; run this command on a machine "
                f"with internet and copy {folder} here"
            ) from None
        (folder / task).mkdir(parents=True, exist_ok=True)
        for split, ds in splits.items():
            path = folder / task / f"{split}.parquet"
            ds.to_parquet(str(path))  # the features (class names) travel in the file's metadata
            written.append(path)
    return written


# ------------------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="where to save GLUE (one sub-folder per task)")
    parser.add_argument("--tasks", nargs="+", default=list(GLUE_TASKS), help="GLUE tasks (default: all)")


def main(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    files = download(folder, check_tasks(args.tasks))
    print(f"saved {len(files)} split files under {folder}/; train offline with, e.g.:")
    print(f"  linformer-lab train experiments/configs/glue/{args.tasks[0]}.yaml data.source={folder / args.tasks[0]}")
    return 0
