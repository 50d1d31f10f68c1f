"""Request handlers: one method per request code (EQueue's one-handler-per-code).

Each handler takes the request payload and returns the response payload as a list
of byte pieces; raising an :class:`~equeue.errors.EQueueError` answers with its code.
Expected outcomes of a pull (no new message, offset too small...) are statuses.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from broker import storage as st
from equeue import control, wire
from equeue.errors import (
    BadRequest,
    BrokerShuttingDown,
    GroupHasMembers,
    MessageNotFound,
    NotQueueOwner,
    QueueNotFound,
    TopicNotFound,
    UnknownRequest,
)
from equeue.names import is_internal, validate_group, validate_topic
from equeue.protocol import PullStatus, RequestCode

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("equeue.handlers")

Parts = list[bytes]
Handler = Callable[[bytes, Any], Awaitable[Parts]]


class Handlers:
    """The broker's request handlers; ``ctx`` is the calling connection."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.table: dict[int, Handler] = {
            RequestCode.PRODUCE: self.produce,
            RequestCode.PULL: self._pull,
        }
        control_handlers: dict[type, Callable[[Any, Any], Awaitable[Any]]] = {
            control.CreateTopic: self.create_topic,
            control.DeleteTopic: self.delete_topic,
            control.AlterTopic: self.alter_topic,
            control.ListTopics: self.list_topics,
            control.GetRoute: self.get_route,
            control.DescribeTopic: self.describe_topic,
            control.QueueOffsets: self.queue_offsets,
            control.OffsetForTime: self.offset_for_time,
            control.CommitOffset: self.commit_offset,
            control.QueryOffset: self.query_offset,
            control.ResetOffsets: self.reset_offsets,
            control.Heartbeat: self.heartbeat,
            control.LeaveGroup: self.leave_group,
            control.ReleaseQueues: self.release_queues,
            control.ListGroups: self.list_groups,
            control.DescribeGroup: self.describe_group,
            control.Stats: self.stats,
            control.GetMessage: self.get_message,
            control.FindByKey: self.find_by_key,
        }
        for code, cls in control.REQUEST_TYPES.items():
            self.table[code] = self._control(cls, control_handlers[cls])

    def _control(self, cls: type, fn: Callable[[Any, Any], Awaitable[Any]]) -> Handler:
        async def handle(payload: bytes, ctx: Any) -> Parts:
            result = await fn(control.decode(payload, cls), ctx)
            if isinstance(result, list) and result and isinstance(result[0], bytes):
                return result
            return [control.encode(result)] if result is not None else [b"{}"]

        return handle

    async def dispatch(self, code: int, payload: bytes, ctx: Any) -> Parts:
        fn = self.table.get(code)
        if fn is None:
            raise UnknownRequest(f"unknown request code {code}")
        return await fn(payload, ctx)

    # ------------------------------------------------------------------ helpers
    @property
    def store(self) -> st.Store:
        return self.b.store

    async def _topic(self, name: str, auto_create: bool = False) -> control.TopicInfo:
        info = self.store.topics.get(name)
        if info is not None:
            return info
        validate_topic(name, allow_internal=True)
        # internal retry/DLQ topics are always created on first use
        if auto_create and (self.b.config.auto_create_topics or is_internal(name)):
            info = await self.b.appender.submit(
                st.CreateTopicOp(name, self.b.config.default_queues, exist_ok=True)
            )
            log.info("auto-created topic %s with %d queues", name, info.queues)
            return info  # type: ignore[no-any-return]
        raise TopicNotFound(f"no topic {name!r} (create it with: equeue topic create {name})")

    # ------------------------------------------------------------------ hot paths
    def produce_prepare(self, payload: bytes) -> Any:
        """Decode, validate and enqueue a produce request at once, without a
        checkpoint, so one connection's requests commit in arrival order (pipelined
        batches of a producer then never reach the appender swapped).

        Returns the appender's pending op, or None when the topic does not exist
        yet (the async :meth:`produce` path creates it). Raises EQueueError for bad
        requests.
        """
        req = wire.ProduceRequest.decode(payload)
        if self.b.closing:
            raise BrokerShuttingDown("the broker is shutting down")
        info = self.store.topics.get(req.topic)
        if info is None:
            return None
        if not 0 <= req.queue_id < info.queues:
            raise QueueNotFound(
                f"topic {info.name!r} has {info.queues} queues; no queue {req.queue_id} "
                f"(queue count: {info.queues})"
            )
        if not req.entries:
            raise BadRequest("empty produce batch")
        cfg = self.b.config
        op = st.ProduceOp(
            info, req.queue_id, req.entries, req.producer_id, req.base_sequence,
            cfg.max_message_bytes, int(cfg.max_delay * 1000),
        )  # fmt: skip
        return self.b.appender.enqueue(op)

    async def produce_finish(self, pending: Any, nbytes: int) -> Parts:
        """Wait for a prepared produce to commit; the answer payload."""
        return self.produce_answer(await self.b.appender.wait(pending), nbytes)

    def produce_answer(self, answer: wire.ProduceResponse, nbytes: int) -> Parts:
        """The answer payload of a committed produce (and its statistics)."""
        self.b.stats.messages_in += answer.stored
        self.b.stats.bytes_in += nbytes
        return [answer.encode()]

    async def produce(self, payload: bytes, ctx: Any) -> Parts:
        """The general path: auto-creates a missing topic first."""
        pending = self.produce_prepare(payload)
        if pending is None:
            req = wire.ProduceRequest.decode(payload)
            await self._topic(req.topic, auto_create=req.auto_create)
            pending = self.produce_prepare(payload)
            if pending is None:
                raise TopicNotFound(f"topic {req.topic!r} was deleted")
        return await self.produce_finish(pending, len(payload))

    async def pull(self, payload: bytes, ctx: Any, request_id: int = 0) -> Parts | None:
        """Answer a pull; park it (long-poll) while there is nothing to return.

        With a ``request_id`` and a connection that can take an answer from another
        thread (``ctx.answer_from_thread``), the appender's writer thread may answer
        the parked pull itself right after the commit that fed it; then this returns
        None and the caller sends nothing.
        """
        req = wire.PullRequest.decode(payload)
        info = await self._topic(req.topic)
        qid = req.queue_id
        if not 0 <= qid < info.queues:
            raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {qid}")
        if req.consumer_id and not self.b.groups.holds(req.group, req.consumer_id, req.topic, qid):
            raise NotQueueOwner(f"consumer {req.consumer_id} does not hold {req.topic}/{qid} in group {req.group}")
        tags = wire.parse_tag_filter(req.tags)
        max_messages = max(1, min(req.max_messages, 10_000))
        max_bytes = max(1, min(req.max_bytes, self.b.config.max_frame - 1024))
        verify = not req.flags & wire.PULL_CLIENT_VERIFIES
        encode = wire.encode_pull_response_packed if req.flags & wire.PULL_PACKED else wire.encode_pull_response_plain
        store = self.store
        r = store.read_queue(info, qid, req.offset, max_messages, max_bytes, tags, verify)
        offset = req.offset
        if r.status is PullStatus.NO_NEW_MESSAGE and r.next_offset > offset:
            offset = r.next_offset  # everything so far filtered out by tags
        if r.status is PullStatus.NO_NEW_MESSAGE and req.max_wait_ms > 0 and not self.b.closing:
            answer = None
            send = getattr(ctx, "answer_from_thread", None)
            if request_id and send is not None:

                def answer() -> tuple[int, int] | None:
                    # writer thread, after a commit to this queue; ``offset`` and
                    # ``info`` are read as they are now (the pull task is parked on
                    # them and does not change them meanwhile)
                    if not ctx.idle():
                        return None  # the writer task is busy: the loop answers
                    now = store.topics.get(req.topic)
                    if now is None or now.topic_id != info.topic_id or qid >= now.queues:
                        return None
                    got = store.read_queue(now, qid, offset, max_messages, max_bytes, tags, verify)
                    if got.status is not PullStatus.FOUND:
                        return None
                    parts = encode(got.status, got.min_offset, got.max_offset, got.next_offset, got.globals, got.recs)
                    size = send(request_id, parts)
                    return (len(got.recs), size) if size else None

            wait = min(req.max_wait_ms / 1000, self.b.config.max_pull_wait)
            with trio.move_on_after(wait):
                while r.status is PullStatus.NO_NEW_MESSAGE and not self.b.closing:
                    sent = await self.b.parked.wait(info.topic_id, qid, answer)
                    if sent is not None:
                        self.b.stats.messages_out += sent[0]
                        self.b.stats.bytes_out += sent[1]
                        return None
                    info = await self._topic(req.topic)
                    r = store.read_queue(info, qid, offset, max_messages, max_bytes, tags, verify)
                    if r.status is PullStatus.NO_NEW_MESSAGE:
                        offset = max(offset, r.next_offset)
        self.b.stats.messages_out += len(r.recs)
        return encode(r.status, r.min_offset, r.max_offset, r.next_offset, r.globals, r.recs)

    async def _pull(self, payload: bytes, ctx: Any) -> Parts:
        """``pull`` for the dispatch table: always answered through the caller."""
        parts = await self.pull(payload, ctx)
        assert parts is not None  # no request id: the writer thread never answers
        return parts

    # ------------------------------------------------------------------ topics
    async def create_topic(self, req: control.CreateTopic, ctx: Any) -> control.TopicInfo:
        validate_topic(req.name)
        self._check_queues(req.queues)
        return await self.b.appender.submit(  # type: ignore[no-any-return]
            st.CreateTopicOp(req.name, req.queues, req.retention_ms, req.retention_bytes, req.exist_ok)
        )

    def _check_queues(self, n: int) -> None:
        if not 1 <= n <= self.b.config.max_queues:
            raise BadRequest(f"queue count must be between 1 and {self.b.config.max_queues}, got {n}")

    async def delete_topic(self, req: control.DeleteTopic, ctx: Any) -> None:
        await self._topic(req.name)
        await self.b.appender.submit(st.DeleteTopicOp(req.name))

    async def alter_topic(self, req: control.AlterTopic, ctx: Any) -> control.TopicInfo:
        await self._topic(req.name)
        if req.queues is not None:
            self._check_queues(req.queues)
        return await self.b.appender.submit(  # type: ignore[no-any-return]
            st.AlterTopicOp(req.name, req.queues, req.retention_ms, req.retention_bytes)
        )

    async def list_topics(self, req: control.ListTopics, ctx: Any) -> list[control.TopicInfo]:
        return sorted(
            (t for t in self.store.topics.values() if req.include_internal or not is_internal(t.name)),
            key=lambda t: t.name,
        )

    async def get_route(self, req: control.GetRoute, ctx: Any) -> control.TopicInfo:
        return await self._topic(req.topic, auto_create=req.auto_create)

    async def describe_topic(self, req: control.DescribeTopic, ctx: Any) -> control.TopicDescription:
        await self._topic(req.name)
        return self.store.describe(req.name)

    # ------------------------------------------------------------------ offsets
    async def queue_offsets(self, req: control.QueueOffsets, ctx: Any) -> control.QueueStats:
        info = await self._topic(req.topic)
        self._check_queue(info, req.queue_id)
        q = self.store.queue_state(info.topic_id, req.queue_id)
        return control.QueueStats(req.queue_id, q.min_offset, q.next_offset, q.next_offset - q.min_offset, q.bytes)

    @staticmethod
    def _check_queue(info: control.TopicInfo, queue_id: int) -> None:
        if not 0 <= queue_id < info.queues:
            raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")

    async def offset_for_time(self, req: control.OffsetForTime, ctx: Any) -> control.OffsetAnswer:
        info = await self._topic(req.topic)
        self._check_queue(info, req.queue_id)
        return control.OffsetAnswer(self.store.offset_for_time(info, req.queue_id, req.timestamp_ms))

    async def commit_offset(self, req: control.CommitOffset, ctx: Any) -> None:
        validate_group(req.group)
        info = await self._topic(req.topic)
        self._check_queue(info, req.queue_id)
        if req.consumer_id and not self.b.groups.holds(req.group, req.consumer_id, req.topic, req.queue_id):
            raise NotQueueOwner(
                f"consumer {req.consumer_id} does not hold {req.topic}/{req.queue_id} in group {req.group}"
            )
        if req.offset < 0:
            raise BadRequest("offset must be >= 0")
        await self.b.appender.submit(st.CommitOffsetOp(req.group, req.topic, req.queue_id, req.offset))

    async def query_offset(self, req: control.QueryOffset, ctx: Any) -> control.OffsetAnswer:
        return control.OffsetAnswer(self.store.committed(req.group, req.topic, req.queue_id))

    async def reset_offsets(self, req: control.ResetOffsets, ctx: Any) -> control.ResetAnswer:
        validate_group(req.group)
        info = await self._topic(req.topic)
        if self.b.groups.live_members(req.group) and not req.force:
            raise GroupHasMembers(
                f"group {req.group!r} has live members; stop them first or pass --force"
            )
        out: dict[int, int] = {}
        for q in range(info.queues):
            qs = self.store.queue_state(info.topic_id, q)
            if req.to == "earliest":
                off = qs.min_offset
            elif req.to == "latest":
                off = qs.next_offset
            elif req.to == "time":
                off = self.store.offset_for_time(info, q, req.timestamp_ms)
            else:
                raise BadRequest(f"reset target must be earliest, latest or time, not {req.to!r}")
            out[q] = off
        for q, off in out.items():
            await self.b.appender.submit(st.CommitOffsetOp(req.group, req.topic, q, off))
        return control.ResetAnswer(out)

    # ------------------------------------------------------------------ groups
    async def heartbeat(self, req: control.Heartbeat, ctx: Any) -> control.HeartbeatAnswer:
        validate_group(req.group)
        counts: dict[str, int] = {}
        for t in req.topics:
            info = self.store.topics.get(t)
            if info is not None:
                counts[t] = info.queues
        return self.b.groups.heartbeat(req, getattr(ctx, "notify_group", None), counts)

    async def leave_group(self, req: control.LeaveGroup, ctx: Any) -> None:
        self.b.groups.leave(req.group, req.consumer_id)

    async def release_queues(self, req: control.ReleaseQueues, ctx: Any) -> None:
        self.b.groups.release(req.group, req.consumer_id, req.leases)

    async def list_groups(self, req: control.ListGroups, ctx: Any) -> list[control.GroupSummary]:
        names = set(self.b.groups.groups) | self.store.groups_of()
        out = []
        for name in sorted(names):
            members = self.b.groups.live_members(name)
            topics = sorted({t for m in members for t in m.topics} | {t for (t, _q) in self.store.group_offsets(name)})
            out.append(control.GroupSummary(name, len(members), topics))
        return out

    async def describe_group(self, req: control.DescribeGroup, ctx: Any) -> control.GroupDescription:
        members = self.b.groups.live_members(req.group)
        offsets = self.store.group_offsets(req.group)
        topics = {t for m in members for t in m.topics} | {t for (t, _q) in offsets}
        queues = []
        for t in sorted(topics):
            info = self.store.topics.get(t)
            if info is None:
                continue
            for q in range(info.queues):
                qs = self.store.queue_state(info.topic_id, q)
                committed = offsets.get((t, q), -1)
                base = committed if committed >= 0 else qs.min_offset
                gq = control.GroupQueue(
                    t, q, self.b.groups.owner(req.group, t, q), committed, qs.next_offset,
                    max(0, qs.next_offset - max(base, qs.min_offset)),
                )  # fmt: skip
                queues.append(gq)
        g = self.b.groups.groups.get(req.group)
        return control.GroupDescription(req.group, members, queues, g.generation if g else 0)

    # ------------------------------------------------------------------ admin
    async def stats(self, req: control.Stats, ctx: Any) -> control.BrokerStats:
        return self.b.statistics()

    # ------------------------------------------------------------------ lookup
    async def get_message(self, req: control.GetMessage, ctx: Any) -> Parts:
        if req.global_offset >= 0:
            rec = self.store.get_global(req.global_offset)
            if rec is None:
                raise MessageNotFound(f"no message at global offset {req.global_offset} (deleted or never written)")
            hit = (req.global_offset, rec)
            topic_id = wire.record_header(rec, verify=False).topic_id
            name = next((t.name for t in self.store.topics.values() if t.topic_id == topic_id), "")
            if req.topic and name != req.topic:  # name "" = its topic was deleted
                raise MessageNotFound(f"global offset {req.global_offset} belongs to topic {name!r}")
        else:
            info = await self._topic(req.topic)
            self._check_queue(info, req.queue_id)
            found = self.store.get_queue_offset(info, req.queue_id, req.queue_offset)
            if found is None:
                qs = self.store.queue_state(info.topic_id, req.queue_id)
                raise MessageNotFound(
                    f"no message at {req.topic}/{req.queue_id} offset {req.queue_offset} "
                    f"(retained range [{qs.min_offset}, {qs.next_offset}))"
                )
            hit = found
        wire.record_header(hit[1])  # verify the checksum
        return wire.encode_pull_response(PullStatus.FOUND, 0, 0, 0, [hit])

    async def find_by_key(self, req: control.FindByKey, ctx: Any) -> Parts:
        info = await self._topic(req.topic)
        hits = self.store.find_by_key(info, req.key, max(1, min(req.limit, 1000)))
        return wire.encode_pull_response(PullStatus.FOUND if hits else PullStatus.NO_NEW_MESSAGE, 0, 0, 0, hits)


def host_name() -> str:
    return socket.gethostname()


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
