"""Reads: pulls (:meth:`StoreReader.read_queue`), lookups by offset, key and time,
and the committed state (topics, queue ranges, offsets) of the published view.

Reads run in any thread, each in its own LMDB read transaction (MVCC): a write
never blocks them. Each read takes ``self.view`` once and works from that one
committed snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import compress
from typing import Any, Final

import attrs
import lmdb

from equeue import control, wire
from equeue.broker.storage import layout
from equeue.broker.storage.view import QueueState, StoreView
from equeue.config import DEFAULT_SCAN_RECORDS, DEFAULT_SCAN_TIME
from equeue.errors import CorruptRecord, QueueNotFound, TopicNotFound
from equeue.logs import RateLimitedLog
from equeue.models import Message
from equeue.protocol import PullStatus
from equeue.wire import batches

log = logging.getLogger("equeue.store")
#: one line per queue per minute for a corrupt record (pulls, lookups, send-backs meet it
#: again and again); any thread may log through it
corrupt_log = RateLimitedLog(log, 60.0, time.monotonic)

#: a scan looks at its clock once per this many records
_CLOCK_EVERY = 64


@attrs.frozen
class ScanBudget:
    """How much one request may scan before it answers with what it has: a
    tag-filtered pull (records it skips) and a key lookup (hash-index candidates it
    checks). Whichever runs out first ends the scan; the answer then says where the
    scan stopped, and the next request resumes there. It keeps each such request
    to a few milliseconds of the event loop (``--scan-records``, ``--scan-time``)."""

    #: records (or key candidates) examined per request
    records: int = DEFAULT_SCAN_RECORDS
    #: seconds of scanning per request
    seconds: float = DEFAULT_SCAN_TIME

    def deadline(self) -> float:
        """When a scan starting now must stop (``time.monotonic`` seconds)."""
        return time.monotonic() + self.seconds

    def spent(self, count: int, deadline: float) -> bool:
        """Whether a scan that has examined ``count`` items must stop: the count is
        used up, or -- looked at once per :data:`_CLOCK_EVERY` items -- the clock
        passed ``deadline``."""
        return count >= self.records or (
            count > 0 and not count % _CLOCK_EVERY and time.monotonic() >= deadline
        )


@attrs.frozen
class KeyHits:
    """What a key lookup found, newest first, and whether its scan budget ran out
    before it had looked at every candidate: then ``resume_before`` is the global
    offset below which candidates were not examined (0 when the walk was complete)."""

    hits: list[BatchHit]
    resume_before: int = 0


#: (global offset of the batch's first record, stored batch, keep mask or b"")
BatchRef = tuple[int, bytes, bytes]
#: the largest records section a stored batch may announce (a produce request's, at most)
MAX_RECORDS_LEN = 1 << 31


@attrs.frozen
class ReadResult:
    """What a read found: whole stored batches, each with its global base and a keep
    mask (bit i set, LSB first in each byte: record i is delivered; b"": every record
    from the requested offset), plus the queue's range and where the next read starts."""

    status: PullStatus
    batches: list[BatchRef]
    min_offset: int
    max_offset: int
    next_offset: int


