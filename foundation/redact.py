"""Passwords out of everything the project prints or writes.

A storage URL such as ``postgresql+psycopg2://user:secret@host/db`` reaches the ``sweep`` and ``report``
commands; whatever shows or stores it (console lines, worker logs, error messages, which may quote the URL,
``summary.md``) shows :func:`redact` of it instead.
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:PASSWORD@host, also mistyped with one slash (the password may hold a raw "@": it runs to the
# last "@" of the word)
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*:/+[^\s:/@]*:)(?P<password>\S*)@")
_QUERY = re.compile(r"(?P<head>[?&;]password=)(?P<password>[^&#\s]*)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it (``user:password@`` or a ``password=`` query parameter)
    replaced by ``***``; text without one (a file path) unchanged."""
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)
