"""``linformer-lab train CONFIG [key=value ...]``: one config → one run directory.

This is the only path from a config to a trained model: sweeps call :func:`train` for every trial.
Order matters for "nothing half-written": the config is validated and the data prepared (which
surfaces missing files and empty corpora) before the run directory is created.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import logging
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig

from foundation.atomic import atomic_write_text, write_json
from foundation.checked import read_json
from foundation.checkpoint import AtomicCheckpointIO, check_architecture
from foundation.configfile import flatten, to_container
from foundation.confined import check_tree
from foundation.errors import ConfigError, Terminated, says_errors
from foundation.lock import LOCK, Owner
from foundation.paths import check_folder
from foundation.rundir import (
    CHECKPOINT,
    TOKENIZER,
    check_run_folder,
    choose_run_dir,
    shared_with_ranks,
    values_name,
)
from lightning_modules.callbacks import Accelerate, RunMetrics, SpectrumMonitor, TrainingFlops, compile_failures
from lightning_modules.encoder import TransformerEncoder, count_parameters
from lightning_modules.language_model import EXAMPLES
from training import config as run_config
from training.answer import Objective, ObjectiveMetrics, ending_lines, objective_of
from training.branch import BRANCH, Branch, check_branch
from training.console import progress, quiet_third_parties
from training.divergence import DivergenceGuard, recorded
from training.resume import (
    DATA,
    HPARAMS,
    MAY_CHANGE_ON_RESUME,
    LastCheckpoint,
    StopTogether,
    adopt_final_state,
    check_same_config,
    check_same_data,
    clean_start,
    data_identity,
    rollback_events,
)
from training.runfiles import BEST, METRICS, Resumed, check_run_files, config_text, new_run_id
from training.sample_curve import SampleValidation
from training.tensorboard import LogPlace, RunLogger, check_record, filled, log_roots, objective_layout, record_run

HP_METRICS = ("hp/val_loss", "hp/val_ppl")
FORKING_STRATEGIES = ("ddp_fork", "ddp_notebook")
# What a run directory holds as files (a resume refuses a folder or a link in their place)
RUN_FILES = (LOCK, "config.yaml", DATA, HPARAMS, str(TOKENIZER), METRICS, str(CHECKPOINT), str(BEST))


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    from datamodules.classification import ClassificationDataModule
    from datamodules.language_model import CausalLMDataModule, MLMDataModule
    from datamodules.listops import ListOpsDataModule
    from datamodules.mqar import MQARDataModule

    if cfg.task == "classify":  # init_from: encode with the pretraining run's tokenizer
        return ClassificationDataModule(cfg.data, cfg.model.max_len, cfg.seed, init_from=cfg.init_from)
    cls = {"mlm": MLMDataModule, "clm": CausalLMDataModule, "recall": MQARDataModule, "listops": ListOpsDataModule}[
        cfg.task
    ]
    return cls(cfg.data, cfg.model.max_len, cfg.seed)


def build_module(cfg: DictConfig, datamodule: L.LightningDataModule) -> L.LightningModule:
    from lightning_modules.classifier import SequenceClassifierModule
    from lightning_modules.language_model import CausalLMModule, MaskedLMModule, TokenPredictionModule

    if cfg.task in ("classify", "listops"):
        return SequenceClassifierModule(
            to_container(cfg), datamodule.vocab_size, datamodule.num_labels, datamodule.test_sets
        )
    # recall: loss on the queried values, with bidirectional or causal attention alike.
    cls = {"mlm": MaskedLMModule, "clm": CausalLMModule, "recall": TokenPredictionModule}[cfg.task]
    return cls(to_container(cfg), datamodule.vocab_size, getattr(datamodule, "target_groups", ()))


def on_gpu(cfg: DictConfig) -> bool:
    """Whether the run trains on a GPU: ``trainer.accelerator`` gpu or cuda, or auto on a machine with one."""
    t = cfg.trainer
    # device_count() counts through NVML and, unlike is_available(), leaves CUDA uninitialised (fork-safe).
    return t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.device_count() > 0)


def compiles(cfg: DictConfig) -> bool:
    """``trainer.compile``, auto resolved: on for a run on a GPU, off on the CPU (training/config.py says why)."""
    return on_gpu(cfg) if cfg.trainer.compile == "auto" else bool(cfg.trainer.compile)


def _precision(cfg: DictConfig) -> str:
    """trainer.precision, or when null: 32-true on CPU; on a GPU bf16-mixed from compute capability 8.0 (Ampere)
    on, 16-mixed before (older GPUs emulate bf16, slowly)."""
    t = cfg.trainer
    if t.precision is not None:
        return t.precision
    if not on_gpu(cfg):
        return "32-true"
    return "bf16-mixed" if _compute_capability(t.strategy)[0] >= 8 else "16-mixed"


def _compute_capability(strategy: str) -> tuple[int, int]:
    """(major, minor) of the first visible GPU. Reading it initialises CUDA, which a process that forks its ranks
    (ddp_fork, ddp_notebook) must not do: there a spawned process reads it."""
    if strategy not in FORKING_STRATEGIES:
        return torch.cuda.get_device_capability()
    return _capability_in_a_child()


@functools.lru_cache(maxsize=1)
def _capability_in_a_child() -> tuple[int, int]:
    with mp.get_context("spawn").Pool(1) as pool:
        return tuple(pool.apply(torch.cuda.get_device_capability))


# The HPARAMS columns: what tells runs apart (the attention kind and all its options, size, lr, seed, steps), not
# every config key; a sweep adds its trial's parameters (train's ``hparams``).
HP_KEYS = (
    "experiment",
    "task",
    "seed",
    "init_from",
    "model.max_len",
    "model.d_model",
    "model.n_heads",
    "model.n_layers",
    "model.d_ff",
    "model.norm",
    "model.init_std",
    "data.source",
    "data.tokenizer.kind",
    "data.batch_size",
    "optim.lr",
    "optim.warmup_steps",
    "trainer.max_steps",
)
HP_BY_TASK = {"mlm": ("data.mask_prob",), "recall": ("data.mqar.",), "listops": ("data.listops.",)}


def hparams_of(cfg: DictConfig) -> dict[str, Any]:
    """The flat scalar hyper-parameters of the HPARAMS tab (lists become strings): :data:`HP_KEYS`,
    ``model.attention.*`` and the task's own data keys (:data:`HP_BY_TASK`)."""
    flat = flatten(to_container(cfg))
    wanted = (*HP_BY_TASK.get(cfg.task, ()), "model.attention.")
    if cfg.data.tokenizer.kind == "bpe":
        wanted += ("data.tokenizer.vocab_size",)
    kept = {k: v for k, v in flat.items() if k in HP_KEYS or k.startswith(wanted)}
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in kept.items()}


