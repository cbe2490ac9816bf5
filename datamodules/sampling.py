"""Data order that survives a kill and spreads over DDP ranks.

Training epoch ``e`` visits ``randperm(n)`` drawn from ``seed + e`` (``DistributedSampler``'s recipe); rank ``r`` of
``w`` takes every ``w``-th index from ``r`` on, and the ``n mod w`` indices that do not divide evenly are left out
of that epoch so that all ranks take the same number of steps (DDP synchronises every training step).
Validation shards the set the same way without repeating or dropping anything, so the metrics averaged over
ranks are those of the whole validation set (ranks then differ by at most one batch, which is safe there:
DDP synchronises buffers only on the first evaluation forward).

Both are ``DistributedSampler`` subclasses, which Lightning keeps as they are (it replaces any other sampler
with its own under DDP); with one process they are a seeded shuffle and a sequential pass.

Randomness of a training batch (MLM masks) is drawn in this process from :func:`batch_generator`, a function
of (seed, epoch, rank, batch index) alone, after the loader's workers have collated the batch: neither torch's
global RNG nor a worker's (which restarts from its base seed whenever workers are started, e.g. on resume) is
involved, so a resumed run draws the masks the uninterrupted one drew, whatever ``num_workers``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, DistributedSampler


def ranks(trainer: Optional[Any]) -> dict[str, int]:
    """``num_replicas`` and ``rank`` of this process (one process when no trainer is attached)."""
    if trainer is None:
        return {"num_replicas": 1, "rank": 0}
    return {"num_replicas": trainer.world_size, "rank": trainer.global_rank}


class EpochShuffle(DistributedSampler):
    """This rank's share of epoch ``epoch``'s permutation, from its ``start``-th index on."""

    def __init__(self, dataset, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)


def validation_shards(dataset, num_replicas: int = 1, rank: int = 0) -> UnrepeatedDistributedSampler:
    """Indices ``rank, rank + w, ...`` of the whole set, nothing repeated."""
    return UnrepeatedDistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)


def batch_generator(seed: int, epoch: int, rank: int, index: int) -> torch.Generator:
    """The generator of training batch ``index`` (0-based, within the epoch) of epoch ``epoch`` on DDP rank
    ``rank``: seeded from those four numbers only (NumPy's ``SeedSequence`` mixes them into 64 bits), so
    every batch, on every rank, draws its own stream, the same in a resumed run as in an uninterrupted one."""
    words = np.random.SeedSequence([seed % 2**64, epoch, rank, index]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))


class ResumableLoader(DataLoader):
    """A training loader whose position Lightning checkpoints.

    Lightning stores ``state_dict()`` of a training loader that has one in every checkpoint and passes it to
    ``load_state_dict`` before iterating on resume. The state is (epoch, batches already handed out in it);
    the resumed iterator starts the sampler after those batches, so no batch is drawn twice or skipped and
    nothing is drawn for the skipped ones. ``sampler`` must be an :class:`EpochShuffle`. ``draw(batch,
    generator)``, if given, turns each collated batch into the one handed out, with its randomness drawn from
    ``generator`` = :func:`batch_generator` of the batch (in this process, in batch order).
    """

    def __init__(
        self,
        dataset,
        sampler: EpochShuffle,
        draw: Optional[Callable[[Any, torch.Generator], Any]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.draw = draw
        self.taken = 0  # batches handed out in the current epoch
        self._resume_at: Optional[tuple[int, int]] = None  # (epoch, batches) from a checkpoint

    def __iter__(self) -> Iterator[Any]:
        # A generator: the body runs at the first batch, after Lightning's set_epoch for this epoch.
        epoch = self.sampler.epoch
        skip = self._resume_at[1] if self._resume_at is not None and self._resume_at[0] == epoch else 0
        self._resume_at = None
        self.sampler.start, self.taken = skip * self.batch_size, skip
        for batch in super().__iter__():
            if self.draw is not None:
                batch = self.draw(batch, batch_generator(self.sampler.seed, epoch, self.sampler.rank, self.taken))
            self.taken += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = (int(state["epoch"]), int(state["batches"]))


def loader_options(data: Any) -> dict:
    """What every data module's loaders take from its ``data`` config: the batch size and the worker processes
    (kept alive between epochs when there are any)."""
    return {"batch_size": data.batch_size, "num_workers": data.num_workers, "persistent_workers": data.num_workers > 0}


def make_loader(
    dataset,
    trainer: Optional[Any],
    seed: Optional[int],
    draw: Optional[Callable[[Any, torch.Generator], Any]] = None,
    **kwargs: Any,
) -> DataLoader:
    """A training loader when ``seed`` is given (:class:`EpochShuffle` order, resumable, ``draw`` applied to each
    batch; its own generator seeds workers, so creating it draws nothing from the global RNG), else an evaluation
    loader (:func:`validation_shards`). ``trainer``: the datamodule's (None outside one); ``kwargs`` go to the
    loader."""
    if seed is None:
        return DataLoader(dataset, sampler=validation_shards(dataset, **ranks(trainer)), **kwargs)
    return ResumableLoader(
        dataset,
        EpochShuffle(dataset, seed, **ranks(trainer)),
        draw=draw,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
