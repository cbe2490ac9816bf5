"""Packed-text data modules for masked (MLM) and causal (CLM) language-model pretraining.

Every document of a split is tokenized (no special tokens), followed by [SEP], and all of them are
concatenated in corpus order and cut into blocks of exactly ``max_len`` tokens; the incomplete last block
is dropped, so no batch needs padding. Blocks are cached as ``<cache_dir>/blocks/<key>.npy`` (int32) with
key = hash(tokenizer JSON, fingerprint of the split's texts, max_len, split): a second run only loads the
corpus from the ``datasets`` cache, checks fingerprints and reads the arrays.

Lightning contract: ``prepare_data`` (one process per node) builds the caches and keeps no state;
``setup`` (every process) loads them, building whatever is missing, and is idempotent.

Batches are dicts of ``input_ids`` (long, B x T), ``labels`` (long, B x T, -100 where nothing is
predicted) and ``attention_mask`` None (validation batches also carry ``example_index`` (B,), each block's place in
the validation set, and for MLM ``target_group`` (B x T): what BERT's rule did to each target, an index into
``target_groups``): a packed block has no padding, and None is the attention's "no
padding" (base.py's mask contract), which lets full attention call SDPA without a mask (its flash kernel on
CUDA; ``is_causal`` instead of a (B, 1, T, T) mask for CLM). Known here by construction, it costs no check; a
check in the LightningModule would read a device tensor back to the host every batch. Subclasses differ only in
:meth:`PackedTextDataModule.make_inputs_labels`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, TensorDataset

from datamodules.cache import NPY_HEADER, cache_key, fingerprint, write_cache
from datamodules.corpus import iter_texts, load_text_corpus
from datamodules.sampling import loader_options, make_loader
from datamodules.tokenizer import MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID, build_tokenizer
from foundation.checked import read_cache
from foundation.errors import ConfigError

IGNORE_INDEX = -100
VAL_MASK_SEED = 1234  # fixed on purpose: the same validation masks for every run, seed and epoch
_ENCODE_BATCH = 1000
_BASELINE_CHUNK = 4096  # training blocks per pass when counting targets (bounds memory)


class PackedTextDataModule(L.LightningDataModule):
    """Shared corpus -> tokenizer -> packed blocks pipeline and data loaders.

    ``data_cfg`` is ``RunConfig.data``; ``max_len`` the block length (``model.max_len``); ``seed`` seeds
    the training shuffle (epoch e: seed + e; ``datamodules/sampling.py``), so compared runs see batches in
    the same order whatever else uses the RNG, and a resumed run continues that order mid-epoch.

    The validation set is ``data.max_val_blocks`` blocks evenly spaced through the validation split (all of
    them when null), masked once with a fixed generator: the same examples, in the same order, with the same
    masks, for every seed and every model of a data config.
    """

    pad_id = PAD_ID
    mask_id = MASK_ID
    target_groups: tuple[str, ...] = ()  # names of the values of a validation batch's ``target_group``

    def __init__(self, data_cfg, max_len: int, seed: int = 0):
        super().__init__()
        self.data_cfg, self.max_len, self.seed = data_cfg, max_len, seed
        self.tokenizer: Optional[Tokenizer] = None
        self.train_blocks: Optional[torch.Tensor] = None
        self.val_set: Optional[TensorDataset] = None
        self._val_columns: tuple[str, ...] = ()  # the batch key of each tensor of val_set
        self._baselines: Optional[dict[str, float]] = None

    # ----------------------------------------------------------------------------- subclass hook
    def make_inputs_labels(self, ids: torch.Tensor, generator: Optional[torch.Generator]):
        """(input_ids, labels, target_group or None) for a long (B, T) batch of blocks; ``generator`` None =
        torch's global RNG."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------- Lightning hooks
    def prepare_data(self) -> None:
        self._load()

    def setup(self, stage: Optional[str] = None) -> None:
        if self.tokenizer is not None:
            return
        tokenizer, train, val = self._load()
        self.tokenizer = tokenizer
        self.train_blocks = torch.from_numpy(train)
        val_ids = torch.from_numpy(spread(val, self.data_cfg.max_val_blocks)).long()
        inputs, labels, groups = self.make_inputs_labels(val_ids, torch.Generator().manual_seed(VAL_MASK_SEED))
        columns = {"input_ids": inputs, "labels": labels, "example_index": torch.arange(len(val_ids))}
        if groups is not None:
            columns["target_group"] = groups
        self._val_columns = tuple(columns)
        self.val_set = TensorDataset(*columns.values())

    def train_dataloader(self) -> DataLoader:
        # Workers only stack blocks; the masks are drawn per batch from (seed, epoch, rank, batch index), in
        # this process (datamodules/sampling.py): a resumed run draws the uninterrupted run's masks.
        return self._loader(self.train_blocks, _stack, seed=self.seed, draw=self._train_batch)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self._val_batch, seed=None)

    # ----------------------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return self._ready().get_vocab_size()

    def trivial_baseline(self) -> dict[str, float]:
        """Loss and accuracy of the best context-free predictor: the validation targets scored under the
        unigram distribution of the training targets (see :func:`unigram_baseline`)."""
        unigram = self.baselines()
        return {"trivial_loss": unigram["unigram/loss"], "trivial_accuracy": unigram["unigram/accuracy"]}

    def baselines(self) -> dict[str, float]:
        """``unigram/<metric>``: the unigram predictor of :meth:`trivial_baseline` on the validation targets the
        model is scored on, every target (``unigram/loss``, ``unigram/accuracy``) and each target group's
        (``unigram/masked_loss``, …): the level a model that ignores its context reaches."""
        if self._baselines is None:
            self._baselines = self._unigram_scores()
        return self._baselines

    def _unigram_scores(self) -> dict[str, float]:
        self._ready()
        counts = torch.zeros(self.vocab_size, dtype=torch.long)
        generator = torch.Generator().manual_seed(VAL_MASK_SEED)
        for chunk in self.train_blocks.split(_BASELINE_CHUNK):
            labels = self.make_inputs_labels(chunk.long(), generator)[1]
            counts += torch.bincount(labels[labels != IGNORE_INDEX], minlength=self.vocab_size)
        columns = dict(zip(self._val_columns, self.val_set.tensors))
        labels, target = columns["labels"], columns["labels"] != IGNORE_INDEX
        chosen = {"": target}
        for g, name in enumerate(self.target_groups):
            chosen[f"{name}_"] = target & (columns["target_group"] == g)
        return {
            f"unigram/{prefix}{metric.removeprefix('trivial_')}": value
            for prefix, where in chosen.items()
            if where.any()
            for metric, value in unigram_baseline(counts, labels[where]).items()
        }

    @property
    def num_train_blocks(self) -> int:
        self._ready()
        return len(self.train_blocks)

    # ----------------------------------------------------------------------------- internals
    def _ready(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run yet")
        return self.tokenizer

    def _load(self) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
        corpus = load_text_corpus(self.data_cfg)
        train_texts = list(iter_texts(corpus["train"]))
        tokenizer = build_tokenizer(self.data_cfg.tokenizer, train_texts, self.data_cfg.cache_dir)
        train = self._blocks(tokenizer, train_texts, "train")
        val = self._blocks(tokenizer, list(iter_texts(corpus["validation"])), "validation")
        return tokenizer, train, val

    def _blocks(self, tokenizer: Tokenizer, texts: list[str], split: str) -> np.ndarray:
        key = cache_key(tokenizer.to_str(), fingerprint(texts), self.max_len, split)
        path = Path(self.data_cfg.cache_dir) / "blocks" / f"{key}.npy"
        cached = read_cache(path, np.load)
        if cached is not None:
            return cached
        blocks = pack(encode_documents(tokenizer, texts), self.max_len)
        if len(blocks) == 0:
            raise ConfigError(
                f"data.source: the {split} split of {self.data_cfg.source!r} is shorter than one "
                f"block of model.max_len={self.max_len} tokens"
            )
        write_cache(self.data_cfg.cache_dir, path, lambda f: np.save(f, blocks), blocks.nbytes + NPY_HEADER)
        return blocks

    def _loader(self, dataset, collate_fn, seed: Optional[int], draw=None) -> DataLoader:
        return make_loader(dataset, self.trainer, seed, draw, collate_fn=collate_fn, **loader_options(self.data_cfg))

    def _train_batch(self, ids: torch.Tensor, generator: torch.Generator) -> dict:
        return _as_batch(*self.make_inputs_labels(ids, generator)[:2])

    def _val_batch(self, items: list[tuple[torch.Tensor, ...]]) -> dict:
        columns = {name: torch.stack(column) for name, column in zip(self._val_columns, zip(*items))}
        return {**columns, "attention_mask": None}  # packed: no padding


class MLMDataModule(PackedTextDataModule):
    """BERT-style dynamic masking: each training batch draws new masks from its own generator, seeded from
    (seed, epoch, rank, batch index) (``datamodules/sampling.py``: a resumed run, with or without loader
    workers, draws the same masks as an uninterrupted one); validation masks are drawn once, in ``setup``, with
    a fixed generator. Each target's group is BERT's action on it: ``masked`` (80 %: the input is [MASK]),
    ``random`` (10 %: a random token), ``kept`` (10 %: the input is the target itself)."""

    target_groups = ("masked", "random", "kept")

    def make_inputs_labels(self, ids, generator):
        selected = (torch.rand(ids.shape, generator=generator) < self.data_cfg.mask_prob) & (ids >= NUM_SPECIAL)
        action = torch.rand(ids.shape, generator=generator)  # < 0.8: [MASK], < 0.9: random token, else keep
        random_ids = torch.randint(NUM_SPECIAL, self.vocab_size, ids.shape, generator=generator)
        group = (action >= 0.8).long() + (action >= 0.9).long()  # 0 masked, 1 random, 2 kept
        inputs = torch.where(selected & (group == 0), MASK_ID, ids)
        inputs = torch.where(selected & (group == 1), random_ids, inputs)
        return inputs, torch.where(selected, ids, IGNORE_INDEX), torch.where(selected, group, -1)


class CausalLMDataModule(PackedTextDataModule):
    """Next-token prediction: labels[t] = input_ids[t + 1]; the last position predicts nothing."""

    def make_inputs_labels(self, ids, generator):
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:, :-1] = ids[:, 1:]
        return ids, labels, None


