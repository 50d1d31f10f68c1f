"""The LMDB store: a partitioned log with per-queue indexes.

Layout (one LMDB environment, named databases; every integer big-endian so byte
order is numeric order)::

    meta       b"format"             -> u32 format version
               b"next_global"        -> u64 next global offset (survives retention)
               b"next_topic_id"      -> u32
               b"deleting"           -> JSON list of topic ids whose data is being removed
    topics     topic name (utf-8)    -> JSON TopicInfo
    messages   u64 global offset     -> stored record (equeue.wire: crc32, header, entry)
    qindex     u32 topic, u32 queue, u64 queue offset -> u64 global offset
    kindex     u32 topic, u32 crc32(key), u64 global offset -> b""   (lookup by key)
    qstats     u32 topic, u32 queue  -> u64 next queue offset, u64 retained bytes
    offsets    group \\0 topic \\0 u32 queue -> u64 committed offset
    schedule   u64 due ms, u64 seq   -> u32 topic, u32 queue, entry  (delayed messages)
    sched_count u32 topic            -> u64 pending delayed messages
    producers  16-byte producer id, u32 topic, u32 queue -> u64 last sequence, u64 ms,
                                     then up to 16 × (u64 base seq, u64 global, u64 queue off,
                                     u32 stored, u32 scheduled)

Writes: :meth:`Store.write` runs a list of :class:`WriteOp` in ONE write
transaction (group commit) and must be called from one thread at a time (the
appender's worker). Each op checks its preconditions before it writes anything and
may raise an :class:`~equeue.errors.EQueueError` then (only that op fails); a
failure after writes began (map full, disk full, I/O) aborts the whole transaction
and fails every op in it -- nothing is half-written. In-memory offsets change only
after the commit succeeded, so readers never see an uncommitted message.

Reads run in any thread, each in its own read transaction (MVCC).
"""

from __future__ import annotations

import heapq
import json
import logging
import struct
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import accumulate, chain, islice, repeat
from operator import add, getitem, ne
from pathlib import Path
from typing import Any, Final
from zlib import crc32

import attrs
import lmdb

from equeue import control, wire
from equeue.errors import (
    BadRequest,
    CorruptRecord,
    DelayTooLong,
    EQueueError,
    MessageTooLarge,
    OutOfOrderSequence,
    QueueNotFound,
    StoreError,
    StoreFull,
    TopicExists,
    TopicNotFound,
)
from equeue.models import SendResult
from equeue.protocol import PullStatus
from equeue.routing import key_hash
from equeue.wire import FLAG_KEY

log = logging.getLogger("equeue.store")

FORMAT_VERSION: Final = 1
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
QKEY = struct.Struct(">IIQ")
TQ = struct.Struct(">II")
KKEY = struct.Struct(">IIQ")
QSTAT = struct.Struct(">QQ")
SKEY = struct.Struct(">QQ")
PSTATE = struct.Struct(">QQ")
PRING = struct.Struct(">QQQII")
PKEY = struct.Struct(">16sII")
PRODUCER_RING = 16
_DBS = (
    b"meta", b"topics", b"messages", b"qindex", b"kindex", b"qstats", b"offsets",
    b"schedule", b"sched_count", b"producers",
)  # fmt: skip


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return group.encode() + b"\0" + topic.encode() + b"\0" + U32.pack(queue_id)


@attrs.define
class QueueState:
    next_offset: int = 0
    min_offset: int = 0
    bytes: int = 0


@attrs.frozen
class ReadResult:
    """What a read found: parallel sequences of global offsets and stored records,
    plus the queue's range."""

    status: PullStatus
    globals: Sequence[int]
    recs: list[bytes]
    min_offset: int
    max_offset: int
    next_offset: int

    @property
    def records(self) -> list[tuple[int, bytes]]:
        """(global offset, stored record) pairs."""
        return list(zip(self.globals, self.recs, strict=True))


class _Writer:
    """Context handed to write ops: the open transaction plus staged state."""

    def __init__(self, store: Store, txn: lmdb.Transaction, now: int) -> None:
        self.store = store
        self.txn = txn
        self.now = now
        self.next_global = store.next_global
        self.queues: dict[tuple[int, int], QueueState] = {}
        self.topics: dict[str, control.TopicInfo | None] = {}
        self.touched: set[tuple[int, int]] = set()
        self.sched_delta: dict[int, int] = {}
        self.next_topic_id: int | None = None
        self.deleting: list[int] | None = None
        self.committed_offsets: list[tuple[str, str, int, int]] = []
        self.db = store.db
        self.wrote = False
        self._cursors: dict[bytes, lmdb.Cursor] = {}

    def cursor(self, db: bytes) -> lmdb.Cursor:
        """A cursor on named database ``db`` in this transaction (reused across ops)."""
        cur = self._cursors.get(db)
        if cur is None:
            cur = self._cursors[db] = self.txn.cursor(db=self.db[db])
        return cur

    def queue(self, topic_id: int, queue_id: int) -> QueueState:
        key = (topic_id, queue_id)
        st = self.queues.get(key)
        if st is None:
            cur = self.store.queues.get(key) or QueueState()
            st = self.queues[key] = attrs.evolve(cur)
        return st

    def topic(self, name: str) -> control.TopicInfo | None:
        if name in self.topics:
            return self.topics[name]
        return self.store.topics.get(name)


class WriteOp:
    """One unit of work inside a group-commit transaction."""

    def apply(self, w: _Writer) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


