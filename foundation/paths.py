"""Names and paths a user passes on, checked before anything is written.

A *name* (an experiment, a study) becomes one folder under ``output_dir``: it must be a relative path that
stays inside it (no ``..``, not absolute) and holds no control character. A *path* (``output_dir``, ``run_dir``,
a cache folder, an ``--out`` folder) may be anywhere, but holds no NUL byte or other control character, and a
folder the command will write into must not be an existing file.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path, PurePosixPath

from foundation.errors import ConfigError


def _control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check_path(key: str, value: str) -> Path:
    """``value`` as a Path, refused when empty or holding a control character (NUL, newline, …)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: must be a non-empty path, got {value!r}")
    if _control(value):
        raise ConfigError(f"{key}: {value!r} holds a control character (NUL, newline, ...); not a usable path")
    return Path(value)


def check_name(key: str, value: str) -> str:
    """A name that becomes a folder inside its root: relative, without ``..`` or control characters."""
    check_path(key, value)
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or Path(value).is_absolute() or ".." in parts or "\\" in value:
        raise ConfigError(f"{key}: {value!r} must be a relative name inside its output folder (no '..', not absolute)")
    if value.strip() != value or value in (".", ""):
        raise ConfigError(f"{key}: {value!r} is not a usable name (no leading or trailing spaces, not '.')")
    return value


def check_folder(key: str, value: str) -> Path:
    """A folder the command will create or write into: a usable path that is not an existing file."""
    path = check_path(key, value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {value} is a file, not a folder")
    return path
