"""Names and paths a user passes on, checked before anything is written.

A *name* (an experiment, a study, a pipeline variant) becomes one folder under ``output_dir``: it must be a
relative path that stays inside it (no ``..``, not absolute), holds no control character, and no part of it is
longer than the ``NAME_MAX`` bytes a file system allows in one name. A *path* (``output_dir``, ``run_dir``, a cache
folder, an ``--out`` folder) may be anywhere, but holds no NUL byte or other control character and is at most
``PATH_MAX`` bytes; a folder the command will write into must not be an existing file, and the nearest part of
it that exists must be a folder this process can write into, which is found out by writing a file there (and
removing it).
"""

from __future__ import annotations

import errno
import os
import tempfile
import unicodedata
from pathlib import Path, PurePosixPath

from foundation.errors import ConfigError

NAME_MAX = 255  # bytes in one file or folder name (ext4, XFS, Btrfs, APFS, NTFS in UTF-16 units)
PATH_MAX = 4096  # bytes in a whole path (Linux)


def _control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check_path(key: str, value: str) -> Path:
    """``value`` as a Path, refused when empty or holding a control character (NUL, newline, …)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: must be a non-empty path, got {value!r}")
    if _control(value):
        raise ConfigError(f"{key}: {value!r} holds a control character (NUL, newline, ...); not a usable path")
    if len(os.fsencode(value)) > PATH_MAX:
        raise ConfigError(f"{key}: a path of {len(os.fsencode(value))} bytes, more than the {PATH_MAX} a path may have")
    return Path(value)


def check_name(key: str, value: str) -> str:
    """A name that becomes a folder inside its root: relative, without ``..`` or control characters."""
    check_path(key, value)
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or Path(value).is_absolute() or ".." in parts or "\\" in value:
        raise ConfigError(f"{key}: {value!r} must be a relative name inside its output folder (no '..', not absolute)")
    if value.strip() != value or value in (".", ""):
        raise ConfigError(f"{key}: {value!r} is not a usable name (no leading or trailing spaces, not '.')")
    longest = max(parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > NAME_MAX:
        raise ConfigError(
            f"{key}: {value[:40]!r}... is {len(os.fsencode(longest))} bytes long, more than the {NAME_MAX} a file "
            "system allows in one folder name"
        )
    return value


def check_folder(key: str, value: str) -> Path:
    """A folder the command will create or write into: a usable path that is not an existing file, and whose
    nearest existing part is a folder that takes a new file (one is written there and removed)."""
    path = check_path(key, value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {value} is a file, not a folder")
    existing = path.absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():  # mkdir would fail there, or loop taking it for a race
        raise ConfigError(
            f"{key}: {value}: {existing} is a symbolic link to {os.readlink(existing)}, which does not exist; "
            "a folder belongs there"
        )
    if not existing.is_dir():
        raise ConfigError(f"{key}: {value} lies inside {existing}, which is a file, not a folder")
    try:
        _write_a_file(existing)
    except OSError as err:
        raise ConfigError(
            f"{key}: {value}: cannot write into {existing} ({err.strerror or type(err).__name__})"
        ) from None
    return path


_UNNAMED = getattr(os, "O_TMPFILE", 0)  # Linux: a file without a name, gone when closed


def _write_a_file(folder: Path) -> None:
    """Create a file in ``folder`` and remove it, or raise the OSError that stopped it. Only trying tells: the
    permission bits answer yes to root whatever they say, and say nothing of a read-only mount or a file
    system that takes no files. An unnamed file leaves no entry and no changed timestamp; where the system or
    the file system has none, a named temporary file is created and removed at once."""
    if _UNNAMED:
        try:
            os.close(os.open(folder, _UNNAMED | os.O_WRONLY, 0o600))
            return
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):  # (no unnamed files there)
                raise
    fd, name = tempfile.mkstemp(dir=folder, prefix=".write-check-")
    os.close(fd)
    os.unlink(name)
