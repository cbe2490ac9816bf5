"""One trial of a budget-curve study: a trunk per seed and arm, and a cooldown per budget branched off it.

A curve study (``sweep STUDY --budgets 1,2,4,8,16``, :mod:`sweeps.spec.budgets`) runs each of its grid points as
:func:`run_curve`: the trunk trains at a constant learning rate to the largest budget's branch step, keeping a
checkpoint at each budget's (``training/branch.py``), then each budget's cooldown trains from its checkpoint to the
budget's end. The folders are the point's, not the trial's, so that a later ``sweep`` finds them again::

    <study>_<preset>_curve/<arm>/seed=<s>/trunk
    <study>_<preset>_curve/<arm>/seed=<s>/cooldown_x1, cooldown_x2, ...

Each is one run (its own run identity, ``config.yaml``, TensorBoard events; a cooldown's ``branch.json`` names the
trunk checkpoint it started from), and the study's folder is their TensorBoard log directory: the trunk and its
cooldowns read side by side, the cooldowns branching off the trunk's curve at their steps.

Resumable and extendable: a folder that exists is resumed (``resume=true``: the run identity and resume checks of
``training/runfiles.py``), a finished cooldown is not run again, and a trunk asked for more steps (a larger budget
listed) trains on from its last checkpoint. A budget whose branch step the trunk has already passed without keeping
a checkpoint is refused in one line before anything is trained (:func:`check_extendable`). :func:`extend` re-enqueues
the finished trials of a study whose budgets now go further than they ran (their copies continue their folders).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import lightning as L
import optuna
from omegaconf import DictConfig

from foundation.checkpoint import read_checkpoint
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT, values_name
from sweeps import stored
from sweeps.run import storage
from sweeps.spec import budgets
from sweeps.spec.schema import SEED_PARAM
from sweeps.spec.study import Study
from training import config as run_config
from training.branch import KeepCheckpoints, kept_checkpoint

TRUNK = "trunk"
POINTS, CURVE_DIR = budgets.POINTS, budgets.CURVE_DIR


def point_folder(study: Study, params: dict[str, Any]) -> Path:
    """``<study folder>/<arm>/seed=<s>``: where a grid point's trunk and cooldowns live, whichever trial runs it."""
    arm = {k: v for k, v in params.items() if k != SEED_PARAM}
    leaf = f"seed={params.get(SEED_PARAM, study.shared.seed)}"
    return study.root / values_name(arm) / leaf if arm else study.root / leaf


def cooldown_folder(folder: Path, factor: float) -> Path:
    return folder / f"cooldown_{budgets.name(factor)}"


def _trunk_step(trunk: Path) -> int:
    """The step of the trunk's last checkpoint (-1: none yet)."""
    ckpt = trunk / CHECKPOINT
    return int(read_checkpoint(ckpt)["global_step"]) if ckpt.is_file() else -1


def check_extendable(folder: Path, curve: Sequence[budgets.Point]) -> None:
    """Each budget not yet cooled down can still branch: its checkpoint is kept, or the trunk has not reached its
    branch step yet; else one line naming the budget (a trunk keeps checkpoints only at the budgets listed when it
    passed them)."""
    reached = _trunk_step(folder / TRUNK)
    for point in curve:
        done = (cooldown_folder(folder, point.factor) / "metrics.json").is_file()
        if not done and point.branch <= reached and not kept_checkpoint(folder / TRUNK, point.branch).is_file():
            raise ConfigError(
                f"--budgets: ×{point.factor:g} branches at step {point.branch}, which the trunk {folder / TRUNK} "
                f"passed (it is at step {reached}) without keeping a checkpoint there; list it from the start, or "
                "only budgets larger than those the trunk has run"
            )


def curve_configs(
    cfg: DictConfig, folder: Path, factors: Sequence[float]
) -> tuple[DictConfig, list[tuple[budgets.Point, DictConfig]]]:
    """The trunk's config and each budget's cooldown config for the trial config ``cfg`` (at ×1), checked, each
    resuming its folder when it exists."""
    curve = budgets.curve_of(cfg, factors)
    trunk = budgets.trunk_config(cfg, curve, str(folder / TRUNK))
    trunk.resume = (folder / TRUNK).is_dir()
    cooldowns = []
    for point in curve:
        where = cooldown_folder(folder, point.factor)
        cooldown = budgets.cooldown_config(cfg, point, None, str(where))
        cooldown.resume = where.is_dir()
        run_config.check(cooldown)
        cooldown.branch_from = str(kept_checkpoint(folder / TRUNK, point.branch))
        cooldowns.append((point, cooldown))
    run_config.check(trunk)
    return trunk, cooldowns


def run_curve(
    study: Study,
    params: dict[str, Any],
    cfg: DictConfig,
    hparams: dict[str, Any],
    callbacks: Sequence[L.Callback] = (),
    log: Any = None,
) -> dict[str, dict[str, Any]]:
    """Train the trunk, then each budget's cooldown, of the grid point ``params`` (its config ``cfg``, at ×1), in the
    point's folder, logged to ``log`` (a :class:`training.tensorboard.LogPlace`; None: the study's root); return each
    budget's ``metrics.json`` by budget name (``x1``, ``x4``, ...)."""
    from training.tensorboard import LogPlace

    log = log or LogPlace(root=(study.parent or study).root)
    return train_curve(cfg, point_folder(study, params), study.budgets, hparams, callbacks, log)


def train_curve(
    cfg: DictConfig,
    folder: Path,
    factors: Sequence[float],
    hparams: Optional[dict[str, Any]] = None,
    callbacks: Sequence[L.Callback] = (),
    log: Any = None,
) -> dict[str, dict[str, Any]]:
    """The trunk of config ``cfg`` (at ×1) in ``folder/trunk``, then each budget's cooldown in
    ``folder/cooldown_x<F>``, each resuming its folder where it exists; each budget's ``metrics.json`` by budget name.
    ``log``: the TensorBoard log directory the runs belong to (a :class:`training.tensorboard.LogPlace`)."""
    from training.tensorboard import BUDGET, LogPlace
    from training.train import train  # heavy import, only where runs train

    trunk, cooldowns = curve_configs(cfg, folder, factors)
    check_extendable(folder, [point for point, _ in cooldowns])
    log = log or LogPlace(root=folder)
    keep = KeepCheckpoints(folder / TRUNK, [point.branch for point, _ in cooldowns])
    hparams = hparams or {}
    train(trunk, callbacks=[*callbacks, keep], hparams={**hparams, BUDGET: TRUNK}, log=log)
    out = {}
    for point, cooldown in cooldowns:
        name = budgets.name(point.factor)
        out[name] = train(cooldown, callbacks=list(callbacks), hparams={**hparams, BUDGET: name}, log=log)
    return out


def extend(study: Study, ostudy: optuna.Study) -> list[int]:
    """Re-enqueue each counted finished trial of a curve study that lacks one of its listed budgets (a longer list
    than it ran with): its copy continues the same folders, training only what is new. Returns their numbers."""
    if not study.budgets:
        return []
    trials = ostudy.get_trials(deepcopy=False)
    excluded = stored.excluded_numbers(trials)
    out = []
    for t in trials:
        if t.number not in excluded and stored.short_of(t, study.budgets):
            storage.requeue(ostudy, t)
            out.append(t.number)
    return out


def largest(points: dict[str, dict[str, Any]], factors: Sequence[float]) -> Optional[dict[str, Any]]:
    """The metrics of the largest listed budget (what a curve trial answers with)."""
    return points.get(budgets.name(max(factors))) if factors else None