def finished_metrics(run_dir: Path, saved_step: int, max_steps: int) -> Optional[dict[str, Any]]:
    """The run's ``metrics.json`` when its training is over (checkpoint at or past ``max_steps``) and that file
    records exactly that end (same step, with its validation scores); else None."""
    path = run_dir / METRICS
    if saved_step < max_steps or not path.is_file():
        return None
    metrics = read_json(path)  # checked readable by check_resume
    complete = metrics.get("global_step") == saved_step
    return metrics if complete and any(k.startswith("val/") for k in metrics) else None


def _earlier_metrics(run_dir: Path) -> Optional[Path]:
    """Where a run trained further keeps the metrics.json of its earlier end: metrics.step_<N>.json (None when
    there is no metrics.json, or it names no step)."""
    path = run_dir / METRICS
    step = read_json(path).get("global_step") if path.exists() else None
    return run_dir / f"metrics.step_{step}.json" if isinstance(step, int) else None


def _keep_earlier_metrics(run_dir: Path) -> None:
    """A run trained further keeps the metrics.json of its earlier end as metrics.step_<N>.json."""
    kept = _earlier_metrics(run_dir)
    if kept is not None:
        os.replace(run_dir / METRICS, kept)


def check_resume(cfg: DictConfig, folder: str = "") -> Optional[Resumed]:
    """A resumed run continues the run that was started and can write its end: its config equals the stored
    ``config.yaml`` (keys of ``MAY_CHANGE_ON_RESUME`` aside), its files are its own and whole
    (:func:`training.runfiles.check_run_files`: one run identity, none missing, each parsed and range-checked), and
    the ``metrics.json`` it will replace (or move to ``metrics.step_<N>.json``) is a readable JSON file. Checked
    before the data is prepared, anything written or a step trained; a problem is one ConfigError line. Returns
    what the resume continues; nothing to check for a new run (None).

    The run directory holds no link and no known name of the wrong type (a folder where ``.lock`` or
    ``last.ckpt`` belongs, a file where ``checkpoints/`` belongs: :func:`foundation.confined.check_tree`), and its
    checkpoint folder takes a new file: a resume that could not save fails here, not at its first save. ``folder``:
    the experiment's subfolder the run takes its versions in (:func:`run_folder`)."""
    if not cfg.resume:
        return None
    run_dir = choose_run_dir(cfg.output_dir, cfg.experiment, cfg.run_dir, True, rank_zero_only.rank, folder)
    check_tree(run_dir, "resume", files=RUN_FILES, folders=(str(CHECKPOINT.parent),))
    check_folder("resume: checkpoints", str(run_dir / CHECKPOINT.parent))
    check_same_config(cfg, run_dir)
    resumed = check_run_files(cfg, run_dir)
    try:
        kept = _earlier_metrics(run_dir)
        if kept is not None and kept.exists() and not kept.is_file():
            raise ConfigError(f"{kept}: not a file")
    except ConfigError as err:
        raise ConfigError(f"resume: {err}; the resumed run would replace it at its end (move it aside)") from None
    return resumed


