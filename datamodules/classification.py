"""Labelled texts and sentence pairs for sequence classification (``task: classify``).

Sources (``data.source``), all read through ``datasets.load_dataset``:

- ``imdb`` / ``rotten_tomatoes``: the embedded movie reviews (:mod:`datamodules.embedded`) in THE split of
  the project, the one MLM pretraining on ``data.source: embedded`` uses: it pretrains on "train" only, so
  no validation or test text of these tasks was seen in pretraining;
- a local file or glob (``.csv``, ``.tsv`` as GLUE ships it, ``.json``/``.jsonl``, ``.parquet``): one split,
  "train";
- a local directory with a file per split, one named ``train.<ext>``: the hub's split names (``train``,
  ``validation``, ``test``; MNLI ``validation_matched``, ``validation_mismatched``, ``test_matched``,
  ``test_mismatched``, as ``linformer-lab glue-download`` writes them) or GLUE's original TSV names (``dev``,
  ``dev_matched``, ``dev_mismatched``); each file is read on its own because GLUE's test files have other
  columns (no label). Any other data file there is refused in one line, never skipped;
- a directory written by ``DatasetDict.save_to_disk``;
- anything else goes to ``load_dataset(source, data.subset)``: a hub id (``nyu-mll/glue`` with subset
  ``sst2``/``qnli``/``qqp``, ``stanfordnlp/imdb``) or a local directory laid out like a hub repository. For GLUE
  offline, the one-line error says what to run once (``linformer-lab glue-download DIR``).

Columns: ``data.text_column``, optionally ``data.text_pair_column`` (sentence pairs) and
``data.label_column`` (``data.column_names`` names those of a header-less file). Local files are read as
written (:mod:`datamodules.files`: a sentence ``NA`` is that text). Texts are cleaned like the embedded reviews
(HTML breaks removed, whitespace squeezed); a missing or empty one is a one-line :class:`ConfigError` naming the
file and the row (:func:`row_at`). GLUE's columns: sst2 ``sentence``; qnli ``question`` + ``sentence``; qqp
``question1`` + ``question2``.

Splits. A test split is *labelled* unless it lacks the label column or all its labels are -1 (GLUE
hides its test labels that way). With u = the stable hash (:func:`~datamodules.cache.unit_hash`) of
the example's text (and pair) and f = ``data.val_fraction``:

=================================  ===========================  =================  ================
the source has                     train                        validation         test
=================================  ===========================  =================  ================
labelled test and validation       train                        validation         test
labelled test, no validation       train, u >= f                train, u < f       test
validation, no labelled test       train, u >= f                train, u < f       its validation
neither                            train, u >= 2f               train, u < f       train, f <= u < 2f
=================================  ===========================  =================  ================

so GLUE tasks report test accuracy on GLUE's validation ("dev") set and select checkpoints on a
hold-out of GLUE's train set. ``data.classify.test_splits`` ({name: split}, MNLI's ``{matched:
validation_matched, mismatched: validation_mismatched}``) names the test sets instead: each is scored apart
(``test/<name>/…``), each must be labelled, and validation is the source's ``validation`` or else the hold-out
of train (u < f). A labelled split that neither rule reads (MNLI's validation sets without ``test_splits``) is
refused in one line; unlabelled test splits are never scored. ``data.max_texts`` then keeps that many training
examples, evenly spaced.

Labels are class ids 0 … C-1, or with ``data.classify.regression`` numbers (floats too: STS-B's 0-5 scores;
C = 1). C is ``data.classify.num_labels`` if set, else the number of
``data.classify.label_names`` (which map a column of strings to ids in list order), else the number of
the label feature's class names (hub datasets), else 2. A missing label column, labels that are not
integers (or not among ``label_names``), missing labels, a label outside 0 … C-1 and an empty split are
one-line :class:`ConfigError`\\ s naming the key. A split whose ClassLabel names are train's (or ``label_names``) in
another order is renumbered to that order by name; one naming other classes is refused.

Encoding: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, cut to ``model.max_len`` tokens, always at the
end of a segment. A single text keeps its first m = max_len − 2 tokens. A pair shares m = max_len − 3
places: a keeps k_a = min(|a|, max(⌈m/2⌉, m − |b|)) tokens and b keeps min(|b|, m − k_a): each segment is
sure of half the places (a gets the odd one), and a segment shorter than its half stays whole and leaves
the rest to the other, so a short question survives next to a long passage. Batches are padded to their
longest sequence: ``input_ids`` (B, T) long, ``attention_mask`` (B, T) bool (True at real tokens),
``labels`` (B,) long.

Tokenizer: ``data.tokenizer.path`` if set; else, with ``init_from``, the pretraining run's
``tokenizer.json`` (``training.train`` writes it into every run directory), so token ids mean what
they meant in pretraining; else a new one for ``data.tokenizer`` (BPE trained on the training texts, or
the fixed byte vocabulary of ``kind: byte``: LRA's byte-level "Text" task).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Value, load_from_disk
from omegaconf import OmegaConf
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from datamodules.cache import hf_cache_room, rule_kwargs, unit_hash
from datamodules.corpus import cap_texts, load_hub
from datamodules.embedded import SOURCES as EMBEDDED_SOURCES
from datamodules.embedded import clean_text, load_embedded
from datamodules.files import FILE_BUILDERS, is_file_spec, load_local_files, local_files, locate
from datamodules.language_model import unigram_baseline
from datamodules.sampling import loader_options, make_loader
from datamodules.tokenizer import CLS_ID, PAD_ID, SEP_ID, build_tokenizer
from foundation.errors import ConfigError
from foundation.rundir import init_from_tokenizer

UNLABELLED = -1  # GLUE's label for its hidden test labels
# A folder's files by stem: the hub's split names, and GLUE's original TSV names (dev*.tsv) for the same splits.
HUB_SPLITS = ("train", "validation", "test", "validation_matched", "validation_mismatched", "test_matched",
              "test_mismatched")  # fmt: skip
SPLIT_FILES = {
    **{split: split for split in HUB_SPLITS},
    "dev": "validation",
    "dev_matched": "validation_matched",
    "dev_mismatched": "validation_mismatched",
}
GLUE_HUB_IDS = ("nyu-mll/glue", "glue")
GLUE_DOWNLOAD = "linformer-lab glue-download DIR"
_ENCODE_BATCH = 1000


# ------------------------------------------------------------------------------------- loading
@hf_cache_room
def load_labelled(data_cfg) -> DatasetDict:
    """The raw splits of ``data.source`` (see the module docstring), before any check."""
    source = data_cfg.source
    if source in EMBEDDED_SOURCES:
        return load_embedded(sources=source)
    if (Path(source).expanduser() / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk
        return load_from_disk(str(Path(source).expanduser()))
    split_files = _split_files(source)
    if split_files:
        return DatasetDict(
            {split: load_local_files(str(path), data_cfg)["train"] for split, path in split_files.items()}
        )
    if is_file_spec(source):
        return load_local_files(source, data_cfg)
    try:
        return load_hub(source, data_cfg.subset)
    except ConfigError as err:
        if source not in GLUE_HUB_IDS:
            raise
        raise ConfigError(
            f"{err}; to run offline, save GLUE once on a machine with internet (`{GLUE_DOWNLOAD}`) and set "
            f"data.source=DIR/{data_cfg.subset or '<task>'}"
        ) from None


def _split_files(source: str) -> dict[str, Path]:
    """``{split: file}`` for a directory holding ``train.<ext>``, else {}. Files are named by split: the hub's
    names (``validation_matched.jsonl``) or GLUE's original ones (``dev_matched.tsv``); another data file there
    is refused rather than skipped."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return {}
    found: dict[str, Path] = {}
    others = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix.lower() not in FILE_BUILDERS or path.suffix.lower() == ".txt":
            continue  # READMEs, sub-folders (GLUE's original/)
        split = SPLIT_FILES.get(path.stem)
        if split is None:
            others.append(path.name)
        elif split in found:
            raise ConfigError(
                f"data.source: {source!r} holds two files for split {split!r}: {found[split].name}, {path.name}"
            )
        else:
            found[split] = path
    if "train" not in found:
        return {}
    if others:
        raise ConfigError(
            f"data.source: {source!r} holds {', '.join(others)}, which names no split (a file per split, named "
            f"{', '.join(SPLIT_FILES)})"
        )
    return found


