"""Per-queue state of a consumer (EQueue's ``ProcessQueue``) and flow control.

One :class:`ProcessQueue` exists for every queue this member consumes: where its
pull loop stands, what is outstanding (the :class:`~equeue.consumer.offsets.OffsetWindow`,
what may be committed), whether it is paused (for flow control, or held by the
application: :meth:`equeue.consumer.AsyncConsumer.pause`), and what is in the hands of
handlers. Leases are ``(topic, queue id)`` tuples; the wire carries them as
``"topic/queue"`` strings, converted only at the edge (:func:`lease_name`,
:func:`parse_lease`).
"""

from __future__ import annotations

import trio

from equeue.consumer.offsets import OffsetWindow
from equeue.wire import PullRest

__all__ = ["Lease", "ProcessQueue", "lease_name", "parse_lease"]

#: a queue of a topic: (topic, queue id)
Lease = tuple[str, int]


def lease_name(lease: Lease) -> str:
    """The wire form of a lease: ``"topic/queue"``."""
    return f"{lease[0]}/{lease[1]}"


def parse_lease(name: str) -> Lease:
    """``"topic/queue"`` (as the broker sends it) → ``(topic, queue)``."""
    topic, _, q = name.rpartition("/")
    return topic, int(q)


class ProcessQueue:
    """What this member knows about one queue it consumes."""

    def __init__(self, topic: str, queue_id: int, *, retry: bool, batch: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.lease: Lease = (topic, queue_id)
        #: a queue of the group's retry topic (messages are presented as their origin)
        self.retry = retry
        #: for logs and statistics
        self.key = lease_name(self.lease)
        self.window = OffsetWindow(0)
        #: the start offset is known (committed offset or start_from resolved)
        self.started = False
        #: the last pull answer said nothing is left past what it returned (next offset
        #: at the queue's end, or nothing new): :class:`equeue.consumer.ending.EndWatch`
        self.at_end = False
        self.last_committed = -1
        #: one commit of this queue at a time (see :mod:`equeue.consumer.commit`)
        self.commit_lock = trio.Lock()
        self.buffered_bytes = 0
        self.peak_buffered = 0
        self.batch = batch
        #: the pull loop waits in :meth:`pause` (for flow control, or while held)
        self.paused = False
        self.resume = trio.Event()
        #: the application paused this queue's fetching (:meth:`hold`, :meth:`unhold`):
        #: the pull loop waits in :meth:`pause` until it is released, whatever the buffer
        self.held = False
        self.stopped = False
        self.scope = trio.CancelScope()
        #: bumped by :meth:`seek`: a pull answer of an older epoch is dropped
        self.epoch = 0
        #: what the last pull answer held past the messages delivered from it (whole
        #: stored batches come back): the next pull is served from it, without a round
        #: trip, when it starts where that one ended (:func:`equeue.wire.decode_pull_rest`)
        self.kept: PullRest | None = None
        #: the pull in flight (:meth:`seek` cancels it)
        self.pull_scope: trio.CancelScope | None = None
        #: messages handed to handlers and not finished
        self.inflight = 0
        #: the highest offset handed to a handler: on stop or revoke only the chunk holding
        #: it may end early (a lower chunk ending early would leave handled messages above
        #: an undone one, to be handled again by the next owner)
        self.taken_top = -1
        #: orderly mode: a worker is handling this queue
        self.busy = False
        #: the lease is not confirmed at the queue's broker group now (its leader died or
        #: changed): nothing buffered is handed out until a pull or a heartbeat answered
        #: there confirms it (another member may hold it at a new leader)
        self.suspended = False
        #: rebalance listeners (:class:`equeue.consumer.assignments.Assignments`): the
        #: queue was handed to the application (its ``on_assigned`` called, or none is
        #: set), so its end is announced too (``on_revoked`` or ``on_lost``) ...
        self.announced = False
        #: ... set once that step is over (``on_assigned`` returned, or the queue was
        #: stopped before it): an end is announced only after it ...
        self.assigned = trio.Event()
        #: ... an end is being (or was) announced, by one callback only ...
        self.farewell = False
        #: ... and that callback returned
        self.farewell_done = trio.Event()

    def __repr__(self) -> str:
        return f"<ProcessQueue {self.key} next={self.window.end} outstanding={len(self.window)}>"

    def finish(self, offset: int, size: int, max_messages: int, max_bytes: int) -> None:
        """One message is done: advance the window, maybe resume pulling."""
        self.window.done(offset)
        self.buffered_bytes -= size
        if self.paused:
            self._maybe_resume(max_messages, max_bytes)

    def finish_many(self, offsets: list[int], size: int, max_messages: int, max_bytes: int) -> None:
        """Messages at ``offsets`` (``size`` body bytes in all) are done."""
        self.window.done_many(offsets)
        self.buffered_bytes -= size
        if self.paused:
            self._maybe_resume(max_messages, max_bytes)

    def full(self, max_messages: int, max_bytes: int) -> bool:
        """Flow control: too much is outstanding to pull more."""
        return len(self.window) >= max_messages or self.buffered_bytes >= max_bytes

    async def pause(self) -> None:
        """Wait until enough outstanding messages are done and the queue is not held
        (or the queue stops)."""
        self.paused = True
        self.resume = trio.Event()
        await self.resume.wait()

    def _maybe_resume(self, max_messages: int, max_bytes: int) -> None:
        """A paused queue pulls again once it is down to half its limits (hysteresis:
        resuming at the limit would pull a message or two per round trip whenever the
        handlers are the bottleneck, which costs far more per message than a batch).
        A held queue stays paused whatever its buffer (:meth:`unhold` looks again)."""
        if self.held:
            return
        if len(self.window) <= max_messages // 2 and self.buffered_bytes <= max_bytes // 2:
            self.paused = False
            self.resume.set()

    def hold(self) -> None:
        """The application paused fetching: the pull loop pulls nothing more from its
        next turn on (it drops the answer of a pull in flight, whose messages are pulled
        again once released). What is buffered is still handed out, and finishes."""
        self.held = True

    def unhold(self, max_messages: int, max_bytes: int) -> None:
        """Fetching may go on (idempotent): the pull loop resumes where it stood, at
        once, or -- when the buffer is still above half its limits -- as flow control
        would, once enough of it is done."""
        self.held = False
        if self.paused:
            self._maybe_resume(max_messages, max_bytes)

    def seek(self, offset: int, dropped: list[int], size: int, max_messages: int, max_bytes: int) -> None:
        """The next pull starts at ``offset`` (the application's seek): ``dropped``
        (buffered, never handed out; ``size`` body bytes) leave the window as if done,
        a pull in flight is cancelled and its answer dropped. Messages handed out stay
        outstanding until done."""
        self.epoch += 1
        self.kept = None
        if dropped:
            self.window.forget(dropped)
            self.buffered_bytes -= size
            if self.paused:
                self._maybe_resume(max_messages, max_bytes)
        self.window.jump(offset)
        self.started = True  # a start offset still being resolved is not wanted any more
        self.at_end = False
        if self.pull_scope is not None:
            self.pull_scope.cancel()

    def stop(self) -> None:
        """Stop pulling (idempotent); buffered messages are dropped by the dispatcher."""
        self.stopped = True
        self.scope.cancel()
        self.resume.set()
