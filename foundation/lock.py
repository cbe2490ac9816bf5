"""One owner per folder: an advisory lock held for the life of the process that writes there.

A run directory is owned by the process that trains it (rank 0 of a DDP run), a study by the ``sweep`` command
that launched its workers (each trial's run directory by the worker that trains it). The lock is
``fcntl.flock`` on ``<folder>/.lock``: held until :meth:`Owner.release` or the process's death, whatever kills
it (the operating system releases it; no stale lock outlives its owner). The file records its holder (host,
pid, since when) for the one line a second process gets:

``error: runs/x/version_0: in use by pid 4242 on host-a since 2026-12-01 14:03:11 UTC (one process at a time
owns a run or a study; wait for it to end or stop it)``

The lock file is opened without following a link (:func:`foundation.confined.open_inside`): a link planted at
``.lock`` is refused in one line, as is a folder there. A clean release empties the file; a process that finds it
still naming a holder took over from one that died, and says so in one line (``…: took over the lock of pid 4242
on host-a since …, which ended without releasing it``).

A lock is only as good as the file system's ``flock``: local disks and NFS (as POSIX record locks) honour it
between machines.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from foundation.confined import open_inside
from foundation.errors import ConfigError

LOCK = ".lock"


class Busy(ConfigError):
    """Another process owns the folder: one line naming the holder, exit 2."""


class Owner:
    """Ownership of ``folder`` (which must exist), taken at construction; a context manager that releases it."""

    def __init__(self, folder: Path, what: Optional[str] = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self._fd: Optional[int] = open_inside(self.folder, self.path, os.O_RDWR | os.O_CREAT)
        self._recorded = False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise _busy(self.folder, what) from None
        left = os.pread(self._fd, 512, 0).decode(errors="replace").strip()
        if left:  # a clean release empties the file: its holder died
            print(
                f"{what or self.folder}: took over the lock of {_described(left)}, which ended without releasing it",
                file=sys.stderr,
            )

    def record(self) -> None:
        """Write this process as the holder (only once it is about to write anyway: an owner that ends without
        writing leaves the folder untouched)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()} {socket.gethostname()} {stamp}\n".encode(), 0)
        self._recorded = True

    def release(self) -> None:
        if self._fd is not None:
            if self._recorded:
                os.ftruncate(self._fd, 0)  # released cleanly: the next owner has nothing to take over
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "Owner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _busy(folder: Path, what: Optional[str]) -> Busy:
    return Busy(
        f"{what or folder}: in use by {holder(folder)} (one process at a time owns a run or a study; wait for it to "
        "end or stop it)"
    )


def check_free(folder: Path, what: Optional[str] = None) -> None:
    """Before a process that will own ``folder`` spends time (a sweep's preflight): one :class:`Busy` line when
    another process owns it now. Nothing is written: the lock file, when there, is opened to read and its lock
    tried and let go at once."""
    path = Path(folder) / LOCK
    if not path.is_file():
        return
    fd = open_inside(Path(folder), path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(Path(folder), what) from None
    finally:
        os.close(fd)  # releases the lock, if taken


def holder(folder: Path) -> str:
    """'pid P on HOST since T' as the lock file records it, or 'another process' when it records nothing."""
    try:
        fd = open_inside(Path(folder), Path(folder) / LOCK, os.O_RDONLY)
    except ConfigError:
        return "another process"
    try:
        return _described(os.pread(fd, 512, 0).decode(errors="replace"))
    finally:
        os.close(fd)


def _described(record: str) -> str:
    try:
        pid, host, since = record.strip().split(" ", 2)
    except ValueError:
        return "another process"
    return f"pid {pid} on {host} since {since}"