def _own_run_dir(cfg: DictConfig, run_dir: Path, folder: str) -> tuple[Path, Optional[Owner]]:
    """Rank 0's claim on its run directory: a new run creates it (a numbered version another process created first
    moves this run on to the next free number), then locks it; a second process on the same directory gets one
    line naming the owner."""
    if cfg.resume or cfg.run_dir is not None:
        if not cfg.resume:
            run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir, (Owner(run_dir) if run_dir.is_dir() else None)
    while True:
        try:
            run_dir.mkdir(parents=True)
            return run_dir, Owner(run_dir)
        except FileExistsError:
            run_dir = choose_run_dir(cfg.output_dir, cfg.experiment, None, False, folder=folder)


def _open_run_dir(
    cfg: DictConfig,
    datamodule: L.LightningDataModule,
    module: L.LightningModule,
    resumed: Optional[Resumed],
    folder: str,
    branch: Optional[Branch] = None,
) -> tuple[Path, Optional[str], Optional[dict], Optional[Owner], str]:
    """The run directory, owned by this process (rank 0) and with its files written (:func:`_write_run_files`); the
    checkpoint to resume from; when the run to resume has already finished and recorded its metrics, those
    metrics (then nothing is written); the ownership, for the caller to release; and the run's identity. A run
    ``branch``-ed off another's checkpoint starts from that checkpoint and records it (``branch.json``).

    A DDP launch runs this in every rank (RANK / LOCAL_RANK / SLURM_PROCID); only rank 0 owns and writes. What a
    resume continues (``resumed``) was checked by :func:`check_resume` before anything was written; here a foreign
    architecture is refused, and resuming drops the TensorBoard events the interrupted process logged after its
    checkpoint (with no checkpoint, all of them: the run starts afresh).
    """
    rank = rank_zero_only.rank
    run_dir = choose_run_dir(cfg.output_dir, cfg.experiment, cfg.run_dir, cfg.resume, rank, folder)
    owner = None
    if rank == 0:
        run_dir, owner = _own_run_dir(cfg, run_dir, folder)
    resume_state = resumed.state if resumed is not None else None
    run_id = resumed.run_id if resumed is not None and resumed.run_id else new_run_id()  # a resumed run keeps its own
    try:
        resume_from = str(run_dir / CHECKPOINT) if resume_state is not None else None
        if branch is not None:
            resume_from = str(branch.path)
        if resume_state is not None:
            check_architecture(resume_state, module, run_dir / CHECKPOINT)
            done = finished_metrics(run_dir, resumed.step, cfg.trainer.max_steps)
            if done is not None:
                if owner is not None:
                    owner.release()
                return run_dir, resume_from, done, None, run_id
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            if owner is None:
                owner = Owner(run_dir)
            owner.record()
            _write_run_files(cfg, run_dir, datamodule, resume_state, run_id)
            if branch is not None:
                write_json(run_dir / BRANCH, branch.record(), run_dir)
    except BaseException:
        if owner is not None:
            owner.release()
        raise
    return run_dir, resume_from, None, owner, run_id


def _write_run_files(
    cfg: DictConfig,
    run_dir: Path,
    datamodule: L.LightningDataModule,
    resume_state: Optional[dict],
    run_id: str,
) -> None:
    """Rank 0, owning ``run_dir``: the event files rolled back to the checkpoint (or cleaned, for a resume without
    one), then ``config.yaml`` and ``data.json`` (each with the run identity), the tokenizer, and a finished run
    trained further keeps its earlier ``metrics.json``."""
    if resume_state is not None:
        rollback_events(run_dir, resume_state)
    elif cfg.resume:
        clean_start(run_dir)
    atomic_write_text(run_dir / "config.yaml", config_text(cfg, run_id), run_dir)
    data = {"fingerprint": data_identity(cfg), "run_id": run_id}
    write_json(run_dir / DATA, data, run_dir)  # a resume checks it
    if getattr(datamodule, "tokenizer", None) is not None:  # fine-tuning from this run encodes text with it
        atomic_write_text(run_dir / TOKENIZER, datamodule.tokenizer.to_str(), run_dir)
    if resume_state is not None:
        _keep_earlier_metrics(run_dir)


