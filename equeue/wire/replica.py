"""Replication requests between the replicas of a broker group (docs/cluster.md,
"Following"; docs/protocol.md draws every layout): REPLICA_FETCH (90), REPLICA_KEYS (91)
and REPLICA_SNAPSHOT (92), each request and its answer.

Strings are u16-length UTF-8, byte strings u32-length; an absent byte string (a
key's value that does not exist, the snapshot cursor before the first key) is the
length :data:`ABSENT` with no bytes. Epochs are u32, positions u64.

A fetch answer carries a dense run of log entries (positions ``first .. first +
count - 1``): one u64 first position, then every entry's u32 length, then the
entries back to back, so the encoder is one join and the decoder one array of
lengths and one slice per entry (the entry itself, which the store copies into its
log anyway).

Every decoder raises :class:`~equeue.errors.RemoteProtocolError` on malformed input
(truncated, trailing bytes, unknown status, lengths that overrun); the broker answers
it BAD_REQUEST. Encoders raise ValueError or struct.error for values the layout
cannot carry (a bug in the caller, never peer input).
"""

from __future__ import annotations

import enum
import struct
import sys
from array import array
from itertools import accumulate, chain
from operator import itemgetter
from typing import Final

import attrs

from equeue.wire._prims import _U32, _bad, pack_str, unpack_str

__all__ = [
    "ABSENT",
    "REPLICA_MAX_FRAME",
    "STORE_FORMAT_UNSTATED",
    "FetchAnswer",
    "FetchRequest",
    "FetchStatus",
    "KeysAnswer",
    "KeysRequest",
    "SnapshotAnswer",
    "SnapshotRequest",
    "decode_fetch_answer",
    "decode_fetch_request",
    "decode_keys_answer",
    "decode_keys_request",
    "decode_snapshot_answer",
    "decode_snapshot_request",
    "encode_fetch_answer",
    "encode_fetch_request",
    "encode_keys_answer",
    "encode_keys_request",
    "encode_snapshot_answer",
    "encode_snapshot_request",
]

#: the largest frame a follower's connection to its leader reads (a fetch answer
#: always carries one whole log entry, and one entry is one write transaction)
REPLICA_MAX_FRAME: Final = 256 << 20
#: the u32 length that stands for an absent byte string
ABSENT: Final = 0xFFFFFFFF
#: the store format of a follower whose fetch or snapshot request ends before the
#: ``store_format`` field. It predates the field, so it counts as format 1; the
#: format-2 builds from before the field look the same and are refused alike
STORE_FORMAT_UNSTATED: Final = 1


class FetchStatus(enum.IntEnum):
    """What a REPLICA_FETCH answer says about the follower's position."""

    #: entries from the asked position (maybe none, after the wait)
    OK = 0
    #: the follower's log has entries the leader's lacks: truncate to ``diverge_at``
    DIVERGED = 1
    #: the position is below the leader's ``log_start``: copy the store (snapshot)
    TOO_OLD = 2


_FETCH_REQ = struct.Struct(">IQIII")  # epoch, position, last epoch, max bytes, wait ms
_FETCH_ANS = struct.Struct(">BIQQQQQI")  # status, epoch, hw, end, diverge_at, log_start, first, count
_KEYS_HEAD = struct.Struct(">II")  # epoch, count
_KEY = struct.Struct(">BI")  # db index, key length
_POS_COUNT = struct.Struct(">QI")  # position, count
_SNAP_REQ = struct.Struct(">BI")  # db index, after length (ABSENT: from the first key)
_EPOCH = struct.Struct(">I")
_LITTLE = sys.byteorder == "little"
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@attrs.frozen(slots=True)
class FetchRequest:
    """REPLICA_FETCH: the follower ``broker_id`` (reachable at ``address``) of leader
    epoch ``epoch`` asks for the entries from ``position`` on (everything below it
    is durable on the follower: the position is its acknowledgement). ``last_epoch``
    is the epoch of its entry ``position - 1`` (0: none). At most ``max_bytes``
    (always one whole entry); waits up to ``wait_ms`` when there is none.
    ``store_format`` is the follower's store format (``equeue.broker.storage.layout``): log
    entries carry raw index keys, so replicas of different formats must not meet.
    ``proof`` is the follower's registration secret (its SHA-256 is in its broker
    record in etcd): the leader counts a fetch only from the broker it names (b"":
    a follower from before the field, refused). ``consistent``: the follower's store
    reached its ``consistent_at`` (a repair or a copy is complete): only then may it
    count as caught up and join the in-sync set (absent: False)."""

    broker_id: str
    address: str
    epoch: int
    position: int
    last_epoch: int
    max_bytes: int
    wait_ms: int
    store_format: int
    proof: bytes = b""
    consistent: bool = False


