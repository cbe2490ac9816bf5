"""Stable hashes and atomic cache files shared by the data modules.

Python's built-in ``hash`` is salted per process, so everything that must agree across runs, ranks and
machines (splits, hold-outs, cache keys) goes through SHA-1 here. Cache files are written to a temporary
file next to their final name and renamed into place, so a concurrent reader (another rank, a run started
while one is still writing) never sees a partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterable

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


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(binary_file)`` via a temporary sibling, fsync and ``os.replace``:
    a reader, or a resume after a kill mid-write, sees the old file or the new one, never half of one.
    Other writers' temporaries are left alone: several workers may fill a shared cache at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a shared cache must be readable by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