def _logger(
    cfg: DictConfig,
    module: L.LightningModule,
    run_dir: Path,
    resumed: bool,
    hparams: Optional[dict],
    answer: ObjectiveMetrics,
    log: LogPlace,
) -> TensorBoardLogger:
    """TensorBoard logger of the run; a new run first records its HPARAMS (a resumed one has them): its
    hyper-parameters, the axes that vary first, and as metrics the objective and its context gain (``answer``) and
    the module's own; and the chart of its objective with the no-context level (training/tensorboard.py)."""
    logger = RunLogger(save_dir=str(run_dir.parent), name="", version=run_dir.name, default_hp_metric=False)
    if not resumed and rank_zero_only.rank == 0:  # the ranks strategy=ddp starts log nothing of their own
        hp_metrics = list(dict.fromkeys([*answer.tags(), *getattr(module, "hp_metrics", HP_METRICS)]))
        params = filled({**hparams_of(cfg), **(hparams or {})}, log.fill)
        layout = objective_layout(answer.objective.metric, answer.level_tag)
        axes = log.axes or tuple(k for k in hparams or {} if not k.startswith("sweep/"))  # a trial's parameters
        roots, name = log_roots(run_dir, Path(cfg.output_dir), log, params)
        record_run(logger, roots, params, hp_metrics, axes, layout, name)
        # Flushed and closed: the writer reopens on next use, in the process that uses it (its thread would
        # not survive into the ranks that strategy=ddp_fork forks, which would then hang on their first flush).
        logger.experiment.close()
    return logger


def trainer_arguments(cfg: DictConfig) -> dict[str, Any]:
    """The Lightning Trainer's arguments that come from the config."""
    t = cfg.trainer
    return dict(
        max_steps=t.max_steps,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=t.strategy,
        precision=_precision(cfg),
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=cfg.optim.gradient_clip_val,
        deterministic=t.deterministic,
    )


def _trainer(cfg: DictConfig, run_dir: Path, logger: TensorBoardLogger, callbacks: list[L.Callback]) -> L.Trainer:
    bar = progress(cfg.trainer.log_every_n_steps)
    return L.Trainer(
        **trainer_arguments(cfg),
        num_sanity_val_steps=0,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        logger=logger,
        plugins=[AtomicCheckpointIO(inside=run_dir)],
        callbacks=[*callbacks, bar],
    )


def check_machine(cfg: DictConfig) -> None:
    """The accelerator the run asks for is on this machine: a GPU without CUDA or an MPS device where there is none
    fail inside Lightning after files exist. (``train --check`` skips this: it validates a GPU preset on a
    laptop.)"""
    accelerator = cfg.trainer.accelerator
    # device_count(): through NVML, leaving CUDA uninitialised (is_available() would initialise it before a fork)
    if accelerator in ("gpu", "cuda") and torch.cuda.device_count() == 0:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(
            f"trainer.accelerator: {accelerator!r} but this machine has no usable CUDA GPU (torch "
            f"{torch.__version__}, {build}); use cpu or auto"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("trainer.accelerator: 'mps' but this machine has no MPS device; use cpu or auto")


def preflight(cfg: DictConfig, vocab_size: Optional[int] = None) -> int:
    """Everything about a checked config that only Lightning or torch would otherwise reject, and only after the
    run directory exists: the Trainer's arguments together (accelerator, devices, strategy, precision) and the
    model's construction, on the meta device (no memory). Writes nothing; returns the model's parameter count.
    A problem is one ConfigError line."""
    # device_count(): through NVML, leaving CUDA uninitialised (is_available() would initialise it before a fork)
    gpu_wanted = cfg.trainer.accelerator in ("gpu", "cuda") and torch.cuda.device_count() == 0
    if cfg.trainer.accelerator == "tpu" and importlib.util.find_spec("torch_xla") is None:
        raise ConfigError("trainer.accelerator: 'tpu' needs the torch_xla package, which is not installed")
    quiet = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in quiet]
    try:
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not gpu_wanted:  # a GPU preset validated on a CPU machine: its device arguments are for later
                L.Trainer(
                    **trainer_arguments(cfg),
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                )
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as err:
        raise ConfigError(
            f"trainer: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}"
        ) from None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return model_parameters(cfg, vocab_size)


