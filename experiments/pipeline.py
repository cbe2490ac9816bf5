"""``linformer-lab pipeline PIPELINE.yaml [key=value ...]``: the paper's Table 2 end to end.

For every variant, pretrain (``pretrain.config`` + ``pretrain.overrides`` + the variant's overrides), then
fine-tune the pretrained encoder on every task (``tasks.<name>.config`` + its overrides, with ``init_from``
= the pretraining run and ``model`` = the pretraining run's model, so the architectures match by
construction). Every stage is one :func:`training.train.train` call. The pipeline writes
``<output_dir>/<experiment>/version_<i>/``::

    config.yaml                     the resolved pipeline config
    pretrain/<variant>/             a train() run directory per variant
    finetune/<variant>/<task>/      a train() run directory per variant and task
    results.md, results.csv         variant × task ``metric`` (test accuracy of the best validation
                                    checkpoint) plus their average over tasks, and the pretraining val/ppl
    events.out.tfevents.*           the same table as TensorBoard text, each cell as scalar
                                    ``table2/<task>/<variant>``

Config paths are relative to the pipeline file. Every stage config is loaded and checked before anything
trains, so a mistake in the last variant fails at once (exit 2, nothing written). ``resume=true`` reopens
the newest run of the pipeline: stages with a ``metrics.json`` are kept, an interrupted one resumes from
its last checkpoint, the rest run.
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from omegaconf import DictConfig, OmegaConf

from foundation.atomic import atomic_write_text
from foundation.checked import read_json
from foundation.configfile import merge, parse_overrides, resolve_includes
from foundation.errors import ConfigError
from foundation.paths import check_folder, check_name
from foundation.rundir import choose_run_dir
from training import config as run_config

METRICS = "metrics.json"


@dataclass
class StageConfig:
    config: str = ""  # an experiment YAML, relative to the pipeline file
    overrides: List[str] = field(default_factory=list)


@dataclass
class PipelineConfig:
    experiment: str = "pipeline"
    output_dir: str = "runs"
    resume: bool = False
    # The base MLM run; each variant adds its overrides to it.
    pretrain: StageConfig = field(default_factory=StageConfig)
    variants: Dict[str, List[str]] = field(default_factory=dict)
    # Fine-tuning runs (task: classify) applied to every variant's pretrained encoder.
    tasks: Dict[str, StageConfig] = field(default_factory=dict)
    # The fine-tuning metric that fills the table.
    metric: str = "test/accuracy"


@dataclass
class Stage:
    variant: str
    task: str  # "" for pretraining
    cfg: DictConfig


def load(path: str | Path, overrides: list[str] = ()) -> DictConfig:
    cfg = merge(PipelineConfig, [resolve_includes(Path(path)), *parse_overrides(list(overrides))])
    check_name("experiment", cfg.experiment)
    check_folder("output_dir", cfg.output_dir)
    if not cfg.pretrain.config:
        raise ConfigError("pretrain.config: required (the base MLM experiment YAML)")
    for key in ("variants", "tasks"):
        if not cfg[key]:
            raise ConfigError(
                f"{key}: required (a mapping of names to "
                f"{'override lists' if key == 'variants' else 'config + overrides'})"
            )
    for name, task in cfg.tasks.items():
        if not task.config:
            raise ConfigError(f"tasks.{name}.config: required (a fine-tuning experiment YAML)")
    return cfg


def stages(cfg: DictConfig, base_dir: Path, root: Path) -> list[Stage]:
    """Every stage's checked RunConfig, pretraining before the fine-tunings that read it."""
    out = []
    for name in [*cfg.variants, *cfg.tasks]:  # each becomes a folder of the pipeline's run directory
        check_name(f"{'variants' if name in cfg.variants else 'tasks'}.{name}", name)
    for variant, variant_overrides in cfg.variants.items():
        pre_dir = root / "pretrain" / variant
        pre = _stage_config(
            base_dir,
            cfg.pretrain,
            [*variant_overrides, f"experiment={cfg.experiment}.{variant}", f"run_dir={pre_dir}"],
            f"variants.{variant}",
        )
        out.append(Stage(variant, "", pre))
        for task, stage in cfg.tasks.items():
            ft = _stage_config(
                base_dir,
                stage,
                [
                    f"experiment={cfg.experiment}.{variant}.{task}",
                    f"run_dir={root / 'finetune' / variant / task}",
                    f"init_from={pre_dir}",
                ],
                f"tasks.{task}",
            )
            ft.model = pre.model  # the pretrained architecture, whatever the task YAML says
            run_config.check(ft)
            out.append(Stage(variant, task, ft))
    return out


