"""Exact resumption: a run killed at any instant resumes from ``checkpoints/last.ckpt`` and ends as if uninterrupted.

A run killed at any instant (SIGKILL, power loss) resumes from ``checkpoints/last.ckpt`` and ends with the
same weights and metrics as a run that was never interrupted, and with TensorBoard curves that have no
duplicated or missing steps. What that takes, besides Lightning's own state (weights, optimiser, scheduler,
loop counters, callbacks' state), the resumable data order of ``datamodules/sampling.py`` and the atomic
checkpoint files of :mod:`foundation.checkpoint`:

- :class:`LastCheckpoint` saves ``last.ckpt`` after each validation with the RNG states (dropout draws from
  the global RNG, which Lightning does not checkpoint; MLM masks draw from a generator per batch, see
  ``datamodules/sampling.py``) and the size of each TensorBoard event
  file, flushed first, and the run's identity (``training/runfiles.py``); :func:`rollback_events` cuts the event
  files back to those sizes before the resumed run logs, so the steps the killed process logged after its
  checkpoint are dropped and logged once more by the resumed run; an event file shorter than recorded, or not
  whole up to there, is refused (:func:`check_events`), and a resume with no checkpoint starts from clean event
  files (:func:`clean_start`);
- :func:`check_same_config`: a resumed run continues the run that was started, so its config must equal the
  stored ``config.yaml`` except the keys of :data:`MAY_CHANGE_ON_RESUME` (where files go, how long it trains, how
  often it logs, threads and loader processes); any other difference is one line listing the keys, before any
  file of the run is touched;
- :func:`check_same_data`: and its data must be the data it started with: the fingerprint of its corpus files
  (:func:`data_identity`, kept in ``data.json``) and its ``tokenizer.json``, which is never replaced by another.
"""

from __future__ import annotations

import atexit
import os
import random
import re
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from foundation.checked import read_json
from foundation.checkpoint import read_checkpoint
from foundation.configfile import flatten, read_yaml, to_container
from foundation.confined import open_inside
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT, TOKENIZER
from lightning_modules.attention import ATTENTION_KINDS
from training import config as run_config
from training.divergence import DivergenceGuard

_STATE_KEY = "resume_state"
CONFIG = "config.yaml"
# What a resumed run may change: where its files go, how long it trains, how often it logs, threads, loader
# processes and whether its model is compiled. Nothing here changes what a step computes (threads and compiled
# kernels change only the order of its roundings) or which batches it sees.
MAY_CHANGE_ON_RESUME = (
    "resume",
    "run_dir",
    "output_dir",
    "data.cache_dir",
    "data.num_workers",
    "trainer.max_steps",
    "trainer.log_every_n_steps",
    "trainer.spectrum_every_n_val",
    "trainer.cpu_threads",
    "trainer.compile",
)
_EVENTS_GLOB = "events.out.tfevents.*"
EVENT_NAME = re.compile(r"events\.out\.tfevents\.[^/\\\x00]+")
HPARAMS = "hparams.yaml"  # Lightning's record of the HPARAMS entry, beside the event files


# --------------------------------------------------------------------------------------- state
def _rng_states(device: torch.device) -> dict[str, Any]:
    """This process's generators: CPU (torch, NumPy, Python) and, on a CUDA device, that device's only (a run
    on the CPU never touches CUDA, which would initialise it, or fail, in every process)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        # plain types only: the checkpoint must load with weights_only=True
        "numpy": [np_state[0], np_state[1].tolist(), *map(float, np_state[2:])],
        "python": random.getstate(),
    }


def _set_rng_states(states: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and isinstance(states.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(states["cuda"], device)
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), gauss))
    random.setstate(tuple(v if not isinstance(v, list) else tuple(v) for v in states["python"]))


def _gathered(trainer: L.Trainer, mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``mine``, by global rank (a collective: every rank saves every checkpoint)."""
    if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    out: list[Any] = [None] * trainer.world_size
    dist.all_gather_object(out, mine)
    return out