@attrs.frozen(slots=True)
class FetchAnswer:
    """The leader's answer: ``entries`` (position, entry), dense from the asked
    position, when ``status`` is OK; ``diverge_at`` (DIVERGED) where the follower
    must truncate to; ``log_start`` the first position the leader still has;
    ``end`` its log's end; ``high_watermark`` the position below which every entry
    is on every in-sync replica."""

    status: FetchStatus
    epoch: int
    high_watermark: int
    end: int
    diverge_at: int
    log_start: int
    entries: list[tuple[int, bytes]]


@attrs.frozen(slots=True)
class KeysRequest:
    """REPLICA_KEYS: the current value of each (database index, key) at the leader
    of ``epoch`` (a truncating replica's repairs), for the follower ``broker_id``
    with its registration ``proof`` (as in :class:`FetchRequest`; absent: "" and b"")."""

    epoch: int
    keys: list[tuple[int, bytes]]
    broker_id: str = ""
    proof: bytes = b""


@attrs.frozen(slots=True)
class KeysAnswer:
    """The values of the FIRST ``len(values)`` keys asked (None: absent), read in one
    read transaction at log ``position``. A leader may answer fewer values than keys
    asked (to bound its answer): ask again for the rest."""

    position: int
    values: list[bytes | None]


@attrs.frozen(slots=True)
class SnapshotRequest:
    """REPLICA_SNAPSHOT: the items of database index ``db`` after key ``after``
    (None: from the first), at most about ``max_bytes`` (at least one item), for the
    follower ``broker_id`` of leader epoch ``epoch``, whose store has format
    ``store_format``, with its registration ``proof`` (both as in :class:`FetchRequest`)."""

    epoch: int
    broker_id: str
    db: int
    after: bytes | None
    max_bytes: int
    store_format: int
    proof: bytes = b""


@attrs.frozen(slots=True)
class SnapshotAnswer:
    """One chunk, read in one read transaction at log ``position``: ``items`` in key
    order, ``last`` the last key returned (ask again after it), None when the
    database is done."""

    position: int
    items: list[tuple[bytes, bytes]]
    last: bytes | None


# ---------------------------------------------------------------- helpers


def _pack_bytes(b: bytes | None) -> list[bytes]:
    if b is None:
        return [_U32.pack(ABSENT)]
    if len(b) >= ABSENT:
        raise ValueError("byte string too long for the wire")
    return [_U32.pack(len(b)), b]


def _unpack_bytes(buf: bytes, pos: int, what: str) -> tuple[bytes | None, int]:
    try:
        (n,) = _U32.unpack_from(buf, pos)
    except struct.error as exc:
        raise _bad(f"truncated {what}") from exc
    pos += 4
    if n == ABSENT:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise _bad(f"{what} overruns the payload")
    return buf[pos:end], end


def _present(b: bytes | None, what: str) -> bytes:
    if b is None:
        raise _bad(f"absent {what}")
    return b


def _end(buf: bytes, pos: int, what: str) -> None:
    if pos != len(buf):
        raise _bad(f"trailing bytes after the {what}")


def _fixed(st: struct.Struct, buf: bytes, pos: int, what: str) -> tuple[int, ...]:
    try:
        return st.unpack_from(buf, pos)
    except struct.error as exc:
        raise _bad(f"truncated {what}") from exc


# ---------------------------------------------------------------- REPLICA_FETCH


def encode_fetch_request(req: FetchRequest) -> bytes:
    """``broker_id str, address str, epoch u32, position u64, last_epoch u32,
    max_bytes u32, wait_ms u32, store_format u32, proof bytes, consistent u8``."""
    return b"".join((
        pack_str(req.broker_id), pack_str(req.address),
        _FETCH_REQ.pack(req.epoch, req.position, req.last_epoch, req.max_bytes, req.wait_ms),
        _U32.pack(req.store_format), *_pack_bytes(req.proof), b"\x01" if req.consistent else b"\x00",
    ))  # fmt: skip


