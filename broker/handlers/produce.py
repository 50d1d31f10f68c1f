"""PRODUCE: decode, validate and queue a batch for the appender; answer once it
committed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from equeue import wire
from equeue.broker.auth import Authorizer
from equeue.broker.handlers.context import Closing, Parts, RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.roles import ReplicaGate
from equeue.broker.handlers.writes import OpQueue
from equeue.broker.stats import Counters
from equeue.broker.storage import ProduceOp
from equeue.errors import (
    BadRequest,
    BrokerShuttingDown,
    QueueNotFound,
    ReservedTopic,
    TopicNotFound,
    TopicPaused,
)
from equeue.protocol import RequestCode

__all__ = ["ProduceHandler"]

_PRODUCE = int(RequestCode.PRODUCE)  # a plain int: no enum lookup on the hot path


class ProduceHandler:
    """The produce hot path (:meth:`prepare` + :meth:`answer`, no task) and the
    general path (:meth:`handle`, which may create the topic first)."""

    def __init__(
        self,
        topics: TopicDirectory,
        appender: OpQueue,
        counters: Counters,
        closing: Closing,
        limits: Limits,
        authorizer: Authorizer | None = None,
        replica: ReplicaGate | None = None,
        paused_topics: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self._topics = topics
        #: the topics an operator paused (:class:`equeue.broker.pauses.Pauses`)
        self._paused_topics = paused_topics
        #: the replica role's produce check (None: standalone, one ``is None`` here)
        self._replica_check = None if replica is None else replica.check_produce
        #: the cluster role (None: standalone, which costs one ``is None`` here)
        self._cluster = topics.cluster
        self._authorizer = authorizer
        self._appender = appender
        self._counters = counters
        self._closing = closing
        self._max_body = limits.max_message_bytes
        self._max_delay_ms = limits.max_delay_ms

    def prepare(self, payload: bytes, principal: str | None = None, *, defer: bool = False) -> Any:
        """Decode, validate and enqueue a produce request at once, without a
        checkpoint, so one connection's requests commit in arrival order (pipelined
        batches of a producer then never reach the appender swapped). ``defer``: the
        caller calls :meth:`kick` before its next checkpoint (``Appender.enqueue``).

        Returns the appender's pending op, or None when the topic does not exist
        yet (the async :meth:`handle` path creates it). Raises EQueueError for bad
        requests, NotAuthorized when ``principal`` (None: no authentication) may not
        produce to the topic, TopicPaused when an operator paused it; on a replica,
        NotLeader when it does not lead its group and NotEnoughReplicas when its ISR is
        below --min-insync (nothing written).
        """
        req = wire.ProduceRequest.decode(payload)
        if principal is not None:
            self._authorizer.check(principal, _PRODUCE, req)  # type: ignore[union-attr]
        if self._closing.closing:
            raise BrokerShuttingDown("the broker is shutting down")
        if self._replica_check is not None:  # a replica: NotLeader, NotEnoughReplicas
            self._replica_check()
        if req.topic[:1] == "%":  # internal topics are written by the broker only
            raise ReservedTopic(
                f"{req.topic!r} is an internal topic: only the broker writes it "
                "(retries go through SEND_BACK, resends through DLQ_RESEND)"
            )
        if req.topic in self._paused_topics():
            raise TopicPaused(
                f"topic {req.topic!r} is paused: its produce is refused until an operator resumes it "
                f"(equeue topic resume {req.topic})"
            )
        info = self._topics.get(req.topic)
        if info is None:
            return None
        cluster = self._cluster
        if cluster is not None:  # one dict lookup and one set test on the owned path
            owned = cluster.owned.get(req.topic)
            if owned is None or req.queue_id >= info.queues:
                return None  # the view or the local store lags etcd: the async path waits
            if req.queue_id not in owned:
                cluster.refuse(req.topic, req.queue_id)  # raises NotOwner / QueueUnavailable
        if not 0 <= req.queue_id < info.queues:
            raise QueueNotFound(
                f"topic {info.name!r} has {info.queues} queues; no queue {req.queue_id} "
                f"(queue count: {info.queues})"
            )
        if not req.entries:
            raise BadRequest("empty produce batch")
        op = ProduceOp(
            info,
            req.queue_id,
            req.entries,
            req.producer_id,
            req.base_sequence,
            self._max_body,
            self._max_delay_ms,
        )
        return self._appender.enqueue(op, defer=defer)

    def kick(self) -> None:
        """Commit the requests prepared with ``defer`` (``Appender.kick``)."""
        self._appender.kick()

    def answer(self, answer: wire.ProduceResponse, nbytes: int) -> Parts:
        """The answer payload of a committed produce (and its statistics)."""
        self._counters.messages_in += answer.stored
        self._counters.bytes_in += nbytes
        return [answer.encode()]

    async def prepare_missing(self, payload: bytes, principal: str | None = None, *, defer: bool = False) -> Any:
        """What :meth:`prepare` does for a request it returned None for: auto-creates
        the missing topic first (cluster mode: in etcd, or learns a topic the view has
        not seen yet, and waits for the local store), then enqueues the request.

        Returns the appender's pending op. Raises what :meth:`prepare` raises, and
        TopicNotFound (no auto-create, or deleted meanwhile), QueueNotFound,
        NotAuthorized (auto-create without the ``admin`` permission), ClusterUnavailable.
        """
        req = wire.ProduceRequest.decode(payload)
        info = await self._topics.require(req.topic, auto_create=req.auto_create, principal=principal)
        if self._cluster is not None and req.queue_id >= info.queues:
            await self._cluster.require(req.topic, None)  # a grow the store has not applied yet
        pending = self.prepare(payload, principal, defer=defer)
        if pending is None:
            if self._cluster is not None and req.topic in self._cluster.owned:
                raise QueueNotFound(f"topic {req.topic!r} has no queue {req.queue_id}")
            raise TopicNotFound(f"topic {req.topic!r} was deleted")
        return pending

    async def handle(self, payload: bytes, ctx: RequestContext) -> Parts:
        """The general path: :meth:`prepare`, or :meth:`prepare_missing` when the topic
        must be created or learned first; then the answer once committed."""
        pending = self.prepare(payload, ctx.principal)
        if pending is None:
            pending = await self.prepare_missing(payload, ctx.principal)
        return self.answer(await self._appender.wait(pending), len(payload))
