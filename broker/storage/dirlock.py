"""One broker per data directory: an exclusive lock held while the store is open.

Two brokers on one directory would both keep the next global offset and every
queue's range in memory and overwrite each other's records: acknowledged data is
lost silently. Like Kafka's ``.lock`` per log directory and RocketMQ's store lock, the
store takes an exclusive ``flock`` on ``<data-dir>/LOCK`` before it opens LMDB and
keeps it until it closes; the file holds the owner's pid, so the refusal can name
it. The kernel drops the lock when the process dies (SIGKILL included), so a crash
never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from equeue.errors import DataDirLocked

__all__ = ["LOCK_FILE", "DirLock"]

LOCK_FILE = "LOCK"


class DirLock:
    """The exclusive lock of one data directory (:meth:`acquire` / :meth:`release`)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting and write our pid into the lock file.

        Raises DataDirLocked, naming the directory and the holder's pid, when another
        store (in this process or another) holds it.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data directory {self.path.parent} is in use by another broker (pid {holder}); "
                "stop it first: two brokers on one directory lose acknowledged data"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the file releases it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
