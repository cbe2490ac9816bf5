"""A run's configuration: model < data < optimiser < trainer, typed, merged and checked.

Every run (``linformer-lab train``, a sweep trial, a fine-tuning stage) is described by one :class:`RunConfig`:
defaults < YAML file < ``key=value`` overrides (:mod:`foundation.configfile`). OmegaConf validates keys, types
and ``Literal`` choices; :func:`check` adds the rules, each stated once where its subject lives (the model's in
:mod:`lightning_modules.config`, the data's in :mod:`datamodules.config`, the run's here). Any problem is a
one-line :class:`~foundation.errors.ConfigError` naming the key, the value and what is allowed; the CLI prints
it and exits with code 2 before writing anything.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Literal, Optional

from omegaconf import DictConfig

from datamodules.config import DataConfig, check_data
from foundation.configfile import merge, parse_overrides, resolve_includes
from foundation.errors import ConfigError, check_number, require
from foundation.paths import check_folder, check_name, check_path
from foundation.rundir import check_experiment_folder
from lightning_modules.attention import ATTENTION_KINDS, check_model, misplaced_option
from lightning_modules.config import ModelConfig, OptimConfig
from lightning_modules.optim import cooldown_start

CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"

__all__ = [
    "CONFIG_DIR",
    "RunConfig",
    "TrainerConfig",
    "check",
    "load",
    "merge_run",
]


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
    # torch.compile the model's encoder: true, false, or auto: on where the run trains on a GPU, off on the CPU (there
    # a compiled step was 0.90-1.24x an eager one after 8-32 s of compiling: it does not pay for trials of 600-1,000
    # steps). Compiled kernels round differently, so a resumed run may change it (like trainer.cpu_threads).
    compile: Any = "auto"


@dataclass
class RunConfig:
    experiment: str = "default"
    # recall: multi-query associative recall (data.mqar), bidirectional or causal attention.
    # classify: sequence classification (data.source imdb, rotten_tomatoes, a hub id or local files; data.classify);
    # listops: LRA ListOps (data.listops). Both train a SequenceClassifierModule.
    task: Literal["mlm", "clm", "recall", "classify", "listops"] = "mlm"
    seed: int = 0
    output_dir: str = "runs"
    # Explicit run directory (sweeps use runs/<study>/<arm>/seed=<s>_trial_<n>); null:
    # <output_dir>/<experiment>/version_<i>.
    run_dir: Optional[str] = None
    resume: bool = False
    # task classify: a pretraining run directory (or a .ckpt file) whose encoder weights and tokenizer are
    # loaded; its architecture must equal model.*. null: train from scratch.
    init_from: Optional[str] = None
    # A checkpoint to branch off (training/branch.py): a cooldown (optim.schedule=wsd) of a constant-rate trunk
    # starts from that checkpoint's whole state, in a run folder of its own. null: start from scratch.
    branch_from: Optional[str] = None
    # Where the config answers its question in minutes: cpu, or gpu (a run on a CPU then says, at its start and
    # end, that it needs a GPU; nothing else changes).
    answers_on: Literal["cpu", "gpu"] = "cpu"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------- loading
def merge_run(layers: list[Any]) -> DictConfig:
    """Plain nested layers (dicts, DictConfigs) merged onto :class:`RunConfig`."""
    return merge(RunConfig, layers, misplaced_option)


def open_mappings(schema: Any = RunConfig, prefix: str = "") -> list[str]:
    """Dotted keys of the schema's free mappings (``Dict`` fields, such as an attention kind's options): the keys
    under them are checked by the rules of their subject, not by the schema."""
    out = []
    for f in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[f.name]
        if typing.get_origin(hint) in (dict, Dict):
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(hint):
            out += open_mappings(hint, f"{prefix}{f.name}.")
    return out


def is_key(key: str, flat_keys: set[str]) -> bool:
    """Whether ``key`` names a config key: one of ``flat_keys`` or a key under a free mapping."""
    return key in flat_keys or any(key.startswith(f"{mapping}.") for mapping in open_mappings())


def load(path: Optional[str | Path] = None, overrides: list[str] = ()) -> DictConfig:
    """defaults < YAML file (with its ``defaults`` bases) < ``key=value`` overrides, then checked."""
    layers: list[Any] = []
    if path is not None:
        layers.append(resolve_includes(Path(path)))
    layers += parse_overrides(list(overrides))
    cfg = merge_run(layers)
    check(cfg)
    return cfg


# --------------------------------------------------------------------------------------- checks
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
STRATEGIES = (
    "auto",
    "ddp",
    "ddp_spawn",
    "ddp_fork",
    "ddp_notebook",
    "ddp_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_true",
    "fsdp",
    "single_device",
    "deepspeed",
)
PRECISIONS = (
    "64-true",
    "64",
    "32-true",
    "32",
    "16-mixed",
    "16",
    "bf16-mixed",
    "bf16",
    "16-true",
    "bf16-true",
    "transformer-engine",
    "transformer-engine-float16",
)
MAX_STEPS = 10**9


def check_seed(seed: Any) -> None:
    """The run's seed: an integer that numpy's and torch's generators accept."""
    check_number("seed", seed, 0, 2**32 - 1, integer=True)


