"""Request handlers: one method per request code (EQueue's one-handler-per-code),
grouped by request family, one module each (produce, pull, topics, offsets,
membership, lookup, dead letters).

Each handler takes the request payload (control requests: the decoded model) and a
:class:`~broker.handlers.base.RequestContext`, and returns the response payload as
a list of byte pieces; raising an :class:`~equeue.errors.EQueueError` answers with
its code. Expected outcomes of a pull (no new message, offset too small...) are
statuses. Each family receives the collaborators it uses and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from broker.groups import GroupRegistry
from broker.handlers.base import (
    Closing,
    Limits,
    OpQueue,
    Parts,
    RequestContext,
    Submit,
    TopicDirectory,
)
from broker.handlers.dlq import DeadLetterHandlers
from broker.handlers.lookup import LookupHandlers
from broker.handlers.membership import GroupHandlers
from broker.handlers.offsets import OffsetHandlers
from broker.handlers.produce import ProduceHandler
from broker.handlers.pull import PullHandler
from broker.handlers.skips import SkipHandlers
from broker.handlers.topics import TopicHandlers
from broker.longpoll import ParkedPulls
from broker.stats import Counters
from broker.storage import StoreReader
from equeue import control
from equeue.errors import UnknownRequest
from equeue.protocol import RequestCode

__all__ = ["Closing", "Handler", "Handlers", "Limits", "RequestContext"]

#: a handler in the dispatch table; None = the writer thread answered (parked pulls)
Handler = Callable[[bytes, RequestContext], Awaitable[Parts | None]]


class Handlers:
    """The dispatch table over the request families."""

    def __init__(
        self, *, store: StoreReader, appender: OpQueue, submit: Submit, groups: GroupRegistry,
        parked: ParkedPulls, counters: Counters, closing: Closing, statistics: Callable[[], control.BrokerStats],
        limits: Limits,
    ) -> None:  # fmt: skip
        topics = TopicDirectory(store, submit, limits)
        #: the produce hot path (the connection calls ``prepare``/``answer`` directly)
        self.produce = ProduceHandler(topics, appender, counters, closing, limits)
        pull = PullHandler(topics, store, groups, parked, counters, closing, limits)
        t = TopicHandlers(topics, store, submit, limits)
        o = OffsetHandlers(topics, store, submit, groups)
        g = GroupHandlers(store, groups)
        lookup = LookupHandlers(topics, store)
        dlq = DeadLetterHandlers(topics, store, submit, limits)
        skips = SkipHandlers(topics, store, submit)
        self._statistics = statistics
        self.table: dict[int, Handler] = {
            RequestCode.PRODUCE: self.produce.handle,
            RequestCode.PULL: pull.handle,
        }
        control_handlers: dict[type, Callable[[Any, RequestContext], Awaitable[Any]]] = {
            control.CreateTopic: t.create_topic,
            control.DeleteTopic: t.delete_topic,
            control.AlterTopic: t.alter_topic,
            control.ListTopics: t.list_topics,
            control.GetRoute: t.get_route,
            control.DescribeTopic: t.describe_topic,
            control.QueueOffsets: o.queue_offsets,
            control.OffsetForTime: o.offset_for_time,
            control.CommitOffset: o.commit_offset,
            control.QueryOffset: o.query_offset,
            control.ResetOffsets: o.reset_offsets,
            control.Heartbeat: g.heartbeat,
            control.LeaveGroup: g.leave_group,
            control.ReleaseQueues: g.release_queues,
            control.ListGroups: g.list_groups,
            control.DescribeGroup: g.describe_group,
            control.Stats: self.stats,
            control.GetMessage: lookup.get_message,
            control.FindByKey: lookup.find_by_key,
            control.SendBack: dlq.send_back,
            control.DlqList: dlq.list_letters,
            control.DlqResend: dlq.resend,
            control.SkipMessage: skips.skip_message,
            control.ListSkipped: skips.list_skipped,
        }
        for code, cls in control.REQUEST_TYPES.items():
            self.table[code] = self._control(cls, control_handlers[cls])

    @staticmethod
    def _control(cls: type, fn: Callable[[Any, RequestContext], Awaitable[Any]]) -> Handler:
        async def handle(payload: bytes, ctx: RequestContext) -> Parts:
            result = await fn(control.decode(payload, cls), ctx)
            if isinstance(result, list) and result and isinstance(result[0], bytes):
                return result
            return [control.encode(result)] if result is not None else [b"{}"]

        return handle

    async def dispatch(self, code: int, payload: bytes, ctx: RequestContext) -> Parts | None:
        """Answer one request; None when the writer thread already answered it."""
        fn = self.table.get(code)
        if fn is None:
            raise UnknownRequest(f"unknown request code {code}")
        return await fn(payload, ctx)

    async def stats(self, req: control.Stats, ctx: RequestContext) -> control.BrokerStats:
        return self._statistics()
