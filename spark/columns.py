"""Batch-layout pull answers -> Arrow record batches, with array arithmetic instead of a loop.

The Spark reader asks the broker for pull answers in the batch layout
(``wire.PULL_BATCHES``: each stored batch whole, with a keep-mask) and verifies the
batches' checksums itself (``wire.PULL_CLIENT_VERIFIES``), so the single broker
process copies stored values into the answer and does no per-record work, while the
decompression and decoding run in Spark's parallel Python workers.

The batches are framed, checked and decompressed by the core's decoder of the layout
(:func:`equeue.wire.frame_pull_batches` and :func:`equeue.wire.checked_batches`:
header and batch crc32s, decompression capped at the announced size, mask lengths).
The records inside (:mod:`equeue.wire.batches`' record layout) are then decoded
column by column with numpy: one pass over their length prefixes in Python finds
where each record starts (the only per-record loop; records that all have one length
below 128 bytes are found by one vectorised check instead), and each field is then read for
every record at once -- the attributes byte, each varint as up to nine vectorised
byte steps, the key, tags and body as Arrow binary columns cut out of the records by
one ``take``. Only non-empty properties are decoded record by record. The checks are
those of the consumer's decoder (:func:`equeue.wire.decode_pull_batches`), vectorised;
tests/unit/test_columns.py holds the two to the same answers and the same refusals.

Imports numpy and pyarrow but not pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa

from equeue import wire
from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.wire import batches as layout

__all__ = ["batches_batch"]

#: a varint read here is at most 9 bytes (63 bits): every length and time fits, and an
#: int64 column cannot hold more
_VARINT_BYTES: Final = 9


#: the latest store time (ms) a timestamp[us] column holds
_MAX_MS: Final = (2**63 - 1) // 1000
#: the most bytes of records decoded into one Arrow batch (its binary columns use
#: int32 offsets); an answer whose records decompress to more becomes several batches
_CHUNK_BYTES: Final = 1 << 30


class _OtherQueue(Exception):
    """A batch that delivers records belongs to another queue than the one read."""


def _int64(values: Sequence[int]) -> np.ndarray:
    """``values`` as an int64 array. Raises CorruptRecord for one beyond int64 (a
    broker never stores such an offset or time)."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise CorruptRecord("an offset or store time beyond 2**63") from None


def _varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unsigned LEB128 varints at positions ``at`` of ``buf``, read for all of them
    at once: (values, the position after each). Raises CorruptRecord for a varint
    longer than :data:`_VARINT_BYTES` or one that runs off the end of ``buf``."""
    if not at.size:
        return at.copy(), at.copy()
    if int(at.max()) >= buf.size:
        raise CorruptRecord("a record is truncated")
    b = buf[at].astype(np.int64)
    value = b & 0x7F
    after = at + 1
    more = np.flatnonzero(b >= 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * _VARINT_BYTES:
            raise CorruptRecord("varint longer than 9 bytes")
        pos = after[more]
        if int(pos.max()) >= buf.size:
            raise CorruptRecord("a record is truncated")
        b = buf[pos].astype(np.int64)
        value[more] |= (b & 0x7F) << shift
        after[more] = pos + 1
        more = more[b >= 0x80]
        shift += 7
    return value, after


def _field(
    buf: np.ndarray, at: np.ndarray, ends: np.ndarray, has: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A length-prefixed field present where ``has``: (its start, its end, the position
    after it: ``at`` unchanged where absent, start = end = ``at``). Raises
    CorruptRecord when a field overruns its record (``ends``)."""
    start = at.copy()
    idx = np.flatnonzero(has)
    if idx.size:
        length, after = _varints(buf, at[idx])
        if (length > ends[idx] - after).any():
            raise CorruptRecord("a record's fields overrun it")
        start[idx] = after
    stop = start.copy()
    if idx.size:
        stop[idx] += length
    return start, stop, stop