def check(cfg: DictConfig) -> None:
    """Every rule of a run config: the model's, the data's, the optimiser's, the trainer's, the task's, the
    names and paths the run writes to, and whether the model fits this machine."""
    check_model(cfg.model)
    check_data(cfg.data, cfg.task, cfg.model.max_len)
    check_optim(cfg.optim)
    check_trainer(cfg.trainer)
    check_curriculum(cfg)
    check_cooldown(cfg.optim, cfg.trainer.max_steps)
    att = cfg.model.attention
    check_seed(cfg.seed)
    check_name("experiment", cfg.experiment)
    check_folder("output_dir", cfg.output_dir)
    if cfg.run_dir is not None:
        check_folder("run_dir", cfg.run_dir)
    else:
        check_experiment_folder(cfg.output_dir, cfg.experiment)
    for key in ("init_from", "branch_from"):
        if cfg[key] is not None:
            check_path(key, cfg[key])
    check_hf_cache()
    require(
        cfg.task != "clm" or att.causal,
        "task: 'clm' needs model.attention.causal=true (next-token prediction must not see the future)",
    )
    require(
        cfg.task != "mlm" or not att.causal,
        "task: 'mlm' needs model.attention.causal=false (a masked token is predicted from both sides)",
    )
    validated = cfg.trainer.limit_val_batches * cfg.data.batch_size
    require(
        cfg.data.max_val_blocks is None or validated >= cfg.data.max_val_blocks,
        f"trainer.limit_val_batches: {cfg.trainer.limit_val_batches} batches of data.batch_size="
        f"{cfg.data.batch_size} validate {validated} of the data.max_val_blocks={cfg.data.max_val_blocks} blocks "
        "(validation and its baselines must score the same set)",
    )
    require(
        cfg.init_from is None or cfg.task == "classify",
        f"init_from: only task 'classify' loads a pretrained encoder, got task '{cfg.task}'",
    )
    check_fits_memory(cfg)


def check_hf_cache() -> None:
    """The Hugging Face cache (datasets writes its processed corpora there) is a folder this process can write:
    ``$HF_DATASETS_CACHE``, else ``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    for key in ("HF_DATASETS_CACHE", "HF_HOME"):
        if os.environ.get(key):
            check_folder(key, os.environ[key])
            return
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        check_folder("HF_HOME", os.path.join(xdg, "huggingface"))
    except ConfigError as err:
        raise ConfigError(f"{err} (set HF_HOME to a folder you can write)") from None


def check_optim(optim: DictConfig) -> None:
    check_number("optim.lr", optim.lr, 0, None, low_open=True)
    check_number("optim.weight_decay", optim.weight_decay, 0, 10)
    require(len(optim.betas) == 2, f"optim.betas: must be two numbers [beta1, beta2], got {list(optim.betas)}")
    for i, beta in enumerate(optim.betas):
        check_number(f"optim.betas[{i}]", beta, 0, 1, high_open=True)
    check_number("optim.eps", optim.eps, 0, 1, low_open=True)
    check_number("optim.warmup_steps", optim.warmup_steps, 0, MAX_STEPS, integer=True)
    check_number("optim.gradient_clip_val", optim.gradient_clip_val, 0, 1e6)
    check_number("optim.short_steps", optim.short_steps, 0, MAX_STEPS, integer=True)
    check_number("optim.cooldown_fraction", optim.cooldown_fraction, 0, 1, low_open=True)
    check_number("optim.projection_lr_scale", optim.projection_lr_scale, 0, 100)


def check_curriculum(cfg: DictConfig) -> None:
    """The length curriculum (``optim.short_steps``, ``optim.short_lengths``) cuts packed blocks: a task whose
    blocks are packed (mlm, clm), short lengths that divide ``model.max_len``, at least one step each, no longer than
    the run."""
    optim, n = cfg.optim, cfg.model.max_len
    if optim.short_steps == 0:
        return
    require(
        cfg.task in ("mlm", "clm"),
        f"optim.short_steps: a length curriculum cuts packed text blocks (task mlm or clm), got task '{cfg.task}'",
    )
    lengths = list(optim.short_lengths)
    require(len(lengths) > 0, "optim.short_lengths: a length curriculum needs at least one length, got []")
    for i, length in enumerate(lengths):
        require(
            isinstance(length, int) and 0 < length < n and n % length == 0,
            f"optim.short_lengths[{i}]: must divide model.max_len={n} and be shorter, got {length}",
        )
    require(
        len(lengths) <= optim.short_steps <= cfg.trainer.max_steps,
        f"optim.short_steps: {optim.short_steps} must be at least one step a length ({len(lengths)}) and at most "
        f"trainer.max_steps={cfg.trainer.max_steps}",
    )


def check_cooldown(optim: DictConfig, max_steps: int) -> None:
    """A ``wsd`` schedule's cooldown is at least one step and starts once the warm-up is over."""
    if optim.schedule != "wsd":
        return
    start = cooldown_start(max_steps, optim.cooldown_fraction)
    require(
        start < max_steps,
        f"optim.cooldown_fraction: {optim.cooldown_fraction} of trainer.max_steps={max_steps} is no whole step of "
        "cooldown; a larger fraction (or more steps) is required",
    )
    require(
        start >= optim.warmup_steps,
        f"optim.cooldown_fraction: {optim.cooldown_fraction} of trainer.max_steps={max_steps} starts the cooldown at "
        f"step {start}, inside the warm-up (optim.warmup_steps={optim.warmup_steps}); at most "
        f"{1 - optim.warmup_steps / max_steps:.3g} is allowed",
    )