def _stage_config(base_dir: Path, stage: DictConfig, extra: list[str], where: str) -> DictConfig:
    try:
        return run_config.load(base_dir / stage.config, [*stage.overrides, *extra])
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def run(cfg: DictConfig, base_dir: Path) -> Path:
    """Run (or finish, with ``resume``) the pipeline; returns its run directory."""
    from training.train import train

    root = choose_run_dir(cfg.output_dir, cfg.experiment, None, False) if not cfg.resume else _newest(cfg)
    plan = stages(cfg, base_dir, root)  # everything checked before the first directory is made
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    results: dict[tuple[str, str], dict] = {}
    for stage in plan:
        run_dir = Path(stage.cfg.run_dir)
        if (run_dir / METRICS).is_file():
            results[stage.variant, stage.task] = read_json(run_dir / METRICS)
            continue
        stage.cfg.resume = run_dir.is_dir()
        results[stage.variant, stage.task] = train(
            stage.cfg, hparams={"pipeline.variant": stage.variant, "pipeline.task": stage.task or "pretrain"}
        )
    write_results(root, list(cfg.variants), list(cfg.tasks), results, cfg.metric)
    return root


def _newest(cfg: DictConfig) -> Path:
    versions = [
        p
        for p in (Path(cfg.output_dir) / cfg.experiment).glob("version_*")
        if p.name.removeprefix("version_").isdigit()
    ]
    if not versions:
        raise ConfigError(f"resume: no run of pipeline {cfg.experiment!r} under {cfg.output_dir}/ to resume")
    return max(versions, key=lambda p: int(p.name.removeprefix("version_")))


def results_table(variants: list[str], tasks: list[str], results: dict, metric: str) -> list[dict]:
    """One row per variant: pretraining val/ppl, ``metric`` of each task, and their mean over tasks."""
    rows = []
    for v in variants:
        scores = {t: float(results[v, t][metric]) for t in tasks}
        rows.append(
            {
                "variant": v,
                "pretrain_val_ppl": float(results[v, ""]["val/ppl"]),
                **scores,
                "average": sum(scores.values()) / len(scores),
            }
        )
    return rows


def write_results(root: Path, variants: list[str], tasks: list[str], results: dict, metric: str) -> str:
    """results.csv (raw values), results.md (percentages, as in Table 2) and TensorBoard; returns the Markdown."""
    from torch.utils.tensorboard import SummaryWriter

    rows = results_table(variants, tasks, results, metric)
    columns = ["variant", "pretrain_val_ppl", *tasks, "average"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(root / "results.csv", buffer.getvalue())
    lines = [
        f"{metric} (%) of the best validation checkpoint; pretraining val/ppl for reference.",
        "",
        "| " + " | ".join(["variant", "pretrain val ppl", *tasks, "average"]) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [r["variant"], f"{r['pretrain_val_ppl']:.2f}", *(f"{100 * r[c]:.1f}" for c in (*tasks, "average"))]
            )
            + " |"
        )
    markdown = "\n".join(lines) + "\n"
    atomic_write_text(root / "results.md", markdown)
    with SummaryWriter(str(root)) as tb:
        tb.add_text("table2", markdown)
        for r in rows:
            for c in (*tasks, "average"):
                tb.add_scalar(f"table2/{c}/{r['variant']}", r[c], 0)
    return markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pipeline YAML file (e.g. experiments/pipelines/table2.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the pipeline file, e.g. resume=true")


def main(args: argparse.Namespace) -> int:
    cfg = load(args.config, args.overrides)
    root = run(cfg, Path(args.config).parent)
    print((root / "results.md").read_text())
    print(f"pipeline directory: {root}")
    return 0
