"""Crash-safe checkpoints and exact resumption.

A run killed at any instant (SIGKILL, power loss) resumes from ``checkpoints/last.ckpt`` and ends with the
same weights and metrics as a run that was never interrupted, and with TensorBoard curves that have no
duplicated or missing steps. What that takes, besides Lightning's own state (weights, optimiser, scheduler,
loop counters, callbacks' state) and the resumable data order of ``datamodules/sampling.py``:

- :class:`AtomicCheckpointIO` writes a checkpoint to a temporary file beside its target, syncs it and renames
  it over the target. Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temporary
  file lives in the system temp folder and is then *moved*: a copy, not an atomic rename, when that folder is
  on another filesystem (a tmpfs ``/tmp``), and never synced.
- :class:`LastCheckpoint` saves ``last.ckpt`` after each validation with the RNG states (dropout and MLM
  masks draw from the global RNG, which Lightning does not checkpoint) and the size of each TensorBoard event
  file, flushed first; :func:`rollback_events` cuts the event files back to those sizes before the resumed
  run logs, so the steps the killed process logged after its checkpoint are dropped and logged once more by
  the resumed run.
- :func:`read_checkpoint` loads with ``weights_only=True`` (a checkpoint cannot run code) and turns a
  truncated, corrupt or foreign file into one :class:`ConfigError` line; :func:`check_architecture` does the
  same for a checkpoint of another model.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO

from datamodules.cache import atomic_write
from experiments.config import ConfigError, flatten

_STATE_KEY = "resume_state"
_EVENTS_GLOB = "events.out.tfevents.*"


# --------------------------------------------------------------------------------------- files
def _load(path: str | Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (tensors memory-mapped, on CPU); a one-line ConfigError naming
    the file when it is missing, truncated, corrupt or holds anything but tensors and plain containers."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path}: not found")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, whose directory comes last
        raise ConfigError(f"checkpoint {path}: truncated or not a PyTorch checkpoint (no complete zip archive)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:  # weights_only met a global: unpickling it could run code
        found = re.search(r"GLOBAL (\S+)", str(err))
        what = f" ({found[1]})" if found else ""
        raise ConfigError(f"checkpoint {path}: holds objects that could run code when loaded{what}; refused: "
                          "only tensors and plain containers load") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise ConfigError(f"checkpoint {path}: corrupt ({reason})") from None


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint's content, or a one-line ConfigError naming the file (see :func:`_load`)."""
    state = _load(path)
    if not isinstance(state, dict) or "state_dict" not in state:
        raise ConfigError(f"checkpoint {path}: not a Lightning checkpoint (no 'state_dict')")
    return state


def _atomic_torch_save(obj: Any, path: Path) -> None:
    # One writer per run directory (rank 0): temporaries beside the checkpoint were left by a killed save.
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints saved by write-sync-rename in the target's folder and loaded with ``weights_only=True``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Optional[Callable] = None, weights_only: Optional[bool] = None):
        return _load(path)


def check_architecture(state: dict[str, Any], module: torch.nn.Module, path: str | Path) -> None:
    """ConfigError unless the checkpoint's tensors have exactly the names and shapes of ``module``'s."""
    saved = {k: tuple(v.shape) for k, v in state["state_dict"].items()}
    wanted = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    if saved == wanted:
        return
    theirs = flatten((state.get("hyper_parameters") or {}).get("config", {}).get("model", {}), "model.")
    ours = flatten(getattr(module, "config", {}).get("model", {}), "model.")
    differ = [f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here" for k in sorted(set(theirs) | set(ours))
              if theirs and theirs.get(k) != ours.get(k)]
    if not differ:
        name = next(k for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k))
        differ = [f"tensor {name} has shape {saved.get(name)} there, {wanted.get(name)} here"]
    raise ConfigError(f"checkpoint {path}: another architecture ({'; '.join(differ[:3])})")


# --------------------------------------------------------------------------------------- state
def _rng_states() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # plain types only: the checkpoint must load with weights_only=True
            "numpy": [np_state[0], np_state[1].tolist(), *map(float, np_state[2:])],
            "python": random.getstate()}


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), gauss))
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in states["python"]))


def _event_dirs(trainer: L.Trainer) -> list[TensorBoardLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


class LastCheckpoint(Checkpoint):
    """Writes ``path`` at the end of every validation during ``fit``, with the RNG states and the TensorBoard
    event file sizes; restores the RNG when a run resumes from it.

    At the end of a validation, not before it (Lightning's ``ModelCheckpoint`` saves step-triggered checkpoints
    before the validation of that step, which a resumed run then skips): a resumed run neither repeats nor
    misses a validation. Lightning runs checkpoint callbacks last, in their order: put it after the others so
    that the checkpoint holds their state after that validation (e.g. a best-model tracker's). The RNG is
    restored when the checkpoint is loaded, before anything of the resumed run draws from it. Under DDP every
    rank draws the same amount from identically seeded generators, so rank 0's state is every rank's.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._saved_step = -1

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path)  # every rank calls it; rank 0 writes
        self._saved_step = trainer.global_step

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The final weights, also when the last step was not a validation step. (A resume from this state,
        # to train further, starts a new epoch: the loops record the epoch as finished.)
        if trainer.global_step != self._saved_step:
            self._save(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        events: dict[str, int] = {}
        if trainer.is_global_zero:
            for logger in _event_dirs(trainer):
                logger.experiment.flush()
                events.update({p.name: p.stat().st_size for p in Path(logger.log_dir).glob(_EVENTS_GLOB)})
        checkpoint[_STATE_KEY] = {"rng": _rng_states(), "events": events}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if _STATE_KEY in checkpoint:
            _set_rng_states(checkpoint[_STATE_KEY]["rng"])


def adopt_final_state(trainer: L.Trainer, path: str | Path) -> int:
    """After a ``fit`` that ran in worker processes (``ddp_spawn``, ``ddp_fork``: Lightning sends back only the
    weights and the last metrics), give this process's callbacks the state rank 0 saved at the end of training
    in ``path``; returns the global step reached."""
    state = read_checkpoint(path)
    for callback in trainer.callbacks:
        if callback.state_key in state.get("callbacks", {}):
            callback.load_state_dict(state["callbacks"][callback.state_key])
    return int(state["global_step"])


def rollback_events(run_dir: Path, state: dict[str, Any]) -> None:
    """Cut the run's TensorBoard event files back to their size at the checkpoint ``state``.

    Files written after it (by a process killed before its first checkpoint) are removed. TensorBoard's record
    format is append-only and the sizes were taken after a flush, so each cut falls on a record boundary.
    """
    sizes = state.get(_STATE_KEY, {}).get("events")
    if not sizes:  # no TensorBoard logger, or a checkpoint from before this mechanism
        return
    for path in Path(run_dir).glob(_EVENTS_GLOB):
        size = sizes.get(path.name)
        if size is None:
            path.unlink()
        elif path.stat().st_size > size:
            os.truncate(path, size)