def decode_fetch_request(buf: bytes) -> FetchRequest:
    """The one decoder of a fetch request (one that ends before ``store_format``
    comes from an older follower: :data:`STORE_FORMAT_UNSTATED`; before ``proof``:
    b""; before ``consistent``: False); raises RemoteProtocolError."""
    broker_id, pos = unpack_str(buf, 0)
    address, pos = unpack_str(buf, pos)
    epoch, position, last_epoch, max_bytes, wait_ms = _fixed(_FETCH_REQ, buf, pos, "fetch request")
    fmt, pos = _store_format(buf, pos + _FETCH_REQ.size, "fetch request")
    proof, pos = _proof(buf, pos, "fetch request")
    consistent = False
    if pos < len(buf):  # a follower from before the field sends none
        if buf[pos] > 1:
            raise _bad(f"fetch request: consistent must be 0 or 1, got {buf[pos]}")
        consistent, pos = buf[pos] == 1, pos + 1
    _end(buf, pos, "fetch request")
    return FetchRequest(
        broker_id, address, epoch, position, last_epoch, max_bytes, wait_ms, fmt, proof, consistent
    )


def _store_format(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    """A request's trailing ``store_format u32`` (absent: :data:`STORE_FORMAT_UNSTATED`)
    and the position after it."""
    if pos == len(buf):
        return STORE_FORMAT_UNSTATED, pos
    (fmt,) = _fixed(_U32, buf, pos, what)
    return fmt, pos + 4


def _proof(buf: bytes, pos: int, what: str, *, optional: bool = True) -> tuple[bytes, int]:
    """A request's trailing ``proof bytes`` (absent, when ``optional``: b"", an older
    follower's) and the position after it."""
    if optional and pos == len(buf):
        return b"", pos
    proof, pos = _unpack_bytes(buf, pos, what)
    return _present(proof, f"{what} proof"), pos


def encode_fetch_answer(ans: FetchAnswer) -> list[bytes]:
    """The answer as pieces (the server writes them without joining):
    ``status u8, epoch u32, high_watermark u64, end u64, diverge_at u64, log_start u64,
    first u64, count u32``, then ``count`` u32 entry lengths, then the entries back to
    back. Raises ValueError when the entries' positions are not dense from ``first``."""
    entries = ans.entries
    first = entries[0][0] if entries else 0
    datas = list(map(_SECOND, entries))
    if list(map(_FIRST, entries)) != list(range(first, first + len(datas))):  # C loops
        raise ValueError("fetch answer entries must have consecutive positions")
    lens = array("I", map(len, datas))
    if _LITTLE:
        lens.byteswap()
    head = _FETCH_ANS.pack(
        ans.status, ans.epoch, ans.high_watermark, ans.end, ans.diverge_at, ans.log_start, first, len(datas)
    )
    return [head, lens.tobytes(), *datas]


def decode_fetch_answer(buf: bytes) -> FetchAnswer:
    """The one decoder of a fetch answer; raises RemoteProtocolError (an unknown
    status, lengths that do not add up to the payload)."""
    status, epoch, hw, end, diverge_at, log_start, first, count = _fixed(_FETCH_ANS, buf, 0, "fetch answer")
    try:
        fs = FetchStatus(status)
    except ValueError as exc:
        raise _bad(f"unknown fetch status {status}") from exc
    at = _FETCH_ANS.size
    data_at = at + 4 * count
    if data_at > len(buf):
        raise _bad("fetch answer is truncated (entry lengths)")
    if first + count > 1 << 64:
        raise _bad("fetch answer positions overflow u64")
    lens = array("I")
    lens.frombytes(buf[at:data_at])
    if _LITTLE:
        lens.byteswap()
    offs = list(accumulate(lens, initial=data_at))
    if offs[-1] != len(buf):
        raise _bad(f"fetch answer entries take {offs[-1] - data_at} bytes, the payload has {len(buf) - data_at}")
    datas = list(map(buf.__getitem__, map(slice, offs, offs[1:])))
    return FetchAnswer(fs, epoch, hw, end, diverge_at, log_start, list(zip(range(first, first + count), datas, strict=True)))


# ---------------------------------------------------------------- REPLICA_KEYS


def encode_keys_request(req: KeysRequest) -> bytes:
    """``epoch u32, count u32``, then per key ``db u8, key bytes``, then
    ``broker_id str, proof bytes``."""
    parts = [_KEYS_HEAD.pack(req.epoch, len(req.keys))]
    for db, key in req.keys:
        if len(key) >= ABSENT:
            raise ValueError("key too long for the wire")
        parts += (_KEY.pack(db, len(key)), key)
    parts += (pack_str(req.broker_id), *_pack_bytes(req.proof))
    return b"".join(parts)


def decode_keys_request(buf: bytes) -> KeysRequest:
    """The one decoder of a keys request; raises RemoteProtocolError."""
    epoch, count = _fixed(_KEYS_HEAD, buf, 0, "keys request")
    pos = _KEYS_HEAD.size
    if count * _KEY.size > len(buf) - pos:
        raise _bad(f"keys request announces {count} keys in {len(buf)} bytes")
    keys: list[tuple[int, bytes]] = []
    append, size = keys.append, len(buf)
    for _ in range(count):
        db, n = _fixed(_KEY, buf, pos, "keys request")
        pos += _KEY.size
        end = pos + n
        if end > size:
            raise _bad("key overruns the keys request")
        append((db, buf[pos:end]))
        pos = end
    broker_id, proof = "", b""
    if pos < size:  # a follower from before the fields sends neither
        broker_id, pos = unpack_str(buf, pos)
        proof, pos = _proof(buf, pos, "keys request", optional=False)
    _end(buf, pos, "keys request")
    return KeysRequest(epoch, keys, broker_id, proof)


def encode_keys_answer(ans: KeysAnswer) -> list[bytes]:
    """``position u64, count u32``, then per value ``bytes`` (length ABSENT: absent)."""
    parts = [_POS_COUNT.pack(ans.position, len(ans.values))]
    parts.extend(chain.from_iterable(map(_pack_bytes, ans.values)))
    return parts


def decode_keys_answer(buf: bytes) -> KeysAnswer:
    """The one decoder of a keys answer; raises RemoteProtocolError."""
    position, count = _fixed(_POS_COUNT, buf, 0, "keys answer")
    pos = _POS_COUNT.size
    if count * 4 > len(buf) - pos:
        raise _bad(f"keys answer announces {count} values in {len(buf)} bytes")
    values: list[bytes | None] = []
    for _ in range(count):
        v, pos = _unpack_bytes(buf, pos, "keys answer value")
        values.append(v)
    _end(buf, pos, "keys answer")
    return KeysAnswer(position, values)


# ---------------------------------------------------------------- REPLICA_SNAPSHOT


def encode_snapshot_request(req: SnapshotRequest) -> bytes:
    """``epoch u32, broker_id str, db u8, after bytes (ABSENT: from the first key),
    max_bytes u32, store_format u32, proof bytes``."""
    return b"".join((
        _EPOCH.pack(req.epoch), pack_str(req.broker_id), bytes((req.db,)),
        *_pack_bytes(req.after), _U32.pack(req.max_bytes), _U32.pack(req.store_format), *_pack_bytes(req.proof),
    ))  # fmt: skip


def decode_snapshot_request(buf: bytes) -> SnapshotRequest:
    """The one decoder of a snapshot request (no ``store_format``: an older follower,
    :data:`STORE_FORMAT_UNSTATED`; no ``proof``: b""); raises RemoteProtocolError."""
    (epoch,) = _fixed(_EPOCH, buf, 0, "snapshot request")
    broker_id, pos = unpack_str(buf, _EPOCH.size)
    if pos >= len(buf):
        raise _bad("truncated snapshot request")
    db = buf[pos]
    after, pos = _unpack_bytes(buf, pos + 1, "snapshot request cursor")
    (max_bytes,) = _fixed(_U32, buf, pos, "snapshot request")
    fmt, pos = _store_format(buf, pos + 4, "snapshot request")
    proof, pos = _proof(buf, pos, "snapshot request")
    _end(buf, pos, "snapshot request")
    return SnapshotRequest(epoch, broker_id, db, after, max_bytes, fmt, proof)


def encode_snapshot_answer(ans: SnapshotAnswer) -> list[bytes]:
    """``position u64, count u32, last bytes (ABSENT: the database is done)``, then
    per item ``key bytes, value bytes``."""
    parts = [_POS_COUNT.pack(ans.position, len(ans.items)), *_pack_bytes(ans.last)]
    for k, v in ans.items:
        parts += _pack_bytes(k)
        parts += _pack_bytes(v)
    return parts


def decode_snapshot_answer(buf: bytes) -> SnapshotAnswer:
    """The one decoder of a snapshot answer; raises RemoteProtocolError."""
    position, count = _fixed(_POS_COUNT, buf, 0, "snapshot answer")
    last, pos = _unpack_bytes(buf, _POS_COUNT.size, "snapshot answer cursor")
    if count * 8 > len(buf) - pos:
        raise _bad(f"snapshot answer announces {count} items in {len(buf)} bytes")
    items: list[tuple[bytes, bytes]] = []
    for _ in range(count):
        k, pos = _unpack_bytes(buf, pos, "snapshot key")
        v, pos = _unpack_bytes(buf, pos, "snapshot value")
        items.append((_present(k, "snapshot key"), _present(v, "snapshot value")))
    _end(buf, pos, "snapshot answer")
    return SnapshotAnswer(position, items, last)
