"""A run's files belong to the run: one identity binds them, and a resume reads every one of them checked.

**The run identity** is a random UUID (:func:`new_run_id`) created once, when a run starts, and written into each
file that says what the run is: the first line of ``config.yaml`` (``# run <id>``, a YAML comment, so every reader of
the config is unaffected), ``data.json`` (``run_id`` beside the data's fingerprint), every checkpoint
(``resume_state.run_id``, :class:`training.resume.LastCheckpoint`: ``last.ckpt`` and a classifier's ``best.ckpt``)
and ``metrics.json`` (``run_id``). A resume (:func:`check_run_files`) requires them all to agree before anything is
written: a checkpoint, a config, a data record or a metrics file of another run (another seed's ``last.ckpt`` copied
in) is refused in one line.

The identity has no exception: a run folder whose files carry none (identities stripped from a copied run, or files
written by another program) is refused in one line that says how to start afresh, and so are files of which some
carry an identity and some do not (they were put together from different runs).

**What a resume reads, checked** (each failure one ``ConfigError`` line, before anything is written):

- beside a checkpoint, ``config.yaml``, ``data.json`` and ``hparams.yaml`` must be there: a resume never re-creates
  them (a missing ``config.yaml`` would accept another config and ``data.json`` another corpus, silently);
- the checkpoint: whole (CRC-checked), its ``global_step`` a whole number that its training loop counted too, the
  config it recorded equal to the one given (keys a resume may change aside), its record of the event files well
  formed and each of those files there, as long as recorded and whole up to there (``training/resume.py``);
- ``data.json``: a JSON object with the data's fingerprint; ``metrics.json``, when there: a JSON object whose
  ``global_step`` is the checkpoint's, and not the record of a diverged run (resuming it would diverge again);
- no checkpoint (a run killed before its first save): no ``metrics.json`` either (that is a run whose checkpoint was
  removed), and the run starts afresh from clean event files (:func:`training.resume.clean_start`).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from foundation.checked import read_json
from foundation.checkpoint import read_checkpoint, saved_step
from foundation.configfile import flatten, to_container
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT
from training.resume import (
    CONFIG,
    DATA,
    HPARAMS,
    check_events,
    checkpoint_record,
    config_differences,
    data_record,
)

METRICS = "metrics.json"
RUN_ID = re.compile(r"[0-9a-f]{32}")
_ID_LINE = "# run "
_LARGEST_STEP = 2**62  # past any run; a larger metrics.json global_step is damage, not a step


def new_run_id() -> str:
    """A new run's identity: 32 hexadecimal digits, random."""
    return uuid.uuid4().hex


def config_text(cfg: DictConfig, run_id: str) -> str:
    """What ``config.yaml`` holds: the resolved config, below the line ``# run <id>``."""
    return f"{_ID_LINE}{run_id}\n{OmegaConf.to_yaml(cfg, resolve=True)}"


BEST = CHECKPOINT.parent / "best.ckpt"  # a classifier's best validation step (training/train.py), bound like last.ckpt


@dataclass(frozen=True)
class Resumed:
    """What a resume continues: the checkpoint's content and step (None and -1 when there is none: the run starts
    afresh in its folder) and the run's identity (None only for a folder that holds none of the run's files yet)."""

    state: Optional[dict[str, Any]]
    step: int
    run_id: Optional[str]


def check_run_files(cfg: DictConfig, run_dir: Path) -> Resumed:
    """Check every file a resume of ``run_dir`` reads (see the module's docstring); one line for the first problem."""
    run_dir = Path(run_dir)
    ckpt = run_dir / CHECKPOINT
    if not ckpt.is_file():
        return _without_checkpoint(run_dir)
    for name in (CONFIG, DATA, HPARAMS):
        if not (run_dir / name).is_file():
            raise ConfigError(
                f"resume: {run_dir / name}: missing beside {CHECKPOINT}; it records what the run is and a resume never "
                "re-creates it: restore it, or start a new run"
            )
    state = read_checkpoint(ckpt)
    step = saved_step(state, ckpt)
    ckpt_id, sizes = checkpoint_record(state, ckpt)
    metrics = _checked_metrics(run_dir)
    ids = {
        str(CHECKPOINT): ckpt_id,
        CONFIG: _config_id(run_dir / CONFIG),
        DATA: data_record(run_dir)[1],
        **({METRICS: metrics.get("run_id")} if metrics is not None else {}),
        **_best_id(run_dir),
    }
    run_id = _one_identity(run_dir, ids)  # first: a file of another run is named as such
    _check_recorded_config(cfg, state, ckpt)
    if metrics is not None and metrics["global_step"] != step:
        raise ConfigError(
            f"resume: {run_dir / METRICS} records the end at step {metrics['global_step']} but {ckpt} holds step "
            f"{step}: files of different moments (a checkpoint replaced?); restore the run's own files, or start a "
            "new run"
        )
    check_events(run_dir, sizes)
    return Resumed(state, step, run_id)


