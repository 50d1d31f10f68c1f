"""Parked pulls: a pull with nothing to return waits here until a commit to its
queue wakes it or its hold time ends (EQueue's SuspendedPullRequestManager).

A parked pull may carry an ``answer`` function, which the appender's writer thread
calls right after the commit that touched the pull's queue: the one thread crossing,
described (with its measurement) in :mod:`equeue.broker.writer_answers`. When the writer
thread cannot answer (nothing new for this pull, the socket busy), the pull task
wakes and reads as before.

A connection may park at most ``max_pulls_per_connection`` pulls: its reader puts
its :class:`PullSlots` in :data:`PULL_SLOTS`, a context variable its handler tasks
inherit, and a pull past the cap is refused here with TOO_MANY_PULLS instead of
parking. A pull that finds messages is never refused: only waiting is limited.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar

import trio

from equeue.errors import TooManyPulls

__all__ = ["PULL_SLOTS", "Answer", "Parked", "ParkedPulls", "PullSlots"]

#: Called in the writer thread: (messages, bytes) written in answer, or None when it
#: wrote nothing (then the pull task reads and answers itself).
Answer = Callable[[], "tuple[int, int] | None"]


class PullSlots:
    """How many pulls one connection may park, and how many it has parked (loop
    only). :meth:`wait_changed` returns after the next pull parks or after
    :meth:`signal` (the connection's reader waits on it for a request to finish)."""

    __slots__ = ("_changed", "limit", "parked")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parked = 0
        self._changed = trio.Event()

    def signal(self) -> None:
        """Wake :meth:`wait_changed`."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()


#: the parking allowance of the connection whose request the current task answers
#: (set by its reader, inherited by its handler tasks; None: no limit)
PULL_SLOTS: ContextVar[PullSlots | None] = ContextVar("equeue_pull_slots", default=None)


class Parked:
    """One parked pull: its queue, its writer-thread answer (if any), its wake-up."""

    __slots__ = ("answer", "error", "event", "key", "outcome")

    def __init__(self, key: tuple[int, int], answer: Answer | None) -> None:
        self.key = key
        self.answer = answer
        self.event = trio.Event()
        #: what the writer thread's answer returned (None: the pull task answers)
        self.outcome: tuple[int, int] | None = None
        #: set by :meth:`ParkedPulls.fail_all`: the pull raises it when woken
        self.error: BaseException | None = None


class ParkedPulls:
    """Parked pulls per queue. The loop parks and unparks; the writer thread takes
    (claims) the pulls of the queues it committed to. ``_lock`` guards the table; a
    queue's pulls are an insertion-ordered dict (O(1) unpark)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, int], dict[Parked, None]] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self.parked = 0
        self.closed = False

    async def wait(
        self, topic_id: int, queue_id: int, answer: Answer | None = None
    ) -> tuple[int, int] | None:
        """Wait for the next commit to (topic_id, queue_id). Callers bound the wait
        with a cancel scope (``trio.move_on_at``). Returns at once once closed.

        Returns (messages, bytes) when the writer thread answered the pull (the
        caller must then send nothing), else None. Raises TooManyPulls when the
        connection of the current task (:data:`PULL_SLOTS`) has its most parked. Once the writer thread has
        claimed the pull, a cancellation waits (shielded, briefly) for its outcome:
        if it answered, that is returned and the cancellation absorbed, so a request
        is never answered twice.
        """
        if self.closed:
            return None
        slots = PULL_SLOTS.get()
        if slots is None:
            return await self._wait(topic_id, queue_id, answer)
        if slots.parked >= slots.limit:
            raise TooManyPulls(f"{slots.limit} pulls parked on this connection already (--max-pulls-per-connection)")
        slots.parked += 1
        slots.signal()
        try:
            return await self._wait(topic_id, queue_id, answer)
        finally:
            slots.parked -= 1

    async def _wait(
        self, topic_id: int, queue_id: int, answer: Answer | None
    ) -> tuple[int, int] | None:
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        key = (topic_id, queue_id)
        p = Parked(key, answer)
        with self._lock:
            self._queues.setdefault(key, {})[p] = None
            self.parked += 1
        try:
            await p.event.wait()
        except BaseException as exc:
            if self._unpark(p) or not isinstance(exc, trio.Cancelled):
                raise
            # claimed by the writer thread: its outcome is moments away
            with trio.CancelScope(shield=True):
                await p.event.wait()
            if p.outcome is None:
                raise
        if p.error is not None:
            raise p.error
        return p.outcome

    def _unpark(self, p: Parked) -> bool:
        """Remove ``p`` if still parked (not claimed); True if it was."""
        with self._lock:
            waiting = self._queues.get(p.key)
            if waiting is None or p not in waiting:
                return False
            del waiting[p]
            if not waiting:
                del self._queues[p.key]
            self.parked -= 1
            return True

    def claim(self, queues: Iterable[tuple[int, int]]) -> list[Parked]:
        """Any thread: take every pull parked on ``queues`` (they are no longer
        parked; wake them with :meth:`release`, or :meth:`wake` on the loop)."""
        taken: list[Parked] = []
        with self._lock:
            pop = self._queues.pop
            for key in queues:
                waiting = pop(key, None)
                if waiting:
                    taken += waiting
            self.parked -= len(taken)
        return taken

    def release(self, claimed: list[Parked]) -> None:
        """Any thread: wake the pull tasks of ``claimed`` pulls (through the loop's
        token; never raises)."""
        token = self._token
        if token is None:
            return
        for p in claimed:
            try:
                token.run_sync_soon(p.event.set)
            except trio.RunFinishedError:
                break

    def wake(self, queues: Iterable[tuple[int, int]]) -> None:
        """Loop thread: wake every pull parked on any of ``queues`` (they read)."""
        for p in self.claim(queues):
            p.event.set()

    def wake_all(self) -> None:
        """Loop thread: wake every parked pull; each reads again (and parks again when
        nothing changed for it). A consumer group's pause does this, so that no pull
        parked before the pause is answered with messages after it."""
        with self._lock:
            queues = list(self._queues)
        self.wake(queues)

    def fail_all(self, exc: BaseException) -> None:
        """Loop thread: every pull parked now raises ``exc`` (a leader that stopped
        serving answers them NOT_LEADER, never with data); later pulls park as usual."""
        with self._lock:
            queues = list(self._queues)
        for p in self.claim(queues):
            p.error = exc
            p.event.set()

    def close(self) -> None:
        """Answer every parked pull now (shutdown) and refuse to park new ones."""
        self.closed = True
        with self._lock:
            queues = list(self._queues)
        self.wake(queues)