@attrs.define
class ProduceOp(WriteOp):
    """Append entries to one queue; entries with a future ``deliver_at`` go to the
    schedule instead. Idempotent when ``producer_id`` is set."""

    topic: control.TopicInfo
    queue_id: int
    entries: Sequence[bytes]
    producer_id: bytes | None = None
    base_sequence: int = 0
    max_body: int = 1 << 62
    max_delay_ms: int = 1 << 62

    def apply(self, w: _Writer) -> wire.ProduceResponse:
        t = self.topic
        if w.topic(t.name) is None:
            raise TopicNotFound(f"topic {t.name!r} was deleted")
        if not 0 <= self.queue_id < t.queues:
            raise QueueNotFound(f"topic {t.name!r} has {t.queues} queues; no queue {self.queue_id}")
        keyed, klens, dues = _scan_entries(self.entries, self.max_body, w.now, self.max_delay_ms)
        pkey = None
        pstate = b""
        n = len(self.entries)
        if self.producer_id is not None:
            pkey = PKEY.pack(self.producer_id, t.topic_id, self.queue_id)
            pstate = bytes(w.txn.get(pkey, db=w.db[b"producers"]) or b"")
            if not pstate and self.base_sequence != 0:
                # An unknown producer starts at 0. Accepting a later batch first would
                # make the earlier one look like a duplicate and drop it.
                raise OutOfOrderSequence(
                    f"sequence {self.base_sequence} from a producer this broker does not know: "
                    "its batches start at 0 (resend in order, or use a new producer id)"
                )
            if pstate:
                last_seq, _ = PSTATE.unpack_from(pstate, 0)
                if self.base_sequence <= last_seq:
                    return _duplicate_answer(pstate, self.base_sequence)
                if self.base_sequence != last_seq + 1:
                    raise OutOfOrderSequence(
                        f"sequence {self.base_sequence} after {last_seq}: resend in order"
                    )
        # ---- preconditions done; writes start
        w.wrote = True
        tid, qid = t.topic_id, self.queue_id
        st = w.queue(tid, qid)
        first_global, first_queue = w.next_global, st.next_offset
        entries = self.entries
        scheduled = 0
        if dues is not None:  # delayed entries go to the schedule, in order
            live: list[bytes] = []
            live_idx: list[int] = []
            tq = TQ.pack(tid, qid)
            for i, entry in enumerate(entries):
                if dues[i]:
                    _schedule_put(w, dues[i], tq + entry)
                    scheduled += 1
                else:
                    live.append(entry)
                    live_idx.append(i)
            if keyed:
                kl_of = dict(zip(keyed, klens, strict=True))
                keyed = [j for j, i in enumerate(live_idx) if i in kl_of]
                klens = [kl_of[live_idx[j]] for j in keyed]
            entries = live
        m = len(entries)
        if m:
            # per-message work in C loops (map/zip), not Python bytecode: this is
            # the broker's hottest loop (see docs/storage.md, "Performance")
            g, qo, now = first_global, first_queue, w.now
            offs = range(qo, qo + m)
            ver = wire.RECORD_VERSION
            rests = map(_REC_REST.pack, repeat(ver, m), repeat(tid, m), repeat(qid, m), offs, repeat(now, m))
            crcs = map(crc32, entries, map(crc32, rests))  # == wire.encode_record's checksum
            heads = map(_REC_HEADER.pack, crcs, repeat(ver, m), repeat(tid, m), repeat(qid, m), offs, repeat(now, m))
            recs = list(map(add, heads, entries))
            gks = list(map(U64.pack, range(g, g + m)))
            w.cursor(b"messages").putmulti(zip(gks, recs, strict=True), append=True)
            w.cursor(b"qindex").putmulti(zip(map(QKEY.pack, repeat(tid, m), repeat(qid, m), offs), gks, strict=True))
            if keyed:  # key index: crc32 of the key bytes == equeue.routing.key_hash
                hs = _EH.size
                k = len(keyed)
                keys = map(getitem, map(entries.__getitem__, keyed), map(slice, repeat(hs, k), map(add, repeat(hs, k), klens)))
                kks = map(KKEY.pack, repeat(tid, k), map(crc32, keys), map(add, repeat(g, k), keyed))  # type: ignore[arg-type]
                w.cursor(b"kindex").putmulti(zip(kks, repeat(b"", k), strict=True))
            w.next_global = g + m
            st.next_offset = qo + m
            st.bytes += sum(map(len, recs))
            w.touched.add((tid, qid))
        if scheduled:
            w.sched_delta[tid] = w.sched_delta.get(tid, 0) + scheduled
        answer = wire.ProduceResponse(
            first_global if m else -1, first_queue if m else -1, m, scheduled
        )
        if pkey is not None:
            last = self.base_sequence + n - 1
            ring = pstate[PSTATE.size :] if pstate else b""
            item = PRING.pack(
                self.base_sequence, answer.first_global & wire.NO_OFFSET,
                answer.first_queue & wire.NO_OFFSET, answer.stored, answer.scheduled,
            )  # fmt: skip
            ring = (item + ring)[: PRING.size * PRODUCER_RING]
            w.txn.put(pkey, PSTATE.pack(last, w.now) + ring, db=w.db[b"producers"])
        return answer


_EH = wire.ENTRY_HEADER


_CRC = slice(0, 4)
_from_be: Callable[[bytes], int] = partial(int.from_bytes, byteorder="big")
_AFTER_CRC = slice(4, None)


#: a stored record's header, and the same without its leading crc32
_REC_HEADER = wire.RECORD_HEADER
_REC_REST = struct.Struct(">" + _REC_HEADER.format.lstrip(">")[1:])