def row_at(data_cfg, split: str, row: int) -> str:
    """Where row ``row`` (0-based) of raw split ``split`` sits: ``row 3 of DIR/train.tsv`` for local files (a
    header not counted), ``row 3 of the train split of 'nyu-mll/glue'`` otherwise (the error path only)."""
    source = data_cfg.source
    if source not in EMBEDDED_SOURCES and not (Path(source).expanduser() / "dataset_dict.json").is_file():
        files = {s: [str(p)] for s, p in _split_files(source).items()}
        if not files and is_file_spec(source):
            files = {"train": local_files(source)}
        if split in files:
            path, line = locate(files[split], row, data_cfg)
            return f"row {line} of {path}"
    return f"row {row + 1} of the {split} split of {source!r}"


def eval_set_names(data_cfg) -> list[str]:
    """The prefixes of the run's test sets: ``test``, or ``test/<name>`` for each of ``data.classify.test_splits``."""
    splits = data_cfg.classify.test_splits
    return ["test"] if not splits else [f"test/{name}" for name in splits]


@hf_cache_room
def labelled_splits(raw: DatasetDict, data_cfg) -> tuple[DatasetDict, int]:
    """(splits "train", "validation" and the test sets of :func:`eval_set_names`, with columns text, [pair,] label;
    number of classes, 1 for a regression): columns read and checked, splits assigned by the table of the module
    docstring (or by ``data.classify.test_splits``), training set capped to ``data.max_texts``."""
    source = data_cfg.source
    if "train" not in raw:
        raise ConfigError(f"data.source: {source!r} has no 'train' split (splits: {', '.join(raw)})")
    names = _class_names(raw["train"], data_cfg)
    num_labels = 1 if data_cfg.classify.regression else _num_labels(names, data_cfg)
    clean = source not in EMBEDDED_SOURCES  # load_embedded cleans its texts already
    tests = _named_test_splits(raw, data_cfg)
    wanted = dict.fromkeys(["train", "validation", "test", *tests.values()])
    classes = list(data_cfg.classify.label_names or names or []) or None  # every split's ClassLabel matched to these
    read = {split: _read(raw[split], split, data_cfg, clean, classes) for split in wanted if split in raw}
    train, f = read["train"], data_cfg.val_fraction
    if tests:
        val = read.get("validation") if "validation" not in tests.values() else None
        if val is None:
            train, val = _hold_out(train, f, 1.0), _hold_out(train, 0.0, f)
        splits = DatasetDict(train=train, validation=val, **{key: read[split] for key, split in tests.items()})
    else:
        test = read.get("test")
        if test is not None and "label" in test.column_names:
            val = read.get("validation")
            if val is None:
                train, val = _hold_out(train, f, 1.0), _hold_out(train, 0.0, f)
        elif "validation" in read:
            train, val, test = _hold_out(train, f, 1.0), _hold_out(train, 0.0, f), read["validation"]
        else:
            train, val, test = _hold_out(train, 2 * f, 1.0), _hold_out(train, 0.0, f), _hold_out(train, f, 2 * f)
        splits = DatasetDict(train=train, validation=val, test=test)
    for split, ds in splits.items():
        _check_split(ds, split, data_cfg, num_labels)
    splits["train"] = cap_texts(splits["train"], data_cfg.max_texts)
    return splits, num_labels


