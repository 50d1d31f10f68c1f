"""Pull requests and answers (the batch layout: stored batches with keep-masks), and tag filters."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

import attrs

from equeue.errors import CorruptRecord
from equeue.models import Message, PullResult
from equeue.protocol import PullStatus
from equeue.wire._prims import _bad, pack_str, unpack_str
from equeue.wire.batches import (
    BATCH_HEAD,
    STORED_HEAD,
    batch_head,
    batch_records,
    decode_records_into,
    stored_batch,
    stored_head,
    verify_batch,
)

_PULL_FIXED = struct.Struct(">IQIII")  # queue, offset, max messages, max bytes, max wait ms

#: pull flag: the client verifies every record's checksum itself, so the broker skips its recheck
PULL_CLIENT_VERIFIES: Final = 2
#: pull flag: answer in the batch layout (stored batches whole, with keep-masks); a
#: broker refuses a pull without it (bit 0, the retired packed layout, is refused too)
PULL_BATCHES: Final = 4
#: pull flag: the answer may end at the end of its last batch rather than inside it,
#: past ``max_messages``, when that batch is sent whole anyway (small or compressed):
#: the reader delivers what it asked for and keeps the rest (:class:`PullRest`)
PULL_WHOLE_BATCHES: Final = 8
_PULL_FLAGS_KNOWN: Final = PULL_CLIENT_VERIFIES | PULL_BATCHES | PULL_WHOLE_BATCHES


@attrs.frozen(slots=True)
class PullRequest:
    """Read from one queue. ``max_wait_ms`` > 0 long-polls when nothing is there.

    ``group``/``consumer_id`` (optional) let the broker enforce queue leases;
    ``tags`` is a filter expression (``"a || b"``; empty or ``*`` = all).
    ``flags`` (:data:`PULL_BATCHES`, set by default: a broker refuses a pull without
    it; :data:`PULL_CLIENT_VERIFIES`) is an optional trailing byte, sent when not 0.
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
    flags: int = PULL_BATCHES

    def encode(self) -> bytes:
        return b"".join(
            (
                pack_str(self.topic),
                _PULL_FIXED.pack(self.queue_id, self.offset, self.max_messages, self.max_bytes, self.max_wait_ms),
                pack_str(self.group),
                pack_str(self.consumer_id),
                pack_str(self.tags),
                bytes((self.flags,)) if self.flags else b"",
            )
        )

    @classmethod
    def decode(cls, buf: bytes) -> PullRequest:
        topic, pos = unpack_str(buf, 0)
        try:
            q, off, mm, mb, mw = _PULL_FIXED.unpack_from(buf, pos)
        except struct.error as exc:
            raise _bad("truncated pull request") from exc
        pos += _PULL_FIXED.size
        group, pos = unpack_str(buf, pos)
        cid, pos = unpack_str(buf, pos)
        tags, pos = unpack_str(buf, pos)
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
#: bytes of a pull answer's head (status, min, max, next offset, record count)
PULL_HEAD_SIZE: Final = _PULL_RESP.size


@attrs.frozen(slots=True)
class PullHead:
    """The head of a pull answer: status, the queue's retained range ``[min_offset,
    max_offset)``, where the next pull starts, and how many batches follow."""

    status: PullStatus
    min_offset: int
    max_offset: int
    next_offset: int
    count: int


def decode_pull_head(buf: bytes | bytearray | memoryview) -> PullHead:
    """The head of a pull answer. Raises RemoteProtocolError when it is truncated or
    carries an unknown status."""
    try:
        status, lo, hi, nxt, count = _PULL_RESP.unpack_from(buf, 0)
    except struct.error as exc:
        raise _bad("truncated pull response") from exc
    try:
        pull_status = PullStatus(status)
    except ValueError as exc:
        raise _bad(f"unknown pull status {status}") from exc
    return PullHead(pull_status, lo, hi, nxt, count)


def parse_tag_filter(expr: str | None) -> frozenset[bytes] | None:
    """``"a || b"`` → {b"a", b"b"}; empty or ``*`` → None (match everything)."""
    if not expr:
        return None
    tags = frozenset(t.strip().encode() for t in expr.split("||") if t.strip())
    if not tags or b"*" in tags:
        return None
    return tags


