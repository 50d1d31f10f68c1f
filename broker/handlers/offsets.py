"""Offset requests: a queue's range, offset for a time, consumer offsets (commit,
query, reset).

An ephemeral group's offsets (``<name>#ephemeral``) are the group registry's, in
memory, never the store's: a commit or reset of one is answered at once, nothing is
written or replicated (docs/consumer.md, "Ephemeral groups")."""

from __future__ import annotations

from equeue import control
from equeue.broker.groups import GroupRegistry
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import check_offset
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import CommitOffsetOp, StoreReader
from equeue.errors import GroupHasMembers, NotQueueOwner, OffsetOutOfRange
from equeue.names import is_ephemeral, validate_group

__all__ = ["OffsetHandlers"]


class OffsetHandlers:
    def __init__(
        self, topics: TopicDirectory, store: StoreReader, submit: Submit, groups: GroupRegistry
    ) -> None:
        self._topics = topics
        self._store = store
        self._submit = submit
        self._groups = groups

    async def queue_offsets(
        self, req: control.QueueOffsets, ctx: RequestContext
    ) -> control.QueueStats:
        info = await self._topics.require_queue(req.topic, req.queue_id)
        q = self._store.queue_state(info.topic_id, req.queue_id)
        return control.QueueStats(
            req.queue_id, q.min_offset, q.next_offset, q.next_offset - q.min_offset, q.bytes
        )

    async def offset_for_time(
        self, req: control.OffsetForTime, ctx: RequestContext
    ) -> control.OffsetAnswer:
        info = await self._topics.require_queue(req.topic, req.queue_id)
        return control.OffsetAnswer(
            self._store.offset_for_time(info, req.queue_id, req.timestamp_ms)
        )

    async def commit_offset(self, req: control.CommitOffset, ctx: RequestContext) -> None:
        validate_group(req.group)
        info = await self._topics.require_queue(req.topic, req.queue_id)
        if req.consumer_id and not self._groups.holds(
            req.group, req.consumer_id, req.topic, req.queue_id
        ):
            raise NotQueueOwner(
                f"consumer {req.consumer_id} does not hold {req.topic}/{req.queue_id} in group {req.group}"
            )
        check_offset("offset", req.offset)
        # past the end would skip messages not yet written (Kafka and RocketMQ refuse
        # it too); the end only grows, so what passes here is still valid when written
        end = self._store.queue_state(info.topic_id, req.queue_id).next_offset
        if req.offset > end:
            raise OffsetOutOfRange(
                f"offset {req.offset} is past the end of {req.topic}/{req.queue_id}: its next offset is {end} "
                "(commit at most the end)"
            )
        # a member's commit never moves the group back (a stale hold's late commit)
        if is_ephemeral(req.group):  # in memory only; GroupNotFound once it has no member
            self._groups.commit_ephemeral(req.group, req.topic, req.queue_id, req.offset, bool(req.consumer_id))
            return
        await self._submit(CommitOffsetOp(req.group, req.topic, req.queue_id, req.offset, bool(req.consumer_id)))

    async def query_offset(
        self, req: control.QueryOffset, ctx: RequestContext
    ) -> control.OffsetAnswer:
        if self._topics.cluster is not None:  # offsets live with the queue's owner
            await self._topics.require_queue(req.topic, req.queue_id)
        if is_ephemeral(req.group):
            return control.OffsetAnswer(self._groups.ephemeral_offsets(req.group).get((req.topic, req.queue_id), -1))
        return control.OffsetAnswer(self._store.committed(req.group, req.topic, req.queue_id))

    async def reset_offsets(
        self, req: control.ResetOffsets, ctx: RequestContext
    ) -> control.ResetAnswer:
        validate_group(req.group)
        info = await self._topics.require(req.topic)
        ephemeral = is_ephemeral(req.group)
        if ephemeral:  # it exists only while it has members: GroupNotFound, else --force needed
            self._groups.ephemeral(req.group)
        if self._groups.live_members(req.group) and not req.force:
            raise GroupHasMembers(
                f"group {req.group!r} has live members; stop them first or pass --force"
            )
        cluster = self._topics.cluster
        owned = cluster.owned.get(req.topic, frozenset()) if cluster is not None else None
        out: dict[int, int] = {}
        for q in range(info.queues):
            if owned is not None and q not in owned:
                continue  # cluster mode: each owner group resets its own queues (the CLI fans out)
            qs = self._store.queue_state(info.topic_id, q)
            if req.to is control.ResetTarget.EARLIEST:
                off = qs.min_offset
            elif req.to is control.ResetTarget.LATEST:
                off = qs.next_offset
            else:  # TIME (the decoder admits nothing else)
                off = self._store.offset_for_time(info, q, req.timestamp_ms)
            out[q] = off
        for q, off in out.items():
            if ephemeral:
                self._groups.commit_ephemeral(req.group, req.topic, q, off, forward_only=False)
            else:
                await self._submit(CommitOffsetOp(req.group, req.topic, q, off))
        return control.ResetAnswer(out)
