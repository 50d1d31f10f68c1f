"""The ``equeue`` sink: ``df.write`` / ``df.writeStream`` ``.format("equeue")``.

Exactly-once publishing without a broker transaction: every Spark task writes as an
*idempotent producer* whose id is derived from what Spark replays identically:

    producer_id = blake2b("<query id>/<batch id>/<partition id>", 16 bytes)   (streaming)
    producer_id = blake2b("<write id>/<partition id>", 16 bytes)              (batch write)

Rows are published through the producer core (:class:`equeue.producer.Producer`: its
routing, sequence numbers, idempotence and retry policy), configured by
:func:`sink_options` so that a replay sends the very same requests: rows are
handed to the producer in row order and the producer is flushed every
:data:`CHUNK_ROWS` rows / :data:`CHUNK_BYTES` bytes, so every request ends by size
or at the end of its chunk, never by time (``linger`` is infinite) and never where
a failure struck (a failed task closes its producer without flushing). Rows go
to ``queue_for_key(key, queues)`` (round-robin over every queue in row order
without a key: :class:`RowOrderSelector`), and each (topic, queue) numbers its
entries 0, 1, 2... within the task. Against a cluster the producer sends each
queue's requests to the queue's owner group, which keeps the task's sequences. The id is kept
after a failure (``stable_id``). A replayed micro-batch (same query id, batch id,
partitioning and rows) therefore sends the same requests with the same sequences,
and the broker answers each one it already stored as a duplicate without storing
it again; a task that died half-way resumes: its stored requests are duplicates,
the rest are stored. Transient failures are resent by the producer after the
pauses of its retry policy. See docs/spark.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from equeue.errors import ConfigError, EQueueError
from equeue.models import Message
from equeue.producer import Producer, ProducerOptions
from equeue.routing import RoundRobin, queue_for_key
from equeue.security import ClientSecurity
from equeue.spark.common import freeze_worker_heap, opt_bool, opt_str
from equeue.wire.batches import Codec

log = logging.getLogger("equeue.spark")

__all__ = ["EQueueBatchWriter", "EQueueStreamWriter", "RowOrderSelector", "SinkCommit", "producer_id_for", "sink_options"]

#: rows per chunk (then the producer is flushed): a queue's share of a chunk goes
#: in one request up to MAX_REQUEST_BYTES
CHUNK_ROWS = 50_000
#: body bytes per chunk (a bigger row makes a chunk alone): bounds a task's memory
CHUNK_BYTES = 32 << 20
#: one produce request carries at most this many bytes
MAX_REQUEST_BYTES = 4 << 20
#: resends of a failed request (5 attempts in all)
SEND_RETRIES = 4

_UNBOUNDED = 1 << 62

BATCH_ID_KEY = "streaming.sql.batchId"
QUERY_ID_KEY = "sql.streaming.queryId"


def producer_id_for(*parts: object) -> bytes:
    """The 16-byte idempotent producer id of one Spark task (stable across replays)."""
    return hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=16).digest()


class RowOrderSelector:
    """The sink's queue choice: a keyed row goes to ``queue_for_key(key, queues)``, a row
    without a key to the next queue of its topic in row order, over EVERY queue.

    The producer's own round-robin skips the queues of a broker group that is down
    (docs/cluster.md); a replay of the same rows could then pick other queues than
    the first attempt, and a row stored by that attempt would be stored again. This
    choice depends only on the rows, so a replay sends the same requests (a row for a
    group that is down waits and fails the task with QueueUnavailable instead).
    """

    def __init__(self) -> None:
        self._rr: dict[str, RoundRobin] = {}

    def __call__(self, queue_count: int, msg: Message) -> int:
        if msg.key is not None:
            return queue_for_key(msg.key, queue_count)
        rr = self._rr.get(msg.topic)
        if rr is None:
            rr = self._rr[msg.topic] = RoundRobin()
        return rr.next(queue_count)


def sink_options(
    producer_id: bytes, security: ClientSecurity | None = None, compression: Codec = Codec.NONE
) -> ProducerOptions:
    """The producer options of one sink task: its stable id, queues picked from the
    rows alone (:class:`RowOrderSelector`), requests sealed only by size or by the end
    of a chunk (``linger`` infinite), and no client-side buffer or body limit: a task's
    memory is bounded by its chunk, and the broker's body limit applies. (With a
    bounded buffer a row could wait for space that only open batches hold, and they
    end only by size or at the end of the chunk.) ``security``: TLS and credentials
    (None: the ``EQUEUE_*`` environment). ``compression``: the codec of each request's
    batch (the sink's ``compression`` option)."""
    return ProducerOptions(
        compression=compression,
        queue_selector=RowOrderSelector(),
        security=security,
        producer_id=producer_id,
        stable_id=True,
        linger=math.inf,
        retries=SEND_RETRIES,
        max_batch_bytes=MAX_REQUEST_BYTES,
        max_buffered_bytes=_UNBOUNDED,
        max_message_bytes=_UNBOUNDED,
    )


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task published: rows seen, entries stored, entries the broker already had."""

    partition_id: int
    rows: int = 0
    stored: int = 0
    duplicates: int = 0
    scheduled: int = 0
    #: chunks published (one flush of the producer each)
    chunks: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


class _Publisher:
    """Publishes the rows of one task through a producer, in deterministic chunks."""

    def __init__(
        self, brokers: str, default_topic: str | None, producer_id: bytes, partition_id: int,
        security: ClientSecurity | None = None, compression: Codec = Codec.NONE,
    ) -> None:  # fmt: skip
        self.default_topic = default_topic
        self.producer = Producer(brokers, options=sink_options(producer_id, security, compression))
        self.chunk_rows = 0
        self.chunk_bytes = 0
        self.commit = SinkCommit(partition_id)

    def add_batch(self, batch: pa.RecordBatch) -> None:
        bodies = _column(batch, "body")
        if bodies is None:
            raise ConfigError('equeue sink: the DataFrame needs a "body" column (binary or string)')
        keys = _column(batch, "key")
        tags = _column(batch, "tags")
        props = _column(batch, "properties")
        topics = _column(batch, "topic") if self.default_topic is None else None
        if topics is None and self.default_topic is None:
            raise ConfigError('equeue sink: set the "topic" option or give the DataFrame a "topic" column')
        for i, body in enumerate(bodies):
            if body is None:
                raise ConfigError("equeue sink: a row has a null body")
            topic = topics[i] if topics is not None else self.default_topic
            if not topic:
                raise ConfigError("equeue sink: a row has a null topic")
            key = keys[i] if keys is not None else None
            if isinstance(key, bytes | bytearray):
                key = bytes(key).decode("utf-8", "replace")
            p = props[i] if props is not None else None
            # a null map value is an absent property (properties are text: str(None) would
            # store "None"); any other non-string value raises TypeError naming it
            p = {k: v for k, v in dict(p).items() if v is not None} if p else None
            self.add(topic, body, key, tags[i] if tags is not None else None, p or None)

    def add(
        self,
        topic: str,
        body: bytes | str,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
    ) -> None:
        """Publish one row (buffered in the producer; the chunk is flushed first when
        the row does not fit in it). Raises what the producer raises before sending."""
        n = len(body)
        if self.chunk_rows and (self.chunk_rows >= CHUNK_ROWS or self.chunk_bytes + n > CHUNK_BYTES):
            self.flush()
        self.producer.send_async(topic, body, key=key, tags=tags, properties=properties)
        self.chunk_rows += 1
        self.chunk_bytes += n
        self.commit.rows += 1
        self.commit.per_topic[topic] = self.commit.per_topic.get(topic, 0) + 1

    def flush(self) -> None:
        """End the chunk: send what it holds and wait for every answer; raise the
        first failure of the task."""
        if not self.chunk_rows:
            return
        self.chunk_rows = self.chunk_bytes = 0
        self.producer.flush()
        self.commit.chunks += 1
        st = self.producer.send_stats
        self.commit.stored, self.commit.scheduled, self.commit.duplicates = st.stored, st.scheduled, st.duplicates
        if st.first_error is not None:
            raise st.first_error

    def close(self) -> SinkCommit:
        """Publish what is left, close the producer, return the task's counts."""
        try:
            self.flush()
        except BaseException:
            self.abort()
            raise
        self.producer.close()
        return self.commit

    def abort(self) -> None:
        """The task failed: close the producer without ending the current chunk (its
        requests would end where the failure struck, not where a replay ends them)."""
        self.producer.close(flush=False)


class _WriterBase:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("the equeue sink only appends (a topic cannot be overwritten)")
        names = {f.name for f in schema.fields}
        if "body" not in names:
            raise ConfigError('equeue sink: the DataFrame needs a "body" column (binary or string)')
        self.brokers = opt_str(options, "brokers", "127.0.0.1:5800")
        #: TLS and credentials from the options (else the driver's environment)
        self.security = ClientSecurity.from_options(options)
        self.topic = opt_str(options, "topic", "") or None
        if self.topic is None and "topic" not in names:
            raise ConfigError('equeue sink: set the "topic" option or give the DataFrame a "topic" column')
        #: each request's batch compressed with this codec (docs/spark.md)
        try:
            self.compression = Codec.parse(opt_str(options, "compression", "none"))
        except ValueError as exc:
            raise ConfigError(f"equeue sink: option compression: {exc}") from None
        #: freeze each Spark worker's heap at its first write (freeze_worker_heap)
        self.gc_freeze = opt_bool(options, "gcFreeze", True)

    def _publish(self, producer_id: bytes, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        if self.gc_freeze:
            freeze_worker_heap()
        ctx = TaskContext.get()
        pub = _Publisher(
            self.brokers, self.topic, producer_id, ctx.partitionId() if ctx else 0, self.security, self.compression
        )
        try:
            for batch in iterator:
                pub.add_batch(batch)
        except BaseException:
            pub.abort()
            raise
        return pub.close()

    @staticmethod
    def _summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int, int]:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        return (
            sum(m.rows for m in done),
            sum(m.stored + m.scheduled for m in done),
            sum(m.duplicates for m in done),
        )


class EQueueStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """``writeStream.format("equeue")``: exactly-once per micro-batch (see module doc)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        if ctx is None:
            raise EQueueError("equeue sink: write() must run inside a Spark task")
        batch_id = ctx.getLocalProperty(BATCH_ID_KEY)
        query_id = ctx.getLocalProperty(QUERY_ID_KEY)
        if batch_id is None or query_id is None:
            raise EQueueError("equeue sink: no streaming batch id / query id in the task context")
        pid = producer_id_for("spark-stream", query_id, batch_id, ctx.partitionId())
        return self._publish(pid, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, stored, dups = self._summary(messages)
        log.info("equeue sink: batch %d published %d rows (%d stored, %d already there)", batchId, rows, stored, dups)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, stored, _ = self._summary(messages)
        log.warning(
            "equeue sink: batch %d aborted after storing %d of %d rows; Spark replays it and "
            "the replay does not duplicate them", batchId, stored, rows,
        )  # fmt: skip


class EQueueBatchWriter(_WriterBase, DataSourceArrowWriter):
    """``df.write.format("equeue").mode("append")``: a retried task does not duplicate rows
    (its producer id is the write's id + partition id)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.write_id = uuid.uuid4().hex  # made once on the driver, pickled to every task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        pid = producer_id_for("spark-write", self.write_id, ctx.partitionId() if ctx else 0)
        return self._publish(pid, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, stored, dups = self._summary(messages)
        log.info("equeue sink: write published %d rows (%d stored, %d already there)", rows, stored, dups)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, stored, _ = self._summary(messages)
        log.warning("equeue sink: write aborted after storing %d of %d rows", stored, rows)
