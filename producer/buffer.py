"""The producer's memory bound: bytes of encoded entries not answered yet.

The submit path (:meth:`equeue.producer.AsyncProducer.submit_nowait`, any thread) adds an
entry's bytes to :attr:`Buffer.used` under :attr:`Buffer.lock`, the same lock that
guards every lane's open batch, send queue and pending set (a message is counted
and placed in its batch in one critical section): at most :attr:`Buffer.limit`
bytes, but one entry may always go alone into an empty buffer; beyond that it
waits (:meth:`Buffer.wait_space`, ``OnFull.BLOCK``) or raises BufferFull
(``OnFull.RAISE``). The loop releases the bytes of each finished batch and wakes
the tasks waiting for space.
"""

from __future__ import annotations

import threading

import trio

from equeue.errors import BufferFull
from equeue.producer.options import OnFull

__all__ = ["Buffer"]


class Buffer:
    """The buffered bytes of one producer and the wait for space (module docstring)."""

    def __init__(self, limit: int, on_full: OnFull) -> None:
        self.limit = limit
        self.on_full = on_full
        #: guards ``used`` and the lanes' open/sendq/pending (any thread)
        self.lock = threading.Lock()
        self.used = 0
        self._space = trio.Event()
        self._waiters = 0

    def full_error(self, need: int = 0) -> BufferFull:
        """The error for a message (or a whole batch: ``need`` bytes) that does not fit."""
        if need:
            return BufferFull(
                f"a batch of {need} bytes does not fit: {self.used} bytes are buffered "
                f"(max_buffered_bytes={self.limit}); nothing of it was sent"
            )
        return BufferFull(f"{self.used} bytes are buffered (max_buffered_bytes={self.limit})")

    def release(self, n: int) -> None:
        """A batch of ``n`` bytes finished (loop thread): free them, wake the waiters."""
        with self.lock:
            self.used -= n
        if self._waiters:
            self._space.set()
            self._space = trio.Event()

    async def wait_space(self) -> None:
        """Wait until some bytes are released (loop thread)."""
        self._waiters += 1
        try:
            await self._space.wait()
        finally:
            self._waiters -= 1
