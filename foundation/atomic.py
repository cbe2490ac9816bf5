"""Files that are either whole or absent: write to a temporary sibling, fsync, ``os.replace``.

A reader, or a resume after a kill mid-write, sees the old file or the new one, never half of one; a write that
fails (a full disk) leaves the old file as it was. Every file the project writes goes through here: text
(:func:`atomic_write_text`, :func:`atomic_text` for ``csv.writer``), JSON (:func:`write_json`), figures
(:func:`write_figure`) and binary caches (:func:`atomic_write`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional

from foundation.confined import check_inside


def atomic_write(path: Path, write: Callable[[IO[bytes]], None], inside: Optional[Path] = None) -> None:
    """Write ``path`` through ``write(binary_file)`` via a temporary sibling, fsync and ``os.replace``.

    Other writers' temporaries are left alone: several workers may fill a shared cache at once. ``inside``: the
    run or study folder ``path`` belongs to, whose resolved parent must stay inside it
    (:func:`foundation.confined.check_inside`), and ``path`` itself is no link.
    """
    path = Path(path)
    if inside is not None:
        check_inside(inside, path)
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


def atomic_write_text(path: Path, text: str, inside: Optional[Path] = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``inside``: see :func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), inside)


@contextlib.contextmanager
def atomic_text(path: Path) -> Iterator[io.StringIO]:
    """A text stream (``newline=""``, as ``csv.writer`` wants) whose content replaces ``path`` atomically when the
    body ends without an exception; nothing is written otherwise."""
    buffer = io.StringIO(newline="")
    yield buffer
    atomic_write_text(path, buffer.getvalue())


def write_figure(path: Path, figure: Any, **savefig: Any) -> None:
    """A Matplotlib figure (anything with ``savefig``) saved to ``path`` atomically, in the format its suffix
    names; ``savefig`` are Matplotlib's arguments (``dpi``, ...)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    atomic_write(path, lambda f: figure.savefig(f, format=fmt, **savefig))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Path, data: dict, inside: Optional[Path] = None) -> None:
    """``data`` as indented, key-sorted JSON, atomically (non-finite floats as strings; ``inside``: see
    :func:`atomic_write`)."""
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2, sort_keys=True) + "\n", inside)