def _named_test_splits(raw: DatasetDict, data_cfg) -> dict[str, str]:
    """``{test/<name>: source split}`` of ``data.classify.test_splits`` (each labelled), after refusing a labelled
    split of the source that the run would ignore (MNLI's validation_matched without test_splits)."""
    source, named = data_cfg.source, dict(data_cfg.classify.test_splits or {})
    for name, split in named.items():
        if split not in raw:
            raise ConfigError(
                f"data.classify.test_splits.{name}: no split {split!r} in data.source {source!r} "
                f"(splits: {', '.join(raw)})"
            )
        if split.startswith("test") and not _is_labelled(raw[split], data_cfg.label_column):
            raise ConfigError(
                f"data.classify.test_splits.{name}: split {split!r} of {source!r} is unlabelled (no labels, or all "
                f"{UNLABELLED} as GLUE hides its test labels) and cannot be scored"
            )
    ignored = [
        split
        for split in raw
        if split not in ("train", "validation", "test", *named.values())
        and _is_labelled(raw[split], data_cfg.label_column)
    ]
    if ignored:
        example = ", ".join(f"{s.rpartition('_')[2] if '_' in s else s}: {s}" for s in ignored)
        raise ConfigError(
            f"data.source: {source!r} has labelled split(s) {', '.join(ignored)} that this run would ignore; "
            f"score them with data.classify.test_splits={{{example}}}"
        )
    return {f"test/{name}": split for name, split in named.items()}


