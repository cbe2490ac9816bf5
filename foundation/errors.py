"""The one user-facing error type."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or input problem: the CLI prints it as one line (``error: …``) and exits with code 2.

    The message names the key (or file, or flag), the value, and what is allowed.
    """


def require(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)
