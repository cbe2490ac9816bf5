"""``linformer-lab glue-standin DIR``: a GLUE-layout folder for machines without GLUE.

It writes the same layout (``DIR/<task>/<split>.jsonl``, the hub's columns and splits, test labels
-1) from the embedded Rotten Tomatoes sentences, for machines without GLUE: a smoke-scale stand-in that exercises
every task's data path, head and metric, **not GLUE**; its ``DIR/STAND-IN.md`` says so, and the pipeline's table
repeats it. Each task's columns, classes and test splits come from its shipped config
(``experiments/configs/glue/<task>.yaml``). Labels follow rules a model can learn from the text:

- one sentence (CoLA, SST-2): the sentence's sentiment;
- two classes of pairs (MRPC, QQP, QNLI, RTE, WNLI): 1 when both sentences have the same sentiment;
- MNLI: 0 when the hypothesis is the end of the premise's own sentence, 1 another sentence of the same
  sentiment, 2 one of the other sentiment;
- STS-B: sentence2 is sentence1 with a random share of its words replaced by another sentence's; the label is
  5 × the share kept, a number in [0, 5].

Training examples come from the reviews' train split, validation and test examples from their validation and
test splits (the ones MLM pretraining on ``data.source: embedded`` never sees).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from experiments.glue import GLUE_TASKS, check_tasks, task_config
from foundation.atomic import atomic_write_text
from foundation.errors import ConfigError

STAND_IN = "STAND-IN.md"
STAND_IN_LINE = "a smoke-scale stand-in built from the embedded movie reviews, not GLUE"


def write_standin(folder: Path, tasks: list[str], examples: int, seed: int = 0) -> list[Path]:
    """GLUE-layout stand-in folders ``folder/<task>/`` (see the module docstring): ``examples`` training examples
    per task, a quarter as many in each evaluation split; returns the files written."""
    from datamodules.embedded import load_embedded

    reviews = load_embedded(sources="rotten_tomatoes")
    pools = {split: list(zip(reviews[split]["text"], reviews[split]["label"])) for split in reviews}
    written = []
    for task in tasks:
        cfg = task_config(task)
        rng = random.Random(f"{task}/{seed}")
        eval_splits = list(cfg.data.classify.test_splits.values()) if cfg.data.classify.test_splits else ["validation"]
        tests = [s.replace("validation", "test") for s in eval_splits]
        sizes = {"train": examples, **{s: max(1, examples // 4) for s in [*eval_splits, *tests]}}
        (folder / task).mkdir(parents=True, exist_ok=True)
        for split, n in sizes.items():
            pool = pools["train" if split == "train" else "validation" if split.startswith("validation") else "test"]
            rows = [_example(cfg, rng, pool) for _ in range(n)]
            for i, row in enumerate(rows):
                row["idx"] = i
                if split.startswith("test"):
                    row["label"] = -1.0 if cfg.data.classify.regression else -1  # hidden, as GLUE's
            path = folder / task / f"{split}.jsonl"
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
            written.append(path)
    atomic_write_text(
        folder / STAND_IN,
        f"{STAND_IN_LINE}.\n\nWritten by `linformer-lab glue-standin` ({examples} training examples per task, "
        f"seed {seed}). It has GLUE's layout, columns and metrics, so every task's data path, head and metric run; "
        "its labels follow rules of experiments/glue.py. Scores on it say nothing about GLUE.\n",
    )
    return written


def _example(cfg, rng: random.Random, pool: list[tuple[str, int]]) -> dict:
    """One example of the task ``cfg`` describes, by the rules of the module docstring."""
    data, classify = cfg.data, cfg.data.classify
    a, label = rng.choice(pool)
    if data.text_pair_column is None:
        return {data.text_column: a, "label": int(label)}
    if classify.regression:
        words, other = a.split(), rng.choice(pool)[0].split() or ["film"]
        kept = rng.randint(0, 5) / 5
        b = " ".join(w if rng.random() < kept else rng.choice(other) for w in words)
        same = sum(x == y for x, y in zip(words, b.split())) / max(1, len(words))
        return {data.text_column: a, data.text_pair_column: b, "label": round(5 * same, 2)}
    if classify.num_labels == 3:  # MNLI: entailment, neutral, contradiction
        target = rng.randrange(3)
        words = a.split()
        half = max(1, len(words) // 2)
        if target == 0:
            premise, hypothesis = " ".join(words[:half]), " ".join(words[half:]) or words[-1]
        else:
            want = label if target == 1 else 1 - label
            premise, hypothesis = a, _with_label(rng, pool, want)
        return {data.text_column: premise, data.text_pair_column: hypothesis, "label": target}
    same = rng.random() < 0.5
    b = _with_label(rng, pool, label if same else 1 - label)
    return {data.text_column: a, data.text_pair_column: b, "label": int(same)}


def _with_label(rng: random.Random, pool: list[tuple[str, int]], label: int) -> str:
    while True:
        text, y = rng.choice(pool)
        if y == label:
            return text


# ------------------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="where to write the stand-in (one sub-folder per task)")
    parser.add_argument("--tasks", nargs="+", default=list(GLUE_TASKS), help="GLUE tasks (default: all)")
    parser.add_argument("--examples", type=int, default=2000, help="training examples per task (default 2000)")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    if args.examples < 4:
        raise ConfigError(f"--examples: must be >= 4, got {args.examples}")
    folder = Path(args.folder)
    files = write_standin(folder, check_tasks(args.tasks), args.examples, args.seed)
    print(f"wrote {len(files)} split files under {folder}/: {STAND_IN_LINE}")
    return 0