def _is_labelled(ds: Dataset, column: str) -> bool:
    """Whether ``ds`` has the label column with a label other than -1 (GLUE's hidden test labels)."""
    if column not in ds.column_names:
        return False
    values = ds.with_format("arrow")[column]
    return len(values) > 0 and not all(v == UNLABELLED for v in values.unique().to_pylist())


def _check_split(ds: Dataset, split: str, data_cfg, num_labels: int) -> None:
    """A split to train or score on is not empty and holds its task's labels (class ids 0 … C-1; finite numbers)."""
    f = data_cfg.val_fraction
    if len(ds) == 0:
        raise ConfigError(
            f"data.source: {data_cfg.source!r} gives an empty {split} split"
            + ("" if split == "train" else f" (data.val_fraction={f})")
        )
    if "label" not in ds.column_names:
        raise ConfigError(
            f"data.label_column: the {split} split of {data_cfg.source!r} is unlabelled and cannot be scored"
        )
    labels = label_array(ds)
    if data_cfg.classify.regression:
        bad = np.flatnonzero(~np.isfinite(labels))
        if len(bad):
            raise ConfigError(f"data.label_column: label {labels[bad[0]]} in the {split} split is not a finite number")
        return
    bad = np.flatnonzero((labels < 0) | (labels >= num_labels))
    if len(bad):
        raise ConfigError(
            f"data.label_column: label {int(labels[bad[0]])} in the {split} split is outside "
            f"the task's classes 0..{num_labels - 1} (data.classify.num_labels={num_labels})"
        )


def label_array(ds: Dataset) -> np.ndarray:
    """The labels: class ids (int64), or a regression's targets (float32)."""
    values = ds.with_format("arrow")["label"].to_numpy()
    return values.astype(np.float32 if values.dtype.kind == "f" else np.int64)


def _class_names(train: Dataset, data_cfg) -> Optional[list[str]]:
    feature = train.features.get(data_cfg.label_column)
    return list(feature.names) if isinstance(feature, ClassLabel) else None


def _num_labels(names: Optional[list[str]], data_cfg) -> int:
    c = data_cfg.classify
    if c.num_labels is not None and names is not None and c.num_labels != len(names):
        raise ConfigError(
            f"data.classify.num_labels: {c.num_labels}, but the label feature has {len(names)} classes {names}"
        )
    if c.num_labels is not None:
        return int(c.num_labels)
    if c.label_names is not None:
        return len(c.label_names)
    return len(names) if names is not None else 2


def _read(ds: Dataset, split: str, data_cfg, clean: bool, classes: Optional[list[str]] = None) -> Dataset:
    """One raw split as columns text, [pair,] label (class ids; no label column: unlabelled), texts cleaned
    if ``clean`` and checked (:func:`_check_texts`); a ClassLabel's ids are renumbered to ``classes`` by name."""
    columns = ", ".join(ds.column_names)
    keep = {}
    for key, name in (("text_column", "text"), ("text_pair_column", "pair")):
        column = data_cfg[key]
        if column is None:
            continue
        if column not in ds.column_names:
            raise ConfigError(f"data.{key}: {column!r} not in columns [{columns}] of the {split} split")
        if getattr(ds.features[column], "dtype", None) not in ("string", "large_string"):
            raise ConfigError(f"data.{key}: {column!r} holds {ds.features[column]}, not text")
        keep[column] = name
    column, label_names = data_cfg.label_column, data_cfg.classify.label_names
    as_names = False
    if column in ds.column_names:
        ds = _by_name(ds, column, split, classes, data_cfg)
        as_names = _check_label_column(ds, split, data_cfg)
        keep[column] = "label"
    elif not split.startswith("test"):  # GLUE's test files have no label column: an unlabelled test split
        raise ConfigError(f"data.label_column: {column!r} not in columns [{columns}] of the {split} split")
    ds = ds.select_columns(list(keep)).rename_columns({k: v for k, v in keep.items() if k != v})
    if as_names:
        ds = ds.map(_names_to_ids, batched=True, fn_kwargs=rule_kwargs(names=list(label_names)))
    if data_cfg.classify.regression and "label" in ds.column_names:
        ds = ds.cast_column("label", Value("float32"))
    if split.startswith("test") and "label" in ds.column_names and len(ds) and (label_array(ds) == UNLABELLED).all():
        ds = ds.remove_columns("label")
    ds = ds.map(_clean_texts, batched=True, fn_kwargs=rule_kwargs()) if clean else ds
    _check_texts(ds, split, data_cfg)
    return ds


