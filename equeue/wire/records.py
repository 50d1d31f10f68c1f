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
from typing import Final

import attrs

from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.models import Message
from equeue.wire._prims import _U32
from equeue.wire.entries import ENTRY_HEADER, EntryMeta, entry_fields, entry_meta

RECORD_HEADER: Final = struct.Struct(">IBIIQQ")  # crc, ver, topic_id, queue_id, queue_offset, ts
RECORD_VERSION: Final = 1


def encode_record(topic_id: int, queue_id: int, queue_offset: int, ts_ms: int, entry: bytes) -> bytes:
    """Build a stored record around an entry, with its checksum."""
    rest = RECORD_HEADER.pack(0, RECORD_VERSION, topic_id, queue_id, queue_offset, ts_ms)[4:]
    crc = zlib.crc32(entry, zlib.crc32(rest))
    return _U32.pack(crc) + rest + entry


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


def record_entry_meta(value: bytes | memoryview) -> EntryMeta:
    return entry_meta(value, RECORD_HEADER.size)


def decode_record(topic: str, global_offset: int, value: bytes | memoryview) -> Message:
    """Decode a stored record into a consumer-side :class:`Message` (verifies the crc)."""
    h = record_header(value)
    try:
        key, tags, props, body, _deliver_at, rc = entry_fields(value, RECORD_HEADER.size, len(value))
    except (struct.error, RemoteProtocolError) as exc:
        raise CorruptRecord(f"malformed record at global offset {global_offset}: {exc}") from exc
    return Message(
        body, key, tags, props, 0, topic, h.queue_id, h.queue_offset, global_offset, h.timestamp, rc
    )