def _scan_entries(
    entries: Sequence[bytes], max_body: int, now: int, max_delay_ms: int
) -> tuple[list[int], list[int], list[int] | None]:
    """Indexes of entries with a key, their key lengths, and due times (None when no
    entry is delayed).

    Raises MessageTooLarge / DelayTooLong / BadRequest (before anything is written).
    """
    keyed: list[int] = []
    klens: list[int] = []
    dues: list[int] | None = None
    hsize = _EH.size
    try:
        headers = list(map(_EH.unpack_from, entries))
    except struct.error as exc:
        raise BadRequest("truncated message entry") from exc
    limit = max_body + hsize - 4  # an entry's n up to this cannot carry a body over max_body
    for i, (n, flags, deliver_at, _rc, kl, tl, pl) in enumerate(headers):
        if n - kl - tl - pl < hsize - 4 or n > limit:
            e = entries[i]
            body = n + 4 - hsize - kl - tl - pl
            if body < 0 or n + 4 != len(e):
                raise BadRequest(f"message {i}: entry lengths are inconsistent")
            if body > max_body:
                raise MessageTooLarge(f"message {i} body is {body} bytes; the broker's limit is {max_body}")
        if flags & FLAG_KEY:
            keyed.append(i)
            klens.append(kl)
        if deliver_at > now:
            if deliver_at - now > max_delay_ms:
                raise DelayTooLong(
                    f"message {i} is due in {(deliver_at - now) / 1000:.0f} s; the broker's maximum "
                    f"delay is {max_delay_ms / 1000:.0f} s"
                )
            if dues is None:
                dues = [0] * len(entries)
            dues[i] = deliver_at
    if any(map(ne, map(len, entries), (h[0] + 4 for h in headers))):
        raise BadRequest("an entry's length prefix does not match its size")
    return keyed, klens, dues


def _duplicate_answer(pstate: bytes, base_seq: int) -> wire.ProduceResponse:
    """The original answer of a batch seen before, or a bare 'duplicate'."""
    for pos in range(PSTATE.size, len(pstate), PRING.size):
        seq, g, q, stored, sched = PRING.unpack_from(pstate, pos)
        if seq == base_seq:
            return wire.ProduceResponse(
                -1 if g == wire.NO_OFFSET else g, -1 if q == wire.NO_OFFSET else q, stored, sched, True
            )
    return wire.ProduceResponse(-1, -1, 0, 0, True)


@attrs.define
class CreateTopicOp(WriteOp):
    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    exist_ok: bool = False

    def apply(self, w: _Writer) -> control.TopicInfo:
        existing = w.topic(self.name)
        if existing is not None:
            if self.exist_ok:
                return existing
            raise TopicExists(f"topic {self.name!r} already exists")
        w.wrote = True
        tid = w.next_topic_id if w.next_topic_id is not None else w.store.next_topic_id
        w.next_topic_id = tid + 1
        info = control.TopicInfo(
            self.name, tid, self.queues, w.now, self.retention_ms, self.retention_bytes
        )
        w.txn.put(self.name.encode(), control.encode(info), db=w.db[b"topics"])
        w.topics[self.name] = info
        for q in range(self.queues):
            w.queue(tid, q)
        return info


@attrs.define
class AlterTopicOp(WriteOp):
    name: str
    queues: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None

    def apply(self, w: _Writer) -> control.TopicInfo:
        info = w.topic(self.name)
        if info is None:
            raise TopicNotFound(f"no topic {self.name!r}")
        if self.queues is not None and self.queues < info.queues:
            raise BadRequest(
                f"topic {self.name!r} has {info.queues} queues; queue counts only grow "
                "(shrinking would strand stored messages)"
            )
        changes: dict[str, Any] = {}
        if self.queues is not None:
            changes["queues"] = self.queues
        if self.retention_ms is not None:
            changes["retention_ms"] = None if self.retention_ms < 0 else self.retention_ms
        if self.retention_bytes is not None:
            changes["retention_bytes"] = None if self.retention_bytes < 0 else self.retention_bytes
        new = attrs.evolve(info, **changes)
        w.wrote = True
        w.txn.put(self.name.encode(), control.encode(new), db=w.db[b"topics"])
        w.topics[self.name] = new
        for q in range(info.queues, new.queues):
            w.queue(new.topic_id, q)
        return new


@attrs.define
class DeleteTopicOp(WriteOp):
    """Remove a topic now; its stored data is removed in bounded background steps."""

    name: str

    def apply(self, w: _Writer) -> None:
        info = w.topic(self.name)
        if info is None:
            raise TopicNotFound(f"no topic {self.name!r}")
        w.wrote = True
        w.txn.delete(self.name.encode(), db=w.db[b"topics"])
        w.topics[self.name] = None
        deleting = w.deleting if w.deleting is not None else list(w.store.deleting)
        deleting.append(info.topic_id)
        w.deleting = deleting
        w.txn.put(b"deleting", json.dumps(deleting).encode(), db=w.db[b"meta"])


@attrs.define
class CommitOffsetOp(WriteOp):
    group: str
    topic: str
    queue_id: int
    offset: int

    def apply(self, w: _Writer) -> None:
        w.wrote = True
        w.txn.put(_offset_key(self.group, self.topic, self.queue_id), U64.pack(self.offset), db=w.db[b"offsets"])
        w.committed_offsets.append((self.group, self.topic, self.queue_id, self.offset))


