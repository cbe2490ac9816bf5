"""Text corpora for language-model pretraining, all loaded through ``datasets.load_dataset``.

:func:`load_text_corpus` turns ``data.source`` into a DatasetDict with "train" and "validation" splits
and a single column "text":

- ``embedded``: the movie reviews' train/validation splits (see :mod:`datamodules.embedded`);
- ``stdlib-code``: the Python standard library's ``.py`` files, one document per file, split by the
  hash of the path relative to the stdlib root (stable across machines);
- a local file or glob (``.txt`` one example per line, ``.csv``, ``.tsv``, ``.json``/``.jsonl``, ``.parquet``), read
  as written (:mod:`datamodules.files`);
- anything else is given to ``load_dataset(source, data.subset)``: a hub id such as
  ``Salesforce/wikitext`` or a local directory laid out like a hub repository.

A corpus without its own "validation" split holds out ``data.val_fraction`` of its texts by the hash of
the text. Empty and whitespace-only texts are dropped; ``data.max_texts`` then keeps that many training
texts, evenly spaced through the corpus (deterministic, order-preserving, mixes the corpus' parts).
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
from datasets import Dataset, DatasetDict, load_dataset

from datamodules.cache import cache_key, hf_cache_room, rule_kwargs, unit_hash
from datamodules.embedded import csv_path, load_embedded
from datamodules.files import is_file_spec, load_local_files
from foundation.errors import ConfigError


@hf_cache_room
def load_text_corpus(data_cfg) -> DatasetDict:
    """ "train" and "validation" splits with one non-empty "text" column for ``data_cfg.source``."""
    source = data_cfg.source
    if source == "embedded":
        corpus = load_embedded()
    elif source == "stdlib-code":
        corpus = _stdlib_code(data_cfg.val_fraction)
    elif is_file_spec(source):
        corpus = load_local_files(source, data_cfg)
    else:
        corpus = load_hub(source, data_cfg.subset)
    if "train" not in corpus:
        raise ConfigError(f"data.source: {source!r} has no 'train' split (splits: {', '.join(corpus)})")
    train = _texts_only(corpus["train"], data_cfg.text_column)
    if "validation" in corpus:
        val = _texts_only(corpus["validation"], data_cfg.text_column)
    else:
        fraction = data_cfg.val_fraction
        train, val = (
            train.filter(_held_out, batched=True, fn_kwargs=rule_kwargs(fraction=fraction, want=want))
            for want in (False, True)
        )
    if len(train) == 0:
        raise ConfigError(f"data.source: {source!r} has no non-empty texts in its training split")
    if len(val) == 0:
        raise ConfigError(
            f"data.val_fraction: {source!r} has no non-empty validation texts (val_fraction={data_cfg.val_fraction})"
        )
    return DatasetDict(train=cap_texts(train, data_cfg.max_texts), validation=val)


def iter_texts(ds: Dataset, batch_size: int = 1000) -> Iterator[str]:
    """The "text" column in order, read in Arrow batches (much faster than iterating ``ds["text"]``)."""
    for batch in ds.iter(batch_size=batch_size):
        yield from batch["text"]


# ------------------------------------------------------------------------------------- sources
def _stdlib_code(val_fraction: float) -> DatasetDict:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))
    held_out = {p: unit_hash(p.relative_to(root).as_posix()) < val_fraction for p in files}
    data_files = {
        "train": [str(p) for p in files if not held_out[p]],
        "validation": [str(p) for p in files if held_out[p]],
    }
    if not data_files["validation"]:
        raise ConfigError(f"data.val_fraction: {val_fraction} holds out no file of 'stdlib-code'")
    # A few test modules are deliberately not UTF-8; decode them leniently rather than fail.
    return load_dataset("text", data_files=data_files, sample_by="document", encoding_errors="replace")


def load_hub(source: str, subset: str | None) -> DatasetDict:
    """``load_dataset(source, subset)`` (a hub id or a local directory laid out like one); failures are
    one-line ConfigErrors naming ``data.source``."""
    try:
        return load_dataset(source, subset)
    except (OSError, ValueError) as err:  # offline/unknown id (ConnectionError, FileNotFoundError), bad subset
        what = f"{source!r}" + (f" (subset {subset!r})" if subset else "")
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"data.source: cannot load {what}: {reason}") from err


# ------------------------------------------------------------------------------------- fingerprint


def _file_digest(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> digest: a file is read once per process


def files_digest(paths: Iterable[str]) -> str:
    """SHA-1 over the names and contents of ``paths`` (sorted): what a corpus of local files holds."""
    parts = []
    for path in sorted(paths):
        stat = os.stat(path)
        key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
        if key not in _DIGESTS:
            _DIGESTS[key] = _file_digest(path)
        parts.append([os.path.basename(path), _DIGESTS[key]])
    return cache_key(parts)


def data_fingerprint(data_cfg) -> str:
    """A short digest of what ``data.source`` (and ``data.tokenizer.path``) hold, to tell that a corpus was edited:
    the contents of local files (a file, a glob, a folder laid out like a hub repository; the embedded corpus'
    CSV), the Python version for ``stdlib-code``, the id and subset of a hub dataset (its revision is the
    ``datasets`` cache's business)."""
    source = data_cfg.source
    if source == "embedded":
        what: Any = ["embedded", files_digest([str(csv_path())])]
    elif source == "stdlib-code":
        what = ["stdlib-code", sys.version.split()[0]]
    elif is_file_spec(source):
        pattern = os.path.expanduser(source)
        files = [f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f)] if glob.has_magic(pattern) else []
        what = ["files", files_digest(files or ([pattern] if os.path.isfile(pattern) else []))]
    elif os.path.isdir(source):
        files = [str(p) for p in Path(source).rglob("*") if p.is_file() and not p.name.startswith(".")]
        what = ["folder", files_digest(files)]
    else:
        what = ["hub", source, data_cfg.subset]
    tokenizer = data_cfg.tokenizer.path
    if tokenizer and os.path.isfile(tokenizer):
        what.append(files_digest([tokenizer]))
    return cache_key(what)


# ------------------------------------------------------------------------------------- shaping
def _texts_only(ds: Dataset, column: str) -> Dataset:
    """The non-empty texts of ``column``, as the single column "text"."""
    if column not in ds.column_names:
        raise ConfigError(f"data.text_column: {column!r} not in columns [{', '.join(ds.column_names)}]")
    dtype = getattr(ds.features[column], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ConfigError(f"data.text_column: {column!r} holds {dtype or ds.features[column]}, not text")
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    return ds.filter(_non_empty, batched=True, fn_kwargs=rule_kwargs())


def _non_empty(batch: dict, **_) -> list[bool]:
    return [bool(t) and not t.isspace() for t in batch["text"]]


def _held_out(batch: dict, fraction: float, want: bool, **_) -> list[bool]:
    return [(unit_hash(t) < fraction) == want for t in batch["text"]]


def cap_texts(ds: Dataset, max_texts: int | None) -> Dataset:
    """At most ``max_texts`` rows (``data.max_texts``), evenly spaced through ``ds``, in order."""
    if max_texts is not None and max_texts < 1:
        raise ConfigError(f"data.max_texts: must be >= 1 or null, got {max_texts}")
    if max_texts is None or len(ds) <= max_texts:
        return ds
    return ds.select((np.arange(max_texts) * len(ds)) // max_texts)