# ---------------------------------------------------------------- the batch layout
#: the largest records section (uncompressed) a reader of pull answers decompresses:
#: an answer never carries more than the frame cap, and a stored batch is at most 1 MiB
MAX_RECORDS_LEN: Final = 64 << 20
_BATCH_ITEM = struct.Struct(">QI")  # global offset of the batch's first record, mask length
_U32 = struct.Struct(">I")
#: a pull answer's bytes around one message's content, besides the frame header and the
#: answer's head: the batch's item (global offset, mask length, a 1-byte mask, value
#: length), the stored and batch headers, and a record's framing at its largest
#: (length, attrs, ts delta, reconsume times, deliver_at, key/tags/properties lengths)
PULL_BATCH_OVERHEAD: Final = 12 + 1 + 4 + STORED_HEAD.size + BATCH_HEAD.size + 5 + 1 + 10 + 5 + 10 + 3 * 5

def encode_pull_batches(
    status: PullStatus,
    min_offset: int,
    max_offset: int,
    next_offset: int,
    batches: Sequence[tuple[int, bytes, bytes]],
) -> list[bytes]:
    """Encode a pull answer in the batch layout (:data:`PULL_BATCHES`) as pieces: the
    one encoder. ``batches`` = (global offset of the first record, stored batch
    verbatim, keep-mask or b"" for every record), as ``ReadResult.batches`` holds them;
    the head's count is the number of batches."""
    parts = [_PULL_RESP.pack(status, min_offset, max_offset, next_offset, len(batches))]
    item, u32 = _BATCH_ITEM.pack, _U32.pack
    for g, value, mask in batches:
        parts += (item(g, len(mask)), mask, u32(len(value)), value)
    return parts


_BASE_AT: Final = 13  # a stored batch's base queue offset (u64), after hcrc, ver, topic, queue
_COUNT_AT: Final = STORED_HEAD.size + 2  # its batch's record count (u32), after magic and codec
_U64 = struct.Struct(">Q")


def delivered_records(batches: Sequence[tuple[int, bytes, bytes]], start: int, stop: int) -> int:
    """How many records of ``batches`` (as :func:`encode_pull_batches` takes them) a
    reader of the answer delivers: queue offsets in ``[start, stop)`` whose mask bit
    is set. Reads two header fields per batch, no record; a value too short to hold
    them counts nothing (its reader reports it)."""
    n = 0
    for _, value, mask in batches:
        if len(value) < _COUNT_AT + 4:
            continue
        (base,) = _U64.unpack_from(value, _BASE_AT)
        (count,) = _U32.unpack_from(value, _COUNT_AT)
        lo, hi = max(start, base), min(stop, base + count)
        if hi <= lo:
            continue
        if mask:
            n += (int.from_bytes(mask, "little") >> (lo - base) & ((1 << (hi - lo)) - 1)).bit_count()
        else:
            n += hi - lo
    return n