def unigram_baseline(train_counts: torch.Tensor, val_targets: torch.Tensor) -> dict[str, float]:
    """Cross-entropy and accuracy of a model that ignores its input and always predicts p(v) ∝ c_v + 1
    (the training targets' counts ``train_counts`` (V,), add-one smoothed so that every id has mass):

        trivial_loss = -mean_j log p(y_j)        trivial_accuracy = mean_j [y_j = argmax_v c_v]

    over the validation targets ``val_targets`` (M,)."""
    log_p = torch.log((train_counts.double() + 1) / (train_counts.sum() + len(train_counts)))
    return {
        "trivial_loss": float(-log_p[val_targets].mean()),
        "trivial_accuracy": float((val_targets == train_counts.argmax()).double().mean()),
    }


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """Token ids of all ``texts`` in order, each document followed by [SEP], as one int32 array."""
    ids: list[int] = []
    for start in range(0, len(texts), _ENCODE_BATCH):
        for encoding in tokenizer.encode_batch_fast(texts[start : start + _ENCODE_BATCH], add_special_tokens=False):
            ids.extend(encoding.ids)
            ids.append(SEP_ID)
    return np.asarray(ids, dtype=np.int32)


def spread(blocks: np.ndarray, count: Optional[int]) -> np.ndarray:
    """``count`` rows of ``blocks`` evenly spaced through it, in order (all of them when ``count`` is None or
    not smaller): row ⌊i·n/count⌋ for i < count, so the set samples the whole split, not its beginning."""
    if count is None or count >= len(blocks):
        return blocks
    return blocks[(np.arange(count) * len(blocks)) // count]


def pack(ids: np.ndarray, max_len: int) -> np.ndarray:
    """Cut a 1-D token stream into (n, max_len) blocks, dropping the incomplete tail."""
    n = len(ids) // max_len
    return ids[: n * max_len].reshape(n, max_len)


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:
    """Collate training blocks: (B, T) long."""
    return torch.stack(rows).long()


def _as_batch(inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    return {"input_ids": inputs, "labels": labels, "attention_mask": None}  # packed: no padding
