"""Stable hashes and cache keys shared by the data modules (cache files are written by
:func:`foundation.atomic.atomic_write`).

Python's built-in ``hash`` is salted per process, so everything that must agree across runs, ranks and
machines (splits, hold-outs, cache keys) goes through SHA-1 here. Cache files are written to a temporary
file next to their final name and renamed into place, so a concurrent reader (another rank, a run started
while one is still writing) never sees a partial file.
"""

from __future__ import annotations

import hashlib
import json
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
