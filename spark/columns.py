"""Packed pull answers → Arrow record batches, with array arithmetic instead of a loop.

The Spark reader asks the broker for the packed pull layout (``wire.PULL_PACKED``: all
global offsets, then all record lengths, then the records back to back) and verifies
checksums itself (``wire.PULL_CLIENT_VERIFIES``), so the single broker process does
the least work per record and the parsing runs in Spark's parallel Python workers.

The answer is framed by the core's one decoder of the packed layout
(:func:`equeue.wire.decode_pull_packed`: head, global offsets, record lengths). The
records inside are in the record layout of :mod:`equeue.wire.records`; the numpy
record type below is built from that module's struct formats, so the layout is
written down once. Every fixed-position field of every record is then gathered at
once with numpy (the core cannot use numpy, and a per-record Python loop costs
several times more here), the variable fields (key, tags, body) become Arrow binary
columns by pointing offsets into the answer buffer, and only checksums (one
``zlib.crc32`` per record, in a C-level ``map``) and non-empty properties touch
records one at a time. The checks are those of the consumer's decoder
(:func:`equeue.wire.decode_pull_messages`), vectorised; tests/unit/test_columns.py
holds the two to the same answers.

Imports numpy and pyarrow but not pyspark.
"""

from __future__ import annotations

import zlib
from typing import Final

import numpy as np
import pyarrow as pa

from equeue import wire
from equeue.errors import CorruptRecord, RemoteProtocolError

__all__ = ["packed_batch"]

_NUMPY_CODES: Final = {"B": "u1", "H": ">u2", "I": ">u4", "Q": ">u8"}


def _record_dtype() -> np.dtype:
    """A stored record's fixed part as a numpy record type: the record header, then the
    entry header (its first field, the entry length, is ``elen``); the key follows."""
    record = ("crc", "ver", "tid", "qid", "qoff", "ts")
    entry = ("elen", "flags", "deliver_at", "reconsume", "kl", "tl", "pl")
    names = (*record, *entry)
    codes = wire.RECORD_HEADER.format.lstrip(">") + wire.ENTRY_HEADER.format.lstrip(">")
    assert len(codes) == len(names)
    return np.dtype([(n, _NUMPY_CODES[c]) for n, c in zip(names, codes, strict=True)])


_FIXED: Final = _record_dtype()
_FIXED_SIZE: Final = _FIXED.itemsize
assert _FIXED_SIZE == wire.RECORD_HEADER.size + wire.ENTRY_HEADER.size
_ENTRY_AFTER_LEN: Final = wire.ENTRY_HEADER.size - 4  # entry header bytes counted by elen
_REC_HEAD: Final = wire.RECORD_HEADER.size + 4  # record header + the entry's length prefix
_GATHER: Final = np.arange(_FIXED_SIZE, dtype=np.int64)


def _slices(
    payload: bytes, starts: np.ndarray, ends: np.ndarray, nulls: np.ndarray | None
) -> pa.Array:
    """A binary column of ``payload[starts[i]:ends[i]]`` (null where ``nulls``), copied
    into a fresh contiguous Arrow array by one ``take`` over interleaved offsets."""
    n = len(starts)
    offs = np.empty(2 * n, dtype=np.int32)
    offs[0::2] = starts
    offs[1::2] = ends
    spread = pa.Array.from_buffers(
        pa.binary(), 2 * n - 1, [None, pa.py_buffer(offs), pa.py_buffer(payload)]
    )
    col = spread.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    if nulls is not None and nulls.any():
        valid = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
        col = pa.Array.from_buffers(pa.binary(), n, [valid, *col.buffers()[1:]])
    return col


def _to_string(col: pa.Array) -> pa.Array:
    try:
        return col.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: decode with replacement characters, like the SDK
        return pa.array(
            [None if v is None else v.decode("utf-8", "replace") for v in col.to_pylist()],
            pa.string(),
        )


