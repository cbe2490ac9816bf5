"""Files written inside a run or study folder, never through a link and never outside the folder.

A run directory or a study folder may itself be a link (``runs -> /scratch/runs`` is common), but nothing
inside it may be: a link planted there (``checkpoints -> /elsewhere``, ``.lock -> ~/.bashrc``) would make the
run truncate and rewrite a file outside its folder. So

* :func:`check_tree`, run by the preflight before anything is written, refuses in one line any symbolic link
  anywhere under the folder, and any known name of the wrong type (a folder where ``.lock`` belongs, a file
  where ``checkpoints/`` belongs);
* :func:`open_inside` opens a file of the folder with ``O_NOFOLLOW`` on its last component, after checking
  that its parent, resolved, is still inside the folder (a link planted after the preflight is refused too);
* :func:`check_inside` is that check alone, for writers that create a temporary sibling and rename it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterable

from foundation.errors import ConfigError

NO_LINKS = "a run or study folder holds no links; remove it"


def check_inside(root: Path, path: Path) -> None:
    """``path``'s parent, every link resolved, lies inside ``root`` (resolved), and ``path`` is no link."""
    real_root = Path(os.path.realpath(root))
    parent = Path(os.path.realpath(Path(path).parent))
    if parent != real_root and real_root not in parent.parents:
        raise ConfigError(f"{path}: its folder resolves to {parent}, outside {root}; {NO_LINKS}")
    if Path(path).is_symlink():
        raise ConfigError(f"{path}: a symbolic link (to {os.readlink(path)}); {NO_LINKS}")


def open_inside(root: Path, path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of ``path`` (inside ``root``) without following a link at its last component; one ConfigError
    line when it is a link, lies outside ``root`` or has the wrong type (a folder where a file belongs)."""
    check_inside(root, path)
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"{path}: a symbolic link; {NO_LINKS}") from None
        if err.errno == errno.EISDIR:
            raise ConfigError(f"{path}: a folder where a file belongs; remove it") from None
        raise ConfigError(f"{path}: cannot open ({err.strerror or type(err).__name__})") from None


def check_tree(
    root: Path, key: str, files: Iterable[str] = (), folders: Iterable[str] = (), links: Iterable[str] = ()
) -> None:
    """Before anything is written into the existing folder ``root``: no symbolic link anywhere under it but at
    ``links`` (paths relative to it that are never opened, only removed: another program's lock left behind), each
    of ``files`` a regular file where it exists and each of ``folders`` a folder. One ConfigError line naming ``key``
    and the path otherwise; nothing to check when ``root`` does not exist."""
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise ConfigError(f"{key}: {root} is a file, not a folder")
    for name in files:
        path = root / name
        if path.exists() and not path.is_symlink() and not path.is_file():
            kind = "a folder" if path.is_dir() else "a special file"
            raise ConfigError(f"{key}: {path} is {kind} where a file belongs; remove it")
    for name in folders:
        path = root / name
        if path.exists() and not path.is_symlink() and not path.is_dir():
            raise ConfigError(f"{key}: {path} is a file where a folder belongs; remove it")
    allowed = {root / name for name in links}
    for folder, dirs, names in os.walk(root):  # never follows links: a link to a folder is listed in dirs
        for name in (*dirs, *names):
            path = Path(folder) / name
            if path.is_symlink() and path not in allowed:
                raise ConfigError(f"{key}: {path} is a symbolic link (to {os.readlink(path)}); {NO_LINKS}")