@attrs.frozen
class BatchHit:
    """One record found by position or key: the stored batch holding it, its global
    base, and the record's index in the batch."""

    global_base: int
    value: bytes
    index: int

    @property
    def global_offset(self) -> int:
        return self.global_base + self.index

    @property
    def mask(self) -> bytes:
        """The keep mask selecting only this record."""
        return wire.mask_of(self.index + 1, [self.index])

    def record(self) -> Message:
        """The record decoded alone, with no position (its store-time delta in
        ``timestamp``): its batch's checksum verified, its records
        section decompressed and its length prefixes checked, then only this record
        decoded (a poison record costs no other record of its batch). Raises
        CorruptRecord."""
        inner = batches.stored_batch(self.value)
        bh = batches.batch_head(inner, MAX_RECORDS_LEN)
        if self.index >= bh.count:
            raise CorruptRecord(f"record {self.index} of a batch of {bh.count}")
        records = batches.batch_records(inner, bh)
        b = batches.record_bounds(records, bh.count)
        return batches.decode_records(records[b[self.index] : b[self.index + 1]], 1)[0]

    def message(self, topic: str) -> Message:
        """The record as a message (:meth:`record`). Raises CorruptRecord."""
        h = batches.stored_head(self.value)
        r = self.record()
        i = self.index
        return Message(
            r.body, r.key, r.tags, r.properties, r.deliver_at, topic, h.queue_id, h.base_offset + i,
            self.global_base + i, h.first_ms + r.timestamp, r.reconsume_times,
        )  # fmt: skip

    def raw_record(self) -> bytes:
        """The stored bytes of the record, as much of them as can be told apart, for a
        record that does not decode: the record itself (its length prefix included)
        when its batch's records section decompresses and its length prefixes hold,
        else the stored batch whole."""
        try:
            inner = batches.stored_batch(self.value)
            bh = batches.batch_head(inner, MAX_RECORDS_LEN, verify=False)
            if self.index < bh.count:
                records = batches.batch_records(inner, bh)
                b = batches.record_bounds(records, bh.count)
                return records[b[self.index] : b[self.index + 1]]
        except CorruptRecord:
            pass
        return bytes(self.value)


ReadFn = Callable[..., ReadResult]


