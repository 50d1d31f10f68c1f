"""The ``equeue`` sink: ``df.write`` / ``df.writeStream`` ``.format("equeue")``.

Exactly-once publishing without a broker transaction: every Spark task writes as an
*idempotent producer* whose id is derived from what Spark replays identically:

    producer_id = blake2b("<query id>/<batch id>/<partition id>", 16 bytes)   (streaming)
    producer_id = blake2b("<write id>/<partition id>", 16 bytes)              (batch write)

Rows go to ``queue_for_key(key, queues)`` (round-robin by row index without a key),
and each (topic, queue) numbers its entries 0, 1, 2... within the task. A replayed
micro-batch (same query id, batch id, partitioning and rows) sends the same
requests with the same sequences, and the broker answers each one it already
stored as a duplicate without storing it again; a task that died half-way resumes:
its stored requests are duplicates, the rest are stored. See docs/spark.md.
"""

from __future__ import annotations

import hashlib
import logging
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

from equeue import wire
from equeue.errors import ConfigError, ConnectionBroken, EQueueError, OutOfOrderSequence
from equeue.routing import queue_for_key
from spark.common import client_for, drop_client, opt_str

log = logging.getLogger("equeue.spark")

__all__ = ["EQueueBatchWriter", "EQueueStreamWriter", "SinkCommit", "producer_id_for"]

#: one produce request carries at most this many entries / bytes
MAX_REQUEST_ENTRIES = 5_000
MAX_REQUEST_BYTES = 4 << 20

BATCH_ID_KEY = "streaming.sql.batchId"
QUERY_ID_KEY = "sql.streaming.queryId"


def producer_id_for(*parts: object) -> bytes:
    """The 16-byte idempotent producer id of one Spark task (stable across replays)."""
    return hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=16).digest()


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task published: rows seen, entries stored, entries the broker already had."""

    partition_id: int
    rows: int = 0
    stored: int = 0
    duplicates: int = 0
    scheduled: int = 0
    requests: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


def _encode(body: bytes, key: str | None, tags: str | None, props: Any) -> bytes:
    """One message entry (equeue.wire layout), without building a Message object."""
    kb = key.encode() if key is not None else b""
    tb = tags.encode() if tags is not None else b""
    pb = wire.encode_props(dict(props)) if props else b""
    if len(kb) > 0xFFFF or len(tb) > 0xFFFF:
        raise ConfigError("equeue sink: key and tags are limited to 65535 bytes")
    flags = (wire.FLAG_KEY if key is not None else 0) | (wire.FLAG_TAGS if tags is not None else 0)
    n = wire.ENTRY_HEADER.size - 4 + len(kb) + len(tb) + len(pb) + len(body)
    return b"".join((wire.ENTRY_HEADER.pack(n, flags, 0, 0, len(kb), len(tb), len(pb)), kb, tb, pb, body))


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


class _Publisher:
    """Routes rows of one task to queues and sends them as idempotent requests."""

    def __init__(self, brokers: str, default_topic: str | None, producer_id: bytes, partition_id: int) -> None:
        self.brokers = brokers
        self.default_topic = default_topic
        self.producer_id = producer_id
        self.queues: dict[str, int] = {}
        self.rr: dict[str, int] = {}
        self.buf: dict[tuple[str, int], list[bytes]] = {}
        self.buf_bytes: dict[tuple[str, int], int] = {}
        self.seq: dict[tuple[str, int], int] = {}
        self.commit = SinkCommit(partition_id)

    def _queue_count(self, topic: str) -> int:
        n = self.queues.get(topic)
        if n is None:
            n = self.queues[topic] = client_for(self.brokers).get_route(topic).queues
        return n

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
            if isinstance(body, str):
                body = body.encode()
            topic = topics[i] if topics is not None else self.default_topic
            if not topic:
                raise ConfigError("equeue sink: a row has a null topic")
            key = keys[i] if keys is not None else None
            if isinstance(key, bytes | bytearray):
                key = bytes(key).decode("utf-8", "replace")
            tag = tags[i] if tags is not None else None
            entry = _encode(bytes(body), key, tag, props[i] if props is not None else None)
            self.add(topic, key, entry)

    def add(self, topic: str, key: str | None, entry: bytes) -> None:
        qn = self._queue_count(topic)
        if key is not None:
            q = queue_for_key(key, qn)
        else:
            r = self.rr.get(topic, 0)
            self.rr[topic] = r + 1
            q = r % qn
        k = (topic, q)
        lst = self.buf.setdefault(k, [])
        lst.append(entry)
        size = self.buf_bytes[k] = self.buf_bytes.get(k, 0) + len(entry)
        self.commit.rows += 1
        self.commit.per_topic[topic] = self.commit.per_topic.get(topic, 0) + 1
        if len(lst) >= MAX_REQUEST_ENTRIES or size >= MAX_REQUEST_BYTES:
            self.flush(k)

    def flush(self, k: tuple[str, int]) -> None:
        entries = self.buf.pop(k, None)
        self.buf_bytes.pop(k, None)
        if not entries:
            return
        topic, q = k
        seq = self.seq.get(k, 0)
        req = wire.ProduceRequest(topic, q, entries, producer_id=self.producer_id, base_sequence=seq)
        ans = self._send(req)
        self.seq[k] = seq + len(entries)
        self.commit.requests += 1
        if ans.duplicate:
            self.commit.duplicates += len(entries)
        else:
            self.commit.stored += ans.stored
            self.commit.scheduled += ans.scheduled

    def _send(self, req: wire.ProduceRequest) -> wire.ProduceResponse:
        # resending the same (producer, sequence) is safe: the broker drops duplicates
        for attempt in range(5):
            try:
                return client_for(self.brokers).produce(req)  # type: ignore[no-any-return]
            except (ConnectionBroken, OutOfOrderSequence) as exc:
                if attempt == 4:
                    raise
                log.warning("equeue sink: %s; resending (idempotent)", exc)
                drop_client(self.brokers)
        raise AssertionError("unreachable")

    def close(self) -> SinkCommit:
        for k in sorted(self.buf):
            self.flush(k)
        return self.commit


class _WriterBase:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("the equeue sink only appends (a topic cannot be overwritten)")
        names = {f.name for f in schema.fields}
        if "body" not in names:
            raise ConfigError('equeue sink: the DataFrame needs a "body" column (binary or string)')
        self.brokers = opt_str(options, "brokers", "127.0.0.1:5800")
        self.topic = opt_str(options, "topic", "") or None
        if self.topic is None and "topic" not in names:
            raise ConfigError('equeue sink: set the "topic" option or give the DataFrame a "topic" column')

    def _publish(self, producer_id: bytes, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = TaskContext.get()
        pub = _Publisher(self.brokers, self.topic, producer_id, ctx.partitionId() if ctx else 0)
        for batch in iterator:
            pub.add_batch(batch)
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
