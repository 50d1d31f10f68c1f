"""PRODUCE: decode, validate and queue a batch for the appender; answer once it
committed.

Two ways in. The general path, :meth:`ProduceHandler.handle` (a request task: wait
for the commit, return the answer), and the hot path, a connection's
:class:`ProducePipeline`: the connection's reader feeds it each produce request as
it decodes it, without a task or a checkpoint, and the pipeline owns the rest of the
request's way -- queueing it *deferred* in the appender, committing what it deferred
(the "kick": the requests of one received chunk form one transaction, committed on
the loop when small with ``--flush async``, docs/storage.md "Inline commits"), and
staging the answer from the appender's commit callback.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import trio

from equeue import control, wire
from equeue.broker.appender import PendingOp
from equeue.broker.auth import Authorizer
from equeue.broker.handlers.context import Closing, Parts, RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.roles import ReplicaGate
from equeue.broker.stats import Counters
from equeue.broker.storage import ProduceOp, WriteOp
from equeue.codec import encode_response
from equeue.errors import (
    BadRequest,
    BrokerShuttingDown,
    CorruptRecord,
    ErrorCode,
    InvalidMessage,
    QueueNotFound,
    ReservedTopic,
    TopicNotFound,
    TopicPaused,
)
from equeue.protocol import RequestCode
from equeue.wire.batches import (
    BATCH_HEAD,
    ProducedRecords,
    batch_head,
    batch_records,
    decode_records,
    scan_produced,
)
from equeue.wire.entries import ENTRY_HEADER, pack_entry

__all__ = ["ErrorAnswer", "ProduceHandler", "ProducePipeline", "ProduceQueue", "Stage", "is_large"]

_PRODUCE = int(RequestCode.PRODUCE)  # a plain int: no enum lookup on the hot path
_OK = int(ErrorCode.OK)
_decode = wire.ProduceRequest.decode
#: the codec each compression setting stores with (None: as sent)
_CODECS = {s: control.stored_codec(s) for s in control.COMPRESSION_SETTINGS}
#: a producer batch announcing more records than this, or more bytes uncompressed than
#: :data:`LARGE_BATCH_BYTES`, is decompressed, decoded and checked in a worker thread
#: (:meth:`ProduceHandler.prepare_missing`), not on the loop: ~1.3 µs per record would
#: pause every other client (a 1 MiB batch of 10,000 small records: ~13 ms); smaller
#: ones (at most ~1.5 ms) stay on the loop, with no thread hand-off added
LARGE_BATCH_RECORDS = 1000
LARGE_BATCH_BYTES = 1 << 20
_HEAD = BATCH_HEAD.size


def is_large(batch: bytes) -> bool:
    """Whether ``batch`` is checked off the loop (its header's record count and
    uncompressed size, unchecked: a lying header is refused by the check itself)."""
    if len(batch) < _HEAD:
        return False
    _, _, count, _, records_len = BATCH_HEAD.unpack_from(batch, 0)
    return count > LARGE_BATCH_RECORDS or records_len > LARGE_BATCH_BYTES


class ProduceQueue(Protocol):
    """The appender's write side as the produce paths use it
    (:class:`equeue.broker.appender.Appender`)."""

    def enqueue(
        self, op: WriteOp, callback: Callable[[PendingOp], None] | None = None, *, defer: bool = False
    ) -> PendingOp: ...
    def kick(self) -> None: ...
    async def wait(self, p: PendingOp) -> Any: ...


#: writes an answer frame to the connection once the transaction is answered
#: (:meth:`equeue.broker.output.Output.stage`)
Stage = Callable[[list[bytes]], None]
#: the error answer of a request: ``(exception, request id, request code) -> (code, parts)``
ErrorAnswer = Callable[[Exception, int, int], tuple[int, Parts]]

class ProduceHandler:
    """The produce checks (:meth:`prepare`, :meth:`prepare_missing`), the general path
    (:meth:`handle`) and the connections' hot path (:meth:`pipeline`)."""

    def __init__(
        self,
        topics: TopicDirectory,
        appender: ProduceQueue,
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
        #: a batch's records, uncompressed, are held to the frame limit: no more than
        #: a request of entries could carry (the decompression-bomb cap)
        self._max_records = limits.max_frame
        #: a batch's records are held to what a request of entries could carry (each
        #: entry has a 29-byte header), so a compressed batch of tiny records cannot
        #: make the broker decode millions of them for a few bytes sent
        self._max_count = limits.max_frame // ENTRY_HEADER.size
        #: a stored batch (and its keep mask) no pull answer could carry is refused
        self._max_entry = limits.max_pull_entry
        #: the broker's ``--compression``, for topics without their own setting
        self._compression = limits.compression
        #: one worker thread at a time checks large batches (made at the first one)
        self._checker: trio.CapacityLimiter | None = None

    def prepare(
        self,
        req: wire.ProduceRequest,
        principal: str | None = None,
        entries: ProducedRecords | list[bytes] | None = None,
    ) -> ProduceOp | None:
        """Check a decoded produce request and build its write op (no checkpoint, so a
        connection's requests are queued in arrival order). ``entries``: the request's
        batch already checked (:meth:`check_batch`, off the loop).

        Returns None when the topic does not exist yet (:meth:`prepare_missing` creates
        or learns it), or when the request's batch is large (:func:`is_large`)
        and not checked yet (:meth:`prepare_missing` checks it in a worker thread).
        Raises EQueueError for bad requests, NotAuthorized when
        ``principal`` (None: no authentication) may not produce to the topic,
        TopicPaused when an operator paused it; on a replica, NotLeader when it does
        not lead its group and NotEnoughReplicas when its ISR is below --min-insync.
        """
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
        checked: Sequence[bytes] | ProducedRecords
        if req.batch is None:
            checked = req.entries
            if not checked:
                raise BadRequest("empty produce batch")
        elif entries is not None:
            checked = entries
        elif is_large(req.batch):
            return None  # checked off the loop, by prepare_missing
        else:
            checked = self.check_batch(req.batch)
        produced = checked if isinstance(checked, ProducedRecords) else None
        return ProduceOp(
            info,
            req.queue_id,
            () if produced is not None else checked,  # type: ignore[arg-type]
            req.producer_id,
            req.base_sequence,
            self._max_body,
            self._max_delay_ms,
            req.batch,
            _CODECS[info.compression or self._compression],
            self._max_entry,
            produced,
        )

    def check_batch(self, batch: bytes) -> ProducedRecords | list[bytes]:
        """A producer batch, checked (header, checksum, then every record in one pass:
        :func:`~equeue.wire.batches.scan_produced`), ready to be stored as sent. A
        batch holding a delayed message goes the general way instead (its messages
        as entries, :meth:`batch_entries`): the schedule keeps entries. Raises what
        :meth:`batch_entries` raises, and MessageTooLarge for a message above
        ``--max-message``."""
        head = batch_head(batch, self._max_records)
        if head.count > self._max_count:  # before inflating: a small bomb of tiny records
            raise CorruptRecord(
                f"a batch of {head.count} records: at most {self._max_count} (as many as a request of entries can carry)"
            )
        produced = scan_produced(batch_records(batch, head), head.count, self._max_body)
        if produced.delayed:
            return self.batch_entries(batch)
        return produced

    def batch_entries(self, batch: bytes) -> list[bytes]:
        """The messages of a producer batch, checked, as entries for the store's
        produce op (which then checks each message's size, UTF-8 and due time, indexes
        their keys and schedules the delayed ones; it stores the batch itself as sent
        unless the topic's compression names another codec).

        The header is checked first (magic, codec, count, the crc32 of the records as
        carried, the announced uncompressed size within the frame limit), so a
        decompression bomb is refused before anything is inflated; decompression is
        capped at the announced size. Raises CorruptRecord when the batch is damaged,
        lies about its size or count, or a due time is out of range; InvalidMessage
        when a record carries a store-time delta (only the broker sets store times),
        or its key or tags exceed 65535 bytes.
        """
        head = batch_head(batch, self._max_records)
        if head.count > self._max_count:  # before inflating: a small bomb of tiny records
            raise CorruptRecord(
                f"a batch of {head.count} records: at most {self._max_count} (as many as a request of entries can carry)"
            )
        records = decode_records(batch_records(batch, head), head.count)
        if any(r.timestamp for r in records):  # stored as sent, it would set its store times
            raise InvalidMessage("a produced record carries a store-time delta: only the broker sets store times")
        if any(r.reconsume_times > 0xFFFF for r in records):
            raise InvalidMessage("a produced record's reconsume count is above 65535")
        try:
            return [
                pack_entry(
                    r.body,
                    None if r.key is None else r.key.encode(),
                    None if r.tags is None else r.tags.encode(),
                    r.properties,
                    r.deliver_at,
                    r.reconsume_times,
                )
                for r in records
            ]
        except ValueError as exc:  # ConfigError: key or tags above 65535 bytes
            raise InvalidMessage(f"a record of the batch does not fit: {exc}") from None
        except struct.error:  # a due time beyond u64
            raise CorruptRecord("a record's due time is out of range") from None

    async def prepare_missing(self, req: wire.ProduceRequest, principal: str | None = None) -> ProduceOp:
        """What :meth:`prepare` does for a request it returned None for (the request
        decoded once, by the caller): auto-creates the missing topic first (cluster
        mode: in etcd, or learns a topic the view has not seen yet, and waits for the
        local store); checks a large batch (:func:`is_large`) in a worker thread
        (one at a time: pure CPU on the request's own bytes, so the loop serves other
        clients meanwhile); then checks the request again.

        Returns its write op. Raises what :meth:`prepare` raises, and TopicNotFound
        (no auto-create, or deleted meanwhile), QueueNotFound, NotAuthorized
        (auto-create without the ``admin`` permission), ClusterUnavailable.
        """
        info = await self._topics.require(req.topic, auto_create=req.auto_create, principal=principal)
        if self._cluster is not None and req.queue_id >= info.queues:
            await self._cluster.require(req.topic, None)  # a grow the store has not applied yet
        entries: ProducedRecords | list[bytes] | None = None
        if req.batch is not None and is_large(req.batch):
            if self._checker is None:
                self._checker = trio.CapacityLimiter(1)
            entries = await trio.to_thread.run_sync(self.check_batch, req.batch, limiter=self._checker)
        op = self.prepare(req, principal, entries)
        if op is None:
            if self._cluster is not None and req.topic in self._cluster.owned:
                raise QueueNotFound(f"topic {req.topic!r} has no queue {req.queue_id}")
            raise TopicNotFound(f"topic {req.topic!r} was deleted")
        return op

    def answer(self, answer: wire.ProduceResponse, nbytes: int) -> Parts:
        """The answer payload of a committed produce (and its statistics)."""
        self._counters.messages_in += answer.stored
        self._counters.bytes_in += nbytes
        return [answer.encode()]

    async def handle(self, payload: bytes, ctx: RequestContext) -> Parts:
        """The general path: :meth:`prepare`, or :meth:`prepare_missing` when the topic
        must be created or learned first; then the answer once committed."""
        req = _decode(payload)
        op = self.prepare(req, ctx.principal)
        if op is None:
            op = await self.prepare_missing(req, ctx.principal)
        appender = self._appender
        return self.answer(await appender.wait(appender.enqueue(op)), len(payload))

    @contextmanager
    def pipeline(
        self, principal: str | None, stage: Stage, answered: Callable[[], None], error_answer: ErrorAnswer
    ) -> Iterator[ProducePipeline]:
        """Open one connection's :class:`ProducePipeline` (its arguments are the
        pipeline's); whatever it deferred is committed when the block is left, however
        it is left, so nothing deferred is ever left unwritten."""
        pipeline = ProducePipeline(self, principal, stage, answered, error_answer)
        try:
            yield pipeline
        finally:
            pipeline.commit()


class ProducePipeline:
    """One connection's produce requests, from its reader to their staged answers
    (loop thread only; opened with :meth:`ProduceHandler.pipeline`).

    The reader feeds (:meth:`feed`) each produce request as it decodes it: the request is
    checked and queued in the appender at once (arrival order), *deferred*: the
    writer is not woken per request. :meth:`commit` commits what was deferred (one
    transaction for the requests of a received chunk; on the loop when it is small
    with ``--flush async``); the reader calls it at its one point before it waits
    (for input, for its output, for a slot, for a yield), and leaving the
    ``pipeline()`` block calls it too. Each answer is staged on the connection's
    output (``stage``) from the appender's commit callback -- written with the rest
    of its transaction's answers, in commit order -- its latency observed since the
    chunk's arrival (:attr:`arrived`), then ``answered()`` tells the connection one
    produce is over. ``error_answer`` builds the answer of a failed one.
    """

    __slots__ = (
        "_answer", "_appender", "_deferred", "_enqueue", "_error_answer", "_handler", "_latency", "_prepare",
        "_principal", "_settled", "_stage", "arrived",
    )  # fmt: skip

    def __init__(
        self, handler: ProduceHandler, principal: str | None, stage: Stage, answered: Callable[[], None],
        error_answer: ErrorAnswer,
    ) -> None:  # fmt: skip
        self._handler = handler
        self._principal = principal
        self._prepare = handler.prepare
        self._answer = handler.answer
        self._appender = handler._appender
        self._enqueue = handler._appender.enqueue
        self._latency = handler._counters.produce_latency
        self._stage = stage
        self._settled = answered
        self._error_answer = error_answer
        #: requests were queued deferred since the last :meth:`commit`
        self._deferred = False
        #: when the chunk being read arrived (``time.perf_counter``): the produce
        #: latency's start, one clock read per received chunk (set by the reader)
        self.arrived = time.perf_counter()

    def feed(self, request_id: int, payload: bytes) -> wire.ProduceRequest | None:
        """Queue one produce request now (deferred until :meth:`commit`); its answer is
        staged once its transaction is answered, then ``answered()`` is called.

        Returns None once queued, or the decoded request when its topic must be created
        or learned first, or its batch is checked off the loop
        (:func:`is_large`): then :meth:`feed_missing` it (nothing was queued). Raises
        what :meth:`ProduceHandler.prepare` raises (nothing queued: the caller
        answers the error).
        """
        req = _decode(payload)
        op = self._prepare(req, self._principal)
        if op is None:
            return req
        self._enqueue(
            op, functools.partial(self._answered, request_id, len(payload), self.arrived), defer=True
        )  # fmt: skip
        self._deferred = True
        return None

    async def feed_missing(self, request_id: int, payload: bytes, req: wire.ProduceRequest) -> None:
        """Queue a request :meth:`feed` returned for, once its topic is created or
        learned (:meth:`ProduceHandler.prepare_missing`); what was deferred before is
        committed first (it does not wait on the topic). The reader reads nothing
        meanwhile, so the requests behind it keep their order. Raises what
        ``prepare_missing`` raises (nothing queued)."""
        self.commit()
        op = await self._handler.prepare_missing(req, self._principal)
        self._enqueue(
            op, functools.partial(self._answered, request_id, len(payload), self.arrived), defer=True
        )  # fmt: skip
        self._deferred = True

    def commit(self) -> None:
        """Commit the requests queued since the last call, as one transaction
        (:meth:`equeue.broker.appender.Appender.kick`: inline when small with ``--flush
        async``, else by the writer thread). Never raises (but a KeyboardInterrupt
        landing in an inline commit goes on up once its ops are answered)."""
        if self._deferred:
            self._deferred = False
            self._appender.kick()

    def _answered(self, request_id: int, nbytes: int, arrived: float, pending: PendingOp) -> None:
        """The appender answered a fed request (loop thread, no task): stage its answer
        (the same as :meth:`ProduceHandler.handle`'s), observe its latency since
        ``arrived``, tell the connection."""
        try:
            result = pending.result
            try:
                if isinstance(result, BaseException):
                    raise result
                parts = self._answer(result, nbytes)
                code = _OK
            except Exception as exc:
                code, parts = self._error_answer(exc, request_id, _PRODUCE)
            self._stage(encode_response(code, request_id, parts))
            self._latency.observe(time.perf_counter() - arrived)
        finally:
            self._settled()