def _slices(data: bytes, starts: np.ndarray, ends: np.ndarray, nulls: np.ndarray | None) -> pa.Array:
    """A binary column of ``data[starts[i]:ends[i]]`` (null where ``nulls``), copied
    into a fresh contiguous Arrow array by one ``take`` over interleaved offsets.
    Raises CorruptRecord for a slice that is reversed or outside ``data`` (the
    callers' checks exclude both; Arrow would read out of bounds)."""
    n = len(starts)
    if not n:
        return pa.array([], pa.binary())
    if (ends < starts).any() or int(ends.max()) > len(data) or int(starts.min()) < 0:
        raise CorruptRecord("a record's fields overrun it")
    offs = np.empty(2 * n, dtype=np.int32)
    offs[0::2] = starts
    offs[1::2] = ends
    spread = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(offs), pa.py_buffer(data)])
    col = spread.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    if nulls is not None and nulls.any():
        valid = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
        col = pa.Array.from_buffers(pa.binary(), n, [valid, *col.buffers()[1:]])
    return col


def _text(data: bytes, starts: np.ndarray, ends: np.ndarray, absent: np.ndarray) -> pa.Array:
    """A string column (null where ``absent``). Raises CorruptRecord for bytes that are
    not UTF-8 (a stored key or tags is text: the broker refuses others at produce)."""
    n = len(starts)
    if absent.all():
        return pa.nulls(n, pa.string())
    try:
        return _slices(data, starts, ends, absent).cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise CorruptRecord(f"a record's key, tags or property is not UTF-8: {exc}") from None


def _properties(data: bytes, starts: np.ndarray, ends: np.ndarray, has: np.ndarray, map_type: pa.DataType) -> pa.Array:
    """The ``properties`` map column; records without properties cost nothing."""
    n = len(starts)
    offs = np.zeros(n + 1, dtype=np.int32)
    keys: list[str] = []
    vals: list[str] = []
    for i in np.flatnonzero(has).tolist():
        try:
            props = layout.decode_record_props(data[int(starts[i]) : int(ends[i])])
        except IndexError:
            raise CorruptRecord("a record's properties are truncated") from None
        except UnicodeDecodeError as exc:
            raise CorruptRecord(f"a record's key, tags or property is not UTF-8: {exc}") from None
        keys += props.keys()
        vals += props.values()
        offs[i + 1] = len(props)
    return pa.MapArray.from_arrays(
        pa.array(np.cumsum(offs, dtype=np.int32)), pa.array(keys, pa.string()), pa.array(vals, pa.string()),
        type=map_type,
    )  # fmt: skip


def _same_length_bounds(buf: np.ndarray, count: int) -> np.ndarray | None:
    """The bounds :func:`equeue.wire.batches.record_bounds` finds, when all ``count``
    records in ``buf`` have one length below 128 (fixed-size records): one vectorised
    check of every length prefix instead of a Python step per record. None when they
    do not (the caller walks them). Each record's one-byte prefix then says exactly
    where the next starts, so the walk would find these same bounds."""
    if not count or buf.size % count:
        return None
    stride = buf.size // count
    if not 2 <= stride <= 0x80 or (buf[::stride] != stride - 1).any():
        return None
    return np.arange(0, buf.size + 1, stride, dtype=np.int64)


def _bits(got: Sequence[wire.PulledBatch]) -> np.ndarray:
    """Every record's keep bit, batch after batch (b"" masks: all set)."""
    parts = [
        np.unpackbits(np.frombuffer(b.mask, np.uint8), bitorder="little")[: b.count].astype(bool)
        if b.mask
        else np.ones(b.count, dtype=bool)
        for b in got
    ]
    return np.concatenate(parts)


