"""A run branched off another run's checkpoint: a cooldown off a constant-learning-rate trunk (Hägele et al. 2024).

A *trunk* trains at a constant learning rate after its warm-up (``optim.schedule=constant``) and keeps a checkpoint at
each step a cooldown will start from (:class:`KeepCheckpoints`: ``checkpoints/step_<N>.ckpt`` beside ``last.ckpt``).
A *cooldown* is a new run (its own folder and run identity, ``training/runfiles.py``) whose config says
``branch_from: <trunk>/checkpoints/step_<N>.ckpt`` and ``optim.schedule=wsd``: it starts from that checkpoint's whole
state (weights, AdamW moments, scheduler step, loop counters, data order and RNG states: what an exact resume
restores, ``training/resume.py``), so its first step is the trunk's step N + 1, and cools the learning rate down to 0 at
its ``trainer.max_steps``. When N is the cooldown's :func:`~lightning_modules.optim.cooldown_start`, the cooldown
computes what one uninterrupted ``wsd`` run of ``trainer.max_steps`` steps computes (a test checks it to the bit).

What a branch start checks, before anything is written (one ConfigError line each, :func:`check_branch`): the
checkpoint is whole and a run of this lab's; the trunk's config equals this one but for the keys of
:data:`MAY_CHANGE_ON_BRANCH` (the schedule, how long it trains, where it writes); the trunk trained at a constant
learning rate; and the checkpoint's step lies in this run's stable phase (after its warm-up, at or before its
cooldown's start), so the cooldown continues from the learning rate its schedule has there. The run's folder records
where it branched from (``branch.json``: the checkpoint, its step and the trunk's run identity); a resume of the
cooldown continues from its own ``last.ckpt`` (a cooldown killed before its first save branches again).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import lightning as L
from omegaconf import DictConfig

from foundation.checkpoint import read_checkpoint, saved_step
from foundation.configfile import flatten, to_container
from foundation.errors import ConfigError, require
from foundation.rundir import CHECKPOINT
from lightning_modules.optim import cooldown_start
from training.resume import MAY_CHANGE_ON_RESUME, checkpoint_record, config_differences

BRANCH = "branch.json"  # in a branched run's folder: where it started from
# What a cooldown may set otherwise than its trunk: what a resume may change, the schedule, and the experiment name.
MAY_CHANGE_ON_BRANCH = (
    *MAY_CHANGE_ON_RESUME,
    "branch_from",
    "experiment",
    "optim.schedule",
    "optim.cooldown_fraction",
    "optim.cooldown_shape",
)


def kept_checkpoint(run_dir: Path, step: int) -> Path:
    """Where a trunk keeps its checkpoint of ``step``: ``<run_dir>/checkpoints/step_<step>.ckpt``."""
    return Path(run_dir) / CHECKPOINT.parent / f"step_{step}.ckpt"


@dataclass(frozen=True)
class Branch:
    """The checkpoint a run starts from, its step, and the run identity of the trunk that saved it."""

    path: Path
    step: int
    trunk_run_id: Optional[str]

    def record(self) -> dict[str, Any]:
        """What ``branch.json`` holds."""
        return {"branch_from": str(self.path), "step": self.step, "trunk_run_id": self.trunk_run_id}


def _trunk_config(state: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    recorded = (state.get("hyper_parameters") or {}).get("config")
    if not isinstance(recorded, dict):
        raise ConfigError(f"branch_from: checkpoint {ckpt} records no run config (not a checkpoint of this lab's runs)")
    return flatten(recorded)


def check_branch(cfg: DictConfig) -> Optional[Branch]:
    """The branch ``cfg.branch_from`` names, checked (see the module's docstring); None when it names none."""
    if cfg.branch_from is None:
        return None
    ckpt = Path(cfg.branch_from)
    state = read_checkpoint(ckpt)
    step = saved_step(state, ckpt)
    trunk_id, _ = checkpoint_record(state, ckpt)
    trunk = _trunk_config(state, ckpt)
    here = flatten(to_container(cfg))
    kept = {k: v for k, v in trunk.items() if k not in MAY_CHANGE_ON_BRANCH}
    differ = config_differences(kept, {k: v for k, v in here.items() if k not in MAY_CHANGE_ON_BRANCH}, True)
    require(
        differ is None,
        f"branch_from: {ckpt} was saved by a run of another config ({differ}); a cooldown changes only the schedule",
    )
    require(
        trunk.get("optim.schedule") == "constant",
        f"branch_from: {ckpt} is of a run with optim.schedule={trunk.get('optim.schedule')!r}; a cooldown branches "
        "off a trunk trained at a constant learning rate (optim.schedule=constant)",
    )
    require(
        cfg.optim.schedule == "wsd",
        f"optim.schedule: {cfg.optim.schedule!r} with branch_from; a cooldown off a trunk is 'wsd'",
    )
    start = cooldown_start(cfg.trainer.max_steps, cfg.optim.cooldown_fraction)
    require(
        cfg.optim.warmup_steps <= step <= start,
        f"branch_from: {ckpt} holds step {step}, outside this run's stable phase (steps {cfg.optim.warmup_steps} "
        f"to {start}: after optim.warmup_steps, at or before the cooldown's start)",
    )
    return Branch(ckpt, step, trunk_id)


class KeepCheckpoints(L.Callback):
    """A trunk's checkpoint at each of ``steps``, kept as :func:`kept_checkpoint` (the whole state, as ``last.ckpt``:
    a cooldown branched off it continues exactly). Saved after that step's optimiser update, before its validation."""

    def __init__(self, run_dir: Path, steps: Iterable[int]) -> None:
        self.run_dir = Path(run_dir)
        self.steps = frozenset(steps)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step in self.steps and not kept_checkpoint(self.run_dir, step).is_file():
            trainer.save_checkpoint(kept_checkpoint(self.run_dir, step), weights_only=False)
