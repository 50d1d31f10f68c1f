"""Pull requests and answers (plain and packed layouts), and tag filters."""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Final

import attrs

from equeue.errors import CorruptRecord
from equeue.models import Message, PullResult
from equeue.protocol import PullStatus
from equeue.wire._prims import _bad, pack_str, unpack_str
from equeue.wire.entries import ENTRY_HEADER, FLAG_KEY, FLAG_TAGS, decode_props
from equeue.wire.records import RECORD_HEADER, RECORD_VERSION

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
_PULL_ITEM = struct.Struct(">QI")  # global offset, record length
#: bytes of a pull answer's head (status, min, max, next offset, record count)
PULL_HEAD_SIZE: Final = _PULL_RESP.size


@attrs.frozen(slots=True)
class PullHead:
    """The head of a pull answer (both layouts): status, the queue's retained range
    ``[min_offset, max_offset)``, where the next pull starts, and how many records follow."""

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
    offsets and stored records (as :class:`equeue.broker.storage.ReadResult` holds them)."""
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


# The plain layout's decoder, for the consumer hot path: the item, record and entry
# headers are unpacked by one struct call per message, and each Message is filled in
# through its slot descriptors instead of its ``__init__`` (whose converters and
# ``on_setattr`` hooks cost about as much as the rest of decoding; what they would
# convert is already bytes / str / a fresh dict here).
# record header (crc, ver, topic id, queue id, queue offset, ts) + entry header
# (len, flags, deliver_at, reconsume, key len, tags len, props len)
_HEAD = struct.Struct(">" + RECORD_HEADER.format.lstrip(">") + ENTRY_HEADER.format.lstrip(">"))
_ENTRY_START = RECORD_HEADER.size + ENTRY_HEADER.size
_REC_PLUS_LEN = RECORD_HEADER.size + 4  # record header + the entry length field
# item + record header + entry header in one call
_ITEM_HEAD = struct.Struct(">QI" + _HEAD.format[1:])
assert _ITEM_HEAD.size == _PULL_ITEM.size + _HEAD.size == _PULL_ITEM.size + _ENTRY_START
_new_message = Message.__new__
# slot setters of Message (attrs slots class): one C call each, no hooks
_SET = {f.name: Message.__dict__[f.name].__set__ for f in attrs.fields(Message)}
assert list(_SET) == ["body", "key", "tags", "properties", "deliver_at", "topic", "queue_id",
                      "queue_offset", "global_offset", "timestamp", "reconsume_times"]  # fmt: skip


def decode_pull_messages(
    topic: str, buf: bytes | bytearray | memoryview, verify: bool = True
) -> tuple[PullStatus, int, int, int, list[Message]]:
    """(status, min offset, max offset, next offset, messages) of a plain pull answer.

    The one decoder of the plain layout. ``verify`` checks every record's checksum
    (about 15 % of the cost; the broker checks them when it reads, so the consumer
    re-checks only when asked). Raises RemoteProtocolError for a malformed answer,
    CorruptRecord for a record whose version, lengths or (with ``verify``) checksum
    are wrong.
    """
    head = decode_pull_head(buf)
    out: list[Message] = []
    count = head.count
    if not count:
        return head.status, head.min_offset, head.max_offset, head.next_offset, out
    if type(buf) is not bytes:
        buf = bytes(buf)
    append = out.append
    item_head = _ITEM_HEAD.unpack_from
    crc32 = zlib.crc32
    new = _new_message
    s_body, s_key, s_tags, s_props, s_deliver, s_topic, s_qid, s_qoff, s_global, s_ts, s_rc = _SET.values()
    mv = memoryview(buf) if verify else None
    cls = Message
    entry_start, rec_plus_len, version = _ENTRY_START, _REC_PLUS_LEN, RECORD_VERSION
    pos = PULL_HEAD_SIZE
    size = len(buf)
    try:
        for _ in range(count):
            g, n, crc, ver, _tid, qid, qoff, ts, elen, flags, _da, rc, kl, tl, pl = item_head(buf, pos)
            pos += 12
            end = pos + n
            p = pos + entry_start
            if end > size or pos + rec_plus_len + elen != end or p + kl + tl + pl > end:
                raise CorruptRecord(f"malformed record at global offset {g}")
            if ver != version:
                raise CorruptRecord(f"unknown record version {ver} at global offset {g}")
            if mv is not None and crc32(mv[pos + 4 : end]) != crc:
                raise CorruptRecord(f"checksum mismatch in record of queue {qid} offset {qoff}")
            m = new(cls)
            if flags & 3 or pl:
                s_key(m, buf[p : p + kl].decode("utf-8", "replace") if flags & FLAG_KEY else None)
                p += kl
                s_tags(m, buf[p : p + tl].decode("utf-8", "replace") if flags & FLAG_TAGS else None)
                p += tl
                s_props(m, decode_props(buf[p : p + pl]) if pl else {})
                p += pl
            else:  # no key, tags or properties: the common case
                s_key(m, None)
                s_tags(m, None)
                s_props(m, {})
                p += kl + tl
            s_body(m, buf[p:end])
            s_deliver(m, 0)
            s_topic(m, topic)
            s_qid(m, qid)
            s_qoff(m, qoff)
            s_global(m, g)
            s_ts(m, ts)
            s_rc(m, rc)
            append(m)
            pos = end
    except struct.error as exc:
        raise _bad(f"truncated pull response: {exc}") from exc
    return head.status, head.min_offset, head.max_offset, head.next_offset, out


def decode_pull_response(topic: str, buf: bytes | bytearray | memoryview) -> PullResult:
    """A plain pull answer as a :class:`PullResult`; every record's checksum is verified
    (:func:`decode_pull_messages` with ``verify=True``)."""
    status, lo, hi, nxt, msgs = decode_pull_messages(topic, buf, True)
    return PullResult(status, msgs, lo, hi, nxt)


@attrs.frozen(slots=True)
class PackedPull:
    """A packed pull answer (:data:`PULL_PACKED`), framed but not parsed record by record.

    ``global_offsets`` and ``lengths`` hold one entry per record (native byte order,
    ``array`` typecodes ``Q`` and ``I``); record ``i`` starts at ``records_at`` plus
    the lengths before it, inside ``buf``. Readers parse the records themselves from
    there (:mod:`equeue.spark.columns` gathers their fields with array arithmetic), using the
    record layout of :mod:`equeue.wire.records`.
    """

    head: PullHead
    buf: bytes
    global_offsets: array[int]
    lengths: array[int]
    records_at: int


def decode_pull_packed(buf: bytes, count: int | None = None) -> PackedPull:
    """Frame a packed pull answer: its head, then the global offsets and record lengths
    of the first ``count`` records (all of them by default).

    The one decoder of the packed layout's framing. Raises RemoteProtocolError when
    the head is malformed, ``count`` exceeds the records present, or the offsets and
    lengths overrun the answer. That the records fit (record ``i`` ends at
    ``records_at`` plus the first ``i + 1`` lengths, at most ``len(buf)``) is checked
    by the reader that walks them, with its own arithmetic (a sum over every length
    here would cost the Spark reader about 5 %).
    """
    head = decode_pull_head(buf)
    total = head.count
    n = total if count is None else count
    if not 0 <= n <= total:
        raise _bad(f"pull answer has {total} records, {n} wanted")
    at = PULL_HEAD_SIZE + 12 * total
    if at > len(buf):
        raise _bad("packed pull answer is truncated (offsets and lengths)")
    gs = array("Q")
    gs.frombytes(buf[PULL_HEAD_SIZE : PULL_HEAD_SIZE + 8 * n])
    lens = array("I")
    lens.frombytes(buf[PULL_HEAD_SIZE + 8 * total : PULL_HEAD_SIZE + 8 * total + 4 * n])
    if sys.byteorder == "little":
        gs.byteswap()
        lens.byteswap()
    return PackedPull(head, buf, gs, lens, at)


def parse_tag_filter(expr: str | None) -> frozenset[bytes] | None:
    """``"a || b"`` → {b"a", b"b"}; empty or ``*`` → None (match everything)."""
    if not expr:
        return None
    tags = frozenset(t.strip().encode() for t in expr.split("||") if t.strip())
    if not tags or b"*" in tags:
        return None
    return tags
