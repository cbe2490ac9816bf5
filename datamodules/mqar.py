"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): the standard probe of what
sub-quadratic attention loses.

One sequence (N = ``n_pairs``, Q = ``n_queries``), 2N + Q tokens::

    position   0    1    2    3   …  2N-2  2N-1   2N   …  2N+Q-1
    input      k_1  v_1  k_2  v_2 …  k_N   v_N    q_1  …  q_Q
    label      -100 …                              v(q_1) … v(q_Q)

Keys k_i are N distinct ids of the key range, values v_i are drawn uniformly with replacement from the
value range, and the queries q_j are Q distinct keys of the same sequence in random order. The label
at a query's own position is the value paired with that key (-100 everywhere else), so the loss is the
cross-entropy on the queried values only. No answer ever appears in the input after its query: the same
sequences train bidirectional and causal attention. Solving it needs exact retrieval of one of N
positions, which a Linformer whose k is far below N cannot do.

Every sequence of a run has the same length 2N + Q ≤ ``model.max_len`` = n (the model's n, which sizes E/F
and w = ⌈n/k⌉ whatever N is): no sequence is padded, so batches carry no attention mask and every kind takes
its path without padding. Padding them up to n would change no output on a real token (every kind's mask
contract, tests/lightning_modules/attention/test_contract.py; the loss and its gradient,
tests/datamodules/test_mqar.py) and only cost: at N = 4 of n = 24,
half of every step.

Vocabulary: [PAD]=0 (never in a sequence), keys 1 … K, values K+1 … K+V with K = ``vocab_size // 2``,
V = ``vocab_size - K``.

Trivial baseline: a model that ignores the context can only predict the targets' marginal, uniform over
the V values: loss log V, accuracy 1/V. (A model that copies *some* value of the context without binding
it to its key is at best near log N and 1/N: leaving that level is what shows recall.)

The training set (``n_train`` sequences) is drawn from the run's seed, so arms compared at one seed see
the same data; the validation set (``n_val``) is drawn from a fixed seed, the same for every run. Validation
batches carry each example's index in it (``example_index``), the order of ``metrics.json``'s per-example sums.
"""

from __future__ import annotations

import math
from typing import Optional

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from datamodules.sampling import loader_options, make_loader

IGNORE_INDEX = -100
VAL_SEED = 4321  # fixed on purpose: one validation set for every run and seed


def vocabulary(vocab_size: int) -> tuple[range, range]:
    """(key ids, value ids) for ``data.mqar.vocab_size`` (see the module docstring)."""
    n_keys = vocab_size // 2
    return range(1, 1 + n_keys), range(1 + n_keys, 1 + vocab_size)


def generate(
    n_examples: int, n_pairs: int, n_queries: int, vocab_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``n_examples`` MQAR sequences: (inputs, labels), both long (n_examples, 2·n_pairs + n_queries)."""
    keys, values = vocabulary(vocab_size)
    b, n, q = n_examples, n_pairs, n_queries
    key_ids = torch.rand(b, len(keys), generator=generator).argsort(-1)[:, :n] + keys.start  # (B, N) distinct
    value_ids = torch.randint(values.start, values.stop, (b, n), generator=generator)  # (B, N)
    queried = torch.rand(b, n, generator=generator).argsort(-1)[:, :q]  # (B, Q) pair index
    inputs = torch.empty((b, 2 * n + q), dtype=torch.long)
    labels = torch.full((b, 2 * n + q), IGNORE_INDEX, dtype=torch.long)
    inputs[:, 0 : 2 * n : 2], inputs[:, 1 : 2 * n : 2] = key_ids, value_ids
    inputs[:, 2 * n : 2 * n + q] = key_ids.gather(1, queried)
    labels[:, 2 * n : 2 * n + q] = value_ids.gather(1, queried)
    return inputs, labels


class MQARDataModule(L.LightningDataModule):
    """MQAR sequences as ``{input_ids, labels, attention_mask}`` batches.

    ``data_cfg`` is ``RunConfig.data`` (``data.mqar`` plus ``batch_size`` and ``num_workers``);
    ``max_len`` the model's n, which bounds 2·n_pairs + n_queries (checked with the config, not used here);
    ``seed`` draws the training set and its shuffle.
    """

    def __init__(self, data_cfg, max_len: int, seed: int = 0):
        super().__init__()
        self.data_cfg, self.cfg, self.seed = data_cfg, data_cfg.mqar, seed
        self.n_queries = self.cfg.n_pairs if self.cfg.n_queries is None else self.cfg.n_queries
        self.train_set: Optional[TensorDataset] = None
        self.val_set: Optional[TensorDataset] = None

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is None:
            self.train_set = self._draw(self.cfg.n_train, self.seed)
            inputs, labels = self._draw(self.cfg.n_val, VAL_SEED).tensors
            self.val_set = TensorDataset(inputs, labels, torch.arange(len(inputs)))  # + each example's index

    @property
    def vocab_size(self) -> int:
        return 1 + self.cfg.vocab_size  # [PAD] + keys + values

    def trivial_baseline(self) -> dict[str, float]:
        """Loss and accuracy of the best context-free predictor: uniform over the V values."""
        n_values = len(vocabulary(self.cfg.vocab_size)[1])
        return {"trivial_loss": math.log(n_values), "trivial_accuracy": 1.0 / n_values}

    def baselines(self) -> dict[str, float]:
        """``unigram/loss`` and ``unigram/accuracy``: the context-free predictor (:meth:`trivial_baseline`)."""
        return {f"unigram/{key.removeprefix('trivial_')}": value for key, value in self.trivial_baseline().items()}

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, seed=None)

    def _draw(self, n_examples: int, seed: int) -> TensorDataset:
        inputs, labels = generate(
            n_examples,
            self.cfg.n_pairs,
            self.n_queries,
            self.cfg.vocab_size,
            torch.Generator().manual_seed(seed),
        )
        return TensorDataset(inputs, labels)

    def _loader(self, dataset: Optional[TensorDataset], seed: Optional[int]) -> DataLoader:
        """Training order resumable mid-epoch, validation sharded over DDP ranks (``datamodules/sampling.py``)."""
        if dataset is None:
            raise RuntimeError("MQARDataModule.setup() has not run yet")
        return make_loader(dataset, self.trainer, seed, collate_fn=collate, **loader_options(self.data_cfg))


def collate(items: list[tuple[Tensor, ...]]) -> dict:
    """(input_ids, labels[, example_index]) items → a batch (validation items carry their index in the set).

    No sequence is padded (module docstring): ``attention_mask`` is None, as the mask contract of the attention
    kinds asks (lightning_modules/attention/base.py)."""
    inputs, labels, *index = (torch.stack(column) for column in zip(*items))
    batch = {"input_ids": inputs, "labels": labels, "attention_mask": None}
    return {**batch, "example_index": index[0]} if index else batch
