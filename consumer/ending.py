"""A consumer that stops by itself: at the end of its queues (``stop_at_end``) or after
a quiet spell (``idle_timeout``). For batch jobs and ``equeue consume --exit-at-end`` /
``--idle-timeout``; both end like :meth:`equeue.consumer.AsyncConsumer.stop` (``run()``
returns, iteration ends; the close then commits and leaves).

**At the end** (kcat's ``-e``): every queue assigned to this member (its allocation;
broadcast mode: every queue) has been read to the end a pull reported (the answer's
next offset reached the queue's end, or it had nothing new) and every message pulled
from it has been handled. Until a queue first reaches its end its pulls do not wait at
the broker (no long-poll hold), so an empty queue counts at once. Delayed messages not
yet due are not waited for. With nothing assigned (no such topic, or other members
hold every queue) the member stops at once.

**Idle**: no message was pulled or finished for ``idle_timeout`` seconds and none is
in a handler's hands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import trio

from equeue.consumer.dispatch import Dispatcher
from equeue.consumer.process_queue import Lease, ProcessQueue

__all__ = ["EndWatch", "watch_idle"]


class EndWatch:
    """Stops the member once its assigned queues are read to the end (module docstring).

    ``assigned()`` is the member's allocation; ``queues()`` the queues it consumes now.
    :meth:`poke` after anything that may complete it (a queue reached its end, handlers
    finished messages, a rebalance round); :meth:`run` checks then."""

    def __init__(
        self, assigned: Callable[[], set[Lease]], queues: Callable[[], Mapping[Lease, ProcessQueue]],
        stop: Callable[[], None],
    ) -> None:  # fmt: skip
        self.assigned = assigned
        self.queues = queues
        self.stop = stop
        self._changed = trio.Event()

    def poke(self) -> None:
        """Something changed: check again (loop thread)."""
        self._changed.set()

    def read_to_end(self) -> bool:
        """Every assigned queue consumed here, read to its end and all handled."""
        queues = self.queues()
        for lease in self.assigned():
            q = queues.get(lease)
            if q is None or not q.started or not q.at_end or len(q.window) or q.inflight:
                return False
        return True

    async def run(self) -> None:
        """Check at every poke; stop the member once read to the end."""
        while True:
            self._changed = trio.Event()
            if self.read_to_end():
                self.stop()
                return
            await self._changed.wait()


async def watch_idle(dispatcher: Dispatcher, queues: Mapping[Lease, ProcessQueue], idle: float,
                     stop: Callable[[], None]) -> None:  # fmt: skip
    """Stop the member (``stop()``) once nothing was pulled or finished for ``idle``
    seconds and no message is in a handler's hands (``dispatcher.activity``: the trio
    time of the last delivery or finished chunk)."""
    while True:
        due = dispatcher.activity + idle
        if trio.current_time() >= due and not any(q.inflight for q in queues.values()):
            stop()
            return
        await trio.sleep_until(max(due, trio.current_time() + min(idle, 0.05)))
