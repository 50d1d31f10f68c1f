"""Pull requests and answers (plain and packed layouts), and tag filters."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Final

import attrs

from equeue.models import Message, PullResult
from equeue.protocol import PullStatus
from equeue.wire._prims import _U32, _bad, pack_str, unpack_str
from equeue.wire.records import decode_record

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
    offsets and stored records (as :class:`broker.storage.ReadResult` holds them)."""
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
