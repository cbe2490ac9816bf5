"""Files read with a check: a missing, unreadable, truncated or malformed file is one line naming it.

Every file the project reads back (``metrics.json``, ``config.yaml`` of a run, an analysis summary) is read here,
so a damaged one is ``error: <file>: <what is wrong>`` and exit code 2, never a traceback. Caches that can be
rebuilt (tokenizers, token blocks) are checked where they are built, and rebuilt when damaged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from foundation.configfile import read_yaml
from foundation.errors import ConfigError

T = TypeVar("T")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; one ConfigError line when it is missing, not a file, unreadable, truncated or
    not an object."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {'not a file' if path.exists() else 'not found'}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror or type(err).__name__})") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path}: not valid JSON, truncated or damaged ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The ``config.yaml`` a run wrote, as plain containers; one ConfigError line when it is missing or malformed."""
    return read_yaml(Path(run_dir) / "config.yaml")


def read_cache(path: Path, load: Callable[[Path], T]) -> Optional[T]:
    """``load(path)`` of a cache file; None when there is none, or when it is damaged (any error while loading it:
    a truncated or overwritten file), which is then removed, saying so on stderr, for the caller to rebuild."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: a folder where a cache file belongs; remove it")
    if not path.exists():
        return None
    try:
        return load(path)
    except Exception as err:  # noqa: BLE001 - whatever the reader raises, the cache can be rebuilt
        print(f"{path}: damaged cache ({type(err).__name__}); rebuilding it", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None