def _check_texts(ds: Dataset, split: str, data_cfg) -> None:
    """Every example has its text (and pair): one missing (a null, an absent JSON key, a short row) or empty (once
    HTML tags and whitespace are cleaned away) is one ConfigError line naming the key, the file and the row."""
    for name, key in (("text", "text_column"), ("pair", "text_pair_column")):
        if name not in ds.column_names:
            continue
        texts = ds.with_format("arrow")[name]
        bad = pc.or_kleene(pc.is_null(texts), pc.equal(pc.utf8_length(texts), 0)).fill_null(True)
        count = pc.sum(bad).as_py() or 0
        if count:
            row = pc.index(bad, True).as_py()
            what = "missing" if texts[row].as_py() is None else "empty (or only whitespace and HTML tags)"
            raise ConfigError(
                f"data.{key}: the {data_cfg[key]!r} text at {row_at(data_cfg, split, row)} is {what} ({count} such "
                f"row{'s' if count > 1 else ''} in the {split} split); every example needs its text"
            )


def _by_name(ds: Dataset, column: str, split: str, classes: Optional[list[str]], data_cfg) -> Dataset:
    """A ClassLabel column whose class names are ``classes`` in another order renumbered to ``classes``' order (a
    parquet split whose names are ordered otherwise than train's would be scored with its labels swapped); other
    names are one ConfigError line. -1 (GLUE's hidden test labels) stays -1."""
    feature = ds.features[column]
    if not isinstance(feature, ClassLabel) or classes is None or list(feature.names) == classes:
        return ds
    names, whose = list(feature.names), ("data.classify.label_names" if data_cfg.classify.label_names else "train")
    if sorted(names) != sorted(classes) or len(set(names)) != len(names):
        raise ConfigError(
            f"data.label_column: the {split} split of {data_cfg.source!r} has the classes {names}, {whose} has "
            f"{classes}: not the same classes"
        )
    features = ds.features.copy()
    features[column] = ClassLabel(names=classes)
    mapping = [classes.index(name) for name in names]
    return ds.map(_renumber, batched=True, features=features, fn_kwargs=rule_kwargs(column=column, mapping=mapping))


def _renumber(batch: dict, column: str, mapping: list[int], **_) -> dict:
    return {column: [y if y < 0 else mapping[y] for y in batch[column]]}