def model_parameters(cfg: DictConfig, vocab_size: Optional[int] = None) -> int:
    """The encoder's trainable parameter count, built on the meta device (no memory, no data); the vocabulary
    defaults to the tokenizer's configured size (at least the byte tokenizer's 260)."""
    vocab = vocab_size or max(cfg.data.tokenizer.vocab_size, 260)
    with torch.device("meta"):
        encoder = TransformerEncoder(cfg.model, vocab)
    return count_parameters(encoder)


def check_parameters(cfg: DictConfig) -> tuple[int, bool]:
    """What ``train --check`` reports: the trainable parameters of the run's LightningModule (encoder and head),
    built on the meta device with the vocabulary and classes its data will have, and whether that is exact. It is
    exact for bytes, MQAR and ListOps; a BPE's trained vocabulary can stay below data.tokenizer.vocab_size (then it
    is an upper bound) and a classification task without data.classify.num_labels learns its classes from the data
    (2 assumed)."""
    import types

    from datamodules.language_model import MLMDataModule
    from datamodules.listops import ListOpsDataModule
    from datamodules.tokenizer import NUM_SPECIAL

    exact = True
    if cfg.task == "recall":
        vocab = 1 + cfg.data.mqar.vocab_size  # [PAD] + keys + values (datamodules/mqar.py)
    elif cfg.task == "listops":
        vocab = ListOpsDataModule.vocab_size
    elif cfg.data.tokenizer.kind == "byte" and cfg.data.tokenizer.path is None:
        vocab = 256 + NUM_SPECIAL
    else:
        vocab, exact = cfg.data.tokenizer.vocab_size, False
    labels = ListOpsDataModule.num_labels if cfg.task == "listops" else cfg.data.classify.num_labels
    if cfg.task == "classify" and labels is None:
        labels, exact = 2, False
    data = types.SimpleNamespace(
        vocab_size=vocab, num_labels=labels, target_groups=MLMDataModule.target_groups if cfg.task == "mlm" else ()
    )
    built = cfg.copy()
    built.init_from = None  # the count does not depend on the weights a classifier starts from
    with torch.device("meta"):
        return build_module(built, data).n_parameters, exact


def _final_scores(
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    best: Optional[ModelCheckpoint],
    validated_at: Optional[int],
    global_step: int,
) -> dict[str, Any]:
    """val/* at the last step (validating once more if the last step was not validated, or if this process
    holds no validation scores: a resumed run whose training was already over), and for tasks with a test split,
    test/* of the best validation checkpoint."""
    if validated_at != global_step or not any(k.startswith("val/") for k in trainer.callback_metrics):
        trainer.validate(module, datamodule=datamodule, verbose=False)
    final = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    if is_overridden("test_dataloader", datamodule):
        best_path = best.best_model_path if best is not None and best.best_model_path else None
        scores = trainer.test(module, datamodule=datamodule, ckpt_path=best_path, verbose=False, weights_only=True)
        final.update({k: float(v) for test_set in scores for k, v in test_set.items()})  # one dict per test set
        if best_path is not None:
            final.update({"best_checkpoint": best_path, f"best_{best.monitor}": float(best.best_model_score)})
    return final


def run_objective(cfg: DictConfig, datamodule: Optional[L.LightningDataModule] = None) -> Objective:
    """The number this run answers with (training/answer.py); a masked LM splits its targets by BERT's rule."""
    from datamodules.language_model import MLMDataModule

    if cfg.task == "classify":  # a GLUE task's first official metric (val/matthews, val/pearson, ...)
        return Objective(f"val/{cfg.data.classify.metrics[0]}")
    groups = getattr(datamodule, "target_groups", MLMDataModule.target_groups if cfg.task == "mlm" else ())
    return objective_of(cfg.task, groups)


def build_module_or_refuse(cfg: DictConfig, datamodule: L.LightningDataModule) -> L.LightningModule:
    """The run's LightningModule; a failed allocation of its weights is one config line, before any write."""
    try:
        return build_module(cfg, datamodule)
    except MemoryError as err:
        raise ConfigError(
            f"model: cannot allocate its weights ({type(err).__name__}); reduce model.max_len, "
            "d_model, d_ff or n_layers"
        ) from None
    except RuntimeError as err:
        if "alloc" not in str(err).lower():
            raise
        raise ConfigError(
            f"model: cannot allocate its weights ({str(err).splitlines()[0][:120]}); reduce "
            "model.max_len, d_model, d_ff or n_layers"
        ) from None


