"""Lookup requests: one message by position, messages by key."""

from __future__ import annotations

import logging

from equeue import control, wire
from equeue.broker.handlers.context import Parts, RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import check_offset
from equeue.broker.storage import StoreReader
from equeue.broker.storage.reader import MAX_RECORDS_LEN, corrupt_log
from equeue.errors import CorruptRecord, MessageNotFound
from equeue.protocol import PullStatus
from equeue.wire import batches

__all__ = ["LookupHandlers"]


class LookupHandlers:
    def __init__(self, topics: TopicDirectory, store: StoreReader, answer_bytes: int = 1 << 62) -> None:
        self._topics = topics
        self._store = store
        #: the records one FIND_BY_KEY answer may carry (it must fit in a frame)
        self._answer_bytes = answer_bytes

    async def get_message(self, req: control.GetMessage, ctx: RequestContext) -> Parts:
        """One record by (topic, queue, queue offset) or by global offset.

        The record is checked against the position asked for: its checksum, and its
        header against the index (a queue-offset read: the header names that queue
        offset; a global-offset read: the index maps the header's position back to
        that global offset). A mismatch is CORRUPT_RECORD naming the position (and a
        rate-limited log line), never another message. A record an operator skipped
        is MESSAGE_NOT_FOUND."""
        store = self._store
        if req.global_offset >= 0:
            hit = self._by_global(req)
        else:
            info = await self._topics.require_queue(req.topic, req.queue_id)
            check_offset("queue_offset", req.queue_offset)
            found = store.get_queue_offset(info, req.queue_id, req.queue_offset)  # checks, logs
            if found is None:
                qs = store.queue_state(info.topic_id, req.queue_id)
                skipped = req.queue_offset in store.view.skips(info.topic_id, req.queue_id)
                raise MessageNotFound(
                    f"no message at {req.topic}/{req.queue_id} offset {req.queue_offset} "
                    + ("(skipped by an operator: equeue message skip)" if skipped else
                       f"(retained range [{qs.min_offset}, {qs.next_offset}))")
                )  # fmt: skip
            hit = wire.masked_entry(found.global_base, found.value, found.index)
        return wire.encode_pull_batches(PullStatus.FOUND, 0, 0, 0, [hit])

    def _by_global(self, req: control.GetMessage) -> tuple[int, bytes, bytes]:
        store = self._store
        check_offset("global_offset", req.global_offset)
        found = store.get_global(req.global_offset)
        if found is None:
            raise MessageNotFound(f"no message at global offset {req.global_offset} (deleted or never written)")
        try:
            h = batches.stored_head(found.value)
            batches.batch_head(batches.stored_batch(found.value), MAX_RECORDS_LEN)
        except CorruptRecord as exc:
            raise _corrupt(f"corrupt record at global offset {req.global_offset}: {exc}") from exc
        queue_offset = h.base_offset + found.index
        info = next((t for t in store.topics.values() if t.topic_id == h.topic_id), None)
        name = info.name if info is not None else ""  # "" = its topic was deleted
        if req.topic and name != req.topic:
            raise MessageNotFound(f"global offset {req.global_offset} belongs to topic {name!r}")
        if not store.global_position_ok(found, h):
            raise _corrupt(
                f"corrupt record at global offset {req.global_offset}: its header names topic "
                f"{name or h.topic_id!r} queue {h.queue_id} offset {queue_offset}, which the "
                "queue index does not map to it"
            )
        if queue_offset in store.view.skips(h.topic_id, h.queue_id):
            raise MessageNotFound(
                f"the message at global offset {req.global_offset} ({name}/{h.queue_id} offset "
                f"{queue_offset}) was skipped by an operator (equeue message skip)"
            )
        try:
            return wire.masked_entry(found.global_base, found.value, found.index)
        except CorruptRecord as exc:
            raise _corrupt(f"corrupt record at global offset {req.global_offset}: {exc}") from exc

    async def find_by_key(self, req: control.FindByKey, ctx: RequestContext) -> Parts:
        """Messages with the key, newest first. The hash-index walk is bounded by the
        store's scan budget (crc32-colliding keys share the walk): when it runs out,
        the answer's ``next_offset`` is the global offset below which candidates were
        not examined (FindByKey's ``before`` resumes there), and with no hit at all
        the status is NO_MATCHED_MSG. ``next_offset`` 0: the walk was complete.
        Raises BadRequest for a ``before`` outside -1 and 0..2^64-1."""
        info = await self._topics.require(req.topic)
        if req.before != -1:
            check_offset("before", req.before)
        found = self._store.find_by_key(
            info, req.key, max(1, min(req.limit, 1000)), req.before, self._answer_bytes
        )
        if found.hits:
            status = PullStatus.FOUND
        else:
            status = PullStatus.NO_MATCHED_MSG if found.resume_before else PullStatus.NO_NEW_MESSAGE
        hits = [wire.masked_entry(h.global_base, h.value, h.index) for h in found.hits]
        return wire.encode_pull_batches(status, 0, 0, found.resume_before, hits)


def _corrupt(message: str) -> CorruptRecord:
    """A CorruptRecord for a record reached by its global offset, logged (rate-limited)."""
    corrupt_log.log(logging.ERROR, "global", "%s", message)
    return CorruptRecord(message)
