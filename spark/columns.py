"""Batch-layout pull answers -> Arrow record batches, for the Spark reader.

The Spark reader asks the broker for pull answers in the batch layout
(``wire.PULL_BATCHES``: each stored batch whole, with a keep-mask) and verifies the
batches' checksums itself (``wire.PULL_CLIENT_VERIFIES``), so the single broker
process copies stored values into the answer and does no per-record work, while the
decompression and decoding run in Spark's parallel Python workers.

The records are decoded by the core's one decoder of the layout
(:func:`equeue.wire.decode_pull_batches`: header and batch crc32s, decompression capped
at the announced size, the keep-masks, the offset bounds), then gathered into Arrow
columns; tests/unit/test_columns.py holds the two to the same answers.

Imports pyarrow but not pyspark.
"""

from __future__ import annotations

import pyarrow as pa

from equeue import wire
from equeue.errors import CorruptRecord, RemoteProtocolError

__all__ = ["batches_batch"]


def batches_batch(
    payload: bytes, topic: str, queue_id: int, first: int, end: int, schema: pa.Schema
) -> tuple[pa.RecordBatch, int]:
    """The records of a batch-layout pull answer (``wire.PULL_BATCHES``) at queue
    offsets ``first`` up to ``end`` and the answer's next offset, as one Arrow batch,
    and the offset this reader goes on from (``min(next offset, end)``, at least
    ``first``).

    The records are decoded by the core's one decoder of the layout
    (:func:`equeue.wire.decode_pull_batches`: stored-header and batch crc32s,
    decompression, the keep-masks), then gathered column by column. Raises
    CorruptRecord for a batch that does not decode, is malformed, or belongs to
    another queue.
    """
    where = f"{topic}/{queue_id} offsets [{first}, {end})"
    try:
        head = wire.decode_pull_head(payload)
        stop = max(first, min(head.next_offset, end))
        msgs = wire.decode_pull_batches(topic, payload, first, True, stop)[4]
    except RemoteProtocolError as exc:
        raise CorruptRecord(f"pull answer for {where} is malformed: {exc}") from exc
    if any(m.queue_id != queue_id for m in msgs):
        raise CorruptRecord(f"pull answer for {where} holds records of another queue")
    n = len(msgs)
    props_type = schema.field("properties").type
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(queue_id, pa.int32()), n),
        pa.array([m.queue_offset for m in msgs], pa.int64()),
        pa.array([m.global_offset for m in msgs], pa.int64()),
        pa.array([m.key for m in msgs], pa.string()),
        pa.array([m.tags for m in msgs], pa.string()),
        pa.array([list(m.properties.items()) for m in msgs], props_type),
        pa.array([m.body for m in msgs], pa.binary()),
        pa.array([m.timestamp * 1000 for m in msgs], pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema), stop