class StoreReader:
    """Read access to the store: LMDB read transactions plus the published view."""

    env: lmdb.Environment
    db: dict[bytes, Any]
    #: the committed state; replaced whole (one reference swap) after each commit
    view: StoreView
    #: wall-clock ms: store times and due times are measured on it
    clock: Callable[[], int]
    map_size: int
    #: the per-request scan budget of tag-filtered pulls and key lookups (the broker
    #: sets it from its configuration before serving)
    scan_budget: ScanBudget = ScanBudget()
    #: replicated: the view stops at the high watermark, and no read may go past it
    #: (LMDB holds the committed but unacknowledged transactions above it)
    replicated: bool = False

    # ------------------------------------------------------------------ committed state
    @property
    def topics(self) -> Mapping[str, control.TopicInfo]:
        return self.view.topics

    @property
    def next_global(self) -> int:
        return self.view.next_global

    @property
    def sched_pending(self) -> Mapping[int, int]:
        return self.view.sched_pending

    @property
    def deleting(self) -> tuple[int, ...]:
        return self.view.deleting

    @property
    def transactions(self) -> int:
        """Write transactions committed since the store was opened."""
        return self.view.transactions

    def topic(self, name: str) -> control.TopicInfo:
        """Raises TopicNotFound."""
        info = self.view.topics.get(name)
        if info is None:
            raise TopicNotFound(f"no topic {name!r}")
        return info

    def queue_state(self, topic_id: int, queue_id: int) -> QueueState:
        return self.view.queue(topic_id, queue_id)

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        return self.view.offsets.get((group, topic, queue_id), -1)

    def groups_of(self, topic: str | None = None) -> set[str]:
        return {g for (g, t, _q) in self.view.offsets if topic is None or t == topic}

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {(t, q): off for (g, t, q), off in self.view.offsets.items() if g == group}

    def pending_delayed(self, topic_id: int) -> int:
        return self.view.sched_pending.get(topic_id, 0)

    def describe(self, name: str) -> control.TopicDescription:
        """Raises TopicNotFound."""
        v = self.view
        info = v.topics.get(name)
        if info is None:
            raise TopicNotFound(f"no topic {name!r}")
        queues = []
        for q in range(info.queues):
            st = v.queue(info.topic_id, q)
            queues.append(
                control.QueueStats(q, st.min_offset, st.next_offset, st.next_offset - st.min_offset, st.bytes)
            )
        return control.TopicDescription(
            info, queues, v.sched_pending.get(info.topic_id, 0), sum(q.bytes for q in queues)
        )

    def store_bytes(self) -> int:
        info = self.env.info()
        stat = self.env.stat()
        return int(info["last_pgno"] + 1) * int(stat["psize"])

    # ------------------------------------------------------------------ pulls
    def read_queue(
        self,
        info: control.TopicInfo,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tag_filter: frozenset[bytes] | None = None,
        verify: bool = True,
        whole: bool = False,
    ) -> ReadResult:
        """Read the stored batches of a queue from ``offset``: exactly ``max_messages``
        records when the queue holds them, within ``max_bytes`` of stored batches.
        Batches go whole (:func:`_cut_to_range` trims large ones); the first always
        goes, a later one when it fits ``max_bytes``, and the answer ends inside the
        batch that holds more records than are left to deliver (``next_offset``: the
        reader delivers the records from ``offset`` below ``next_offset``). With
        ``whole`` (the pull's WHOLE_BATCHES flag) an answer does not end inside a batch
        that goes whole anyway (:func:`_goes_whole`) and is committed: its
        ``next_offset`` is that batch's end, past ``max_messages``, and the reader
        keeps what it did not ask for.

        Records an operator skipped, and with a ``tag_filter`` the records whose tags
        it does not hold, are masked out (a batch with none left is not sent). A
        filtered scan examines at most :attr:`scan_budget` records, counted record by
        record: when it runs out, even inside a batch, the answer ends there
        (``next_offset``: the first record not examined, where the next pull
        resumes), NO_MATCHED_MSG when nothing matched. Without a filter no record is
        decoded. ``verify=False`` skips the batch
        checksum, for a client that verifies it itself (the header is always
        checked). Returns a status (never raises for expected outcomes); raises
        QueueNotFound, or CorruptRecord when the first batch to return is damaged.
        """
        max_messages = max(1, max_messages)  # 0 would cut the first batch at its end
        if not 0 <= queue_id < info.queues:
            raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")
        tid = info.topic_id
        st = self.view.queue(tid, queue_id)
        lo, hi = st.min_offset, st.next_offset
        if offset < lo:
            return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], lo, hi, lo)
        if offset > hi and not self.replicated:
            # The writer thread publishes a new view just after its commit, so a
            # reader may already have seen committed messages past ``hi``: ask LMDB.
            hi = max(hi, self._last_committed(tid, queue_id) + 1)
            if offset > hi:
                return ReadResult(PullStatus.OFFSET_OVERFLOW, [], lo, hi, hi)
        if offset == hi:
            return ReadResult(PullStatus.NO_NEW_MESSAGE, [], lo, hi, hi)
        skips = self.view.skips(tid, queue_id)
        out: list[BatchRef] = []
        delivered = size = scanned = 0
        nxt = offset
        end = hi if self.replicated else 1 << 64  # standalone: what LMDB holds is committed
        budget = self.scan_budget
        deadline = budget.deadline()
        exhausted = False
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            get = txn.get
            mdb = self.db[b"messages"]
            prefix = layout.queue_key(tid, queue_id)
            if not _batch_key_at(cur, tid, queue_id, offset):
                return ReadResult(PullStatus.NO_NEW_MESSAGE, [], lo, hi, offset)
            for k, v in cur:
                if not k.startswith(prefix):
                    break
                base = layout.qindex_offset(k)
                try:
                    g, count = layout.unpack_qindex_value(v)
                except CorruptRecord as exc:
                    if out:
                        break  # answer the batches before it; the next pull starts at it
                    raise CorruptRecord(f"{exc} at {info.name}/{queue_id} offset {base}") from None
                if base >= end or base > nxt:
                    if not out and base > nxt and nxt == offset:
                        # retention removed the head while we looked
                        return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], base, hi, base)
                    break
                if base + count <= nxt:
                    continue
                first = nxt - base  # records below the asked offset are not delivered
                keep: list[int] | None = None
                if skips and any(base + first <= o < base + count for o in skips):
                    keep = [i for i in range(first, count) if base + i not in skips]
                    if not keep:  # every record skipped: not read at all (it may be the damaged one)
                        nxt = base + count
                        continue
                value = get(layout.global_key(g), db=mdb)
                if value is None:
                    break
                try:
                    records = check_batch(value, info, queue_id, base, count, g, verify, tag_filter is not None)
                except CorruptRecord:
                    if out:
                        break
                    raise
                stopped = -1  # the scan budget ran out inside this batch: its first record not examined
                if records is not None and tag_filter is not None:
                    cand = range(first, count) if keep is None else keep
                    try:
                        keep, stopped, scanned, poison = _scan_tags(records, count, cand, tag_filter, scanned,
                                                                    budget, deadline)  # fmt: skip
                    except CorruptRecord as exc:
                        if out:
                            break
                        raise _corrupt(info, queue_id, base + first, base, count, str(exc)) from None
                    if poison is not None and base + stopped == offset:  # the first record asked for
                        raise _corrupt(info, queue_id, offset, base, count, str(poison))
                n = count - first if keep is None else len(keep)
                room = max_messages - delivered
                if out and n and size + len(value) > max_bytes:
                    break
                if n > room and not (whole and stopped < 0 and base + count <= end and _goes_whole(value)):
                    # more than asked for: the answer ends inside this batch
                    cut = first + room - 1 if keep is None else keep[room - 1]
                    nxt = base + cut + 1
                    out.append((g, value, b"" if keep is None else wire.mask_of(count, keep[:room])))
                    delivered += room
                    break
                if stopped >= 0:  # the answer ends where the scan stopped, inside this batch
                    nxt = base + stopped
                    if n:
                        out.append((g, value, wire.mask_of(count, keep) if keep is not None else b""))
                    exhausted = not out
                    break
                nxt = base + count
                if n:
                    out.append((g, value, b"" if keep is None else wire.mask_of(count, keep)))
                    delivered += n
                    size += len(value)
                    if delivered >= max_messages or size >= max_bytes:
                        break
                if tag_filter is not None and (scanned >= budget.records or time.monotonic() >= deadline):
                    exhausted = not out  # the scan budget ran out at the end of this batch
                    break
        if out:
            status = PullStatus.FOUND
            out = _cut_to_range(out, offset, nxt)
        else:
            status = PullStatus.NO_MATCHED_MSG if exhausted else PullStatus.NO_NEW_MESSAGE
        return ReadResult(status, out, lo, max(hi, nxt), nxt)

    def read_messages(self, info: control.TopicInfo, queue_id: int, offset: int, max_messages: int,
                      max_bytes: int = 1 << 62) -> tuple[list[Message], ReadResult]:  # fmt: skip
        """:meth:`read_queue`, its records decoded: the messages delivered (from
        ``offset``, masks applied) and the read's result. Raises as it does."""
        r = self.read_queue(info, queue_id, offset, max_messages, max_bytes)
        return messages_of(info.name, r.batches, offset, r.next_offset), r

    def _last_committed(self, topic_id: int, queue_id: int) -> int:
        """Highest committed queue offset of a queue according to LMDB (-1 if empty)."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            ok = cur.prev() if cur.set_range(layout.qindex_key(topic_id, queue_id + 1, 0)) else cur.last()
            if ok:
                t, q, off = layout.unpack_qindex_key(cur.key())
                if (t, q) == (topic_id, queue_id):
                    return int(off) + layout.unpack_qindex_value(cur.value())[1] - 1
        return -1

    # ------------------------------------------------------------------ lookups
    def get_global(self, global_offset: int) -> BatchHit | None:
        """The stored batch holding ``global_offset`` (None: no record there); only
        what the published view shows (a replicated store's readers see what is below
        its high watermark). The batch's header is not checked: see
        :meth:`check_global`."""
        if global_offset >= self.view.next_global:
            return None
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"messages"])
            if not _last_below(cur, layout.global_key(global_offset + 1)):
                return None
            base = layout.global_of(cur.key())
            value = bytes(cur.value())
        try:
            count = batches.batch_head(batches.stored_batch(value), MAX_RECORDS_LEN, verify=False).count
        except CorruptRecord:
            count = 1  # damaged: only its first record is known to be there
        if global_offset >= base + count:
            return None
        return BatchHit(base, value, global_offset - base)

    def get_queue_offset(
        self, info: control.TopicInfo, queue_id: int, offset: int, *, salvage: bool = False
    ) -> BatchHit | None:
        """The record at a queue offset, or None (none there, or an operator skipped
        it).

        Raises CorruptRecord when its batch's header fails its checksum or names
        another position than the index (an index pointer gone wrong): never another
        message in its place; and, unless ``salvage``, when the record itself does not
        decode (its batch's checksum, lengths, or its own fields: the other records of
        its batch are not decoded). With ``salvage`` such a record is returned, for
        the caller to salvage what it can (:meth:`BatchHit.raw_record`)."""
        view = self.view
        tid = info.topic_id
        if offset in view.skips(tid, queue_id) or offset >= view.queue(tid, queue_id).next_offset:
            return None  # skipped, or past what the published view shows (the high watermark)
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            if not _batch_key_at(cur, tid, queue_id, offset):
                return None
            base = layout.qindex_offset(cur.key())
            g, count = layout.unpack_qindex_value(cur.value())
            if not base <= offset < base + count:
                return None
            value = txn.get(layout.global_key(g), db=self.db[b"messages"])
            if value is None:
                return None
            value = bytes(value)
        hit = BatchHit(g, value, offset - base)
        if salvage:
            check_position(value, info, queue_id, base, count, g, offset)
            return hit
        check_batch(value, info, queue_id, base, count, g, True, False, at=offset)
        try:
            hit.record()
        except CorruptRecord as exc:
            raise _corrupt(info, queue_id, offset, base, count, str(exc)) from None
        return hit

    def global_position_ok(self, hit: BatchHit, h: batches.StoredHead) -> bool:
        """Whether the queue index agrees that the batch of ``hit`` (header ``h``) is
        the one at its queue offsets: a record reached by its global offset is checked
        against the index as a queue-offset read is against its header."""
        with self.env.begin() as txn:
            v = txn.get(layout.qindex_key(h.topic_id, h.queue_id, h.base_offset), db=self.db[b"qindex"])
        return v is not None and layout.unpack_qindex_value(v)[0] == hit.global_base

    def find_by_key(
        self, info: control.TopicInfo, key: str, limit: int, before: int = -1, max_bytes: int = 1 << 62
    ) -> KeyHits:
        """Messages of ``info`` with ``key``, newest first (hash index + exact check),
        at global offsets below ``before`` (-1: all).

        The walk visits the topic's key-index buckets newest first (one seek each;
        empty buckets are skipped) and takes the pairs of the key's 16-bit hash in
        each; keys sharing the hash are filtered by reading the record. It checks at
        most :attr:`scan_budget` candidates, and visits at most as many buckets,
        within its time; when that runs out first, ``KeyHits.resume_before`` says
        where it stopped (pass it as ``before`` to go on). The hits' batches (plus 16
        bytes each in an answer) stay within ``max_bytes`` (the first hit always
        goes), so the answer fits in a frame; a hit left out for that is where
        ``resume_before`` resumes.
        """
        shown = self.view.next_global  # only what the published view shows
        before = shown if before < 0 or before > shown else before
        if before <= 0:
            return KeyHits([])
        h = layout.kindex_hash(key.encode())
        tid = info.topic_id
        bsize = layout.KINDEX_BUCKET
        out: list[BatchHit] = []
        budget = self.scan_budget
        deadline = budget.deadline()
        examined = hops = size = 0
        bucket: int | None = (before - 1) // bsize
        last: tuple[int, bytes, bytes, list[int]] | None = None  # the batch read last: records, bounds
        with self.env.begin() as txn:
            kcur = txn.cursor(db=self.db[b"kindex"])
            mcur = txn.cursor(db=self.db[b"messages"])
            while bucket is not None and len(out) < limit:
                end = min(before, (bucket + 1) * bsize)  # this bucket's part below ``before``
                if budget.spent(hops, deadline):
                    return KeyHits(out, end)
                hops += 1
                ok = _last_below(kcur, layout.kindex_key(tid, bucket + 1))
                if not ok or not kcur.key().startswith(layout.topic_prefix(tid)):
                    break
                bucket = layout.kindex_bucket(kcur.key())
                start = bucket * bsize
                end = min(before, start + bsize)
                hashes, offs = layout.unpack_kindex_value(kcur.value())
                cands = sorted((start + o for o in compress(offs, map(h.__eq__, hashes)) if start + o < end),
                               reverse=True)  # fmt: skip
                for g in cands:
                    if budget.spent(examined, deadline):
                        return KeyHits(out, g + 1)
                    examined += 1
                    if last is None or not last[0] <= g < last[0] + len(last[3]) - 1:
                        if not _last_below(mcur, layout.global_key(g + 1)):
                            continue
                        base, value = layout.global_of(mcur.key()), bytes(mcur.value())
                        try:
                            batches.stored_head(value)
                            inner = batches.stored_batch(value)
                            bh = batches.batch_head(inner, MAX_RECORDS_LEN)
                            records = batches.batch_records(inner, bh)
                            last = (base, value, records, batches.record_bounds(records, bh.count))
                        except CorruptRecord:
                            continue  # a damaged batch is no candidate (its reads say why)
                    base, value, records, bounds = last
                    i = g - base
                    if i + 1 < len(bounds) and _record_key(records, bounds, i) == key:
                        size += len(value) + 16
                        if out and size > max_bytes:
                            return KeyHits(out, g + 1)
                        out.append(BatchHit(base, value, g - base))
                        if len(out) >= limit:
                            break
                bucket = bucket - 1 if bucket > 0 else None
        return KeyHits(out)

    def offset_for_time(self, info: control.TopicInfo, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after ``ts_ms``: a binary search over the
        queue's batches by their last store time, then over the records of the one
        found."""
        st = self.view.queue(info.topic_id, queue_id)
        lo, hi = st.min_offset, st.next_offset
        tid = info.topic_id
        with self.env.begin() as txn:
            qcur = txn.cursor(db=self.db[b"qindex"])
            mdb = self.db[b"messages"]

            def batch_at(off: int) -> tuple[int, int, bytes] | None:
                if not _batch_key_at(qcur, tid, queue_id, off):
                    return None
                base = layout.qindex_offset(qcur.key())
                g, count = layout.unpack_qindex_value(qcur.value())
                v = txn.get(layout.global_key(g), db=mdb)
                return (base, count, bytes(v)) if v is not None and base <= off < base + count else None

            while lo < hi:  # on batches: the first whose last store time is >= ts_ms
                mid = (lo + hi) // 2
                found = batch_at(mid)
                if found is None:
                    lo = mid + 1
                    continue
                base, count, value = found
                try:
                    head = batches.stored_head(value)
                except CorruptRecord:
                    lo = base + count
                    continue
                if head.last_ms < ts_ms:
                    lo = base + count
                elif head.first_ms >= ts_ms:
                    hi = base
                else:  # inside this batch: its records' own times
                    try:
                        recs = batches.decode_batch(batches.stored_batch(value), MAX_RECORDS_LEN)
                    except CorruptRecord:
                        return base
                    return base + next((i for i, r in enumerate(recs) if head.first_ms + r.timestamp >= ts_ms), count)
        return lo

    def next_due(self) -> int | None:
        """Due time (ms) of the earliest delayed message, or None."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"schedule"])
            if cur.first():
                return layout.schedule_due(cur.key())
        return None


def _last_below(cur: lmdb.Cursor, key: bytes) -> bool:
    """Put ``cur`` on the last key below ``key``; False when there is none."""
    return bool(cur.prev() if cur.set_range(key) else cur.last())


def _batch_key_at(cur: lmdb.Cursor, topic_id: int, queue_id: int, offset: int) -> bool:
    """Put a ``qindex`` cursor on the entry of the batch that holds ``offset`` of a
    queue -- the last key at or below it -- or, when the queue has none there (the
    offset is below its first batch), on the queue's first entry. False when the
    queue has no entry at or above ``offset``'s batch."""
    prefix = layout.queue_key(topic_id, queue_id)
    if _last_below(cur, layout.qindex_key(topic_id, queue_id, offset + 1)) and bytes(cur.key()).startswith(prefix):
        return True
    return bool(cur.set_range(layout.qindex_key(topic_id, queue_id, 0)) and bytes(cur.key()).startswith(prefix))