@attrs.define
class MoveDueOp(WriteOp):
    """Move delayed messages due at ``w.now`` into their queues: remove them from the
    schedule and append them to the log in the same transaction, earliest due first
    (ties in produce order), at most ``limit`` per transaction so a burst never makes
    one huge transaction. Returns the number of schedule entries consumed.

    Entries whose topic was deleted (or is now too small for their queue) and
    entries that are malformed are dropped with a log line; they never make the
    transaction fail, so one bad entry cannot block the schedule.
    """

    limit: int = 2000

    def apply(self, w: _Writer) -> int:
        cur = w.txn.cursor(db=w.db[b"schedule"])
        if not cur.first() or SKEY.unpack(cur.key())[0] > w.now:
            return 0  # nothing due: stay read-only
        w.wrote = True
        by_id: dict[int, control.TopicInfo] = {}
        for name in {*w.store.topics, *w.topics}:
            info = w.topic(name)
            if info is not None:
                by_id[info.topic_id] = info
        groups: dict[tuple[int, int], list[bytes]] = {}
        delta: dict[int, int] = {}
        moved = 0
        while moved < self.limit:
            k = cur.key()
            if not k or SKEY.unpack(k)[0] > w.now:
                break
            v = bytes(cur.value())
            moved += 1
            tid, qid = TQ.unpack_from(v, 0) if len(v) >= TQ.size else (0, 0)
            entry = v[TQ.size :]
            delta[tid] = delta.get(tid, 0) - 1
            t = by_id.get(tid)
            if t is None or qid >= t.queues:
                log.warning("dropping a delayed message of deleted topic id %d (queue %d)", tid, qid)
            elif not _entry_ok(entry):
                log.error("dropping a malformed delayed message for topic %s queue %d", t.name, qid)
            else:
                groups.setdefault((tid, qid), []).append(_undelay(entry))
            cur.delete()  # moves to the next entry
        for (tid, qid), entries in groups.items():
            # cannot raise: the topic exists in this txn, the queue is in range and the
            # entries are well-formed and no longer delayed. If it did, abort the whole
            # transaction (a RuntimeError does) rather than commit half a move.
            try:
                ProduceOp(by_id[tid], qid, entries).apply(w)
            except EQueueError as exc:
                raise RuntimeError(f"moving delayed messages into {tid}/{qid} failed: {exc}") from exc
        for tid, d in delta.items():
            w.sched_delta[tid] = w.sched_delta.get(tid, 0) + d
        return moved


def _entry_ok(entry: bytes) -> bool:
    """The lengths ProduceOp checks are consistent (they were when it was scheduled)."""
    if len(entry) < _EH.size:
        return False
    n, _flags, _due, _rc, kl, tl, pl = _EH.unpack_from(entry, 0)
    return n + 4 == len(entry) and kl + tl + pl <= n + 4 - _EH.size


def _undelay(entry: bytes) -> bytes:
    """The entry with deliver_at cleared (it is being delivered now), so it is never
    scheduled again if it passes through a produce path a second time."""
    return entry[:5] + b"\0" * 8 + entry[13:]


def _schedule_put(w: _Writer, due: int, value: bytes) -> None:
    """Add one entry to the schedule under (due, seq). Never overwrites: if a key
    exists (sequence reused after a clock step back across a restart) take the next
    sequence, so a pending delayed message can never be lost to a collision."""
    db = w.db[b"schedule"]
    while not w.txn.put(SKEY.pack(due, w.store.next_sched_seq()), value, db=db, overwrite=False):
        pass


@attrs.define
class RetentionOp(WriteOp):
    """Delete the oldest messages past their topic's retention, at most ``limit`` per
    transaction (the caller repeats while a full batch was removed).

    Per topic (its overrides, else the broker defaults; 0 or None = no limit):

    - time: per queue, from its head, messages stored before ``now - retention_ms``;
    - consumed (``delete_consumed``): per queue, messages below the lowest committed
      offset of every group that has offsets on the topic or a live subscriber
      (``live_groups``); a group without an offset for a queue protects all of it;
    - size: while the topic's retained record bytes exceed ``retention_bytes``, the
      oldest head across its queues (lowest global offset) goes first.

    Also removes the data of deleted topics. Messages go strictly from the head of a
    queue, so the retained range stays contiguous. Returns the number removed.
    """

    default_retention_ms: int | None
    default_retention_bytes: int | None
    delete_consumed: bool = False
    limit: int = 5000
    live_groups: Mapping[str, frozenset[str]] = attrs.Factory(dict)

    def apply(self, w: _Writer) -> int:
        s = w.store
        removed = 0
        for tid in list(w.deleting if w.deleting is not None else s.deleting):
            removed += self._purge_topic(w, tid, self.limit - removed)
            if removed >= self.limit:
                return removed
        for t in list(s.topics.values()):
            if removed >= self.limit:
                break
            removed += self._topic(w, t, self.limit - removed)
        return removed

    def _topic(self, w: _Writer, t: control.TopicInfo, budget: int) -> int:
        rms = t.retention_ms if t.retention_ms is not None else self.default_retention_ms
        rbytes = t.retention_bytes if t.retention_bytes is not None else self.default_retention_bytes
        cutoff = w.now - rms if rms else None
        consumed = self._consumed(w.store, t) if self.delete_consumed else {}
        mdb = w.db[b"messages"]
        tid = t.topic_id
        removed = 0
        if cutoff is not None or consumed:
            for q in range(t.queues):
                st = self._state(w, tid, q)
                upto = consumed.get(q, 0)
                while removed < budget and st.min_offset < st.next_offset:
                    g = self._head_global(w, tid, q, st.min_offset)
                    if g is None:
                        break
                    if st.min_offset >= upto:
                        if cutoff is None:
                            break
                        rec = w.txn.get(U64.pack(g), db=mdb)
                        if rec is not None and wire.RECORD_HEADER.unpack_from(rec, 0)[5] >= cutoff:
                            break
                    if st is not w.queues.get((tid, q)):
                        st = w.queue(tid, q)
                    self._delete_head(w, tid, q, st, g)
                    removed += 1
        if rbytes:
            total = sum(self._state(w, tid, q).bytes for q in range(t.queues))
            heads: list[tuple[int, int]] = []
            if total > rbytes:
                for q in range(t.queues):
                    st = self._state(w, tid, q)
                    g = self._head_global(w, tid, q, st.min_offset) if st.min_offset < st.next_offset else None
                    if g is not None:
                        heapq.heappush(heads, (g, q))
            while removed < budget and total > rbytes and heads:
                g, q = heapq.heappop(heads)
                st = w.queue(tid, q)
                total -= self._delete_head(w, tid, q, st, g)
                removed += 1
                if st.min_offset < st.next_offset:
                    nxt = self._head_global(w, tid, q, st.min_offset)
                    if nxt is not None:
                        heapq.heappush(heads, (nxt, q))
        return removed

    def _consumed(self, s: Store, t: control.TopicInfo) -> dict[int, int]:
        """Per queue, the offset below which every interested group has committed."""
        groups = {g for (g, tt, _q) in s.offsets if tt == t.name}
        groups |= self.live_groups.get(t.name, frozenset())
        if not groups:
            return {}
        return {q: min(s.offsets.get((g, t.name, q), 0) for g in groups) for q in range(t.queues)}

    @staticmethod
    def _state(w: _Writer, tid: int, q: int) -> QueueState:
        """Queue state as staged in this txn, without staging it (read-only)."""
        return w.queues.get((tid, q)) or w.store.queues.get((tid, q)) or QueueState()

    @staticmethod
    def _head_global(w: _Writer, tid: int, q: int, off: int) -> int | None:
        v = w.txn.get(QKEY.pack(tid, q, off), db=w.db[b"qindex"])
        if v is None:
            log.warning("queue %d/%d has no index entry at its head offset %d", tid, q, off)
            return None
        return int(U64.unpack(v)[0])

    @staticmethod
    def _delete_head(w: _Writer, tid: int, q: int, st: QueueState, g: int) -> int:
        """Delete the head message of a queue (record, queue index, key index)."""
        w.wrote = True
        gk = U64.pack(g)
        rec = w.txn.pop(gk, db=w.db[b"messages"])
        w.txn.delete(QKEY.pack(tid, q, st.min_offset), db=w.db[b"qindex"])
        size = len(rec) if rec else 0
        if rec:
            try:
                key = wire.record_entry_meta(rec).key
            except EQueueError:
                key = None
            if key is not None:
                w.txn.delete(KKEY.pack(tid, key_hash(key), g), db=w.db[b"kindex"])
        st.min_offset += 1
        st.bytes = max(0, st.bytes - size)
        w.touched.add((tid, q))
        return size

    @staticmethod
    def _purge_topic(w: _Writer, tid: int, limit: int) -> int:
        """Remove up to ``limit`` records of a deleted topic; forget it when done."""
        cur = w.txn.cursor(db=w.db[b"qindex"])
        prefix = U32.pack(tid)
        n = 0
        w.wrote = True
        if cur.set_range(prefix):
            while n < limit and cur.key()[:4] == prefix:
                w.txn.delete(cur.value(), db=w.db[b"messages"])
                n += 1
                cur.delete()
        if n < limit:
            kc = w.txn.cursor(db=w.db[b"kindex"])
            if kc.set_range(prefix):
                while n < limit and kc.key()[:4] == prefix:
                    n += 1
                    kc.delete()
        if n < limit:
            qc = w.txn.cursor(db=w.db[b"qstats"])
            if qc.set_range(prefix):
                while qc.key()[:4] == prefix:
                    qc.delete()
            deleting = [x for x in (w.deleting if w.deleting is not None else w.store.deleting) if x != tid]
            w.deleting = deleting
            w.txn.put(b"deleting", json.dumps(deleting).encode(), db=w.db[b"meta"])
            for key in [k for k in w.store.queues if k[0] == tid]:
                w.queues.pop(key, None)
        return n