def _without_checkpoint(run_dir: Path) -> Resumed:
    """A run directory without a checkpoint: a run killed before its first save (its config and data records, when
    there, agree on its identity), never one whose checkpoint was removed (it has a ``metrics.json``)."""
    if (run_dir / METRICS).is_file():
        _refuse_diverged(run_dir / METRICS, read_json(run_dir / METRICS))
    ended = [p for p in (run_dir / METRICS, *run_dir.glob("metrics.step_*.json")) if p.exists() or p.is_symlink()]
    if ended:
        raise ConfigError(
            f"resume: {ended[0]} records an end of this run but {run_dir / CHECKPOINT} is missing (removed?); a resume "
            "continues from the checkpoint: restore it, or start a new run"
        )
    ids = _best_id(run_dir)
    if (run_dir / CONFIG).is_file():
        ids[CONFIG] = _config_id(run_dir / CONFIG)
    if (run_dir / DATA).is_file():
        ids[DATA] = data_record(run_dir)[1]
    return Resumed(None, -1, _one_identity(run_dir, ids) if ids else None)


def _best_id(run_dir: Path) -> dict[str, Any]:
    """``{"checkpoints/best.ckpt": its identity}`` when the run has one (read whole and checked), else ``{}``."""
    path = run_dir / BEST
    if not (path.exists() or path.is_symlink()):
        return {}
    return {str(BEST): checkpoint_record(read_checkpoint(path), path)[0]}


def _config_id(path: Path) -> Optional[str]:
    """The identity on the first line of a run's ``config.yaml`` (None when it has no such line)."""
    with open(path, "rb") as f:
        first = f.readline(200).decode("utf-8", errors="replace").rstrip("\n")
    return first.removeprefix(_ID_LINE).strip() if first.startswith(_ID_LINE) else None


def _one_identity(run_dir: Path, ids: dict[str, Any]) -> str:
    """The one identity every file in ``ids`` (file name → what it records) carries; files that carry none, files of
    different runs, or some with an identity and some without, are one line naming them."""
    for name, value in ids.items():
        if value is not None and not (isinstance(value, str) and RUN_ID.fullmatch(value)):
            raise ConfigError(
                f"resume: {run_dir / name}: its run identity must be 32 hexadecimal digits, got {value!r:.60}"
            )
    found = {value for value in ids.values() if value is not None}
    if not found:
        raise ConfigError(
            f"resume: {run_dir}: its files carry no run identity ({', '.join(ids)}), so nothing tells them from a "
            "copy of another run's; a resume continues one identified run: start afresh, without resume=true (a new "
            "version) or with run_dir=<a new folder>"
        )
    if len(found) == 1 and None not in ids.values():
        return found.pop()
    shown = ", ".join(f"{name}: {'no identity' if value is None else 'run ' + value}" for name, value in ids.items())
    raise ConfigError(
        f"resume: {run_dir} holds files of different runs ({shown}); a resume continues one run: restore that "
        "run's own files, or start a new run"
    )


def _check_recorded_config(cfg: DictConfig, state: dict[str, Any], ckpt: Path) -> None:
    """The config the checkpoint recorded (its module's) equals ``cfg``, keys a resume may change aside and keys only
    one of them knows aside (a checkpoint of an earlier schema): another seed's checkpoint is refused."""
    recorded = (state.get("hyper_parameters") or {}).get("config")
    if not isinstance(recorded, dict):
        raise ConfigError(f"checkpoint {ckpt}: records no run config (not a checkpoint of this lab's runs); refused")
    differ = config_differences(flatten(recorded), flatten(to_container(cfg)), shared_only=True)
    if differ is not None:
        raise ConfigError(
            f"resume: checkpoint {ckpt} was saved by a run of another config ({differ}) than the one given and in "
            "config.yaml: the checkpoint, or an edited config.yaml, is not this run's; restore the run's own files, "
            "or start a new run"
        )


def _checked_metrics(run_dir: Path) -> Optional[dict[str, Any]]:
    """The run's ``metrics.json`` (None when there is none), checked: a JSON object whose ``global_step`` is a whole
    number of steps; the record of a diverged run is refused (resuming it would diverge again)."""
    path = run_dir / METRICS
    if not path.exists():
        return None
    metrics = read_json(path)
    _refuse_diverged(path, metrics)
    found = metrics.get("global_step")
    if not isinstance(found, int) or isinstance(found, bool) or not 0 <= found < _LARGEST_STEP:
        raise ConfigError(f"resume: {path}: global_step must be a whole number of steps >= 0, got {found!r:.60}")
    return metrics


def _refuse_diverged(path: Path, metrics: dict[str, Any]) -> None:
    """One line when ``metrics`` (read from ``path``) records a diverged run: resuming it would diverge again."""
    diverged = metrics.get("diverged")
    if diverged is None:
        return
    at = diverged if isinstance(diverged, dict) else {}
    raise ConfigError(
        f"resume: {path}: this run diverged at step {at.get('step')!r:.20} (train/loss {at.get('loss')!r:.20}, "
        f"learning rate {at.get('lr')!r:.20}); resuming it would diverge again: start a new run with a smaller "
        "optim.lr"
    )
