"""Stable hashes and cache keys shared by the data modules (cache files are written by
:func:`foundation.atomic.atomic_write`).

Python's built-in ``hash`` is salted per process, so everything that must agree across runs, ranks and
machines (splits, hold-outs, cache keys) goes through SHA-1 here. Cache files are written to a temporary
file next to their final name and renamed into place, so a concurrent reader (another rank, a run started
while one is still writing) never sees a partial file.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

# datasets fingerprints a module-level function by its qualified name only, so editing a rule (cleaning,
# THE split, the hold-out) would silently reuse map/filter results cached under the old rule. Passing this
# hash of the package's source along with every fn_kwargs makes any edit invalidate those caches.
CODE_VERSION = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()


def rule_kwargs(**kwargs: Any) -> dict:
    """``fn_kwargs`` for ``Dataset.map``/``filter``: ``kwargs`` plus ``code_version`` (see CODE_VERSION);
    the named functions accept it as ``**_``."""
    return {**kwargs, "code_version": CODE_VERSION}


def unit_hash(text: str) -> float:
    """A stable, pseudo-uniform number in [0, 1) for ``text`` (first 8 bytes of its SHA-1)."""
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fingerprint(texts: Iterable[str]) -> str:
    """SHA-1 over texts in order; length prefixes keep ``["ab"]`` and ``["a", "b"]`` apart."""
    h = hashlib.sha1()
    for text in texts:
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def cache_key(*parts: Any) -> str:
    """A short file-name-safe key for JSON-serialisable ``parts``."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


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
    from datamodules.corpus import is_file_spec  # (corpus imports this module)

    source = data_cfg.source
    if source == "embedded":
        from datamodules.embedded import csv_path

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
