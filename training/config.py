"""A run's configuration: model < data < optimiser < trainer, typed, merged and checked.

Every run (``linformer-lab train``, a sweep trial, a fine-tuning stage) is described by one :class:`RunConfig`:
defaults < YAML file < ``key=value`` overrides (:mod:`foundation.configfile`). OmegaConf validates keys, types
and ``Literal`` choices; :func:`check` adds the rules, each stated once where its subject lives (the model's in
:mod:`lightning_modules.config`, the data's in :mod:`datamodules.config`, the run's here). Any problem is a
one-line :class:`~foundation.errors.ConfigError` naming the key, the value and what is allowed; the CLI prints
it and exits with code 2 before writing anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from omegaconf import DictConfig

from datamodules.config import DataConfig, check_data
from foundation.configfile import flatten, merge, parse_overrides, resolve_includes, to_container
from foundation.errors import ConfigError, require
from lightning_modules.config import RENAMED, ModelConfig, OptimConfig, check_model

CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"

__all__ = ["CONFIG_DIR", "ConfigError", "RunConfig", "TrainerConfig", "check", "flatten", "load", "merge_run",
           "to_container"]


@dataclass
class TrainerConfig:
    max_steps: int = 500
    val_check_interval: int = 100
    limit_val_batches: int = 50
    log_every_n_steps: int = 10
    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    # null: 32-true on CPU; on a GPU bf16-mixed from compute capability 8.0 (Ampere) on, 16-mixed on older ones.
    precision: Optional[str] = None
    accumulate_grad_batches: int = 1
    deterministic: bool = False
    # Threads per process on CPU (0 keeps torch's default).
    cpu_threads: int = 0
    # Log the attention spectrum (heatmap + effective rank per layer) every N validations; 0: off.
    spectrum_every_n_val: int = 0


@dataclass
class RunConfig:
    experiment: str = "default"
    # recall: multi-query associative recall (data.mqar), bidirectional or causal attention.
    # classify: sequence classification (data.source imdb, rotten_tomatoes, a hub id or local files; data.classify);
    # listops: LRA ListOps (data.listops). Both train a SequenceClassifierModule.
    task: Literal["mlm", "clm", "recall", "classify", "listops"] = "mlm"
    seed: int = 0
    output_dir: str = "runs"
    # Explicit run directory (sweeps use runs/<study>/trial_<n>); null: <output_dir>/<experiment>/version_<i>.
    run_dir: Optional[str] = None
    resume: bool = False
    # task classify: a pretraining run directory (or a .ckpt file) whose encoder weights and tokenizer are
    # loaded; its architecture must equal model.*. null: train from scratch.
    init_from: Optional[str] = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------- loading
def merge_run(layers: list[Any]) -> DictConfig:
    """Plain layers (dicts, dotted-key dicts, DictConfigs) merged onto :class:`RunConfig`, renamed keys migrated."""
    return merge(RunConfig, layers, RENAMED)


def load(path: Optional[str | Path] = None, overrides: list[str] = ()) -> DictConfig:
    """defaults < YAML file (with its ``defaults`` bases) < ``key=value`` overrides, then checked."""
    layers: list[Any] = []
    if path is not None:
        layers.append(resolve_includes(Path(path)))
    layers.append(parse_overrides(list(overrides)))
    cfg = merge_run(layers)
    check(cfg)
    return cfg


# --------------------------------------------------------------------------------------- checks
def check(cfg: DictConfig) -> None:
    """Every rule of a run config: the model's, the data's, the optimiser's, the trainer's, and the task's."""
    check_model(cfg.model)
    check_data(cfg.data, cfg.task, cfg.model.max_len)
    att = cfg.model.attention
    require(cfg.trainer.max_steps >= 1, f"trainer.max_steps: must be >= 1, got {cfg.trainer.max_steps}")
    require(cfg.trainer.spectrum_every_n_val >= 0,
            f"trainer.spectrum_every_n_val: must be >= 0 (0: off), got {cfg.trainer.spectrum_every_n_val}")
    require(cfg.optim.lr > 0, f"optim.lr: must be > 0, got {cfg.optim.lr}")
    require(cfg.task != "clm" or att.causal,
            "task: 'clm' needs model.attention.causal=true (next-token prediction must not see the future)")
    require(cfg.task != "mlm" or not att.causal,
            "task: 'mlm' needs model.attention.causal=false (a masked token is predicted from both sides)")
    require(cfg.init_from is None or cfg.task == "classify",
            f"init_from: only task 'classify' loads a pretrained encoder, got task '{cfg.task}'")
