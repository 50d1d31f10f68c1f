"""Lookup requests: one message by position, messages by key."""

from __future__ import annotations

from broker.handlers.base import Parts, RequestContext, TopicDirectory, check_offset, check_queue
from broker.storage import StoreReader
from equeue import control, wire
from equeue.errors import MessageNotFound
from equeue.protocol import PullStatus

__all__ = ["LookupHandlers"]


class LookupHandlers:
    def __init__(self, topics: TopicDirectory, store: StoreReader) -> None:
        self._topics = topics
        self._store = store

    async def get_message(self, req: control.GetMessage, ctx: RequestContext) -> Parts:
        store = self._store
        if req.global_offset >= 0:
            check_offset("global_offset", req.global_offset)
            rec = store.get_global(req.global_offset)
            if rec is None:
                raise MessageNotFound(
                    f"no message at global offset {req.global_offset} (deleted or never written)"
                )
            hit = (req.global_offset, rec)
            topic_id = wire.record_header(rec, verify=False).topic_id
            name = next((t.name for t in store.topics.values() if t.topic_id == topic_id), "")
            if req.topic and name != req.topic:  # name "" = its topic was deleted
                raise MessageNotFound(
                    f"global offset {req.global_offset} belongs to topic {name!r}"
                )
        else:
            info = await self._topics.require(req.topic)
            check_queue(info, req.queue_id)
            check_offset("queue_offset", req.queue_offset)
            found = store.get_queue_offset(info, req.queue_id, req.queue_offset)
            if found is None:
                qs = store.queue_state(info.topic_id, req.queue_id)
                raise MessageNotFound(
                    f"no message at {req.topic}/{req.queue_id} offset {req.queue_offset} "
                    f"(retained range [{qs.min_offset}, {qs.next_offset}))"
                )
            hit = found
        wire.record_header(hit[1])  # verify the checksum
        return wire.encode_pull_response(PullStatus.FOUND, 0, 0, 0, [hit])

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
        found = self._store.find_by_key(info, req.key, max(1, min(req.limit, 1000)), req.before)
        if found.hits:
            status = PullStatus.FOUND
        else:
            status = PullStatus.NO_MATCHED_MSG if found.resume_before else PullStatus.NO_NEW_MESSAGE
        return wire.encode_pull_response(status, 0, 0, found.resume_before, found.hits)