def validation_examples(callback_metrics: dict[str, Any]) -> dict[str, Any]:
    """``{"validation_examples": {metric: {"sum": [...], "count": [...]}}}``, entry i the i-th validation example's
    (``lightning_modules/per_example.py``), from the callback metrics ``validation_examples/<metric>/sum|count``
    that token-prediction modules leave; empty for modules that leave none."""
    examples: dict[str, dict[str, list[float]]] = {}
    for key, value in callback_metrics.items():
        if key.startswith(EXAMPLES):
            metric, _, field = key.removeprefix(EXAMPLES).rpartition("/")
            examples.setdefault(metric, {})[field] = value.tolist()
    return {"validation_examples": examples} if examples else {}


def run_metrics_of(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    best: Optional[ModelCheckpoint],
    run: RunMetrics,
    flops: TrainingFlops,
    global_step: int,
    started: float,
    run_dir: Path,
) -> dict[str, Any]:
    """What ``metrics.json`` records: final scores, trivial baselines, sizes, time, throughput, FLOPs, memory."""
    final = _final_scores(trainer, module, datamodule, best, run.validated_at, global_step)
    return {
        **final,
        **datamodule.trivial_baseline(),  # trivial_loss, trivial_accuracy: what "learned nothing" scores
        **({"baselines": datamodule.baselines()} if hasattr(datamodule, "baselines") else {}),
        **validation_examples(trainer.callback_metrics),
        "global_step": global_step,
        "parameters": module.n_parameters,
        "projection_parameters": module.encoder.attention_class.projection_parameters(module.encoder.shared),
        "wall_time_s": time.time() - started,
        "train_time_s": run.train_seconds,  # the timed steps' (each process's first step: warmup_s)
        "tokens": run.tokens,
        "tokens_per_sec": run.tokens_per_sec,
        # model FLOP/s of one device over its named peak (mfu, mfu_peak), or why there is none (mfu_unavailable)
        **run.utilisation(),
        "compiled": compiles(cfg),
        # matrix FLOPs of training (forward + backward): one batch counted, times the batches of every rank (a length
        # curriculum's short batches counted apart)
        "flops_per_batch": flops.flops_per_batch,
        "short_flops_per_batch": flops.short_flops_per_batch,
        "train_flops": flops.train_flops,
        "peak_mem_mb": run.peak_mem_mb,  # read during training (the module is on the CPU by now)
        "ppl_vs_wallclock": [list(c) for c in run.curve],
        "run_dir": str(run_dir),
    }


def train(
    cfg: DictConfig,
    callbacks: Iterable[L.Callback] = (),
    hparams: Optional[dict] = None,
    log: LogPlace = LogPlace(),
    folder: str = "",
) -> dict[str, Any]:
    """Train one run and return its ``metrics.json`` content.

    Args:
        cfg: a checked :class:`RunConfig`.
        callbacks: extra Lightning callbacks (e.g. Optuna's pruning callback).
        hparams: extra entries for the HPARAMS tab (e.g. a sweep trial's parameters).
        log: the TensorBoard log directory the run belongs to and the axes its HPARAMS tab lists first (default:
            the run directory's parent, and ``hparams``' keys other than ``sweep/*``).
        folder: the subfolder of ``<output_dir>/<experiment>`` the run takes its version in (the ``train``
            command's :func:`run_folder`; default: none, ``<output_dir>/<experiment>/version_<i>``). An explicit
            ``run_dir`` ignores it.
    """
    started = time.time()
    quiet_third_parties()
    check_machine(cfg)
    preflight(cfg)
    resumed = check_resume(cfg, folder)
    if rank_zero_only.rank == 0 and (resumed is None or resumed.state is None):  # a run that records its HPARAMS
        check_record(
            log.root or choose_run_dir(cfg.output_dir, cfg.experiment, cfg.run_dir, cfg.resume, 0, folder).parent
        )
    # a run that starts (or restarts before its first save) off another run's checkpoint: training/branch.py
    branch = check_branch(cfg) if resumed is None or resumed.state is None else None
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.trainer.cpu_threads > 0:
        torch.set_num_threads(cfg.trainer.cpu_threads)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    if cfg.resume:  # the data it started with, before anything is written
        tokenizer = getattr(datamodule, "tokenizer", None)
        run_dir = choose_run_dir(cfg.output_dir, cfg.experiment, cfg.run_dir, True, rank_zero_only.rank, folder)
        check_same_data(cfg, run_dir, tokenizer.to_str() if tokenizer is not None else None)
    module = build_module_or_refuse(cfg, datamodule)
    run_dir, resume_from, done, owner, run_id = _open_run_dir(
        cfg, datamodule, module, resumed, folder, branch
    )  # the first write
    if done is not None:
        print(
            f"{run_dir}: already finished at step {done['global_step']} (trainer.max_steps={cfg.trainer.max_steps}); "
            f"nothing to do, its {METRICS} is unchanged"
        )
        return done
    with owner or contextlib.nullcontext():
        kept = resumed.step if resumed is not None and resumed.state is not None else None
        resuming = (resume_from, kept, run_id)
        return _fit(cfg, datamodule, module, run_dir, resuming, list(callbacks), hparams, started, log)


