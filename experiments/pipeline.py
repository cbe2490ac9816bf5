"""``linformer-lab pipeline PIPELINE.yaml [key=value ...]``: the paper's Table 2 end to end.

For every variant, pretrain (``pretrain.config`` + ``pretrain.overrides`` + the variant's overrides), then
fine-tune the pretrained encoder on every task (``tasks.<name>.config`` + its overrides, with ``init_from``
= the pretraining run and ``model`` = the pretraining run's model, so the architectures match by
construction). A variant listed in ``scratch`` is not pretrained: its fine-tunings start from a fresh encoder
(no ``init_from``), and the table says so. ``data_dir`` sets every task's ``data.source`` to
``<data_dir>/<task>`` (a folder of ``linformer-lab glue-download``). Every stage is one
:func:`training.train.train` call. The pipeline writes ``<output_dir>/<experiment>/version_<i>/``::

    config.yaml                     the resolved pipeline config
    pretrain/<variant>/             a train() run directory per pretrained variant
    finetune/<variant>/<task>/      a train() run directory per variant and task
    results.md, results.csv         variant × task: the task's official metrics (``data.classify.metrics`` on
                                    each of its test sets, of the best validation checkpoint; or ``metric``
                                    for every task), their mean as the task's score, the average over tasks,
                                    and the pretraining val/ppl
    results.png                     the task scores and their average as grouped bars
    events.out.tfevents.*           the same table as TensorBoard text, each score as scalar
                                    ``table2/<task>/<variant>``

Config paths are relative to the pipeline file. Every stage config is loaded and checked before anything
trains, so a mistake in the last variant fails at once (exit 2, nothing written), and so is every number the
results table reads: one the stage's task writes (:func:`check_results_written`). ``resume=true`` reopens
the newest run of the pipeline: stages with a ``metrics.json`` are kept (if their config is the one the pipeline
gives them now: :func:`finished_stages`), an interrupted one resumes from its last checkpoint, the rest run.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from foundation.atomic import atomic_write_text
from foundation.checked import read_json
from foundation.configfile import merge, parse_overrides, resolve_includes
from foundation.errors import ConfigError
from foundation.paths import check_folder, check_name
from foundation.rundir import check_experiment_folder, choose_run_dir
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
    # The metrics.json key that fills the table for every task; null: each task's official metrics
    # (data.classify.metrics on each of its test sets).
    metric: Optional[str] = None
    # A folder with one sub-folder per task (linformer-lab glue-download): each task's data.source becomes
    # <data_dir>/<task>. null: the task configs' own data.source.
    data_dir: Optional[str] = None
    # Variants fine-tuned without pretraining (no init_from): what pretraining adds.
    scratch: List[str] = field(default_factory=list)
    # A line printed above the table (what the preset leaves out of the full experiment).
    note: str = ""


@dataclass
class Stage:
    variant: str
    task: str  # "" for pretraining
    cfg: DictConfig


def load(path: str | Path, overrides: list[str] = ()) -> DictConfig:
    cfg = merge(PipelineConfig, [resolve_includes(Path(path)), *parse_overrides(list(overrides))])
    check_name("experiment", cfg.experiment)
    check_folder("output_dir", cfg.output_dir)
    check_experiment_folder(cfg.output_dir, cfg.experiment)
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
    for name in cfg.scratch:
        if name not in cfg.variants:
            raise ConfigError(f"scratch: {name!r} is not one of the variants ({', '.join(cfg.variants)})")
    if cfg.data_dir is not None:
        missing = [t for t in cfg.tasks if not (Path(cfg.data_dir) / t).is_dir()]
        if missing:
            raise ConfigError(
                f"data_dir: no folder {str(Path(cfg.data_dir) / missing[0])!r} for task {missing[0]!r}; save GLUE "
                f"there once with `linformer-lab glue-download {cfg.data_dir}` (or write a stand-in without "
                f"internet: `linformer-lab glue-standin {cfg.data_dir}`)"
            )
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
        pretrained = variant not in cfg.scratch
        if pretrained:
            out.append(Stage(variant, "", pre))
        for task, stage in cfg.tasks.items():
            ft = _stage_config(
                base_dir,
                stage,
                [
                    f"experiment={cfg.experiment}.{variant}.{task}",
                    f"run_dir={root / 'finetune' / variant / task}",
                    f"init_from={pre_dir if pretrained else 'null'}",
                    *([f"data.source={Path(cfg.data_dir) / task}"] if cfg.data_dir is not None else []),
                ],
                f"tasks.{task}",
            )
            ft.model = pre.model  # the pretrained architecture, whatever the task YAML says
            run_config.check(ft)
            out.append(Stage(variant, task, ft))
    for stage in out:
        check_results_written(stage, cfg.metric)
    return out


# What metrics.json holds whatever the task (training/train.py, run_metrics_of): numbers a table may read.
RUN_NUMBERS = ("global_step", "parameters", "projection_parameters", "wall_time_s", "train_time_s", "tokens",
               "tokens_per_sec", "flops_per_batch", "train_flops", "peak_mem_mb")  # fmt: skip


def written_scores(run: DictConfig) -> set[str]:
    """The scores a run of ``run`` writes to metrics.json, by its task: a classifier (classify, listops) the loss and
    the metrics of :func:`~lightning_modules.classifier.score_metrics` on validation and on each test set; a token
    predictor (mlm, clm, recall) validation loss and accuracy (also per target group: masked, random, kept) and
    perplexity, and no test set."""
    from datamodules.classification import eval_set_names
    from datamodules.language_model import MLMDataModule
    from foundation.configfile import to_container
    from lightning_modules.classifier import score_metrics, task_settings
    from lightning_modules.per_example import column_names

    if run.task in ("classify", "listops"):
        regression, metrics = task_settings(to_container(run))
        names = ["loss", *score_metrics(regression, metrics, 2).keys()]
        sets = ["val", *(eval_set_names(run.data) if run.task == "classify" else ["test"])]
        return {f"{s}/{name}" for s in sets for name in names}
    groups = MLMDataModule.target_groups if run.task == "mlm" else ()
    return {"val/ppl", *(f"val/{prefix}{name}" for prefix in column_names(groups) for name in ("loss", "accuracy"))}


def check_results_written(stage: Stage, metric: Optional[str]) -> None:
    """Before anything trains: every number the results table reads from this stage's metrics.json is one its
    task writes (a pretraining stage: ``val/ppl``; a fine-tuning: :func:`official_keys`), else one ConfigError
    line naming the stage, its task, the key and what the task writes."""
    needs = official_keys(stage.cfg, metric) if stage.task else ["val/ppl"]
    scores = written_scores(stage.cfg)
    missing = [key for key in needs if key not in scores and key not in RUN_NUMBERS]
    if not missing:
        return
    writes = ", ".join(sorted(scores))
    if not stage.task:
        raise ConfigError(
            f"variants.{stage.variant}: the results table reads {missing[0]!r} from its pretraining run, which task "
            f"{stage.cfg.task!r} does not write (it writes {writes}); pretrain.config must train a language model "
            "(task mlm or clm)"
        )
    reader = f"metric: {metric!r}" if metric is not None else "the results table"
    raise ConfigError(
        f"tasks.{stage.task}: {reader} reads {missing[0]!r} from its fine-tuning runs, which task {stage.cfg.task!r} "
        f"does not write (it writes {writes}, and every run {', '.join(RUN_NUMBERS)})"
    )


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
    results = finished_stages(plan, cfg.metric)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    keys = {s.task: official_keys(s.cfg, cfg.metric) for s in plan if s.task}
    for stage in plan:
        run_dir = Path(stage.cfg.run_dir)
        if (stage.variant, stage.task) in results:
            continue
        stage.cfg.resume = run_dir.is_dir()
        results[stage.variant, stage.task] = train(
            stage.cfg, hparams={"pipeline.variant": stage.variant, "pipeline.task": stage.task or "pretrain"}
        )
    notes = table_notes(cfg, {s.task: s.cfg.data.max_texts for s in plan if s.task and s.variant == plan[-1].variant})
    write_results(root, cfg, keys, results, notes)
    return root


def finished_stages(plan: list[Stage], metric: Optional[str]) -> dict[tuple[str, str], dict]:
    """The metrics.json of every stage a resumed pipeline keeps (those that hold one), checked before anything
    trains: the stage's run was started with the config the pipeline gives it now (a resumed run's rule,
    :func:`training.resume.check_same_config`) and holds every number the table reads from it; else one ConfigError
    line naming the stage."""
    from training.resume import check_same_config

    kept = {}
    for stage in plan:
        run_dir = Path(stage.cfg.run_dir)
        if not (run_dir / METRICS).is_file():
            continue
        where = f"tasks.{stage.task} (variant {stage.variant})" if stage.task else f"variants.{stage.variant}"
        try:
            check_same_config(stage.cfg, run_dir)
        except ConfigError as err:
            reason = str(err).removeprefix("resume: ")
            raise ConfigError(f"{where}: the finished run resume=true would keep: {reason}") from None
        metrics = read_json(run_dir / METRICS)
        needs = official_keys(stage.cfg, metric) if stage.task else ["val/ppl"]
        missing = [key for key in needs if key not in metrics]
        if missing:
            raise ConfigError(f"{where}: {run_dir / METRICS} holds no {missing[0]!r}, which the results table reads")
        kept[stage.variant, stage.task] = metrics
    return kept


def official_keys(ft: DictConfig, metric: Optional[str] = None) -> list[str]:
    """The metrics.json keys that score a fine-tuning run: ``metric``, or its task's official metrics on each of
    its test sets (``test/matched/accuracy``, ``test/mismatched/accuracy`` for MNLI)."""
    from datamodules.classification import eval_set_names

    if metric is not None:
        return [metric]
    return [f"{test}/{m}" for test in eval_set_names(ft.data) for m in ft.data.classify.metrics]


def _newest(cfg: DictConfig) -> Path:
    versions = [
        p
        for p in (Path(cfg.output_dir) / cfg.experiment).glob("version_*")
        if p.name.removeprefix("version_").isdigit()
    ]
    if not versions:
        raise ConfigError(f"resume: no run of pipeline {cfg.experiment!r} under {cfg.output_dir}/ to resume")
    return max(versions, key=lambda p: int(p.name.removeprefix("version_")))


SHORT = {"accuracy": "acc", "f1": "F1", "matthews": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def results_table(cfg: DictConfig, keys: dict[str, list[str]], results: dict) -> list[dict]:
    """One row per variant: whether it was pretrained, its pretraining val/ppl, each task's official values
    (``<task> <key>``) and score (their mean, GLUE's rule for a task with several), and the mean score over tasks."""
    rows = []
    for v in cfg.variants:
        pretrained = v not in cfg.scratch
        row = {"variant": v, "pretrained": pretrained}
        row["pretrain_val_ppl"] = float(results[v, ""]["val/ppl"]) if pretrained else math.nan
        for task, task_keys in keys.items():
            values = [float(results[v, task][k]) for k in task_keys]
            row.update({f"{task} {k}": x for k, x in zip(task_keys, values)})
            row[task] = sum(values) / len(values)
        row["average"] = sum(row[t] for t in keys) / len(keys)
        rows.append(row)
    return rows


def _header(task: str, task_keys: list[str]) -> str:
    """A task's column: its name and the metrics of its cell (``mnli matched/mismatched acc``)."""
    sets = list(dict.fromkeys(k.rpartition("/")[0] for k in task_keys))
    metrics = list(dict.fromkeys(k.rpartition("/")[2] for k in task_keys))
    shown = "/".join(SHORT.get(m, m) for m in metrics)
    if len(sets) > 1:
        shown = "/".join(s.rpartition("/")[2] for s in sets) + " " + shown
    return f"{task} ({shown})"


def table_notes(cfg: DictConfig, plan_max_texts: dict[str, Optional[int]]) -> list[str]:
    """What the reader must know beside the numbers: the data (a stand-in?), subsets, variants not pretrained."""
    from experiments.glue_standin import STAND_IN, STAND_IN_LINE

    notes = []
    if cfg.note:
        notes.append(cfg.note)
    if cfg.data_dir is not None and (Path(cfg.data_dir) / STAND_IN).is_file():
        notes.append(f"**Data: {cfg.data_dir} is {STAND_IN_LINE}**: these scores say nothing about GLUE.")
    capped = {t: n for t, n in plan_max_texts.items() if n is not None}
    if capped:
        notes.append(
            "Training examples capped (data.max_texts): " + ", ".join(f"{t} {n:,}" for t, n in capped.items()) + "."
        )
    for v in cfg.scratch:
        notes.append(f"{v} (no pretraining): fine-tuned from scratch, no pretrained encoder was loaded.")
    return notes


def write_results(root: Path, cfg: DictConfig, keys: dict[str, list[str]], results: dict, notes=()) -> str:
    """results.csv (raw values), results.md (percentages, as in Table 2), results.png and TensorBoard; returns
    the Markdown."""
    from torch.utils.tensorboard import SummaryWriter

    rows = results_table(cfg, keys, results)
    tasks = list(keys)
    columns = ["variant", "pretrained", "pretrain_val_ppl", *(f"{t} {k}" for t in tasks for k in keys[t]), *tasks]
    columns.append("average")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(root / "results.csv", buffer.getvalue())
    what = cfg.metric or "each task's official metric"
    lines = [
        f"{what} (%) on the task's test sets (GLUE: its validation splits) of the best validation checkpoint; a "
        "task with several numbers scores their mean, the average is the mean score over tasks; pretraining val ppl "
        "for reference.",
        *(f"\n{n}" for n in notes),
        "",
        "| " + " | ".join(["variant", "pretrain val ppl", *(_header(t, keys[t]) for t in tasks), "average"]) + " |",
        "|" + "---|" * (len(tasks) + 3),
    ]
    for r in rows:
        name = r["variant"] if r["pretrained"] else f"{r['variant']} (no pretraining)"
        ppl = f"{r['pretrain_val_ppl']:.2f}" if r["pretrained"] else "–"
        cells = ["/".join(f"{100 * r[f'{t} {k}']:.1f}" for k in keys[t]) for t in tasks]
        lines.append("| " + " | ".join([name, ppl, *cells, f"{100 * r['average']:.1f}"]) + " |")
    markdown = "\n".join(lines) + "\n"
    atomic_write_text(root / "results.md", markdown)
    _figure(root / "results.png", rows, [*tasks, "average"])
    with SummaryWriter(str(root)) as tb:
        tb.add_text("table2", markdown)
        for r in rows:
            for c in (*tasks, "average"):
                tb.add_scalar(f"table2/{c}/{r['variant']}", r[c], 0)
    return markdown


def _figure(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Grouped bars: one group per task (and the average), one bar per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(columns) * max(1, len(rows)) / 3, 3.6))
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        label = r["variant"] if r["pretrained"] else f"{r['variant']} (no pretraining)"
        ax.bar([c + i * width for c in range(len(columns))], [100 * r[c] for c in columns], width, label=label)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(columns))], columns)
    ax.set_ylabel("score (%)")
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pipeline YAML file (e.g. experiments/pipelines/table2.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the pipeline file, e.g. resume=true")


def main(args: argparse.Namespace) -> int:
    cfg = load(args.config, args.overrides)
    root = run(cfg, Path(args.config).parent)
    print((root / "results.md").read_text())
    print(f"pipeline directory: {root}")
    return 0