def _record_key(records: bytes, bounds: list[int], i: int) -> str | None:
    """The key of record ``i`` of a records section (None: no key, or it does not decode)."""
    try:
        return batches.decode_records(records[bounds[i] : bounds[i + 1]], 1)[0].key
    except CorruptRecord:
        return None


def _scan_tags(
    records: bytes, count: int, cand: Sequence[int], tags: frozenset[bytes], scanned: int, budget: ScanBudget,
    deadline: float,
) -> tuple[list[int], int, int, CorruptRecord | None]:  # fmt: skip
    """Examine the records ``cand`` (ascending indexes) of a records section of
    ``count`` records for a tag of ``tags``, :data:`_CLOCK_EVERY` records decoded at a
    time, while the scan budget lasts (``scanned`` records examined so far in the
    request; the clock is looked at once some were). Only the records examined are
    decoded: a skipped record between them is stepped over by its length.

    Returns (the indexes whose tag matches, the first of ``cand`` not examined or -1
    when every one was, the records examined in the request, and the error of that
    first record not examined when it is there because it does not decode, else
    None: the scan stops right before a poison record, so what matched before it is
    answered). Raises CorruptRecord when the records' lengths do not hold."""
    bounds = batches.record_bounds(records, count)
    keep: list[int] = []
    pos, n = 0, len(cand)
    while pos < n:
        if scanned >= budget.records or (scanned and time.monotonic() >= deadline):
            return keep, cand[pos], scanned, None
        step = cand[pos : pos + min(_CLOCK_EVERY, budget.records - scanned)]
        lo, hi = step[0], step[-1]
        try:
            if hi - lo + 1 != len(step):  # skipped records between: decoded one by one
                raise CorruptRecord("not consecutive")
            recs = batches.decode_records(records[bounds[lo] : bounds[hi + 1]], hi - lo + 1)
        except CorruptRecord:
            recs = []
            for i in step:
                try:
                    recs += batches.decode_records(records[bounds[i] : bounds[i + 1]], 1)
                except CorruptRecord as exc:  # the poison record: the scan stops before it
                    keep += [j for j, r in zip(step, recs, strict=False) if _tag_bytes(r.tags) in tags]
                    return keep, i, scanned + len(recs), exc
        keep += [i for i, r in zip(step, recs, strict=True) if _tag_bytes(r.tags) in tags]
        scanned += len(step)
        pos += len(step)
    return keep, -1, scanned, None


