"""Checkpoint files: read with ``weights_only=True`` and refused in one line when damaged; saved atomically.

* :func:`read_checkpoint` loads a Lightning checkpoint (a checkpoint cannot run code) and turns a missing,
  truncated, damaged (any entry failing the archive's CRC-32), corrupt or foreign file into one
  :class:`~foundation.errors.ConfigError` line;
* :class:`AtomicCheckpointIO` writes a checkpoint to a temporary file beside its target, syncs it and renames it
  over the target. Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temporary file
  lives in the system temp folder and is then *moved*: a copy, not an atomic rename, when that folder is on
  another filesystem (a tmpfs ``/tmp``), and never synced;
* :func:`check_architecture` refuses a checkpoint of another model.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from foundation.atomic import atomic_write
from foundation.configfile import flatten
from foundation.confined import check_inside
from foundation.errors import ConfigError


def _load(path: str | Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (tensors memory-mapped, on CPU); a one-line ConfigError naming
    the file when it is missing, truncated, corrupt or holds anything but tensors and plain containers."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path}: not found")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, whose directory comes last
        raise ConfigError(f"checkpoint {path}: truncated or not a PyTorch checkpoint (no complete zip archive)")
    verify_archive(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:  # weights_only met a global: unpickling it could run code
        found = re.search(r"GLOBAL (\S+)", str(err))
        what = f" ({found[1]})" if found else ""
        raise ConfigError(
            f"checkpoint {path}: holds objects that could run code when loaded{what}; refused: "
            "only tensors and plain containers load"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise ConfigError(f"checkpoint {path}: corrupt ({reason})") from None


def verify_archive(path: Path) -> None:
    """Every entry of the checkpoint's zip archive against its stored CRC-32 (the archive's own checksums):
    a damaged file is refused in one line instead of loading, silently, weights that were never saved."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ConfigError(
            f"checkpoint {path}: damaged ({str(err).splitlines()[0] if str(err) else type(err).__name__}); refused"
        ) from None
    if bad is not None:
        raise ConfigError(f"checkpoint {path}: damaged (entry {bad} fails its CRC-32 check); refused")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint's content, or a one-line ConfigError naming the file (see :func:`_load`)."""
    state = _load(path)
    if not isinstance(state, dict) or "state_dict" not in state:
        raise ConfigError(f"checkpoint {path}: not a Lightning checkpoint (no 'state_dict')")
    return state


def saved_step(state: dict[str, Any], path: str | Path) -> int:
    """The step a Lightning checkpoint was saved at: its ``global_step``, a whole number >= 0 that its training loop
    counted too (the optimiser steps of its progress record, where it has one); else one line naming the file."""
    step = state.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**62:
        raise ConfigError(f"checkpoint {path}: global_step must be a whole number >= 0, got {step!r:.60}; refused")
    counted = _loop_steps(state)
    if counted is not None and counted != step:
        raise ConfigError(
            f"checkpoint {path}: records global_step {step} but its training loop counted {counted} steps "
            "(edited or damaged); refused"
        )
    return step


def _loop_steps(state: dict[str, Any]) -> Optional[int]:
    """The optimiser steps a checkpoint's training loop counted (automatic and manual optimisation, as Lightning
    sums them into ``global_step`` when it restores), or None when it holds no such record."""
    try:
        loop = state["loops"]["fit_loop"]
        automatic = loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]["total"]["completed"]
        manual = loop["epoch_loop.manual_optimization.optim_step_progress"]["total"]["completed"]
    except (KeyError, TypeError):
        return None
    return automatic + manual if all(isinstance(n, int) for n in (automatic, manual)) else None


def _atomic_torch_save(obj: Any, path: Path, inside: Optional[Path] = None) -> None:
    # One writer per run directory (rank 0): temporaries beside the checkpoint were left by a killed save.
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f), inside)


def _named_inside(root: Path, path: Path) -> bool:
    """``path`` is named inside ``root``, as written (no link resolved)."""
    root, path = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    return root == path or root in path.parents


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints saved by write-sync-rename in the target's folder and loaded with ``weights_only=True``;
    ``inside``: the run directory, which a checkpoint named inside it must not leave, links resolved. A path named
    outside it is Lightning's own (spawn strategies hand the trained weights back through a checkpoint in a fresh
    temporary folder) and is written as it is."""

    def __init__(self, inside: Optional[Path] = None) -> None:
        super().__init__()
        self.inside = inside

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        inside = self.inside if self.inside is not None and _named_inside(self.inside, path) else None
        if inside is not None:
            check_inside(inside, path)  # before the folder is made: never one through a link
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_torch_save(checkpoint, path, inside)

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
    differ = [
        f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here"
        for k in sorted(set(theirs) | set(ours))
        if theirs and theirs.get(k) != ours.get(k)
    ]
    if not differ:
        name = next(k for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k))
        differ = [f"tensor {name} has shape {saved.get(name)} there, {wanted.get(name)} here"]
    raise ConfigError(f"checkpoint {path}: another architecture ({'; '.join(differ[:3])})")
