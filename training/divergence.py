"""The one rule for divergence, for a plain run and a sweep's trial alike: a run whose training loss becomes NaN or
infinite stops at that step and never saves a non-finite checkpoint.

:class:`DivergenceGuard` is installed by :func:`training.train.train` in every run. It raises
:class:`foundation.errors.Diverged` (the step, the loss, the learning rate of that step); ``train`` then records
``diverged`` in ``metrics.json`` (:func:`diverged_metrics`) and lets the error go on: the ``train`` command prints one
``error:`` line and exits 3 (``EXIT_DIVERGED``), a sweep counts the trial as failed with that line as its reason. A
resume of a diverged run is refused (``training/runfiles.py``): it would only diverge again.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import lightning as L
import torch
import torch.distributed as dist

from foundation.errors import Diverged


def _lr(trainer: L.Trainer) -> Optional[float]:
    """The learning rate of the step about to run (the first parameter group's; a host value, no device read)."""
    optimizers = getattr(trainer, "optimizers", None) or []
    groups = getattr(optimizers[0], "param_groups", None) if optimizers else None
    return float(groups[0]["lr"]) if groups else None


class DivergenceGuard(L.Callback):
    """Stops a run at the first non-finite training loss (cheaper and narrower than ``detect_anomaly``).

    Every step records, on the device, the first step whose loss was not finite and that loss, without a host
    synchronisation. The host reads the record after every step on the CPU (where reading costs nothing, so the run
    stops at that very step), every ``every`` steps on an accelerator (default: the trainer's ``log_every_n_steps``),
    before each validation, before each checkpoint (:meth:`check_before_saving`, which also checks the weights) and at
    the end of training: a diverged run never reaches a checkpoint, and stops naming the step where it diverged."""

    def __init__(self, every: Optional[int] = None) -> None:
        self.every = every
        self._first: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (step or -1, loss there)
        self._lrs: dict[int, Optional[float]] = {}  # learning rate of each step since the last read
        self._last: Optional[torch.Tensor] = None  # the latest step's loss (on the device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._lrs[trainer.global_step + 1] = _lr(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        loss = loss.detach().float()
        self._last = loss
        if self._first is None:
            self._first = (torch.full((), -1, device=loss.device), torch.zeros((), device=loss.device))
        step, value = self._first
        new = (step < 0) & ~torch.isfinite(loss).all()
        self._first = (torch.where(new, trainer.global_step, step), torch.where(new, loss.sum(), value))
        every = self.every or (1 if loss.device.type == "cpu" else max(1, trainer.log_every_n_steps))
        if trainer.global_step % every == 0:
            self._check()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._check()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check()

    def check_before_saving(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Raise :class:`Diverged` when the loss diverged, or the weights are not all finite (a finite loss whose
        update overflowed): a checkpoint is never saved with either. One device read per checkpoint."""
        self._check()
        finite = torch.stack([torch.isfinite(p.detach()).all() for p in pl_module.parameters()]).all()
        if not bool(finite):
            step, lr = trainer.global_step, self._lrs.get(trainer.global_step)
            loss = float(self._last.sum()) if self._last is not None else None
            raise Diverged(f"diverged: the weights became non-finite at step {step}{_at(loss, lr)}", step, loss, lr)

    def _check(self) -> None:
        if self._first is None:
            return
        step_t, loss_t = _agreed(*self._first)
        step = int(step_t)  # the one host read
        if step < 0:  # the learning rates of the steps read are no longer needed (the latest's may be)
            latest = max(self._lrs, default=None)
            self._lrs = {latest: self._lrs[latest]} if latest is not None else {}
            return
        loss, lr = float(loss_t), self._lrs.get(step)
        raise Diverged(f"diverged: train/loss={loss:.4g} at step {step}{_at(None, lr)}", step, loss, lr)


def _agreed(step: torch.Tensor, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Under DDP, the first step at which any rank's loss was not finite, and that rank's loss (every rank checks at
    the same steps, so every rank stops together; a rank that stopped alone would leave the others waiting in a
    collective); else this process's own record. Two all-reduces, only where there are several ranks."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return step, loss
    never = torch.iinfo(torch.int64).max
    first = torch.where(step >= 0, step, never).to(torch.int64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    mine = (step >= 0) & (step == first)
    found = torch.stack([torch.where(mine, loss, torch.zeros_like(loss)), mine.to(loss.dtype)])
    dist.all_reduce(found, op=dist.ReduceOp.SUM)
    agreed = torch.where(first == never, torch.full_like(first, -1), first)
    return agreed, found[0] / found[1].clamp(min=1)


def _at(loss: Optional[float], lr: Optional[float]) -> str:
    """`` (train/loss=…, learning rate … at that step)``, of what is known."""
    known = [
        *([f"train/loss={loss:.4g}"] if loss is not None else []),
        *([f"learning rate {lr:.4g}"] if lr is not None else []),
    ]
    return f" ({', '.join(known)} at that step)" if known else ""


def diverged_metrics(err: Diverged, kept_step: Optional[int]) -> dict[str, Any]:
    """What ``metrics.json`` records of a diverged run: ``diverged`` (step, loss, learning rate), the step it stopped
    at (``global_step``) and the step of the checkpoint it kept (``checkpoint_step``, None when it saved none)."""
    return {
        "diverged": {"step": err.step, "loss": err.loss, "lr": err.lr},
        "global_step": err.step,
        "checkpoint_step": kept_step,
    }


def stopped_line(err: Diverged, run_dir: Any, kept_step: Optional[int], optim_lr: float) -> str:
    """The one line a diverged run ends with: what diverged, where, what was kept and what to do."""
    kept = f"its last finite checkpoint (step {kept_step}) kept" if kept_step is not None else "no checkpoint saved"
    return (
        f"{err}, optim.lr={optim_lr:g}; {run_dir}: stopped there, {kept}; start a new run with a smaller optim.lr "
        "(or more warm-up, or gradient clipping)"
    )


@contextlib.contextmanager
def recorded(
    run_dir: Any, kept_step: Callable[[], Optional[int]], optim_lr: float, record: Callable[[dict[str, Any]], None]
) -> Iterator[None]:
    """Around ``fit``: a divergence is recorded (``record``: the :func:`diverged_metrics` of it, with the step of the
    last checkpoint, ``kept_step()``) and raised again as the one line the run ends with (:func:`stopped_line`)."""
    try:
        yield
    except Diverged as err:
        kept = kept_step()
        record(diverged_metrics(err, kept))
        raise Diverged(stopped_line(err, run_dir, kept, optim_lr), err.step, err.loss, err.lr) from None