def _tag_bytes(tags: str | None) -> bytes | None:
    return None if tags is None else tags.encode()


#: a batch is cut to the records a pull delivers only when that leaves out about this
#: many bytes or more (cutting walks the batch's records and seals a copy; below it,
#: sending the batch whole costs less, and its reader skips the rest)
CUT_SAVES_BYTES: Final = 64 << 10


def _cut_to_range(out: list[BatchRef], offset: int, nxt: int) -> list[BatchRef]:
    """The answer's first and last batches cut to the records it delivers (queue
    offsets ``offset`` .. ``nxt - 1``) when they are uncompressed, unfiltered and
    the cut leaves out :data:`CUT_SAVES_BYTES` or more (estimated from the batch's
    size and record count): a pull of 100 records from a batch of 10,000 sends those
    100, not the whole batch. Other batches go whole; the reader skips what it was
    not asked for."""
    for i in (0, len(out) - 1) if len(out) > 1 else (0,):
        g, value, mask = out[i]
        if mask or len(value) < CUT_SAVES_BYTES:
            continue
        h = batches.stored_head(value)
        count = batches.BATCH_HEAD.unpack_from(value, batches.STORED_HEAD.size)[2]
        first = max(0, offset - h.base_offset)
        stop = min(count, nxt - h.base_offset)
        if len(value) * (count - (stop - first)) < CUT_SAVES_BYTES * count:
            continue
        cut = batches.slice_stored(value, first, stop)
        if cut is not None:
            out[i] = (g + first, cut, b"")
    return out