def _columns(
    got: Sequence[wire.PulledBatch], topic: str, queue_id: int, first: int, stop: int, schema: pa.Schema
) -> pa.RecordBatch:
    """The delivered records of ``got`` (queue offsets in [``first``, ``stop``) whose
    mask bit is set) as one Arrow batch. Raises CorruptRecord, without saying which
    batch (the caller does)."""
    data = b"".join(b.records for b in got)
    counts = np.array([b.count for b in got], dtype=np.int64)
    total = int(counts.sum())
    # where every record starts: the one pass over the length prefixes, across the
    # batches at once (each records section ends exactly where its last record does)
    buf = np.frombuffer(data, np.uint8)
    bounds = _same_length_bounds(buf, total)
    if bounds is None:
        bounds = np.array(layout.record_bounds(data, total), dtype=np.int64)
    ends_at = np.cumsum(counts)
    if (bounds[ends_at] != np.cumsum([len(b.records) for b in got])).any():
        raise CorruptRecord("a batch holds more or fewer records than it says")
    which = np.repeat(np.arange(len(got)), counts)
    index = np.arange(total, dtype=np.int64) - np.repeat(ends_at - counts, counts)
    qoff = _int64([b.base for b in got])[which] + index
    keep = (qoff >= first) & (qoff < stop)
    if any(b.mask for b in got):
        keep &= _bits(got)
    sel = np.flatnonzero(keep)
    n = sel.size
    starts, ends = bounds[sel], bounds[sel + 1]
    which, index, qoff = which[sel], index[sel], qoff[sel]
    if any(got[i].queue_id != queue_id for i in np.unique(which).tolist()):
        raise _OtherQueue

    length, at = _varints(buf, starts)
    if (length < 1).any():
        raise CorruptRecord("a record overruns its batch")
    attrs_ = buf[at]
    if (attrs_ & ~np.uint8(63)).any():
        raise CorruptRecord(f"unknown record attributes {int(attrs_[np.argmax(attrs_ & ~np.uint8(63))]):#x}")
    at = at + 1
    ts = np.zeros(n, dtype=np.int64)
    for flag in (layout.A_TS, layout.A_RECONSUME, layout.A_DELIVER):
        idx = np.flatnonzero(attrs_ & flag)
        if idx.size:
            value, after = _varints(buf, at[idx])
            if flag == layout.A_TS:
                ts[idx] = value
            at[idx] = after
    if (at > ends).any():
        raise CorruptRecord("a record's fields overrun it")
    has_key, has_tags, has_props = attrs_ & layout.A_KEY != 0, attrs_ & layout.A_TAGS != 0, attrs_ & layout.A_PROPS != 0
    key_at, key_end, at = _field(buf, at, ends, has_key)
    tags_at, tags_end, at = _field(buf, at, ends, has_tags)
    props_at, props_end, at = _field(buf, at, ends, has_props)
    first_ms = _int64([b.first_ms for b in got])[which]
    globals_ = _int64([b.global_base for b in got])[which] + index
    if ((ts > _MAX_MS - first_ms) | (globals_ < 0)).any():
        raise CorruptRecord("a record's store time or global offset is out of range")
    columns = [
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(queue_id, pa.int32()), n),
        pa.array(qoff),
        pa.array(globals_),
        _text(data, key_at, key_end, ~has_key),
        _text(data, tags_at, tags_end, ~has_tags),
        _properties(data, props_at, props_end, has_props, schema.field("properties").type),
        _slices(data, at, ends, None),
        pa.array((first_ms + ts) * 1000, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def batches_batch(
    payload: bytes, topic: str, queue_id: int, first: int, end: int, schema: pa.Schema
) -> tuple[list[pa.RecordBatch], int]:
    """The records of a batch-layout pull answer (``wire.PULL_BATCHES``) at queue
    offsets ``first`` up to ``end`` and the answer's next offset, as Arrow batches
    (one, or several when the records decompress to more than :data:`_CHUNK_BYTES`;
    none when nothing is delivered), and the offset this reader goes on from
    (``min(next offset, end)``, at least ``first``).

    Raises CorruptRecord for a batch or record that does not decode (naming the
    answer's queue and offsets), an answer that is malformed, or one whose records
    delivered belong to another queue.
    """
    where = f"{topic}/{queue_id} offsets [{first}, {end})"
    try:
        head, items = wire.frame_pull_batches(payload)
        stop = max(first, min(head.next_offset, end))
        got = list(wire.checked_batches(topic, items, first, stop))
    except RemoteProtocolError as exc:
        raise CorruptRecord(f"pull answer for {where} is malformed: {exc}") from exc
    chunks: list[list[wire.PulledBatch]] = []
    size = _CHUNK_BYTES
    for b in got:  # a stored batch decompresses to at most MAX_RECORDS_LEN, well below a chunk
        if size + len(b.records) > _CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(b)
        size += len(b.records)
    out: list[pa.RecordBatch] = []
    try:
        for chunk in chunks:
            batch = _columns(chunk, topic, queue_id, first, stop, schema)
            if batch.num_rows:
                out.append(batch)
    except _OtherQueue:
        raise CorruptRecord(f"pull answer for {where} holds records of another queue") from None
    except CorruptRecord as exc:
        raise CorruptRecord(f"corrupt record in the pull answer for {where}: {exc}") from None
    return out, stop
