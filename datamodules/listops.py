"""LRA ListOps (Tay et al. 2020, after Nangia & Bowman 2018): classify the value of a long nested expression.

An expression is an operator applied to 2 … ``max_args`` arguments, each a digit or (below
``max_depth`` levels) another expression::

    [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]   = 5

    MAX, MIN   the largest / smallest argument
    MED        the median: for an even count, the mean of the two middle values rounded down
    SM         the sum modulo 10 (LRA's SUM_MOD)

Its value is a digit, so the task has 10 classes. The answer depends on every token, including ones
thousands of positions apart: a long-range dependency task without any lexical shortcut.

Generation (a seeded re-implementation of LRA's recipe, not its code): the root is an operator; every
argument is an expression with probability 1/4 while the depth is below ``max_depth``, else a
uniform digit; operators are uniform, argument counts uniform in [2, max_args]. Expressions are drawn
until their length lies in [``min_length``, ``max_length``] tokens (LRA: 500–2,000, depth 10, 10 args).

Vocabulary (16 ids, its own): [PAD]=0, "]"=1, "[MAX"=2, "[MIN"=3, "[MED"=4, "[SM"=5, digits "0"… "9" =
6 … 15. A sequence is the expression's tokens, nothing else; batches are padded to their longest
sequence: ``input_ids`` (B, T), ``attention_mask`` (B, T), ``labels`` (B,) the value.

Each split has its own random stream: training from the run's seed (arms compared at one seed see the
same data), validation and test from fixed streams shared by all runs. Sets are cached as
``<cache_dir>/listops/<key>.npz``; drawing LRA's 96,000 training expressions takes minutes in Python.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np

from datamodules.cache import CODE_VERSION, NPY_HEADER, cache_key, write_cache
from datamodules.classification import EncodedSplit, LabelledSequenceDataModule
from foundation.checked import read_cache

VOCAB = ("[PAD]", "]", "[MAX", "[MIN", "[MED", "[SM", *map(str, range(10)))
PAD_ID, CLOSE_ID, OPERATOR_IDS, DIGIT_0 = 0, 1, range(2, 6), 6
NUM_CLASSES = 10
P_EXPRESSION = 0.25  # LRA's probability that an argument is an expression while the depth allows one


def _median(values: list[int]) -> int:
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2


APPLY = {2: max, 3: min, 4: _median, 5: lambda values: sum(values) % 10}


class _TooLong(Exception):
    """Raised as soon as an expression being drawn exceeds ``max_length`` tokens."""


def generate(n: int, cfg, rng: random.Random) -> tuple[list[np.ndarray], np.ndarray]:
    """``n`` expressions with ``cfg.min_length`` <= length <= ``cfg.max_length`` (``data.listops``), drawn
    from ``rng``: (token ids (uint8) per expression, values (n,))."""
    limits = _Limits(int(cfg.max_depth), int(cfg.max_args), int(cfg.max_length))  # plain ints: a hot loop
    sequences, values = [], []
    while len(sequences) < n:
        ids: list[int] = []
        try:
            value = _draw(rng, 1, limits, ids)
        except _TooLong:
            continue
        if len(ids) >= cfg.min_length:
            sequences.append(np.asarray(ids, dtype=np.uint8))
            values.append(value)
    return sequences, np.asarray(values, dtype=np.int64)


class _Limits(NamedTuple):
    max_depth: int
    max_args: int
    max_length: int


def _draw(rng: random.Random, depth: int, cfg: _Limits, ids: list[int]) -> int:
    """Append one argument at ``depth`` (1 = the root) to ``ids`` and return its value."""
    if len(ids) >= cfg.max_length:
        raise _TooLong
    if depth > 1 and (depth > cfg.max_depth or rng.random() >= P_EXPRESSION):
        digit = rng.randrange(10)
        ids.append(DIGIT_0 + digit)
        return digit
    op = rng.choice(OPERATOR_IDS)
    ids.append(op)
    values = [_draw(rng, depth + 1, cfg, ids) for _ in range(rng.randint(2, cfg.max_args))]
    if len(ids) >= cfg.max_length:
        raise _TooLong
    ids.append(CLOSE_ID)
    return APPLY[op](values)


def decode(ids) -> str:
    """The expression as LRA writes it, tokens separated by spaces (padding dropped)."""
    return " ".join(VOCAB[i] for i in ids if i != PAD_ID)


class ListOpsDataModule(LabelledSequenceDataModule):
    """ListOps batches ``{input_ids, attention_mask, labels}``; ``data_cfg.listops`` sets sizes and shapes.

    ``max_len`` is ``model.max_len`` (at least ``listops.max_length``, checked by the config); ``seed``
    draws the training set and its shuffle.
    """

    vocab_size = len(VOCAB)
    num_labels = NUM_CLASSES

    def __init__(self, data_cfg, max_len: int, seed: int = 0):
        super().__init__(data_cfg, seed)
        self.cfg, self.max_len = data_cfg.listops, max_len

    def _streams(self) -> dict[str, tuple[int, str]]:
        """{split: (size, name of its random stream)}."""
        return {
            "train": (self.cfg.n_train, f"listops/train/{self.seed}"),
            "validation": (self.cfg.n_val, "listops/validation"),
            "test": (self.cfg.n_test, "listops/test"),
        }

    def prepare_data(self) -> None:
        for n, stream in self._streams().values():
            self._load(n, stream)

    def setup(self, stage: Optional[str] = None) -> None:
        if not self.datasets:
            self.datasets = {
                split: EncodedSplit(*self._load(n, stream)) for split, (n, stream) in self._streams().items()
            }

    def _load(self, n: int, stream: str) -> tuple[list[np.ndarray], np.ndarray]:
        c = self.cfg
        key = cache_key(stream, n, c.min_length, c.max_length, c.max_depth, c.max_args, CODE_VERSION)
        path = Path(self.data_cfg.cache_dir) / "listops" / f"{key}.npz"
        cached = read_cache(path, _read_encoded)
        if cached is not None:
            return cached
        sequences, labels = generate(n, c, random.Random(stream))
        ends = np.cumsum([len(s) for s in sequences])
        ids = np.concatenate(sequences)
        size = ids.nbytes + ends.nbytes + np.asarray(labels).nbytes + 3 * 2 * NPY_HEADER  # + zip and .npy headers
        write_cache(self.data_cfg.cache_dir, path, lambda f: np.savez(f, ids=ids, ends=ends, labels=labels), size)
        return sequences, labels


def _read_encoded(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    with np.load(path) as f:
        return np.split(f["ids"], f["ends"][:-1]), f["labels"]
