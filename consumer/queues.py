"""Per-queue state of a consumer (EQueue's ``ProcessQueue``) and its pull loop.

One :class:`ProcessQueue` exists for every queue this member consumes. Its pull loop
long-polls the broker, hands batches to the dispatcher, and pauses while too much is
buffered (flow control). The :class:`~consumer.offsets.OffsetWindow` tracks what may
be committed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from consumer.decode import decode_pull
from consumer.offsets import OffsetWindow
from equeue import wire
from equeue.errors import EQueueError, NotQueueOwner, QueueNotFound, TopicNotFound
from equeue.models import Message
from equeue.protocol import PullStatus, RequestCode

if TYPE_CHECKING:
    from consumer.core import AsyncConsumer

log = logging.getLogger("equeue.consumer")

__all__ = ["ProcessQueue"]

MAX_PULL_BYTES = 4 << 20


class ProcessQueue:
    """What this member knows about one queue it consumes."""

    def __init__(self, topic: str, queue_id: int, *, retry: bool, batch: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        #: a queue of the group's retry topic (messages are presented as their origin)
        self.retry = retry
        self.key = f"{topic}/{queue_id}"
        self.window = OffsetWindow(0)
        #: the start offset is known (committed offset or start_from resolved)
        self.started = False
        self.last_committed = -1
        self.commit_lock = trio.Lock()
        self.buffered_bytes = 0
        self.peak_buffered = 0
        self.batch = batch
        self.paused = False
        self.resume = trio.Event()
        self.stopped = False
        self.scope = trio.CancelScope()
        #: messages handed to handlers and not finished
        self.inflight = 0
        #: the highest offset handed to a handler: on stop or revoke only the chunk holding
        #: it may end early (a lower chunk ending early would leave handled messages above
        #: an undone one, to be handled again by the next owner)
        self.taken_top = -1
        #: orderly mode: a worker is handling this queue
        self.busy = False

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

    def _maybe_resume(self, max_messages: int, max_bytes: int) -> None:
        """A paused queue pulls again once it is down to half its limits (hysteresis:
        resuming at the limit would pull a message or two per round trip whenever the
        handlers are the bottleneck, which costs far more per message than a batch)."""
        if len(self.window) <= max_messages // 2 and self.buffered_bytes <= max_bytes // 2:
            self.paused = False
            self.resume.set()

    def stop(self) -> None:
        """Stop pulling (idempotent); buffered messages are dropped by the dispatcher."""
        self.stopped = True
        self.scope.cancel()
        self.resume.set()


async def pull_loop(
    c: AsyncConsumer,
    q: ProcessQueue,
    initial_offset: Callable[[ProcessQueue], Awaitable[int]],
    deliver: Callable[[ProcessQueue, list[Message], int], None],
) -> None:
    """Long-poll one queue until it is stopped: resolve the start offset, then pull,
    deliver, and pause while the queue holds too much (flow control).

    Lease loss (NotQueueOwner) ends the loop and tells the consumer; transient
    errors are retried with backoff.
    """
    o = c.options
    hold_ms = int(o.pull_hold * 1000)
    group = c.group if o.mode == "clustering" else ""
    cid = c.consumer_id if o.mode == "clustering" else ""
    tags = "" if q.retry else (o.tags or "")
    request = c.client.request
    verify = o.verify_checksums
    backoff = 0.05
    with q.scope:
        while not q.started:
            try:
                start = await initial_offset(q)
            except EQueueError as exc:
                log.warning("queue %s: cannot resolve start offset (%s); retrying", q.key, exc)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            q.window.jump(start)
            q.started = True
        backoff = 0.05
        overflows = 0
        while not q.stopped:
            outstanding = len(q.window)
            if outstanding >= o.max_buffered_messages or q.buffered_bytes >= o.max_buffered_bytes:
                q.paused = True
                q.resume = trio.Event()
                c.stats_paused += 1
                await q.resume.wait()
                continue
            n = min(q.batch, o.max_buffered_messages - outstanding)
            offset = q.window.end
            req = wire.PullRequest(q.topic, q.queue_id, offset, n, MAX_PULL_BYTES, hold_ms, group, cid, tags)
            try:
                payload = await request(RequestCode.PULL, req.encode())
                status, lo, hi, nxt, msgs = decode_pull(q.topic, payload, verify)
            except NotQueueOwner:
                c.lease_lost(q)
                return
            except (TopicNotFound, QueueNotFound) as exc:
                log.warning("queue %s: %s", q.key, exc)
                await trio.sleep(o.rebalance_interval)
                continue
            except EQueueError as exc:
                if not exc.transient:
                    log.error("queue %s: pull failed: %s", q.key, exc)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            if q.stopped:
                return
            if msgs:
                deliver(q, msgs, nxt)
                if len(msgs) >= n:
                    q.batch = min(q.batch * 2, o.max_pull_batch)
                else:
                    q.batch = o.pull_batch
                    # Caught up (a short answer): let the worker woken by deliver run
                    # the handler first -- it runs in the next scheduling batch; two
                    # checkpoints put the next pull behind it whatever order trio
                    # picks in that batch. The pull would park at the broker anyway.
                    await trio.lowlevel.checkpoint()
                    await trio.lowlevel.checkpoint()
            elif status is PullStatus.NO_NEW_MESSAGE:
                q.window.advance(nxt)
            elif status is PullStatus.OFFSET_TOO_SMALL:
                log.warning(
                    "queue %s: offset %d is below the lowest retained offset %d (messages lost "
                    "to retention); moving to %d", q.key, offset, lo, lo,
                )  # fmt: skip
                q.window.jump(lo)
            elif status is PullStatus.OFFSET_OVERFLOW:
                # past the end: usually a topic recreated or data lost; retry a few times
                # first, so a momentarily stale answer never rewinds (and duplicates)
                overflows += 1
                if overflows < 3:
                    await trio.sleep(0.05 * overflows)
                    continue
                log.warning("queue %s: offset %d is past the end %d; moving to %d", q.key, offset, hi, hi)
                q.window.jump(hi)
            if status is not PullStatus.OFFSET_OVERFLOW:
                overflows = 0