def _event_dirs(trainer: L.Trainer) -> list[TensorBoardLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


class LastCheckpoint(Checkpoint):
    """Writes ``path`` at the end of every validation during ``fit``, with the RNG states and the TensorBoard
    event file sizes; restores the RNG when a run resumes from it.

    At the end of a validation, not before it (Lightning's ``ModelCheckpoint`` saves step-triggered checkpoints
    before the validation of that step, which a resumed run then skips): a resumed run neither repeats nor
    misses a validation. Lightning runs checkpoint callbacks last, in their order: put it after the others so
    that the checkpoint holds their state after that validation (e.g. a best-model tracker's). The RNG is
    restored when the checkpoint is loaded, before anything of the resumed run draws from it. Under DDP each
    rank's generators (its CPU ones and its own device's: dropout on a GPU draws from that device's) are
    gathered into the checkpoint by global rank, and each rank restores its own; a rank the checkpoint does not
    know (more ranks than when it was written) takes rank 0's CPU generators and keeps its device's as seeded.
    """

    def __init__(self, path: str | Path, run_id: Optional[str] = None, guard: Optional[DivergenceGuard] = None) -> None:
        self.path = Path(path)
        self.run_id = run_id  # the run's identity (training/runfiles.py), recorded in every checkpoint
        self.guard = guard  # checked before each save: a non-finite checkpoint is never written
        self._saved_step = -1

    @property
    def saved_step(self) -> int:
        """The step of the last checkpoint this process saved (-1: none yet)."""
        return self._saved_step

    def _save(self, trainer: L.Trainer) -> None:
        # every rank calls it; rank 0 writes. weights_only=False: the full state (optimiser, loops, callbacks) that
        # exact resumption needs; said explicitly, since Lightning otherwise logs that it chose it. (Saving: the
        # file is read back with weights_only=True, foundation/checkpoint.py.)
        if self.guard is not None:
            self.guard.check_before_saving(trainer, trainer.lightning_module)
        trainer.save_checkpoint(self.path, weights_only=False)
        self._saved_step = trainer.global_step

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The final weights, also when the last step was not a validation step. (A resume from this state,
        # to train further, starts a new epoch: the loops record the epoch as finished.)
        if trainer.global_step != self._saved_step:
            self._save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # SIGTERM (a scheduler's preemption): Lightning stops after a whole training step; save it so that a
        # resumed run continues from there. (Stopped during a validation, the run resumes from the checkpoint
        # before it and validates again.)
        if (
            isinstance(exception, SIGTERMException)
            and trainer.state.fn == "fit"
            and trainer.state.stage == RunningStage.TRAINING
            and trainer.global_step != self._saved_step
        ):
            self._save(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        events: dict[str, int] = {}
        if trainer.is_global_zero:
            for logger in _event_dirs(trainer):
                logger.save()  # flushed, and its hparams.yaml written (a resume requires it beside the checkpoint)
                events.update({p.name: p.stat().st_size for p in Path(logger.log_dir).glob(_EVENTS_GLOB)})
        rng = _gathered(trainer, _rng_states(trainer.strategy.root_device))
        checkpoint[_STATE_KEY] = {"rng_by_rank": rng, "events": events, "run_id": self.run_id}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        state = checkpoint.get(_STATE_KEY, {})
        # (checkpoints from before per-rank states hold rank 0's under "rng", its CUDA part for all devices)
        by_rank = state.get("rng_by_rank") or ([{**state["rng"], "cuda": None}] if "rng" in state else [])
        if not by_rank:
            return
        rank = trainer.global_rank
        own = by_rank[rank] if rank < len(by_rank) else {**by_rank[0], "cuda": None}
        _set_rng_states(own, trainer.strategy.root_device)


class StopTogether(L.Callback):
    """Under DDP every rank stops after the same training step when SIGTERM reaches any of them.

    Lightning's own SIGTERM handler runs a broadcast inside the signal handler, a collective at whatever point the
    process was at: when it lands during another collective (a checkpoint's gather, a barrier) the ranks wait on
    each other for good. And each rank stops at the end of the step in which its own flag was set, so ranks
    signalled a step apart part ways. With several ranks, from the start of training, this callback replaces that
    handler by one that only notes the signal; after each training batch the ranks agree in one all-reduce whether
    any of them was signalled, and all set Lightning's flag at once: each ends that same step, saves it
    (:class:`LastCheckpoint`) and the command exits 143. Lightning restores the handlers it replaced when ``fit``
    ends. (A SIGTERM before training starts, while ``fit`` sets up, meets Lightning's handler.)

    A rank that rank 0 started (``strategy=ddp``) then ends after rank 0: Lightning's watcher in rank 0 kills rank 0
    (SIGKILL, not 143) when it sees one of its ranks end with a non-zero code first.
    """

    def __init__(self) -> None:
        self._signalled = False
        self._child_of_rank_zero = False

    @staticmethod
    def _several(trainer: L.Trainer) -> bool:
        return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _note(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._several(trainer):
            return
        pids: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(pids, os.getpid())
        self._child_of_rank_zero = trainer.global_rank > 0 and os.getppid() == pids[0]
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._note)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self._several(trainer):
            return
        anyone = torch.tensor([int(self._signalled)], device=trainer.strategy.root_device)
        dist.all_reduce(anyone, op=dist.ReduceOp.MAX)
        if anyone.item():
            trainer._signal_connector.received_sigterm = True  # Lightning's flag: it stops after this step

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and self._child_of_rank_zero:
            atexit.register(_end_after, os.getppid())


def _end_after(parent: int, seconds: float = 30.0) -> None:
    """Wait, at most ``seconds``, until the parent process ``parent`` has ended (this one is then re-parented)."""
    deadline = time.monotonic() + seconds
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.02)


def adopt_final_state(trainer: L.Trainer, path: str | Path) -> int:
    """After a ``fit`` that ran in worker processes (``ddp_spawn``, ``ddp_fork``: Lightning sends back only the
    weights and the last metrics), give this process's callbacks the state rank 0 saved at the end of training
    in ``path``; returns the global step reached."""
    state = read_checkpoint(path)
    for callback in trainer.callbacks:
        if callback.state_key in state.get("callbacks", {}):
            callback.load_state_dict(state["callbacks"][callback.state_key])
    return int(state["global_step"])


def checkpoint_record(state: dict[str, Any], path: Path) -> tuple[Any, Optional[dict[str, int]]]:
    """What a checkpoint of :class:`LastCheckpoint` records of its run: the run identity (as stored: checked by
    ``training/runfiles.py``) and each TensorBoard event file's size, checked here (names of event files, whole
    numbers of bytes); (None, None) for a checkpoint from before these records. A malformed record is one line."""
    record = state.get(_STATE_KEY)
    if record is None:
        return None, None
    sizes = record.get("events") if isinstance(record, dict) else None
    whole = isinstance(sizes, dict) and all(
        isinstance(k, str) and EVENT_NAME.fullmatch(k) and _whole(v) for k, v in sizes.items()
    )
    if not isinstance(record, dict) or (sizes is not None and not whole) or not _rng_record(record.get("rng_by_rank")):
        raise ConfigError(
            f"checkpoint {path}: its record of the run ({_STATE_KEY}: the event files' sizes, the generators' "
            "states) is malformed; refused"
        )
    return record.get("run_id"), sizes


def _rng_record(by_rank: Any) -> bool:
    """Whether ``by_rank`` is absent or a list of generator states as :func:`_rng_states` writes them."""
    if by_rank is None:
        return True
    return isinstance(by_rank, list) and all(
        isinstance(one, dict)
        and isinstance(one.get("torch"), torch.Tensor)
        and isinstance(one.get("numpy"), list)
        and len(one["numpy"]) == 5
        and isinstance(one.get("python"), (list, tuple))
        for one in by_rank
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def check_events(run_dir: Path, sizes: Optional[dict[str, int]]) -> None:
    """Before anything is written: every TensorBoard event file in ``run_dir`` is a plain file, and each one the
    checkpoint recorded (``sizes``) is there, at least that long and whole up to there (each record's frame intact),
    so that cutting it back (:func:`rollback_events`) leaves the curves with no step missing. Else one line."""
    run_dir = Path(run_dir)
    for path in run_dir.glob(_EVENTS_GLOB):
        if path.is_symlink() or not path.is_file():
            raise ConfigError(f"resume: {path}: not a file, where a TensorBoard event file belongs; move it aside")
    for name, size in (sizes or {}).items():
        path = run_dir / name
        if not path.is_file():
            raise ConfigError(
                f"resume: {path}: missing, its checkpoint recorded {size} bytes of curves there; the resumed curves "
                "would miss every step before it: restore the file, or start a new run"
            )
        have = path.stat().st_size
        if have < size:
            raise ConfigError(
                f"resume: {path}: {have} bytes, shorter than the {size} its checkpoint recorded (cut short?); the "
                "resumed curves would miss steps: restore the file, or start a new run"
            )
        broken = _broken_record(path, size)
        if broken is not None:
            raise ConfigError(
                f"resume: {path}: damaged (no whole TensorBoard record at byte {broken} of the {size} its checkpoint "
                "recorded); restore the file, or start a new run"
            )


def _broken_record(path: Path, size: int) -> Optional[int]:
    """The offset of the first record of the event file ``path`` that is not whole within its first ``size`` bytes
    (a length, its masked CRC-32C, the data and its CRC: TensorBoard's record frame), or None when they end exactly
    at ``size``. The lengths' checksums are checked, not the data's."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    at = 0
    with open(path, "rb") as f:
        while at < size:
            head = f.read(12)
            if len(head) < 12 or at + 12 > size:
                return at
            (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if masked_crc32c(head[:8]) != crc or at + 16 + length > size:
                return at
            at += 16 + length
            f.seek(at)
    return None


def rollback_events(run_dir: Path, state: dict[str, Any]) -> None:
    """Cut the run's TensorBoard event files back to their size at the checkpoint ``state``.

    Files written after it (by a process killed before its first checkpoint) are removed. TensorBoard's record
    format is append-only and the sizes were taken after a flush, so each cut falls on a record boundary. A file
    shorter than recorded, or not whole up to there, is refused (:func:`check_events`), never continued.
    """
    _, sizes = checkpoint_record(state, Path(run_dir) / "checkpoints")
    if not sizes:  # no TensorBoard logger, or a checkpoint from before this mechanism
        return
    check_events(run_dir, sizes)
    for path in Path(run_dir).glob(_EVENTS_GLOB):
        size = sizes.get(path.name)
        if size is None:
            path.unlink()
        elif path.stat().st_size > size:
            fd = open_inside(run_dir, path, os.O_WRONLY)  # never the target of a link planted here
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)


def clean_start(run_dir: Path) -> None:
    """A resume with no checkpoint (its run killed before the first one) starts afresh: the event files and
    ``hparams.yaml`` its first process wrote are removed, so no step is logged twice and HPARAMS once."""
    check_events(run_dir, None)
    for path in [*Path(run_dir).glob(_EVENTS_GLOB), Path(run_dir) / HPARAMS]:
        if path.is_file() and not path.is_symlink():
            path.unlink()


# --------------------------------------------------------------------------------------- same config
def stored_config(run_dir: Path) -> DictConfig:
    """The run's ``config.yaml``, read and merged onto the schema (keys the schema gained take their defaults);
    a missing, malformed or foreign file is one ConfigError line naming it."""
    path = Path(run_dir) / CONFIG
    try:
        return run_config.merge_run([read_yaml(path)])
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message if str(path) in message else f"{path}: {message}") from None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def settled(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened run config with its attention kind's ``auto`` options written as what they resolve to (the
    kind's ``settled_options``): Linformer's ``init: auto`` and the draw it stands for start the same model, so a
    run or a study recorded with one compares equal to a config that says the other."""
    kind = ATTENTION_KINDS.get(flat.get("model.attention.kind"))
    if kind is None:
        return flat
    prefix = "model.attention.options."
    given = {key.removeprefix(prefix): value for key, value in flat.items() if key.startswith(prefix)}
    options = kind.settled_options(given, bool(flat.get("model.attention.causal")))
    rest = {key: value for key, value in flat.items() if not key.startswith(prefix)}
    return {**rest, **{prefix + key: value for key, value in options.items()}}


def config_differences(there: dict[str, Any], here: dict[str, Any], shared_only: bool = False) -> Optional[str]:
    """The keys at which two flattened run configs differ, keys of :data:`MAY_CHANGE_ON_RESUME` aside (each with
    both values, at most six shown), or None when they agree; ``shared_only``: keys only one of them has aside."""
    there, here = settled(there), settled(here)
    keys = set(there) & set(here) if shared_only else set(there) | set(here)
    differ = [k for k in sorted(keys) if k not in MAY_CHANGE_ON_RESUME and there.get(k) != here.get(k)]
    if not differ:
        return None
    shown = ", ".join(f"{k} ({_shown(there.get(k))} there, {_shown(here.get(k))} here)" for k in differ[:6])
    return shown + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")


def check_same_config(cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to resume ``run_dir`` with a config other than the one it was started with (keys of
    :data:`MAY_CHANGE_ON_RESUME` aside): one line listing each differing key with both values."""
    if not (Path(run_dir) / CONFIG).exists():
        return  # a directory a run has not written to yet (beside a checkpoint it is refused: training/runfiles.py)
    differ = config_differences(flatten(to_container(stored_config(run_dir))), flatten(to_container(cfg)))
    if differ is None:
        return
    raise ConfigError(
        f"resume: {Path(run_dir) / CONFIG} differs at {differ}; a resumed run may change only "
        f"{', '.join(MAY_CHANGE_ON_RESUME[1:])} (start a new run for another config)"
    )


# --------------------------------------------------------------------------------------- same data
DATA = "data.json"
SYNTHETIC_TASKS = ("recall", "listops")  # data drawn from the config itself: the config is its identity


def data_identity(cfg: DictConfig) -> str:
    """A short digest of the data a run trains on: the fingerprint of ``data.source``'s files (or of the hub id)
    and of ``data.tokenizer.path`` (:func:`datamodules.corpus.data_fingerprint`); ``synthetic`` for tasks whose
    data the config draws."""
    if cfg.task in SYNTHETIC_TASKS:
        return "synthetic"
    from datamodules.corpus import data_fingerprint

    return data_fingerprint(cfg.data)


def data_record(run_dir: Path) -> tuple[str, Any]:
    """The data fingerprint and the run identity (as stored: ``training/runfiles.py`` checks it) that the run's
    ``data.json`` records; one line when the file is missing, malformed or its fingerprint is not a short string."""
    path = Path(run_dir) / DATA
    record = read_json(path)
    fingerprint = record.get("fingerprint")
    if not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= 200:
        raise ConfigError(f"{path}: fingerprint must be the data's digest (a string), got {fingerprint!r:.60}")
    return fingerprint, record.get("run_id")


def check_same_data(cfg: DictConfig, run_dir: Path, tokenizer: Optional[str]) -> None:
    """Refuse to resume ``run_dir`` on data other than its own: the fingerprint its ``data.json`` records, and its
    ``tokenizer.json`` against ``tokenizer`` (the one the data gives now, as JSON; None without one). One line."""
    run_dir = Path(run_dir)
    recorded = run_dir / DATA
    if recorded.exists():
        there, here = data_record(run_dir)[0], data_identity(cfg)
        if there != here:
            raise ConfigError(
                f"resume: the data of {run_dir} changed since it started (fingerprint {there} in {recorded}, "
                f"{here} now: {cfg.data.source} edited or replaced?); a resumed run trains on the data it started "
                "with: restore it, or start a new run"
            )
    saved = run_dir / TOKENIZER
    if tokenizer is not None and not saved.is_file() and (run_dir / CHECKPOINT).is_file():
        raise ConfigError(
            f"resume: {saved}: missing beside {CHECKPOINT}; the run encodes its text with it and a resume never "
            "re-creates it: restore it, or start a new run"
        )
    if tokenizer is not None and saved.is_file() and saved.read_bytes() != tokenizer.encode("utf-8"):
        raise ConfigError(
            f"resume: {saved} differs from the tokenizer the data gives now (the corpus changed?); it is never "
            "replaced: restore the data, or start a new run"
        )