@attrs.define
class ExpireProducersOp(WriteOp):
    """Forget the idempotence state of producers silent for longer than ``ttl_ms``.

    Examines at most ``limit`` entries from ``start`` (a key; b"" = the first) and
    returns ``(removed, next_start)``; ``next_start`` is None once the end was reached,
    so the caller walks the whole table in bounded transactions.
    """

    ttl_ms: int
    limit: int = 10_000
    start: bytes = b""

    def apply(self, w: _Writer) -> tuple[int, bytes | None]:
        cur = w.txn.cursor(db=w.db[b"producers"])
        ok = cur.set_range(self.start) if self.start else cur.first()
        n = seen = 0
        horizon = w.now - self.ttl_ms
        while ok and seen < self.limit:
            seen += 1
            v = cur.value()
            ts = PSTATE.unpack_from(v, 0)[1] if len(v) >= PSTATE.size else 0
            if ts < horizon:
                w.wrote = True
                n += 1
                cur.delete()  # moves to the next entry (key b"" past the end)
                ok = bool(cur.key())
            else:
                ok = cur.next()
        return n, (bytes(cur.key()) or None) if ok else None


@attrs.frozen
class WriteOutcome:
    results: list[Any]  # per op: its result or the EQueueError it raised
    touched: set[tuple[int, int]]
    committed_offsets: list[tuple[str, str, int, int]]
    #: some op added delayed messages to the schedule
    scheduled: bool = False