def _fit(
    cfg: DictConfig,
    datamodule: L.LightningDataModule,
    module: L.LightningModule,
    run_dir: Path,
    resuming: tuple[Optional[str], Optional[int], str],
    callbacks: list[L.Callback],
    hparams: Optional[dict],
    started: float,
    log: LogPlace,
) -> dict[str, Any]:
    """Train in the opened run directory and write its ``metrics.json``. ``resuming``: the checkpoint to resume from
    and its step (None, None for a run that starts afresh) and the run's identity."""
    resume_from, kept, run_id = resuming
    study_metrics = str((hparams or {}).get("sweep/objective", "")).split(",")
    # the module's HPARAMS metrics (hp/val_loss: val/loss) too, all logged at the step validated
    module_metrics = [m.replace("hp/val_", "val/", 1) for m in getattr(module, "hp_metrics", HP_METRICS)]
    answer = ObjectiveMetrics(
        run_objective(cfg, datamodule), [m for m in [*study_metrics, *module_metrics] if m.startswith("val/")]
    )
    logger = _logger(cfg, module, run_dir, kept is not None, hparams, answer, log)
    flops = TrainingFlops()
    run = RunMetrics(flops)
    sample = SampleValidation(answer.objective.metric, run, answer.levels)
    best = _best_checkpoint(module, run_dir)
    every = cfg.trainer.spectrum_every_n_val
    trainer = _trainer(
        cfg,
        run_dir,
        logger,
        [
            Accelerate(compiles(cfg)),
            guard := DivergenceGuard(),  # the one rule, for every run: a non-finite loss stops it
            run,
            flops,
            sample,
            *callbacks,
            answer,
            *([SpectrumMonitor(every)] if every > 0 else []),
            *([best] if best else []),
            StopTogether(),
            last := LastCheckpoint(run_dir / CHECKPOINT, run_id, guard),
        ],
    )  # after `best`: last.ckpt holds its state after each validation
    with (
        shared_with_ranks(run_dir),
        honest_ending(trainer, run_dir),
        compile_failures(compiles(cfg)),
        _recorded_divergence(cfg, trainer, run_dir, last, kept, run_id),
    ):
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
        global_step = trainer.global_step
        if not run.fit_here:  # fit ran in spawned/forked ranks (ddp_spawn, ddp_fork)
            global_step = adopt_final_state(trainer, run_dir / CHECKPOINT)
        metrics = run_metrics_of(cfg, trainer, module, datamodule, best, run, flops, global_step, started, run_dir)
    metrics["run_id"] = run_id
    if trainer.is_global_zero:
        write_json(run_dir / METRICS, metrics, run_dir)
    return metrics


def _best_checkpoint(module: L.LightningModule, run_dir: Path) -> Optional[ModelCheckpoint]:
    """Modules with a checkpoint_monitor (classifiers) also keep their best validation step, which is tested."""
    monitor, mode = getattr(module, "checkpoint_monitor", (None, "min"))
    if not monitor:
        return None
    return ModelCheckpoint(
        dirpath=str(run_dir / "checkpoints"),
        filename="best",
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        save_on_train_epoch_end=False,
    )


def _recorded_divergence(
    cfg: DictConfig, trainer: L.Trainer, run_dir: Path, last: LastCheckpoint, kept: Optional[int], run_id: str
) -> contextlib.AbstractContextManager:
    """Around ``fit``: a divergence recorded in ``metrics.json`` (rank 0), with the step of the last checkpoint kept
    (this process's last save, else the one it resumed from), and ended as one line (``training/divergence.py``)."""

    def record(diverged: dict[str, Any]) -> None:
        if trainer.is_global_zero:
            write_json(run_dir / METRICS, {**diverged, "run_id": run_id, "run_dir": str(run_dir)}, run_dir)

    return recorded(run_dir, lambda: last.saved_step if last.saved_step >= 0 else kept, cfg.optim.lr, record)