def _properties(
    payload: bytes, starts: np.ndarray, lens: np.ndarray, map_type: pa.DataType
) -> pa.Array:
    """The ``properties`` map column; records without properties cost nothing."""
    n = len(starts)
    if not lens.any():
        return pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, dtype=np.int32)),
            pa.array([], pa.string()),
            pa.array([], pa.string()),
            type=map_type,
        )
    keys: list[str] = []
    vals: list[str] = []
    offs = np.zeros(n + 1, dtype=np.int32)
    for i in np.flatnonzero(lens).tolist():
        s = int(starts[i])
        props = wire.decode_props(payload[s : s + int(lens[i])])
        keys += props.keys()
        vals += props.values()
        offs[i + 1] = len(props)
    return pa.MapArray.from_arrays(
        pa.array(np.cumsum(offs, dtype=np.int32)),
        pa.array(keys, pa.string()),
        pa.array(vals, pa.string()),
        type=map_type,
    )


def packed_batch(
    payload: bytes, topic: str, queue_id: int, first: int, count: int, schema: pa.Schema
) -> pa.RecordBatch:
    """The first ``count`` records of a packed pull answer as one Arrow batch.

    Verifies each record's checksum, version, lengths, queue id and that record ``i``
    is queue offset ``first + i``. Raises CorruptRecord otherwise.
    """
    where = f"{topic}/{queue_id} offsets [{first}, {first + count})"
    if count < 1:
        raise CorruptRecord(f"pull answer for {where}: no record wanted")
    try:
        framed = wire.decode_pull_packed(payload, count)
    except RemoteProtocolError as exc:
        raise CorruptRecord(f"pull answer for {where} is malformed: {exc}") from exc
    goffs = np.frombuffer(framed.global_offsets, np.uint64).astype(np.int64)
    lens = np.frombuffer(framed.lengths, np.uint32).astype(np.int64)
    ends = framed.records_at + np.cumsum(lens)
    starts = ends - lens
    if (
        ends[-1] > len(payload)
        or len(payload) > np.iinfo(np.int32).max
        or (lens < _FIXED_SIZE).any()
    ):
        raise CorruptRecord(f"pull answer for {where} is malformed (record lengths)")
    buf = np.frombuffer(payload, np.uint8)
    fixed = buf[starts[:, None] + _GATHER].view(_FIXED).ravel()
    kl = fixed["kl"].astype(np.int64)
    tl = fixed["tl"].astype(np.int64)
    pl = fixed["pl"].astype(np.int64)
    bad = (
        (fixed["ver"] != wire.RECORD_VERSION)
        | (fixed["qid"] != queue_id)
        | (fixed["qoff"] != np.arange(first, first + count, dtype=np.uint64))
        | (fixed["elen"].astype(np.int64) + _REC_HEAD != lens)
        | (kl + tl + pl + _ENTRY_AFTER_LEN > fixed["elen"])
    )
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecord(
            f"malformed record at {topic}/{queue_id} offset {first + i} (global {goffs[i]})"
        )
    crc_from = (starts + 4).tolist()
    computed = np.fromiter(
        map(zlib.crc32, map(payload.__getitem__, map(slice, crc_from, ends.tolist()))),
        np.uint32,
        count,
    )
    mismatch = computed != fixed["crc"]
    if mismatch.any():
        i = int(np.argmax(mismatch))
        raise CorruptRecord(
            f"checksum mismatch at {topic}/{queue_id} offset {first + i} (global {goffs[i]})"
        )
    flags = fixed["flags"]
    key_at = starts + _FIXED_SIZE
    tags_at = key_at + kl
    props_at = tags_at + tl
    body_at = props_at + pl
    no_key = (flags & wire.FLAG_KEY) == 0
    no_tags = (flags & wire.FLAG_TAGS) == 0
    keys = (
        pa.nulls(count, pa.string())
        if no_key.all()
        else _to_string(_slices(payload, key_at, tags_at, no_key))
    )
    tags = (
        pa.nulls(count, pa.string())
        if no_tags.all()
        else _to_string(_slices(payload, tags_at, props_at, no_tags))
    )
    ts_us = fixed["ts"].astype(np.int64) * 1000
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(queue_id, pa.int32()), count),
        pa.array(np.arange(first, first + count, dtype=np.int64)),
        pa.array(goffs),
        keys,
        tags,
        _properties(payload, props_at, pl, schema.field("properties").type),
        _slices(payload, body_at, ends, None),
        pa.array(ts_us, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


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