def _goes_whole(value: bytes) -> bool:
    """Whether :func:`_cut_to_range` never cuts this stored batch: it is smaller than
    :data:`CUT_SAVES_BYTES`, or compressed (its records cannot be cut)."""
    return len(value) < CUT_SAVES_BYTES or value[batches.STORED_HEAD.size + 1] != batches.Codec.NONE


def mask_keeps(mask: bytes, i: int) -> bool:
    """Whether a keep mask delivers record ``i`` (b"": every record)."""
    return not mask or bool(mask[i >> 3] >> (i & 7) & 1)


def messages_of(topic: str, refs: Sequence[BatchRef], offset: int = 0, end: int = 1 << 64) -> list[Message]:
    """The messages of a read's batches: records at queue offsets from ``offset`` below
    ``end`` (the read's next offset) that their masks keep. Raises CorruptRecord."""
    out: list[Message] = []
    for g, value, mask in refs:
        for i, m in enumerate(batches.decode_stored(topic, g, value, MAX_RECORDS_LEN)):
            if offset <= m.queue_offset < end and mask_keeps(mask, i):
                out.append(m)
    return out


def check_batch(
    value: bytes, info: control.TopicInfo, queue_id: int, base: int, count: int, g: int, verify: bool,
    decode: bool, at: int | None = None,
) -> bytes | None:  # fmt: skip
    """Check the stored batch the index entry (``info``, ``queue_id``, ``base``) ->
    (``g``, ``count``) led to: its header's checksum, that it names that same
    position and count, and with ``verify`` its batch checksum; with ``decode`` its
    records section is decompressed and returned (its records are not decoded).

    Raises CorruptRecord naming the position (``at``, else the batch's first
    offset), what is wrong, and the way past it (``equeue message skip`` of each of
    its records), and logs it (rate-limited: consumers ask for the same record again
    and again)."""
    try:
        h = batches.stored_head(value)
        inner = batches.stored_batch(value)
        bh = batches.batch_head(inner, MAX_RECORDS_LEN, verify=verify)
        if (h.topic_id, h.queue_id, h.base_offset, bh.count) == (info.topic_id, queue_id, base, count):
            if not decode:
                return None
            return batches.batch_records(inner, bh)
        why = (
            f"the index points to global offset {g}, a batch of topic id {h.topic_id} queue "
            f"{h.queue_id} offsets {h.base_offset}..{h.base_offset + bh.count - 1}"
        )
    except CorruptRecord as exc:
        why = str(exc)
    raise _corrupt(info, queue_id, base if at is None else at, base, count, why)