@contextlib.contextmanager
def honest_ending(trainer: L.Trainer, run_dir: Path) -> Iterator[None]:
    """An interrupted ``fit`` ends as what it is. Lightning answers Ctrl-C inside ``fit`` with ``sys.exit(1)`` and
    SIGTERM with a ``SystemExit`` whose code is 0: here Ctrl-C becomes ``KeyboardInterrupt`` (exit 130) and
    SIGTERM, once :class:`LastCheckpoint` has saved the step reached, :class:`Terminated` (exit 143)."""
    try:
        yield
    except SIGTERMException:
        raise Terminated(
            f"{run_dir}: stopped by SIGTERM at step {trainer.global_step} of {trainer.max_steps}, its checkpoint "
            "saved; rerun with resume=true to continue"
        ) from None
    except SystemExit as exit_:
        if isinstance(exit_.__context__, KeyboardInterrupt):  # Lightning's sys.exit(1) in its Ctrl-C handler
            raise KeyboardInterrupt from None
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment YAML file (e.g. experiments/configs/quickstart.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.attention.options.k=32")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config (schema, rules, Trainer arguments, the model built on the meta "
        "device) and exit without writing anything",
    )


def overridden_columns(cfg: DictConfig, overrides: Iterable[str]) -> tuple[str, ...]:
    """The HPARAMS columns that ``key=value`` overrides set (``model.attention.kind=full`` → that column; a whole
    node, ``model.attention={...}``, → each of its columns), to list first."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    return tuple(c for c in hparams_of(cfg) if any(c == k or c.startswith(k + ".") for k in keys))


def run_folder(cfg: DictConfig, overrides: Iterable[str]) -> str:
    """The folder of ``<output_dir>/<experiment>/`` in which the ``train`` command's runs with these ``key=value``
    overrides take their versions (Hydra's ``override_dirname``): ``model.attention.kind=full`` → ``kind=full``
    (:func:`foundation.rundir.values_name`: keys in sorted order, each by the name it owns among the config's keys,
    ``dropout`` for ``model.dropout`` and ``attention.dropout`` for ``model.attention.dropout``; values as given, unsafe
    characters as ``_`` and then a hash of the exact overrides, so two different overrides never share a folder;
    capped with a hash). The keys a resume may change (``MAY_CHANGE_ON_RESUME``: ``resume``, ``output_dir``,
    ``trainer.max_steps``, ...) and ``experiment`` do not name it, so a resume with the same overrides finds its run.
    '' when nothing names it, or when ``run_dir`` is given (that is the run's place)."""
    if cfg.run_dir is not None:
        return ""
    given = dict(o.split("=", 1) for o in overrides)
    named = {k: given[k] for k in sorted(given) if k not in MAY_CHANGE_ON_RESUME and k != "experiment"}
    return values_name(named, list(flatten(to_container(cfg)))) if named else ""


def gpu_note(cfg: DictConfig) -> Optional[str]:
    """For a config that answers its question only on a GPU (``answers_on: gpu``), run on a machine without one:
    the sentence that says so; else None."""
    if cfg.answers_on != "gpu" or on_gpu(cfg):
        return None
    return (
        f"{cfg.experiment} needs a GPU to answer its question (the header of its config file says why); on a CPU "
        "expect it to stay near the no-context level. experiments/configs/bytes_mlm.yaml and the Linformer "
        "ablations on it learn on a CPU in minutes."
    )


def main(args: argparse.Namespace) -> int:
    cfg = run_config.load(args.config, args.overrides)
    folder = run_folder(cfg, args.overrides)
    experiment = check_run_folder(cfg.output_dir, cfg.experiment, folder).parent if folder else None
    if args.check:
        check_resume(cfg, folder)
        preflight(cfg)
        n, exact = check_parameters(cfg)
        print(
            f"config OK: {cfg.task}, {cfg.model.attention.kind} attention, {'' if exact else 'at most '}{n:,} "
            "parameters; nothing written"
        )
        return 0
    if (note := gpu_note(cfg)) is not None:
        print(f"note: {note}", flush=True)
    log = LogPlace(root=experiment, axes=overridden_columns(cfg, args.overrides))  # one HPARAMS tab for all its runs
    metrics = train(cfg, log=log, folder=folder)
    if metrics["global_step"] < cfg.trainer.max_steps:  # a run that did not finish never exits 0
        if says_errors():  # (once, under DDP)
            print(
                f"error: {metrics['run_dir']}: training stopped at step {metrics['global_step']} of "
                f"{cfg.trainer.max_steps}; rerun with resume=true to finish it",
                file=sys.stderr,
            )
        return 1
    print("\n".join(ending_lines(run_objective(cfg), metrics, gpu_note(cfg), experiment)))
    return 0
