"""Corruption requests (admin): skip a record consumers cannot get past, list the
skipped ones."""

from __future__ import annotations

import logging

from equeue import control
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import check_offset
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import StoreReader
from equeue.broker.storage.skips import SkipRecordOp

__all__ = ["SkipHandlers"]

log = logging.getLogger("equeue.broker")


class SkipHandlers:
    def __init__(self, topics: TopicDirectory, store: StoreReader, submit: Submit) -> None:
        self._topics = topics
        self._store = store
        self._submit = submit

    async def skip_message(self, req: control.SkipMessage, ctx: RequestContext) -> control.SkipAnswer:
        """Stop serving one record (a skip marker, committed before the answer).
        Raises TopicNotFound, QueueNotFound, BadRequest, MessageNotFound."""
        await self._topics.require_queue(req.topic, req.queue_id)
        check_offset("queue_offset", req.queue_offset)
        ans: control.SkipAnswer = await self._submit(SkipRecordOp(req.topic, req.queue_id, req.queue_offset))
        if not ans.already_skipped:  # an admin action: one line each (audit)
            log.warning(
                "skipped the record at %s/%d offset %d on request (%s)",
                req.topic, req.queue_id, req.queue_offset, ans.problem or "it reads intact",
            )  # fmt: skip
        return ans

    async def list_skipped(self, req: control.ListSkipped, ctx: RequestContext) -> control.SkippedAnswer:
        """The skipped offsets of a topic, by queue. Raises TopicNotFound."""
        info = await self._topics.require(req.topic)
        view = self._store.view
        return control.SkippedAnswer(
            {q: sorted(offs) for q in range(info.queues) if (offs := view.skips(info.topic_id, q))}
        )
