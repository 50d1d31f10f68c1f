"""PULL: read a queue; park the pull (long-poll) while there is nothing to return.
A pull of a paused consumer group is held the same way, and answered NO_NEW_MESSAGE
at the offset it asked for when its hold ends before the group is resumed."""

from __future__ import annotations

import time

import trio

from equeue import wire
from equeue.broker.groups import GroupRegistry
from equeue.broker.handlers.context import Closing, Parts, RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import Limits
from equeue.broker.longpoll import ParkedPulls
from equeue.broker.pauses import Pauses
from equeue.broker.stats import Counters
from equeue.broker.storage import StoreReader
from equeue.broker.writer_answers import PullAnswer, delivered
from equeue.errors import BadRequest, CorruptRecord, NotQueueOwner
from equeue.protocol import PullStatus
from equeue.wire.batches import stored_head

__all__ = ["PullHandler"]


class PullHandler:
    def __init__(
        self, topics: TopicDirectory, store: StoreReader, groups: GroupRegistry, parked: ParkedPulls,
        counters: Counters, closing: Closing, limits: Limits, pauses: Pauses | None = None,
    ) -> None:  # fmt: skip
        self._topics = topics
        self._pauses = pauses
        self._store = store
        self._groups = groups
        self._parked = parked
        self._counters = counters
        self._closing = closing
        self._max_bytes = limits.max_frame - 1024
        self._max_frame = limits.max_frame
        #: the room for one batch entry (its 16-byte item, mask and stored batch) in an
        #: answer within the frame cap
        self._max_entry = limits.max_pull_entry
        self._max_wait = limits.max_pull_wait

    async def handle(self, payload: bytes, ctx: RequestContext) -> Parts | None:
        """Answer a pull; park it (long-poll) while there is nothing to return.

        A tag-filtered read is bounded by the store's scan budget: when it runs out
        with no match the answer is NO_MATCHED_MSG at once (never parked), with the
        offset the scan reached, and the consumer pulls again from there. A parked
        pull woken by a commit reads with the same budget.

        A parked pull's wait goes to ``counters.pull_wait_messages`` or
        ``counters.pull_wait_empty`` once it is answered (not when it fails).

        With a ``ctx.output`` (and a request id), the appender's writer thread may
        answer the parked pull itself right after the commit that fed it
        (:mod:`equeue.broker.writer_answers`); then this returns None and the caller sends
        nothing.
        """
        req = wire.PullRequest.decode(payload)
        if not req.flags & wire.PULL_BATCHES:
            raise BadRequest(
                "pull without the BATCHES flag (4): answers carry record batches "
                "(docs/protocol.md, pull answer); upgrade the client"
            )
        qid = req.queue_id
        info = await self._topics.require_queue(req.topic, qid)  # QueueNotFound, NotOwner
        if req.consumer_id and not self._groups.holds(req.group, req.consumer_id, req.topic, qid):
            raise NotQueueOwner(
                f"consumer {req.consumer_id} does not hold {req.topic}/{qid} in group {req.group}"
            )
        tags = wire.parse_tag_filter(req.tags)
        max_messages = max(1, min(req.max_messages, 10_000))
        # the answer fits the frame cap: batches plus their 16-byte items and masks (at
        # most one bit per record, a record at least 2 bytes) plus the head; the first
        # batch always goes (one too big for any answer is refused below)
        max_bytes = max(1, min(req.max_bytes, (self._max_bytes - 17 * max_messages) * 15 // 16))
        verify = not req.flags & wire.PULL_CLIENT_VERIFIES
        whole = bool(req.flags & wire.PULL_WHOLE_BATCHES)
        encode = wire.encode_pull_batches
        pauses = self._pauses
        if req.group and pauses is not None and pauses.group_paused(req.group):
            if not await self._held(pauses, req.group, req.max_wait_ms):
                # still paused: nothing is delivered and the offset stays where it was asked
                st = self._store.queue_state(info.topic_id, qid)
                return encode(PullStatus.NO_NEW_MESSAGE, st.min_offset, st.next_offset, req.offset, [])
            info = await self._topics.require_queue(req.topic, qid)
        store = self._store
        counters = self._counters
        r = store.read_queue(info, qid, req.offset, max_messages, max_bytes, tags, verify, whole)
        offset = req.offset
        if r.status is PullStatus.NO_NEW_MESSAGE and r.next_offset > offset:
            offset = r.next_offset  # everything up to the end filtered out by tags
        closing = self._closing
        if r.status is PullStatus.NO_NEW_MESSAGE and req.max_wait_ms > 0 and not closing.closing:
            answer = None
            if ctx.request_id and ctx.output is not None:
                answer = PullAnswer(
                    store,
                    ctx.output,
                    ctx.request_id,
                    info,
                    qid,
                    offset,
                    max_messages,
                    max_bytes,
                    tags,
                    verify,
                    encode,
                    whole,
                )
            parked_at = time.perf_counter()
            with trio.move_on_after(min(req.max_wait_ms / 1000, self._max_wait)):
                while r.status is PullStatus.NO_NEW_MESSAGE and not closing.closing:
                    sent = await self._parked.wait(info.topic_id, qid, answer)
                    if sent is not None:
                        counters.messages_out += sent[0]
                        counters.bytes_out += sent[1]
                        counters.pull_wait_messages.observe(time.perf_counter() - parked_at)
                        return None
                    if pauses is not None and req.group and pauses.group_paused(req.group):
                        # the group was paused while this pull was parked: it is held now
                        if not await self._held(pauses, req.group, req.max_wait_ms):
                            break
                    info = await self._topics.require(req.topic)
                    r = store.read_queue(info, qid, offset, max_messages, max_bytes, tags, verify, whole)
                    if r.status is PullStatus.NO_NEW_MESSAGE:
                        offset = max(offset, r.next_offset)
                        if answer is not None:
                            answer.info, answer.offset = info, offset
            waited = counters.pull_wait_messages if r.batches else counters.pull_wait_empty
            waited.observe(time.perf_counter() - parked_at)
        if r.batches and len(r.batches[0][1]) + len(r.batches[0][2]) > self._max_entry:
            # stored under a larger limit (an older broker): no answer could carry it,
            # so it is reported like a corrupt record, which consumers skip to their DLQ
            g, value, _ = r.batches[0]
            raise CorruptRecord(
                f"batch at {info.name}/{qid} offset {stored_head(value).base_offset} (global offset {g}) "
                f"is {len(value)} bytes: too big for any answer under the {self._max_frame}-byte frame cap"
            )
        counters.messages_out += delivered(r, offset)
        return encode(r.status, r.min_offset, r.max_offset, r.next_offset, r.batches)

    async def _held(self, pauses: Pauses, group: str, max_wait_ms: int) -> bool:
        """Hold a pull of paused ``group`` for its long-poll time at most (the broker's
        cap included); True when the group was resumed meanwhile (then it reads now)."""
        if max_wait_ms > 0 and not self._closing.closing:
            with trio.move_on_after(min(max_wait_ms / 1000, self._max_wait)):
                await pauses.wait_for(lambda: not pauses.group_paused(group) or self._closing.closing)
        return not pauses.group_paused(group)