def _check_label_column(ds: Dataset, split: str, data_cfg) -> bool:
    """Whether the labels are class names to map through ``label_names`` (else they are integer ids, or a
    regression's numbers)."""
    column, label_names, regression = data_cfg.label_column, data_cfg.classify.label_names, data_cfg.classify.regression
    values = ds.with_format("arrow")[column]
    if values.null_count:
        row = pc.index(pc.is_null(values), True).as_py()
        raise ConfigError(
            f"data.label_column: the {column!r} label at {row_at(data_cfg, split, row)} is missing "
            f"({values.null_count} missing in the {split} split)"
        )
    dtype = getattr(ds.features[column], "dtype", "")
    if regression:
        if not dtype.startswith(("int", "uint", "float", "double")):
            raise ConfigError(
                f"data.label_column: {column!r} holds {dtype or ds.features[column]} values, not numbers "
                f"(data.classify.regression=true)"
            )
        return False
    if isinstance(ds.features[column], ClassLabel) or dtype.startswith(("int", "uint")):
        return False
    if dtype not in ("string", "large_string"):
        hint = " (a regression? set data.classify.regression=true)" if dtype.startswith(("float", "double")) else ""
        raise ConfigError(
            f"data.label_column: {column!r} holds {dtype or ds.features[column]} values, not integer class ids{hint}"
        )
    if label_names is None:
        row = max(0, pc.index(pc.invert(pc.match_substring_regex(values, r"^[+-]?\d+$")), True).as_py())
        raise ConfigError(
            f"data.label_column: {column!r} holds strings ({values[row].as_py()!r} at {row_at(data_cfg, split, row)})"
            ", not class ids; list the classes in order in data.classify.label_names"
        )
    unknown = pc.invert(pc.is_in(values, value_set=pa.array(list(label_names), values.type)))
    if pc.any(unknown).as_py():
        row = pc.index(unknown, True).as_py()
        raise ConfigError(
            f"data.label_column: label {values[row].as_py()!r} at {row_at(data_cfg, split, row)} is not one of "
            f"data.classify.label_names {list(label_names)}"
        )
    return True


def _names_to_ids(batch: dict, names: list[str], **_) -> dict:
    index = {name: i for i, name in enumerate(names)}
    return {"label": [index[x] for x in batch["label"]]}


def _clean_texts(batch: dict, **_) -> dict:
    """Texts cleaned (:func:`~datamodules.embedded.clean_text`); a missing one stays missing, for the check."""
    return {key: [None if t is None else clean_text(t) for t in batch[key]] for key in ("text", "pair") if key in batch}


def _hold_out(ds: Dataset, low: float, high: float) -> Dataset:
    """The examples whose hash u (of text and pair) lies in [low, high)."""
    return ds.filter(_hash_in, batched=True, fn_kwargs=rule_kwargs(low=low, high=high))


def _hash_in(batch: dict, low: float, high: float, **_) -> list[bool]:
    pairs = batch.get("pair") or [""] * len(batch["text"])
    return [low <= unit_hash(f"{a}\x1f{b}") < high for a, b in zip(batch["text"], pairs)]


# ------------------------------------------------------------------------------------- encoding
def encode(tokenizer: Tokenizer, ds: Dataset, max_len: int) -> list[np.ndarray]:
    """Token ids (int32) per example of ``ds`` (columns text, [pair]): [CLS] a [SEP] (b [SEP]), at most
    ``max_len`` long, truncated by the rule of the module docstring."""
    pair = "pair" in ds.column_names
    m = max_len - (3 if pair else 2)  # places left by [CLS] and the [SEP]s
    out: list[np.ndarray] = []
    for batch in ds.iter(batch_size=_ENCODE_BATCH):
        a = _head_ids(tokenizer, batch["text"], m)
        b = _head_ids(tokenizer, batch["pair"], m) if pair else [None] * len(a)
        for x, y in zip(a, b):
            if y is None:
                ids = [CLS_ID, *x[:m], SEP_ID]
            else:
                ka = min(len(x), max((m + 1) // 2, m - len(y)))
                ids = [CLS_ID, *x[:ka], SEP_ID, *y[: m - ka], SEP_ID]
            out.append(np.asarray(ids, dtype=np.int32))
    return out


def _head_ids(tokenizer: Tokenizer, texts: list[str], m: int) -> list[list[int]]:
    """Token ids of each text's beginning: all of them, or at least the first ``m``.

    Only the first ``m`` whitespace-separated words are tokenized (a review of 25,000 characters costs as
    much as a short one): a token never spans whitespace (byte-level BPE pre-tokenizes at whitespace; the
    byte vocabulary has no merges) and every word gives at least one token, so those words yield the text's
    first tokens exactly, at least ``m`` of them. The truncation rule depends on a segment's length only
    through min(length, m), so it is unchanged."""
    heads = []
    for text in texts:
        rest = text.split(maxsplit=m)
        heads.append(text if len(rest) <= m else text[: len(text) - len(rest[m])])
    return [e.ids for e in tokenizer.encode_batch_fast(heads, add_special_tokens=False)]


class EncodedSplit(torch.utils.data.Dataset):
    def __init__(self, ids: list[np.ndarray], labels: np.ndarray) -> None:
        dtype = torch.float32 if labels.dtype.kind == "f" else torch.long  # a regression's targets, or class ids
        self.ids, self.labels = ids, torch.as_tensor(labels, dtype=dtype)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[np.ndarray, torch.Tensor]:
        return self.ids[i], self.labels[i]


def collate(items: list[tuple[np.ndarray, torch.Tensor]]) -> dict:
    """Pad to the longest sequence of the batch: input_ids (B, T), attention_mask (B, T), labels (B,)."""
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), PAD_ID, dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids != PAD_ID,
        "labels": torch.stack([label for _, label in items]),
    }