def check_trainer(t: DictConfig) -> None:
    check_number("trainer.max_steps", t.max_steps, 1, MAX_STEPS, integer=True)
    check_number("trainer.val_check_interval", t.val_check_interval, 1, MAX_STEPS, integer=True)
    check_number("trainer.limit_val_batches", t.limit_val_batches, 1, MAX_STEPS, integer=True)
    check_number("trainer.log_every_n_steps", t.log_every_n_steps, 1, MAX_STEPS, integer=True)
    check_number("trainer.accumulate_grad_batches", t.accumulate_grad_batches, 1, 1 << 16, integer=True)
    check_number("trainer.num_nodes", t.num_nodes, 1, 1 << 16, integer=True)
    check_number("trainer.cpu_threads", t.cpu_threads, 0, 1024, integer=True)
    check_number("trainer.spectrum_every_n_val", t.spectrum_every_n_val, 0, MAX_STEPS, integer=True)
    require(
        t.accelerator in ACCELERATORS, f"trainer.accelerator: {t.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
    )
    require(t.strategy in STRATEGIES, f"trainer.strategy: {t.strategy!r} is not one of {', '.join(STRATEGIES)}")
    require(
        isinstance(t.compile, bool) or t.compile == "auto",
        f"trainer.compile: {t.compile!r} is not one of auto, true, false",
    )
    require(
        t.precision is None or str(t.precision) in PRECISIONS,
        f"trainer.precision: {t.precision!r} is not one of {', '.join(PRECISIONS)} (or null: bf16-mixed on a "
        "GPU that has bf16, 32-true on CPU)",
    )
    devices = t.devices
    if isinstance(devices, str):
        require(
            devices == "auto" or devices.lstrip("-").isdigit() or devices.replace(",", "").isdigit(),
            f"trainer.devices: {devices!r} is not a count, a list of device indices, -1 or 'auto'",
        )
    elif isinstance(devices, (int, float)) and not isinstance(devices, bool):
        require(
            isinstance(devices, int) and (devices == -1 or 1 <= devices <= 4096),
            f"trainer.devices: must be a count >= 1, -1 (all), a list of indices or 'auto', got {devices!r}",
        )
    else:
        items = list(devices) if devices is not None and not isinstance(devices, bool) else None
        require(
            items is not None
            and len(items) >= 1
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 4096 for i in items),
            f"trainer.devices: must be a count >= 1, -1 (all), a list of indices or 'auto', got {devices!r}",
        )


def parameter_estimate(cfg: DictConfig) -> int:
    """An upper estimate of the model's parameters (embeddings, blocks, what the attention kind adds)."""
    m = cfg.model
    vocab = max(cfg.data.tokenizer.vocab_size, 512)
    blocks = m.n_layers * (4 * m.d_model * m.d_model + 2 * m.d_model * m.d_ff)
    return (vocab + m.max_len) * m.d_model + blocks + ATTENTION_KINDS[m.attention.kind].extra_parameters(m)


def check_fits_memory(cfg: DictConfig) -> None:
    """Refuse a model whose weights, gradients and AdamW state (16 bytes a parameter) exceed this machine's
    memory: the allocation would fail (or swap) after the run directory exists."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    need = 16 * parameter_estimate(cfg)
    require(
        need <= total,
        f"model: about {parameter_estimate(cfg):.3g} parameters need {need / 2**30:.1f} GiB for "
        f"weights, gradients and AdamW state, more than this machine's {total / 2**30:.1f} GiB "
        "(reduce model.max_len, d_model, d_ff or n_layers)",
    )
