"""Packed binary layouts of the hot paths: message entries, stored records,
produce and pull requests/responses. All integers big-endian. See docs/protocol.md.

Message entry (what a producer sends, stored verbatim inside a record)::

    +-------+-------+------------+-----------+---------+----------+-----------+-----+------+-------+------+
    | len   | flags | deliver_at | reconsume | key_len | tags_len | props_len | key | tags | props | body |
    | u32   | u8    | u64 ms     | u16       | u16     | u16      | u32       |     |      |       |      |
    +-------+-------+------------+-----------+---------+----------+-----------+-----+------+-------+------+
    len counts the bytes after itself; flags bit 0 = key present, bit 1 = tags present;
    props = repeated (u16 klen, key, u32 vlen, value), UTF-8; body = the rest.

Stored record (LMDB ``messages`` value)::

    +-------+-----+----------+----------+--------------+-----------+-------+
    | crc32 | ver | topic_id | queue_id | queue_offset | store_ts  | entry |
    | u32   | u8  | u32      | u32      | u64          | u64 ms    |       |
    +-------+-----+----------+----------+--------------+-----------+-------+
    crc32 (zlib/IEEE) covers everything after itself.

Nothing here does I/O; decoders raise :class:`~equeue.errors.RemoteProtocolError`
(or :class:`~equeue.errors.CorruptRecord` for stored records) on malformed input.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Final

import attrs

from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.models import Message, PullResult, SendResult
from equeue.protocol import PullStatus

__all__ = [
    "ENTRY_HEADER",
    "RECORD_HEADER",
    "EntryMeta",
    "ProduceRequest",
    "ProduceResponse",
    "PullRequest",
    "decode_entries",
    "decode_pull_response",
    "decode_record",
    "encode_entry",
    "encode_pull_response",
    "encode_pull_response_packed",
    "encode_pull_response_plain",
    "encode_record",
    "entry_meta",
    "split_entries",
]

ENTRY_HEADER: Final = struct.Struct(">IBQHHHI")  # len, flags, deliver_at, reconsume, klen, tlen, plen
RECORD_HEADER: Final = struct.Struct(">IBIIQQ")  # crc, ver, topic_id, queue_id, queue_offset, ts
RECORD_VERSION: Final = 1
FLAG_KEY: Final = 1
FLAG_TAGS: Final = 2
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PROP_K = struct.Struct(">H")
_PROP_V = struct.Struct(">I")
NO_OFFSET: Final = 0xFFFFFFFFFFFFFFFF


def _bad(msg: str) -> RemoteProtocolError:
    return RemoteProtocolError(msg)


# --------------------------------------------------------------------------- entries
def encode_props(props: dict[str, str]) -> bytes:
    if not props:
        return b""
    parts: list[bytes] = []
    for k, v in props.items():
        kb, vb = k.encode(), v.encode()
        parts += (_PROP_K.pack(len(kb)), kb, _PROP_V.pack(len(vb)), vb)
    return b"".join(parts)


def decode_props(buf: bytes | memoryview) -> dict[str, str]:
    out: dict[str, str] = {}
    pos, end = 0, len(buf)
    try:
        while pos < end:
            (kl,) = _PROP_K.unpack_from(buf, pos)
            pos += 2
            if pos + kl + 4 > end:
                raise _bad("property overruns its block")
            k = bytes(buf[pos : pos + kl]).decode()
            pos += kl
            (vl,) = _PROP_V.unpack_from(buf, pos)
            pos += 4
            if pos + vl > end:
                raise _bad("property overruns its block")
            out[k] = bytes(buf[pos : pos + vl]).decode()
            pos += vl
    except (struct.error, UnicodeDecodeError) as exc:
        raise _bad(f"malformed properties: {exc}") from exc
    return out


def encode_entry(msg: Message) -> bytes:
    """Encode one message to send (its produce-side fields only)."""
    key = msg.key.encode() if msg.key is not None else b""
    tags = msg.tags.encode() if msg.tags is not None else b""
    props = encode_props(msg.properties)
    if len(key) > 0xFFFF or len(tags) > 0xFFFF:
        raise ValueError("key and tags are limited to 65535 bytes")
    flags = (FLAG_KEY if msg.key is not None else 0) | (FLAG_TAGS if msg.tags is not None else 0)
    body = msg.body
    n = ENTRY_HEADER.size - 4 + len(key) + len(tags) + len(props) + len(body)
    return b"".join(
        (
            ENTRY_HEADER.pack(
                n, flags, msg.deliver_at, min(msg.reconsume_times, 0xFFFF), len(key), len(tags), len(props)
            ),
            key,
            tags,
            props,
            body,
        )
    )


@attrs.frozen(slots=True)
class EntryMeta:
    """What the broker needs from an entry without decoding its body."""

    deliver_at: int
    key: bytes | None
    tags: bytes | None
    body_len: int


def entry_meta(entry: bytes | memoryview, base: int = 0) -> EntryMeta:
    """Read the header of the entry at ``base``; validates the lengths."""
    try:
        n, flags, deliver_at, _rc, kl, tl, pl = ENTRY_HEADER.unpack_from(entry, base)
    except struct.error as exc:
        raise _bad("truncated message entry") from exc
    body_len = n - (ENTRY_HEADER.size - 4) - kl - tl - pl
    if body_len < 0 or base + 4 + n > len(entry):
        raise _bad("message entry lengths are inconsistent")
    p = base + ENTRY_HEADER.size
    key = bytes(entry[p : p + kl]) if flags & FLAG_KEY else None
    tags = bytes(entry[p + kl : p + kl + tl]) if flags & FLAG_TAGS else None
    return EntryMeta(deliver_at, key, tags, body_len)


def split_entries(buf: bytes, pos: int, count: int) -> list[bytes]:
    """Slice ``count`` length-prefixed entries from ``buf`` starting at ``pos``.

    Validates only the outer lengths (cheap); the entries must end exactly at the
    end of ``buf``.
    """
    out: list[bytes] = []
    end = len(buf)
    unpack = _U32.unpack_from
    hdr = ENTRY_HEADER.size - 4
    for _ in range(count):
        if pos + 4 > end:
            raise _bad("truncated batch: fewer entries than announced")
        (n,) = unpack(buf, pos)
        stop = pos + 4 + n
        if n < hdr or stop > end:
            raise _bad("message entry overruns the batch")
        out.append(buf[pos:stop])
        pos = stop
    if pos != end:
        raise _bad("trailing bytes after the last entry")
    return out


def _entry_to_message(
    e: bytes | memoryview, base: int, limit: int
) -> tuple[str | None, str | None, dict[str, str], bytes, int, int]:
    n, flags, deliver_at, rc, kl, tl, pl = ENTRY_HEADER.unpack_from(e, base)
    p = base + ENTRY_HEADER.size
    stop = base + 4 + n
    if stop > limit or p + kl + tl + pl > stop:
        raise CorruptRecord("entry lengths are inconsistent")
    key = bytes(e[p : p + kl]).decode("utf-8", "replace") if flags & FLAG_KEY else None
    p += kl
    tags = bytes(e[p : p + tl]).decode("utf-8", "replace") if flags & FLAG_TAGS else None
    p += tl
    props = decode_props(e[p : p + pl]) if pl else {}
    p += pl
    return key, tags, props, bytes(e[p:stop]), deliver_at, rc


def decode_entries(buf: bytes, pos: int, count: int) -> list[Message]:
    """Decode ``count`` entries into produce-side messages (tests, scheduler)."""
    out = []
    for e in split_entries(buf, pos, count):
        key, tags, props, body, deliver_at, rc = _entry_to_message(e, 0, len(e))
        out.append(Message(body, key, tags, props, deliver_at, reconsume_times=rc))
    return out


# --------------------------------------------------------------------------- records
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
        key, tags, props, body, _deliver_at, rc = _entry_to_message(value, RECORD_HEADER.size, len(value))
    except (struct.error, RemoteProtocolError) as exc:
        raise CorruptRecord(f"malformed record at global offset {global_offset}: {exc}") from exc
    return Message(
        body, key, tags, props, 0, topic, h.queue_id, h.queue_offset, global_offset, h.timestamp, rc
    )


# --------------------------------------------------------------------------- produce
_PRODUCE_FIXED = struct.Struct(">IB")  # queue id, flags
_PRODUCE_IDEM = struct.Struct(">16sQ")  # producer id, base sequence
PRODUCE_IDEMPOTENT: Final = 1
#: do not auto-create the topic even when the broker would
PRODUCE_NO_AUTO_CREATE: Final = 2


def _pack_str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise ValueError("string too long for the wire (65535 bytes)")
    return _U16.pack(len(b)) + b


def _unpack_str(buf: bytes, pos: int) -> tuple[str, int]:
    try:
        (n,) = _U16.unpack_from(buf, pos)
    except struct.error as exc:
        raise _bad("truncated string") from exc
    end = pos + 2 + n
    if end > len(buf):
        raise _bad("truncated string")
    try:
        return buf[pos + 2 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise _bad("string is not UTF-8") from exc


@attrs.frozen(slots=True)
class ProduceRequest:
    """A batch of entries for one queue of one topic.

    ``entries`` are encoded message entries (see :func:`encode_entry`). With a
    ``producer_id`` (16 bytes) the request is idempotent: ``base_sequence`` is the
    sequence number of its first entry for this (producer, topic, queue).
    """

    topic: str
    queue_id: int
    entries: Sequence[bytes]
    producer_id: bytes | None = None
    base_sequence: int = 0
    auto_create: bool = True

    def encode(self) -> bytes:
        flags = (PRODUCE_IDEMPOTENT if self.producer_id else 0) | (
            0 if self.auto_create else PRODUCE_NO_AUTO_CREATE
        )
        parts = [_pack_str(self.topic), _PRODUCE_FIXED.pack(self.queue_id, flags)]
        if self.producer_id:
            parts.append(_PRODUCE_IDEM.pack(self.producer_id, self.base_sequence))
        parts.append(_U32.pack(len(self.entries)))
        parts.extend(self.entries)
        return b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes) -> ProduceRequest:
        topic, pos = _unpack_str(buf, 0)
        try:
            queue_id, flags = _PRODUCE_FIXED.unpack_from(buf, pos)
            pos += _PRODUCE_FIXED.size
            pid: bytes | None = None
            seq = 0
            if flags & PRODUCE_IDEMPOTENT:
                pid, seq = _PRODUCE_IDEM.unpack_from(buf, pos)
                pos += _PRODUCE_IDEM.size
            (count,) = _U32.unpack_from(buf, pos)
            pos += 4
        except struct.error as exc:
            raise _bad("truncated produce request") from exc
        entries = split_entries(buf, pos, count)
        return cls(topic, queue_id, entries, pid, seq, not flags & PRODUCE_NO_AUTO_CREATE)


_PRODUCE_RESP = struct.Struct(">BQQII")  # duplicate, first global, first queue, stored, scheduled


@attrs.frozen(slots=True)
class ProduceResponse:
    """Offsets of a stored batch: non-delayed entries, in order, got consecutive
    offsets from ``first_global``/``first_queue``; delayed ones were scheduled."""

    first_global: int
    first_queue: int
    stored: int
    scheduled: int
    duplicate: bool = False

    def encode(self) -> bytes:
        return _PRODUCE_RESP.pack(
            1 if self.duplicate else 0,
            self.first_global & NO_OFFSET,
            self.first_queue & NO_OFFSET,
            self.stored,
            self.scheduled,
        )

    @classmethod
    def decode(cls, buf: bytes) -> ProduceResponse:
        try:
            dup, g, q, stored, sched = _PRODUCE_RESP.unpack(buf)
        except struct.error as exc:
            raise _bad("malformed produce response") from exc
        return cls(
            -1 if g == NO_OFFSET else g, -1 if q == NO_OFFSET else q, stored, sched, bool(dup)
        )

    def results(self, topic: str, queue_id: int, delayed: Iterable[bool]) -> list[SendResult]:
        """One :class:`SendResult` per entry of the request, in request order."""
        out: list[SendResult] = []
        i = 0
        for is_delayed in delayed:
            if is_delayed:
                out.append(SendResult(topic, queue_id, -1, -1, scheduled=True, duplicate=self.duplicate))
            elif self.first_global < 0:
                out.append(SendResult(topic, queue_id, -1, -1, duplicate=True))
            else:
                out.append(
                    SendResult(topic, queue_id, self.first_queue + i, self.first_global + i, False, self.duplicate)
                )
                i += 1
        return out


# --------------------------------------------------------------------------- pull
_PULL_FIXED = struct.Struct(">IQIII")  # queue, offset, max messages, max bytes, max wait ms

#: pull flag: answer in the packed layout (all global offsets, then all lengths, then the records)
PULL_PACKED: Final = 1
#: pull flag: the client verifies every record's checksum itself, so the broker skips its recheck
PULL_CLIENT_VERIFIES: Final = 2
_PULL_FLAGS_KNOWN: Final = PULL_PACKED | PULL_CLIENT_VERIFIES


@attrs.frozen(slots=True)
class PullRequest:
    """Read from one queue. ``max_wait_ms`` > 0 long-polls when nothing is there.

    ``group``/``consumer_id`` (optional) let the broker enforce queue leases;
    ``tags`` is a filter expression (``"a || b"``; empty or ``*`` = all).
    ``flags`` (:data:`PULL_PACKED`, :data:`PULL_CLIENT_VERIFIES`) is an optional trailing
    byte, sent only when not 0, so the plain layout is unchanged.
    """

    topic: str
    queue_id: int
    offset: int
    max_messages: int = 32
    max_bytes: int = 4 * 1024 * 1024
    max_wait_ms: int = 0
    group: str = ""
    consumer_id: str = ""
    tags: str = ""
    flags: int = 0

    def encode(self) -> bytes:
        return b"".join(
            (
                _pack_str(self.topic),
                _PULL_FIXED.pack(self.queue_id, self.offset, self.max_messages, self.max_bytes, self.max_wait_ms),
                _pack_str(self.group),
                _pack_str(self.consumer_id),
                _pack_str(self.tags),
                bytes((self.flags,)) if self.flags else b"",
            )
        )

    @classmethod
    def decode(cls, buf: bytes) -> PullRequest:
        topic, pos = _unpack_str(buf, 0)
        try:
            q, off, mm, mb, mw = _PULL_FIXED.unpack_from(buf, pos)
        except struct.error as exc:
            raise _bad("truncated pull request") from exc
        pos += _PULL_FIXED.size
        group, pos = _unpack_str(buf, pos)
        cid, pos = _unpack_str(buf, pos)
        tags, pos = _unpack_str(buf, pos)
        flags = 0
        if pos + 1 == len(buf):
            flags = buf[pos]
            if not flags or flags & ~_PULL_FLAGS_KNOWN:  # 0 is never sent: it is the absent byte
                raise _bad(f"bad pull flags {flags:#x}")
            pos += 1
        if pos != len(buf):
            raise _bad("trailing bytes after pull request")
        return cls(topic, q, off, mm, mb, mw, group, cid, tags, flags)


_PULL_RESP = struct.Struct(">BQQQI")  # status, min, max, next, count
_PULL_ITEM = struct.Struct(">QI")  # global offset, record length


def encode_pull_response(
    status: PullStatus, min_offset: int, max_offset: int, next_offset: int, records: Sequence[tuple[int, bytes]]
) -> list[bytes]:
    """Encode a pull answer as pieces (``records`` = (global offset, stored record))."""
    gs, recs = zip(*records, strict=True) if records else ((), ())
    return encode_pull_response_plain(status, min_offset, max_offset, next_offset, gs, recs)


def encode_pull_response_plain(
    status: PullStatus,
    min_offset: int,
    max_offset: int,
    next_offset: int,
    globals_: Sequence[int],
    records: Sequence[bytes],
) -> list[bytes]:
    """Encode a pull answer in the plain layout from parallel sequences of global
    offsets and stored records (as :class:`broker.store.ReadResult` holds them)."""
    parts = [_PULL_RESP.pack(status, min_offset, max_offset, next_offset, len(records))]
    if records:  # per-record work in C loops: this builds every pull answer
        parts.extend(chain.from_iterable(zip(map(_PULL_ITEM.pack, globals_, map(len, records)), records, strict=True)))
    return parts


def encode_pull_response_packed(
    status: PullStatus,
    min_offset: int,
    max_offset: int,
    next_offset: int,
    globals_: Sequence[int],
    records: Sequence[bytes],
) -> list[bytes]:
    """Encode a pull answer in the packed layout (:data:`PULL_PACKED`): the same head,
    then ``count`` u64 global offsets, then ``count`` u32 record lengths, then the
    records back to back. A reader finds every field with array arithmetic instead of
    walking the answer record by record."""
    lens = array("I", map(len, records))
    gs = array("Q", globals_)
    if sys.byteorder == "little":
        lens.byteswap()
        gs.byteswap()
    return [
        _PULL_RESP.pack(status, min_offset, max_offset, next_offset, len(records)),
        gs.tobytes(),
        lens.tobytes(),
        *records,
    ]


def decode_pull_response(topic: str, buf: bytes) -> PullResult:
    """Decode a pull answer; every record's checksum is verified."""
    try:
        status, lo, hi, nxt, count = _PULL_RESP.unpack_from(buf, 0)
    except struct.error as exc:
        raise _bad("truncated pull response") from exc
    try:
        pull_status = PullStatus(status)
    except ValueError as exc:
        raise _bad(f"unknown pull status {status}") from exc
    pos = _PULL_RESP.size
    msgs: list[Message] = []
    unpack = _PULL_ITEM.unpack_from
    mv = memoryview(buf)
    for _ in range(count):
        try:
            g, n = unpack(buf, pos)
        except struct.error as exc:
            raise _bad("truncated pull response") from exc
        pos += _PULL_ITEM.size
        if pos + n > len(buf):
            raise _bad("record overruns the pull response")
        msgs.append(decode_record(topic, g, mv[pos : pos + n]))
        pos += n
    return PullResult(pull_status, msgs, lo, hi, nxt)


def iter_records(buf: bytes) -> Iterator[tuple[int, memoryview]]:
    """Yield (global offset, record) pairs of a pull response without decoding."""
    (count,) = _U32.unpack_from(buf, _PULL_RESP.size - 4)
    pos = _PULL_RESP.size
    mv = memoryview(buf)
    for _ in range(count):
        g, n = _PULL_ITEM.unpack_from(buf, pos)
        pos += _PULL_ITEM.size
        yield g, mv[pos : pos + n]
        pos += n


def parse_tag_filter(expr: str | None) -> frozenset[bytes] | None:
    """``"a || b"`` → {b"a", b"b"}; empty or ``*`` → None (match everything)."""
    if not expr:
        return None
    tags = frozenset(t.strip().encode() for t in expr.split("||") if t.strip())
    if not tags or b"*" in tags:
        return None
    return tags