class Store:
    """The LMDB environment and its in-memory view (topics, queue offsets)."""

    def __init__(self, path: str | Path, *, map_size: int = 8 << 30, sync: bool = True) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.sync_commits = sync
        self.map_size = map_size
        try:
            self.env = lmdb.open(
                str(self.path), map_size=map_size, max_dbs=len(_DBS) + 2, sync=sync,
                metasync=sync, readahead=False, max_readers=512, writemap=False,
            )  # fmt: skip
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc
        with self.env.begin(write=True) as txn:
            self.db = {name: self.env.open_db(name, txn=txn) for name in _DBS}
            fmt = txn.get(b"format", db=self.db[b"meta"])
            if fmt is None:
                txn.put(b"format", U32.pack(FORMAT_VERSION), db=self.db[b"meta"])
            elif U32.unpack(fmt)[0] != FORMAT_VERSION:
                raise StoreError(
                    f"store at {self.path} has format {U32.unpack(fmt)[0]}, this broker reads "
                    f"{FORMAT_VERSION}"
                )
        self.topics: dict[str, control.TopicInfo] = {}
        self.queues: dict[tuple[int, int], QueueState] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.sched_pending: dict[int, int] = {}
        self.deleting: list[int] = []
        self.next_global = 0
        self.next_topic_id = 1
        self._sched_seq = time.time_ns()
        self.transactions = 0
        self._recover()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Rebuild in-memory offsets from last keys (no full scan)."""
        with self.env.begin() as txn:
            meta = self.db[b"meta"]
            ng = txn.get(b"next_global", db=meta)
            self.next_global = U64.unpack(ng)[0] if ng else 0
            cur = txn.cursor(db=self.db[b"messages"])
            if cur.last():
                self.next_global = max(self.next_global, U64.unpack(cur.key())[0] + 1)
            nt = txn.get(b"next_topic_id", db=meta)
            self.next_topic_id = U32.unpack(nt)[0] if nt else 1
            dl = txn.get(b"deleting", db=meta)
            self.deleting = json.loads(dl) if dl else []
            for k, v in txn.cursor(db=self.db[b"topics"]):
                info: control.TopicInfo = control.decode(v, control.TopicInfo)
                self.topics[bytes(k).decode()] = info
            qidx = txn.cursor(db=self.db[b"qindex"])
            for info in self.topics.values():
                for q in range(info.queues):
                    st = QueueState()
                    sv = txn.get(TQ.pack(info.topic_id, q), db=self.db[b"qstats"])
                    if sv:
                        st.next_offset, st.bytes = QSTAT.unpack(sv)
                    # last key of the queue: set_range past it, step back
                    if qidx.set_range(QKEY.pack(info.topic_id, q + 1, 0)):
                        ok = qidx.prev()
                    else:
                        ok = qidx.last()
                    if ok:
                        t, qq, off = QKEY.unpack(qidx.key())
                        if (t, qq) == (info.topic_id, q):
                            st.next_offset = max(st.next_offset, off + 1)
                    st.min_offset = st.next_offset
                    if qidx.set_range(QKEY.pack(info.topic_id, q, 0)):
                        t, qq, off = QKEY.unpack(qidx.key())
                        if (t, qq) == (info.topic_id, q):
                            st.min_offset = off
                    self.queues[(info.topic_id, q)] = st
            for k, v in txn.cursor(db=self.db[b"sched_count"]):
                self.sched_pending[U32.unpack(k)[0]] = U64.unpack(v)[0]
            for k, v in txn.cursor(db=self.db[b"offsets"]):
                group, topic, rest = k.split(b"\0", 2)
                self.offsets[(group.decode(), topic.decode(), U32.unpack(rest)[0])] = U64.unpack(v)[0]

    def next_sched_seq(self) -> int:
        self._sched_seq += 1
        return self._sched_seq

    # ------------------------------------------------------------------ writes
    def write(self, ops: Sequence[WriteOp]) -> WriteOutcome:
        """Run ``ops`` in one write transaction (call from one thread at a time).

        Raises StoreFull / StoreError when the transaction as a whole failed: then
        no op took effect.
        """
        ts = now_ms()
        try:
            txn = self.env.begin(write=True)
        except lmdb.Error as exc:
            raise _store_error(exc, self.path) from exc
        w = _Writer(self, txn, ts)
        results: list[Any] = []
        try:
            for op in ops:
                try:
                    results.append(op.apply(w))
                except EQueueError as exc:
                    results.append(exc)
            if not w.wrote:
                txn.abort()
                return WriteOutcome(results, set(), [])
            meta = self.db[b"meta"]
            if w.next_global != self.next_global:
                txn.put(b"next_global", U64.pack(w.next_global), db=meta)
            if w.next_topic_id is not None:
                txn.put(b"next_topic_id", U32.pack(w.next_topic_id), db=meta)
            for (tid, q), st in w.queues.items():
                txn.put(TQ.pack(tid, q), QSTAT.pack(st.next_offset, st.bytes), db=self.db[b"qstats"])
            for tid, d in w.sched_delta.items():
                n = max(0, self.sched_pending.get(tid, 0) + d)
                txn.put(U32.pack(tid), U64.pack(n), db=self.db[b"sched_count"])
            txn.commit()
        except lmdb.Error as exc:
            txn.abort()
            err = _store_error(exc, self.path)
            log.error("%s", err)
            raise err from exc
        except BaseException:
            txn.abort()
            raise
        # committed: publish the new state
        self.transactions += 1
        self.next_global = w.next_global
        if w.next_topic_id is not None:
            self.next_topic_id = w.next_topic_id
        for name, info in w.topics.items():
            if info is None:
                self.topics.pop(name, None)
            else:
                self.topics[name] = info
        self.queues.update(w.queues)
        if w.deleting is not None:
            self.deleting = w.deleting
            for key in [k for k in self.queues if k[0] in self.deleting]:
                del self.queues[key]
        for tid, d in w.sched_delta.items():
            self.sched_pending[tid] = max(0, self.sched_pending.get(tid, 0) + d)
        for group, topic, q, off in w.committed_offsets:
            self.offsets[(group, topic, q)] = off
        return WriteOutcome(
            results, w.touched, w.committed_offsets, any(d > 0 for d in w.sched_delta.values())
        )

    def sync(self) -> None:
        """Force committed data to disk (the ``async`` flush policy calls this)."""
        self.env.sync(True)

    def close(self) -> None:
        try:
            self.env.sync(True)
        finally:
            self.env.close()

    # ------------------------------------------------------------------ reads
    def topic(self, name: str) -> control.TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise TopicNotFound(f"no topic {name!r}")
        return info

    def queue_state(self, topic_id: int, queue_id: int) -> QueueState:
        return self.queues.get((topic_id, queue_id)) or QueueState()

    def read_queue(
        self,
        info: control.TopicInfo,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tag_filter: frozenset[bytes] | None = None,
        verify: bool = True,
    ) -> ReadResult:
        """Read up to ``max_messages`` records of a queue from ``offset``.

        ``verify=False`` skips the checksum recheck, for a client that verifies every
        record itself. Returns a status (never raises for expected outcomes); raises
        CorruptRecord when the first record to return fails its checksum.
        """
        if not 0 <= queue_id < info.queues:
            raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")
        st = self.queue_state(info.topic_id, queue_id)
        lo, hi = st.min_offset, st.next_offset
        if offset < lo:
            return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], [], lo, hi, lo)
        if offset > hi:
            # The writer thread publishes next offsets just after its commit, so a
            # reader may already have seen committed messages past ``hi``: ask LMDB.
            hi = max(hi, self._last_committed(info.topic_id, queue_id) + 1)
            if offset > hi:
                return ReadResult(PullStatus.OFFSET_OVERFLOW, [], [], lo, hi, hi)
        if offset == hi:
            return ReadResult(PullStatus.NO_NEW_MESSAGE, [], [], lo, hi, hi)
        if tag_filter is None:
            fast = self._read_dense(info.topic_id, queue_id, offset, min(max_messages, hi - offset), max_bytes, verify)
            if fast is not None:
                return ReadResult(PullStatus.FOUND, fast[0], fast[1], lo, hi, offset + len(fast[1]))
        gbes: list[int] = []
        recs: list[bytes] = []
        size = 0
        nxt = offset
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            get = txn.get
            mdb = self.db[b"messages"]
            if not cur.set_range(QKEY.pack(info.topic_id, queue_id, offset)):
                return ReadResult(PullStatus.NO_NEW_MESSAGE, [], [], lo, hi, offset)
            prefix = TQ.pack(info.topic_id, queue_id)
            scanned = 0
            for k, gk in cur:
                if k[:8] != prefix:
                    break
                qo = U64.unpack_from(k, 8)[0]
                if qo != nxt:
                    if not recs and qo > nxt and nxt == offset:
                        # retention removed the head while we looked
                        return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], [], qo, hi, qo)
                    break
                rec = get(gk, db=mdb)
                if rec is None:
                    break
                if verify:
                    try:
                        wire.record_header(rec)
                    except CorruptRecord:
                        if recs:
                            break
                        raise
                scanned += 1
                if tag_filter is not None:
                    tags = wire.record_entry_meta(rec).tags
                    if tags not in tag_filter:
                        nxt += 1
                        if scanned >= max_messages * 16:
                            break
                        continue
                if recs and size + len(rec) > max_bytes:
                    break
                gbes.append(U64.unpack(gk)[0])
                recs.append(rec)
                size += len(rec)
                nxt += 1
                if len(recs) >= max_messages:
                    break
        status = PullStatus.FOUND if recs else PullStatus.NO_NEW_MESSAGE
        return ReadResult(status, gbes, recs, lo, max(hi, nxt), nxt)

    def _read_dense(
        self, topic_id: int, queue_id: int, offset: int, count: int, max_bytes: int, verify: bool
    ) -> tuple[Sequence[int], list[bytes]] | None:
        """The common read, with per-record work in C loops: ``count`` records from
        ``offset``, all below the queue's committed next offset (so they exist unless
        retention is removing the head).

        A produce batch is stored as a run of consecutive global offsets, so the index
        is only probed (binary search) for where runs end, and each run is one cursor
        walk over the log. Where runs are short (many small interleaved batches) it
        reads the whole index range and fetches the records with ``getmulti``.
        Checksums (with ``verify``) are compared in bulk. Returns None whenever
        anything is unusual (a gap, a bad checksum, a missing record): the careful
        loop then decides."""
        qdb, mdb = self.db[b"qindex"], self.db[b"messages"]
        with self.env.begin() as txn:
            runs = _find_runs(txn, qdb, topic_id, queue_id, offset, count)
            if runs is None:
                cur = txn.cursor(db=qdb)
                if not cur.set_key(QKEY.pack(topic_id, queue_id, offset)):
                    return None
                gks = list(islice(cur.iternext(keys=False), count))
                last = txn.get(QKEY.pack(topic_id, queue_id, offset + count - 1), db=qdb)
                if len(gks) != count or last != gks[-1]:
                    return None  # keys are unique and sorted: first and last right => all dense
                got = txn.cursor(db=mdb).getmulti(gks)
                if len(got) != count:
                    return None
                recs = [v for _k, v in got]
                globals_: Sequence[int] = list(map(_from_be, gks))
            else:
                cur = txn.cursor(db=mdb)
                recs = []
                for g, m in runs:
                    if not cur.set_key(U64.pack(g)):
                        return None
                    run = list(islice(cur.iternext(keys=False), m))
                    if len(run) != m or (m > 1 and cur.key() != U64.pack(g + m - 1)):
                        return None
                    recs += run
                globals_ = array("Q", chain.from_iterable(range(g, g + m) for g, m in runs))
        if len(recs) > 1 and sum(map(len, recs)) > max_bytes:
            keep = max(1, bisect_right(list(accumulate(map(len, recs))), max_bytes))
            recs, globals_ = recs[:keep], globals_[:keep]
        if verify:
            # crc32 of everything after the stored crc == the stored crc; version byte
            n = len(recs)
            stored = map(_from_be, map(getitem, recs, repeat(_CRC, n)))  # type: ignore[arg-type]
            if any(map(ne, map(crc32, map(getitem, recs, repeat(_AFTER_CRC, n))), stored)):  # type: ignore[arg-type]
                return None
            if any(map(ne, map(getitem, recs, repeat(4, n)), repeat(wire.RECORD_VERSION, n))):  # type: ignore[arg-type]
                return None
        return globals_, recs

    def _last_committed(self, topic_id: int, queue_id: int) -> int:
        """Highest committed queue offset of a queue according to LMDB (-1 if empty)."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            ok = cur.prev() if cur.set_range(QKEY.pack(topic_id, queue_id + 1, 0)) else cur.last()
            if ok:
                t, q, off = QKEY.unpack(cur.key())
                if (t, q) == (topic_id, queue_id):
                    return int(off)
        return -1

    def get_global(self, global_offset: int) -> bytes | None:
        with self.env.begin() as txn:
            return txn.get(U64.pack(global_offset), db=self.db[b"messages"])

    def get_queue_offset(self, info: control.TopicInfo, queue_id: int, offset: int) -> tuple[int, bytes] | None:
        with self.env.begin() as txn:
            gk = txn.get(QKEY.pack(info.topic_id, queue_id, offset), db=self.db[b"qindex"])
            if gk is None:
                return None
            rec = txn.get(gk, db=self.db[b"messages"])
            return (U64.unpack(gk)[0], rec) if rec is not None else None

    def find_by_key(self, info: control.TopicInfo, key: str, limit: int) -> list[tuple[int, bytes]]:
        """Messages of ``info`` with ``key``, newest first (hash index + exact check)."""
        kb = key.encode()
        prefix = TQ.pack(info.topic_id, key_hash(kb))
        out: list[tuple[int, bytes]] = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"kindex"])
            if cur.set_range(prefix + b"\xff" * 8):
                ok = cur.prev()
            else:
                ok = cur.last()
            while ok and len(out) < limit:
                k = cur.key()
                if k[:8] != prefix:
                    break
                g = U64.unpack_from(k, 8)[0]
                rec = txn.get(U64.pack(g), db=self.db[b"messages"])
                if rec is not None and wire.record_entry_meta(rec).key == kb:
                    out.append((g, rec))
                ok = cur.prev()
        return out

    def offset_for_time(self, info: control.TopicInfo, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after ``ts_ms`` (binary search on store time)."""
        st = self.queue_state(info.topic_id, queue_id)
        lo, hi = st.min_offset, st.next_offset
        with self.env.begin() as txn:
            qdb, mdb = self.db[b"qindex"], self.db[b"messages"]

            def ts_at(off: int) -> int:
                gk = txn.get(QKEY.pack(info.topic_id, queue_id, off), db=qdb)
                rec = txn.get(gk, db=mdb) if gk else None
                return wire.RECORD_HEADER.unpack_from(rec, 0)[5] if rec else 0

            while lo < hi:
                mid = (lo + hi) // 2
                if ts_at(mid) < ts_ms:
                    lo = mid + 1
                else:
                    hi = mid
        return lo

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.get((group, topic, queue_id), -1)

    def min_committed(self, topic: str) -> dict[int, int]:
        """Per queue, the lowest offset committed by any group with offsets on ``topic``."""
        out: dict[int, int] = {}
        for (_g, t, q), off in self.offsets.items():
            if t == topic:
                out[q] = min(off, out.get(q, off))
        return out

    def next_due(self) -> int | None:
        """Due time (ms) of the earliest delayed message, or None."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"schedule"])
            if cur.first():
                return int(SKEY.unpack(cur.key())[0])
        return None

    def pending_delayed(self, topic_id: int) -> int:
        return self.sched_pending.get(topic_id, 0)

    def describe(self, name: str) -> control.TopicDescription:
        info = self.topic(name)
        queues = []
        for q in range(info.queues):
            st = self.queue_state(info.topic_id, q)
            queues.append(
                control.QueueStats(q, st.min_offset, st.next_offset, st.next_offset - st.min_offset, st.bytes)
            )
        return control.TopicDescription(
            info, queues, self.pending_delayed(info.topic_id), sum(q.bytes for q in queues)
        )

    def store_bytes(self) -> int:
        info = self.env.info()
        stat = self.env.stat()
        return int(info["last_pgno"] + 1) * int(stat["psize"])

    def groups_of(self, topic: str | None = None) -> set[str]:
        return {g for (g, t, _q) in self.offsets if topic is None or t == topic}

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {(t, q): off for (g, t, q), off in self.offsets.items() if g == group}


#: give up on run walks once runs average fewer records than this (getmulti is cheaper then)
_MIN_RUN = 64


def _find_runs(
    txn: lmdb.Transaction, qdb: Any, topic_id: int, queue_id: int, offset: int, count: int
) -> list[tuple[int, int]] | None:
    """Split queue offsets ``[offset, offset + count)`` into runs of consecutive global
    offsets: [(first global, length), ...], probing the index by binary search.

    Global offsets grow strictly with queue offsets, so ``global(o) - o`` never
    decreases and a run is the prefix where it stays equal. None when a probe finds
    no entry or the runs are too short to be worth walking."""
    runs: list[tuple[int, int]] = []
    i = 0
    budget = max(1, count // _MIN_RUN)
    while i < count:
        if len(runs) >= budget:
            return None
        gi = txn.get(QKEY.pack(topic_id, queue_id, offset + i), db=qdb)
        if gi is None:
            return None
        g = int.from_bytes(gi, "big")
        lo, hi = i, count - 1  # invariant: offset+lo is in the run; find its last member
        while lo < hi:
            mid = (lo + hi + 1) // 2
            gm = txn.get(QKEY.pack(topic_id, queue_id, offset + mid), db=qdb)
            if gm is None:
                return None
            if int.from_bytes(gm, "big") - g == mid - i:
                lo = mid
            else:
                hi = mid - 1
        runs.append((g, lo - i + 1))
        i = lo + 1
    return runs


def _store_error(exc: lmdb.Error, path: Path) -> EQueueError:
    if isinstance(exc, lmdb.MapFullError):
        return StoreFull(
            f"the store's LMDB map is full ({path}): nothing was written. Raise --map-size "
            "(restart the broker with a larger value) or lower retention to free space."
        )
    text = str(exc)
    if "No space" in text or "ENOSPC" in text or isinstance(exc, lmdb.DiskError):
        return StoreFull(f"the disk holding {path} is full: nothing was written. Free disk space.")
    return StoreError(f"store write failed ({path}): {text}")


def send_results(topic: str, queue_id: int, answer: wire.ProduceResponse, delayed: Iterable[bool]) -> list[SendResult]:
    return answer.results(topic, queue_id, delayed)


ReadFn = Callable[..., ReadResult]