def mask_of(count: int, keep: Sequence[int]) -> bytes:
    """The keep-mask of a batch of ``count`` records delivering records ``keep``
    (indexes in the batch): bit i set = record i is delivered, LSB-first per byte."""
    out = bytearray((count + 7) // 8)
    for i in keep:
        out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def masked_entry(global_base: int, value: bytes, index: int) -> tuple[int, bytes, bytes]:
    """The batch entry of one record found by position or key (GET_MESSAGE,
    FIND_BY_KEY): its stored batch whole, the mask selecting record ``index``. Raises
    CorruptRecord when the value is too short to hold the batch's record count, or
    the index is not one of its records."""
    if len(value) < _COUNT_AT + 4:
        raise CorruptRecord(f"stored batch at global offset {global_base} is truncated")
    (count,) = _U32.unpack_from(value, _COUNT_AT)
    if not 0 <= index < count:
        raise CorruptRecord(f"record {index} of a batch of {count} at global offset {global_base}")
    return global_base, value, mask_of(count, (index,))


def frame_pull_batches(buf: bytes | bytearray | memoryview) -> tuple[PullHead, list[tuple[int, bytes, bytes]]]:
    """The head and the (global base, mask, stored batch) triples of a batch-layout
    answer, unchecked inside: the framing half of the one decoder. Raises
    RemoteProtocolError when the answer is truncated or has bytes after its batches."""
    head = decode_pull_head(buf)
    if type(buf) is not bytes:
        buf = bytes(buf)
    out: list[tuple[int, bytes, bytes]] = []
    pos, size = PULL_HEAD_SIZE, len(buf)
    item, u32 = _BATCH_ITEM.unpack_from, _U32.unpack_from
    try:
        for _ in range(head.count):
            g, ml = item(buf, pos)
            pos += 12
            mask = buf[pos : pos + ml]
            pos += ml
            (vl,) = u32(buf, pos)
            pos += 4
            if pos + vl > size:
                raise _bad("truncated pull response: a batch overruns the answer")
            out.append((g, mask, buf[pos : pos + vl]))
            pos += vl
    except struct.error as exc:
        raise _bad(f"truncated pull response: {exc}") from exc
    if pos != size:
        raise _bad(f"{size - pos} bytes after the pull answer's {head.count} batches")
    return head, out


@attrs.frozen(slots=True)
class PulledBatch:
    """One stored batch of a batch-layout answer, its headers checked and its records
    decompressed: record ``i`` of ``records`` is queue offset ``base + i``, global
    offset ``global_base + i``; ``mask`` b"" delivers every record."""

    global_base: int
    queue_id: int
    base: int
    count: int
    first_ms: int
    mask: bytes
    records: bytes


def check_batch(
    topic: str, g: int, mask: bytes, value: bytes, start: int, stop: int, verify: bool = True
) -> PulledBatch | None:
    """One framed batch (global base ``g``, keep-``mask``, stored ``value``) checked
    and decompressed, or None when it holds no queue offset in [``start``,
    ``stop``) (its record crc is then not computed): stored header crc, batch
    header, mask length, with ``verify`` the batch crc. Decompression is capped at
    :data:`MAX_RECORDS_LEN`. The one batch check of the pull decoders.

    Raises CorruptRecord naming the batch's position (topic, queue, queue offset,
    global offset); RemoteProtocolError for a mask that does not fit its batch."""
    try:
        sh = stored_head(value)
    except CorruptRecord as exc:
        raise CorruptRecord(f"corrupt batch of {topic} at global offset {g}: {exc}") from None
    base = sh.base_offset
    try:
        inner = stored_batch(value)
        bh = batch_head(inner, MAX_RECORDS_LEN, verify=False)
        if base >= stop or base + bh.count <= start:
            return None
        if verify:
            verify_batch(inner, bh)
        if mask and len(mask) != (bh.count + 7) // 8:
            raise _bad(f"a mask of {len(mask)} bytes for a batch of {bh.count} records")
        records = batch_records(inner, bh)
    except CorruptRecord as exc:
        raise batch_error(topic, sh.queue_id, base, g, exc) from None
    return PulledBatch(g, sh.queue_id, base, bh.count, sh.first_ms, mask, records)


def checked_batches(
    topic: str, items: Sequence[tuple[int, bytes, bytes]], start: int, stop: int, verify: bool = True
) -> Iterator[PulledBatch]:
    """The batches of :func:`frame_pull_batches`'s ``items`` that hold queue offsets in
    [``start``, ``stop``), each checked (:func:`check_batch`) when it is reached: the
    batch half of the one decoder, shared by the consumer's :func:`decode_pull_answer`
    and the Spark reader's columns. Raises what :func:`check_batch` raises."""
    for g, mask, value in items:
        b = check_batch(topic, g, mask, value, start, stop, verify)
        if b is not None:
            yield b


def batch_error(topic: str, queue_id: int, base: int, global_base: int, exc: CorruptRecord) -> CorruptRecord:
    """``exc`` of a batch or one of its records, naming where the batch is."""
    return CorruptRecord(f"corrupt batch of {topic}/{queue_id} at offset {base} (global offset {global_base}): {exc}")


def decode_pull_batches(
    topic: str,
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    verify: bool = True,
    end: int | None = None,
    limit: int | None = None,
) -> tuple[PullStatus, int, int, int, list[Message]]:
    """(status, min offset, max offset, next offset, messages) of a batch-layout answer:
    :func:`decode_pull_answer` without what a ``limit`` left undelivered."""
    status, lo, hi, nxt, out, _rest = decode_pull_answer(topic, buf, start, verify, end, limit)
    return status, lo, hi, nxt, out


@attrs.frozen(slots=True)
class PullRest:
    """What a decode capped at a ``limit`` left of a pull answer: the records after
    the last one delivered, from queue offset ``start`` to ``stop`` (the answer's
    bound). ``batch`` is the batch the cap stopped inside (checked and decompressed;
    None when the cap fell on its last record), ``items`` the answer's later batches,
    framed and not yet checked. The status and offsets are the answer's.

    A consumer keeps it to serve its next pull of the queue without a round trip
    (:func:`decode_pull_rest`), as a Kafka consumer serves ``max.poll.records`` from
    the whole batches its fetch brought."""

    topic: str
    status: PullStatus
    min_offset: int
    max_offset: int
    next_offset: int
    stop: int
    start: int
    batch: PulledBatch | None
    items: Sequence[tuple[int, bytes, bytes]]


def decode_pull_answer(
    topic: str,
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    verify: bool = True,
    end: int | None = None,
    limit: int | None = None,
) -> tuple[PullStatus, int, int, int, list[Message], PullRest | None]:
    """(status, min offset, max offset, next offset, messages, rest) of a batch-layout
    answer: the one decoder of its records.

    Delivers the records of each batch whose queue offset is >= ``start`` and below
    the answer's next offset (and below ``end`` when given; ``end=-1``: no bound at
    all, for answers that are not a queue read, GET_MESSAGE and FIND_BY_KEY) and whose
    mask bit is set; with a ``limit``, at most that many (the broker sends whole
    batches: a reader that asked for n messages takes n), and then the next offset
    returned is the one after the last message delivered, where the next pull starts,
    and ``rest`` (else None) is what the answer holds past it (:class:`PullRest`).
    Decompresses (capped at :data:`MAX_RECORDS_LEN`), checks each stored header's
    crc, and with ``verify`` each batch's crc; records after the limit are not
    decoded, and batches after it not checked.

    Raises RemoteProtocolError for a truncated or malformed answer; CorruptRecord
    naming the batch's position (topic, queue, queue offset, global offset) for a
    batch or record that does not decode.
    """
    head, items = frame_pull_batches(buf)
    nxt = head.next_offset
    stop = nxt if end is None else (1 << 64 if end < 0 else min(end, nxt))
    cap = 1 << 62 if limit is None else max(1, limit)
    return _take(topic, head.status, head.min_offset, head.max_offset, nxt, stop, start, None, items, verify, cap)


def decode_pull_rest(
    rest: PullRest, limit: int, verify: bool = True
) -> tuple[PullStatus, int, int, int, list[Message], PullRest | None]:
    """:func:`decode_pull_answer` of the answer ``rest`` was kept from, from where
    the last decode stopped (``rest.start``), at most ``limit`` messages: the same
    six values, the rest of the rest last. Raises what that raises (the batches in
    ``rest.items`` are checked when they are reached)."""
    return _take(rest.topic, rest.status, rest.min_offset, rest.max_offset, rest.next_offset, rest.stop,
                 rest.start, rest.batch, rest.items, verify, max(1, limit))  # fmt: skip


def _take(
    topic: str,
    status: PullStatus,
    lo: int,
    hi: int,
    nxt: int,
    stop: int,
    start: int,
    first: PulledBatch | None,
    items: Sequence[tuple[int, bytes, bytes]],
    verify: bool,
    cap: int,
) -> tuple[PullStatus, int, int, int, list[Message], PullRest | None]:
    """The records of ``first`` (checked already) and then of ``items`` from queue
    offset ``start`` below ``stop``, at most ``cap``: the decoders' one loop."""
    out: list[Message] = []
    for i in range(-1, len(items)):
        b = first if i < 0 else check_batch(topic, *items[i], start, stop, verify)
        if b is None:
            continue
        try:
            decode_records_into(out, b.records, b.count, b.mask, topic, b.queue_id, b.base, b.global_base,
                                b.first_ms, start, stop, cap)  # fmt: skip
        except CorruptRecord as exc:
            raise batch_error(topic, b.queue_id, b.base, b.global_base, exc) from None
        if len(out) >= cap:  # the batches after it are not even checked
            after = out[-1].queue_offset + 1
            rest = None
            if after < stop:  # (a rest of no records moves the reader on to ``stop``)
                kept = b if after < b.base + b.count else None
                rest = PullRest(topic, status, lo, hi, nxt, stop, after, kept, items[i + 1 :])
            return status, lo, hi, min(nxt, after), out, rest
    return status, lo, hi, nxt, out, None


def decode_pull_response(
    topic: str,
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    limit: int | None = None,
) -> PullResult:
    """A batch-layout answer as a :class:`PullResult`, every batch's crc verified
    (:func:`decode_pull_batches`, whose ``start``, ``end`` and ``limit`` these are)."""
    status, lo, hi, nxt, msgs = decode_pull_batches(topic, buf, start, True, end, limit)
    return PullResult(status, msgs, lo, hi, nxt)