def check_position(
    value: bytes, info: control.TopicInfo, queue_id: int, base: int, count: int, g: int, at: int
) -> None:
    """Check only that the stored batch the index entry (``info``, ``queue_id``,
    ``base``) -> ``g`` led to is the one at that position: its header's checksum,
    and that it names that topic, queue and base offset (the batch behind the header
    is not looked at). Raises and logs CorruptRecord as :func:`check_batch` does."""
    try:
        h = batches.stored_head(value)
    except CorruptRecord as exc:
        raise _corrupt(info, queue_id, at, base, count, str(exc)) from None
    if (h.topic_id, h.queue_id, h.base_offset) != (info.topic_id, queue_id, base):
        why = (
            f"the index points to global offset {g}, a batch of topic id {h.topic_id} queue "
            f"{h.queue_id} from offset {h.base_offset}"
        )
        raise _corrupt(info, queue_id, at, base, count, why)


def _corrupt(info: control.TopicInfo, queue_id: int, where: int, base: int, count: int, why: str) -> CorruptRecord:
    """The CorruptRecord of a damaged record at a queue offset (``where``, in the batch
    of ``count`` records from ``base``): what is wrong and the way past it (``equeue
    message skip`` of each record of the batch), logged (rate-limited: consumers ask
    for the same record again and again)."""
    span = f" (its batch holds offsets {base}..{base + count - 1}: skip each)" if count > 1 else ""
    corrupt = CorruptRecord(
        f"corrupt record at {info.name}/{queue_id} offset {where}: {why}; restore the store from "
        f"a copy, or skip it: equeue message skip --topic {info.name} --queue {queue_id} --offset {where}{span}"
    )
    corrupt_log.log(logging.ERROR, f"{info.name}/{queue_id}", "%s", corrupt)
    return corrupt
