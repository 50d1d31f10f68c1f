"""Parked pulls: a pull with nothing to return waits here until a commit to its
queue wakes it or its hold time ends (EQueue's SuspendedPullRequestManager)."""

from __future__ import annotations

import trio

__all__ = ["ParkedPulls"]


class ParkedPulls:
    """One :class:`trio.Event` per queue with waiters; a commit sets and drops it."""

    def __init__(self) -> None:
        self._events: dict[tuple[int, int], trio.Event] = {}
        self.parked = 0
        self.closed = False

    async def wait(self, topic_id: int, queue_id: int) -> None:
        """Wait for the next commit to (topic_id, queue_id); callers bound it with a
        cancel scope (``trio.move_on_at``). Returns at once once closed."""
        if self.closed:
            return
        key = (topic_id, queue_id)
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = trio.Event()
        self.parked += 1
        try:
            await ev.wait()
        finally:
            self.parked -= 1

    def wake(self, queues: set[tuple[int, int]]) -> None:
        """Wake every pull parked on any of ``queues``."""
        pop = self._events.pop
        for key in queues:
            ev = pop(key, None)
            if ev is not None:
                ev.set()

    def close(self) -> None:
        """Answer every parked pull now (shutdown) and refuse to park new ones."""
        self.closed = True
        for ev in self._events.values():
            ev.set()
        self._events.clear()
