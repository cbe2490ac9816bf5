"""Validation scores kept per example and per target group, so that a report can resample validation sequences.

A validation batch's targets are scored one by one (cross-entropy ℓ_j, correctness c_j); each target j belongs
to its example e(j) and, optionally, to one group g(j) of the data module's ``target_groups`` (MLM: what BERT's
rule did to it: ``masked``, ``random`` or ``kept``). For example i and column m ∈ {all, group 1, …, group G}:

    loss_sum[i, m] = Σ_{j: e(j)=i, j ∈ m} ℓ_j      correct[i, m] = Σ c_j      count[i, m] = |{j: e(j)=i, j ∈ m}|

The token-weighted means (``val/loss``, ``val/masked_loss``, …) are Σ_i loss_sum / Σ_i count, the same
numbers a mean over all targets gives; the per-example rows, in the order of the examples' index in the
validation set, are what ``metrics.json`` keeps as ``validation_examples``. Rows are concatenated across DDP ranks
(torchmetrics' "cat" reduction), so every rank computes the whole validation set's scores.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

SCORES = ("loss", "accuracy", "count")  # the three sums kept per example and column


class PerExampleSums(Metric):
    """Per validation example: Σ loss, Σ correct and the target count, overall and per group (module docstring).

    ``update(index (B,), sums (B, 3, 1 + G))``; ``compute()`` → (index (n,), sums (n, 3, 1 + G)), by index."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.add_state("sums", default=[], dist_reduce_fx="cat")

    def update(self, index: Tensor, sums: Tensor) -> None:
        self.index.append(index)
        self.sums.append(sums)

    def compute(self) -> tuple[Tensor, Tensor]:
        index, sums = dim_zero_cat(self.index), dim_zero_cat(self.sums)
        order = index.argsort()
        return index[order], sums[order]


def example_sums(
    losses: Tensor, correct: Tensor, example: Tensor, group: Optional[Tensor], n_examples: int, n_groups: int
) -> Tensor:
    """Per-example sums of one batch: losses, correct (N,) of its N targets, ``example`` (N,) their row in the
    batch, ``group`` (N,) their group in [0, G) (None: no groups) → (B = n_examples, 3, 1 + G) float64."""
    member = torch.ones(len(losses), 1 + n_groups, dtype=torch.float64, device=losses.device)  # (N, 1 + G)
    if n_groups:
        member[:, 1:] = F.one_hot(group, n_groups).double()
    scores = torch.stack([losses.double(), correct.double(), torch.ones_like(losses, dtype=torch.float64)], 1)
    values = scores[:, :, None] * member[:, None, :]  # (N, 3, 1 + G)
    sums = torch.zeros(n_examples, len(SCORES), 1 + n_groups, dtype=torch.float64, device=losses.device)
    return sums.index_add_(0, example, values)


def column_names(groups: tuple[str, ...]) -> list[str]:
    """The metric prefix of each column: "" (every target), then "<group>_"."""
    return ["", *(f"{g}_" for g in groups)]
