"""Offsets: where a queue starts, and committing how far it is done.

Clustering: offsets live on the broker, per group (a commit is refused with
NOT_QUEUE_OWNER once this member no longer holds the queue: reported as
:attr:`CommitStatus.LEASE_LOST`). Broadcast: in this member's
:class:`~equeue.consumer.broadcast_store.BroadcastOffsetStore`. What is committed is the
queue's :meth:`~equeue.consumer.offsets.OffsetWindow.committable` offset, only when it moved,
and one commit of a queue at a time: the broker handles requests concurrently, so a
periodic commit still on its way could otherwise land after (and undo) the final one
of a revoke or a close.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import trio

from equeue import control
from equeue.consumer.broadcast_store import BroadcastOffsetStore
from equeue.consumer.options import ConsumerOptions, StartFrom
from equeue.consumer.process_queue import ProcessQueue
from equeue.errors import NotQueueOwner
from equeue.times import epoch_ms

__all__ = ["CommitStatus", "Committer"]


class CommitStatus(enum.Enum):
    OK = "ok"
    #: the broker says this member no longer holds the queue
    LEASE_LOST = "lease lost"


class OffsetClient(Protocol):
    """The client calls offsets need."""

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, consumer_id: str = "") -> Awaitable[None]: ...

    def query_offset(self, group: str, topic: str, queue_id: int) -> Awaitable[int]: ...

    def queue_offsets(self, topic: str, queue_id: int) -> Awaitable[control.QueueStats]: ...

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> Awaitable[int]: ...


class Committer:
    """Start offsets and commits of one member (``store``: broadcast mode)."""

    def __init__(
        self, client: OffsetClient, group: str, consumer_id: str, options: ConsumerOptions,
        store: BroadcastOffsetStore | None, regain: Callable[[], Awaitable[None]] | None = None,
    ) -> None:  # fmt: skip
        #: a heartbeat round, waited for: a commit refused with NOT_QUEUE_OWNER is made
        #: once more after it (the broker may be a new leader that has not seen this
        #: member yet: :meth:`equeue.consumer.rebalance.Coordinator.heartbeat_now`)
        self.regain = regain
        self.client = client
        self.group = group
        self.consumer_id = consumer_id
        self.options = options
        self.store = store

    async def start_offset(self, q: ProcessQueue) -> int:
        """Where ``q`` starts: its committed offset, else ``start_from`` resolved (then
        committed at the next commit)."""
        if self.store is not None:
            off = self.store.get(q.topic, q.queue_id)
        else:
            off = await self.client.query_offset(self.group, q.topic, q.queue_id)
        if off >= 0:
            q.last_committed = off
            return off
        start = self.options.start_from
        if q.retry or start == StartFrom.EARLIEST:
            off = (await self.client.queue_offsets(q.topic, q.queue_id)).min_offset
        elif start == StartFrom.LATEST:
            off = (await self.client.queue_offsets(q.topic, q.queue_id)).max_offset
        else:
            assert isinstance(start, dt.datetime)
            # a naive datetime is UTC (equeue.times: the one rule, as deliver_at's)
            off = await self.client.offset_for_time(q.topic, q.queue_id, max(0, epoch_ms(start)))
        q.last_committed = -1  # commit the resolved start at the next commit
        return off

    async def commit(self, q: ProcessQueue) -> CommitStatus:
        """Commit ``q``'s committable offset if it moved (clustering; never with
        ``commit_offsets`` off)."""
        if not q.started or self.store is not None or not self.options.commit_offsets:
            return CommitStatus.OK
        async with q.commit_lock:
            off = q.window.committable()
            if off == q.last_committed:
                return CommitStatus.OK
            try:
                await self.client.commit_offset(self.group, q.topic, q.queue_id, off, self.consumer_id)
            except NotQueueOwner:
                if self.regain is None:
                    return CommitStatus.LEASE_LOST
                await self.regain()
                try:
                    await self.client.commit_offset(self.group, q.topic, q.queue_id, off, self.consumer_id)
                except NotQueueOwner:
                    return CommitStatus.LEASE_LOST
            q.last_committed = off
        return CommitStatus.OK

    async def save_local(self, queues: Iterable[ProcessQueue]) -> None:
        """Broadcast: save the committable offsets that moved to the local store (never
        with ``commit_offsets`` off)."""
        assert self.store is not None
        if not self.options.commit_offsets:
            return
        updates = {}
        for q in queues:
            if q.started:
                off = q.window.committable()
                if off != q.last_committed:
                    updates[(q.topic, q.queue_id)] = off
                    q.last_committed = off
        if updates:
            await trio.to_thread.run_sync(self.store.save, updates)