# ------------------------------------------------------------------------------------- data modules
class LabelledSequenceDataModule(L.LightningDataModule):
    """Encoded train/validation/test splits (``self.datasets``, filled by ``setup``) served as padded
    batches; shared by text classification and ListOps. ``data_cfg`` is ``RunConfig.data``; ``seed`` the
    training shuffle. ``test_sets`` names the test splits, each scored apart (metrics ``<name>/...``)."""

    num_labels: int
    test_sets: tuple[str, ...] = ("test",)

    def __init__(self, data_cfg, seed: int = 0):
        super().__init__()
        self.data_cfg, self.seed = data_cfg, seed
        self.datasets: dict[str, EncodedSplit] = {}

    def trivial_baseline(self) -> dict[str, float]:
        """Loss and accuracy on the validation split of always predicting the training label frequencies; for a
        regression, the mean squared error of always predicting the training mean."""
        train, val = self._split("train").labels, self._split("validation").labels
        if train.is_floating_point():
            return {"trivial_loss": float(((val - train.mean()) ** 2).mean())}
        return unigram_baseline(torch.bincount(train, minlength=self.num_labels), val)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", seed=None)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [self._loader(name, seed=None) for name in self.test_sets]
        return loaders[0] if len(loaders) == 1 else loaders

    def _split(self, split: str) -> EncodedSplit:
        if split not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run yet")
        return self.datasets[split]

    def _loader(self, split: str, seed: Optional[int]) -> DataLoader:
        """Training order resumable mid-epoch, evaluation sharded over DDP ranks (``datamodules/sampling.py``)."""
        return make_loader(self._split(split), self.trainer, seed, collate_fn=collate, **loader_options(self.data_cfg))


class ClassificationDataModule(LabelledSequenceDataModule):
    """Sequence classification batches ``{input_ids, attention_mask, labels}`` for ``data.source``.

    ``max_len`` is the longest sequence (``model.max_len``); ``init_from`` the pretraining run whose
    tokenizer to use (see the module docstring).
    """

    def __init__(self, data_cfg, max_len: int, seed: int = 0, init_from: Optional[str] = None):
        super().__init__(data_cfg, seed)
        self.max_len, self.init_from = max_len, init_from
        self.tokenizer: Optional[Tokenizer] = None
        self.splits: Optional[DatasetDict] = None  # texts and labels, before encoding
        self.num_labels = 0
        self.test_sets = tuple(eval_set_names(data_cfg))

    def prepare_data(self) -> None:
        load_labelled(self.data_cfg)  # fetches a hub dataset into the datasets cache; keeps no state

    def setup(self, stage: Optional[str] = None) -> None:
        if self.tokenizer is not None:
            return
        self.splits, self.num_labels = labelled_splits(load_labelled(self.data_cfg), self.data_cfg)
        self.tokenizer = self._tokenizer(self.splits["train"])
        self.datasets = {
            split: EncodedSplit(encode(self.tokenizer, ds, self.max_len), label_array(ds))
            for split, ds in self.splits.items()
        }

    def _tokenizer(self, train: Dataset) -> Tokenizer:
        tok_cfg = self.data_cfg.tokenizer
        if not tok_cfg.path and self.init_from is not None:
            tok_cfg = OmegaConf.merge(tok_cfg, {"path": str(init_from_tokenizer(self.init_from))})
        texts = list(train["text"]) + (list(train["pair"]) if "pair" in train.column_names else [])
        return build_tokenizer(tok_cfg, texts, self.data_cfg.cache_dir)

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise RuntimeError("ClassificationDataModule.setup() has not run yet")
        return self.tokenizer.get_vocab_size()
