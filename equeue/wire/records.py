"""Stored records (the LMDB ``messages`` value): a checksummed header around an entry.

::

    +-------+-----+----------+----------+--------------+-----------+-------+
    | crc32 | ver | topic_id | queue_id | queue_offset | store_ts  | entry |
    | u32   | u8  | u32      | u32      | u64          | u64 ms    |       |
    +-------+-----+----------+----------+--------------+-----------+-------+
    crc32 (zlib/IEEE) covers everything after itself.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from itertools import repeat
from operator import add, getitem, ne
from typing import Final

import attrs

from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.models import Message
from equeue.wire._prims import _U32
from equeue.wire.entries import ENTRY_HEADER, EntryMeta, entry_fields, entry_meta

RECORD_HEADER: Final = struct.Struct(">IBIIQQ")  # crc, ver, topic_id, queue_id, queue_offset, ts
RECORD_VERSION: Final = 1
#: the header without its leading crc32 (what the checksum covers first)
_REST: Final = struct.Struct(">BIIQQ")
_TS_AT: Final = RECORD_HEADER.size - 8
_CRC = slice(0, 4)
_AFTER_CRC = slice(4, None)


def encode_records(
    topic_id: int, queue_id: int, first_offset: int, ts_ms: int, entries: Sequence[bytes]
) -> list[bytes]:
    """The stored records of ``entries`` at consecutive queue offsets from
    ``first_offset``, all stamped ``ts_ms``: the one record encoder.

    This is the broker's hottest loop (every produced message passes here), so the
    per-record work runs in C loops (``map``/``repeat``), not Python bytecode.
    """
    m = len(entries)
    rests = list(
        map(
            _REST.pack, repeat(RECORD_VERSION, m), repeat(topic_id, m), repeat(queue_id, m),
            range(first_offset, first_offset + m), repeat(ts_ms, m),
        )
    )  # fmt: skip
    crcs = map(zlib.crc32, entries, map(zlib.crc32, rests))
    return list(map(add, map(add, map(_U32.pack, crcs), rests), entries))


def encode_record(topic_id: int, queue_id: int, queue_offset: int, ts_ms: int, entry: bytes) -> bytes:
    """Build one stored record around an entry, with its checksum (see :func:`encode_records`)."""
    return encode_records(topic_id, queue_id, queue_offset, ts_ms, (entry,))[0]


@attrs.frozen(slots=True)
class RecordHeader:
    topic_id: int
    queue_id: int
    queue_offset: int
    timestamp: int


def record_header(value: bytes | memoryview, *, verify: bool = True) -> RecordHeader:
    """Parse a stored record's header; with ``verify`` check its checksum.

    Raises :class:`CorruptRecord` on a checksum mismatch or a truncated record.
    """
    if len(value) < RECORD_HEADER.size + ENTRY_HEADER.size:
        raise CorruptRecord("stored record is truncated")
    crc, ver, topic_id, queue_id, qoff, ts = RECORD_HEADER.unpack_from(value, 0)
    if ver != RECORD_VERSION:
        raise CorruptRecord(f"unknown record version {ver}")
    if verify and zlib.crc32(memoryview(value)[4:]) != crc:
        raise CorruptRecord(f"checksum mismatch in record of queue {queue_id} offset {qoff}")
    return RecordHeader(topic_id, queue_id, qoff, ts)


def records_intact(recs: Sequence[bytes]) -> bool:
    """Whether every record passes the checks :func:`record_header` makes (version,
    checksum), in bulk: the per-record work runs in C loops. False leaves it to
    :func:`record_header` to say which record is bad and why."""
    n = len(recs)
    if n and min(map(len, recs)) < RECORD_HEADER.size + ENTRY_HEADER.size:
        return False
    if any(map(ne, map(getitem, recs, repeat(4, n)), repeat(RECORD_VERSION, n))):  # type: ignore[arg-type]
        return False
    stored = map(int.from_bytes, map(getitem, recs, repeat(_CRC, n)))  # type: ignore[arg-type]
    return not any(map(ne, map(zlib.crc32, map(getitem, recs, repeat(_AFTER_CRC, n))), stored))  # type: ignore[arg-type]


#: where a record's (topic id, queue id, queue offset) sit, packed big-endian
_POSITION = slice(5, 21)
_POS = struct.Struct(">IIQ")


def records_placed(recs: Sequence[bytes], topic_id: int, queue_id: int, first_offset: int) -> bool:
    """Whether ``recs`` carry the positions ``(topic_id, queue_id, first_offset + i)``
    in their headers, in bulk (C loops): an index pointer that leads to another
    queue's or offset's record is corruption, even when that record's checksum holds."""
    n = len(recs)
    want = map(_POS.pack, repeat(topic_id, n), repeat(queue_id, n), range(first_offset, first_offset + n))
    return not any(map(ne, map(getitem, recs, repeat(_POSITION, n)), want))  # type: ignore[arg-type]


def record_timestamp(value: bytes | memoryview) -> int:
    """A stored record's store time (ms), unverified (the cheap read retention and
    time lookups make)."""
    return int.from_bytes(value[_TS_AT : RECORD_HEADER.size])


def record_entry_meta(value: bytes | memoryview) -> EntryMeta:
    return entry_meta(value, RECORD_HEADER.size)


def decode_record(topic: str, global_offset: int, value: bytes | memoryview) -> Message:
    """Decode a stored record into a consumer-side :class:`Message` (verifies the crc)."""
    h = record_header(value)
    try:
        key, tags, props, body, _deliver_at, rc = entry_fields(value, RECORD_HEADER.size, len(value))
    except (struct.error, RemoteProtocolError, CorruptRecord) as exc:
        raise CorruptRecord(f"malformed record at global offset {global_offset}: {exc}") from exc
    return Message(
        body, key, tags, props, 0, topic, h.queue_id, h.queue_offset, global_offset, h.timestamp, rc
    )
