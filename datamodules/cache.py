"""Stable hashes and cache keys shared by the data modules, and the writer of their cache files
(:func:`write_cache`, through :func:`foundation.atomic.atomic_write`).

Python's built-in ``hash`` is salted per process, so everything that must agree across runs, ranks and
machines (splits, hold-outs, cache keys) goes through SHA-1 here. Cache files are written to a temporary
file next to their final name and renamed into place, so a concurrent reader (another rank, a run started
while one is still writing) never sees a partial file.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import shutil
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Optional, TypeVar

from foundation.atomic import atomic_write
from foundation.errors import ConfigError

# datasets fingerprints a module-level function by its qualified name only, so editing a rule (cleaning,
# THE split, the hold-out) would silently reuse map/filter results cached under the old rule. Passing this
# hash of the package's source along with every fn_kwargs makes any edit invalidate those caches.
CODE_VERSION = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()


F = TypeVar("F", bound=Callable[..., Any])
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a full quota
NPY_HEADER = 128  # bytes numpy's .npy format puts before an array's data (a multiple of 64; 128 for ours)


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


def write_cache(cache_dir: str | Path, path: Path, write: Callable[[IO[bytes]], None], size: int) -> None:
    """``path`` (under ``data.cache_dir``) written atomically through ``write``, which writes ``size`` bytes.

    A cache that does not fit is one ConfigError line naming ``data.cache_dir``, the file, the space it needs and
    the space free: found before anything is written (nothing started on a disk that cannot take it) or when the
    write fails (space taken meanwhile; numpy then says only "195584 requested and 16352 written"), in which case
    the temporary file is removed, so no partial cache is left. Any other failure to write is one line too."""
    free = _free_bytes(Path(path))
    if free is not None and free < size:
        raise _no_room(cache_dir, path, size, free)
    try:
        atomic_write(path, write)
    except OSError as err:
        free = _free_bytes(Path(path))
        if err.errno in NO_ROOM or (free is not None and free < size):
            raise _no_room(cache_dir, path, size, free) from None
        raise ConfigError(f"data.cache_dir: {cache_dir}: cannot write {path} ({err.strerror or err})") from None


def _free_bytes(path: Path) -> Optional[int]:
    """Bytes free to this process on the file system that holds ``path`` (its nearest existing folder)."""
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return None


def _no_room(cache_dir: str | Path, path: Path, size: int, free: Optional[int]) -> ConfigError:
    left = "unknown" if free is None else f"{_mb(free)} free"
    return ConfigError(
        f"data.cache_dir: {cache_dir}: no room for the cache file {path} ({_mb(size)} needed, {left}); free some "
        "space or set data.cache_dir to a folder on another disk"
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def hf_cache_room(fn: F) -> F:
    """``fn`` (a step that has ``datasets`` convert a source to Arrow, map or filter it: files in the Hugging Face
    cache) with a full disk there as one ConfigError line naming the cache, not a traceback."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OSError as err:
            cause = err if err.errno in NO_ROOM else err.__cause__ or err.__context__
            if not isinstance(cause, OSError) or cause.errno not in NO_ROOM:
                raise
            raise no_room_in_hf_cache(cause) from None

    return wrapped  # type: ignore[return-value]


def no_room_in_hf_cache(err: OSError) -> ConfigError:
    import datasets

    folder = datasets.config.HF_DATASETS_CACHE
    free = _free_bytes(Path(folder) / "x")
    left = "" if free is None else f", {_mb(free)} free"
    return ConfigError(
        f"HF_DATASETS_CACHE: {folder}: no room for the data's Arrow files ({err.strerror}{left}); free some space or "
        "set HF_HOME to a folder on another disk"
    )
