"""Reads: pulls (:meth:`StoreReader.read_queue`), lookups by offset, key and time,
and the committed state (topics, queue ranges, offsets) of the published view.

Reads run in any thread, each in its own LMDB read transaction (MVCC): a write
never blocks them. Each read takes ``self.view`` once and works from that one
committed snapshot.
"""

from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, chain, islice
from typing import Any

import attrs
import lmdb

from equeue import control
from equeue.broker.storage import layout
from equeue.broker.storage.view import QueueState, StoreView
from equeue.config import DEFAULT_SCAN_RECORDS, DEFAULT_SCAN_TIME
from equeue.errors import CorruptRecord, QueueNotFound, TopicNotFound
from equeue.logs import RateLimitedLog
from equeue.protocol import PullStatus
from equeue.routing import key_hash
from equeue.wire.records import (
    RecordHeader,
    record_entry_meta,
    record_header,
    record_timestamp,
    records_intact,
    records_placed,
)

log = logging.getLogger("equeue.store")
#: one line per queue per minute for a corrupt record (pulls, lookups, send-backs meet it
#: again and again); any thread may log through it
corrupt_log = RateLimitedLog(log, 60.0, time.monotonic)

#: give up on run walks once runs average fewer records than this (getmulti is cheaper then)
_MIN_RUN = 64
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

    hits: list[tuple[int, bytes]]
    resume_before: int = 0


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
    ) -> ReadResult:
        """Read up to ``max_messages`` records of a queue from ``offset``.

        ``verify=False`` skips the checksum recheck, for a client that verifies every
        record itself. With a ``tag_filter`` the scan examines at most
        :attr:`scan_budget` records: when it runs out with no match the status is
        NO_MATCHED_MSG and ``next_offset`` is where the scan stopped (the next pull
        resumes there); with some matches, they are returned (FOUND). Returns a status
        (never raises for expected outcomes); raises QueueNotFound, or CorruptRecord
        when the first record to return fails its checksum.
        """
        if not 0 <= queue_id < info.queues:
            raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")
        st = self.view.queue(info.topic_id, queue_id)
        lo, hi = st.min_offset, st.next_offset
        if offset < lo:
            return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], [], lo, hi, lo)
        if offset > hi and not self.replicated:
            # The writer thread publishes a new view just after its commit, so a
            # reader may already have seen committed messages past ``hi``: ask LMDB.
            hi = max(hi, self._last_committed(info.topic_id, queue_id) + 1)
            if offset > hi:
                return ReadResult(PullStatus.OFFSET_OVERFLOW, [], [], lo, hi, hi)
        if offset == hi:
            return ReadResult(PullStatus.NO_NEW_MESSAGE, [], [], lo, hi, hi)
        skips = self.view.skips(info.topic_id, queue_id)
        if tag_filter is None and not (skips and any(offset <= o < offset + max_messages for o in skips)):
            fast = self._read_dense(info.topic_id, queue_id, offset, min(max_messages, hi - offset), max_bytes, verify)
            if fast is not None:
                return ReadResult(PullStatus.FOUND, fast[0], fast[1], lo, hi, offset + len(fast[1]))
        # record by record: tag filters, and whatever the dense read found unusual
        # (the end of the data, retention at the head, a damaged record)
        gbes: list[int] = []
        recs: list[bytes] = []
        size = 0
        nxt = offset
        end = hi if self.replicated else 1 << 64  # standalone: what LMDB holds is committed
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            get = txn.get
            mdb = self.db[b"messages"]
            if not cur.set_range(layout.qindex_key(info.topic_id, queue_id, offset)):
                return ReadResult(PullStatus.NO_NEW_MESSAGE, [], [], lo, hi, offset)
            prefix = layout.queue_key(info.topic_id, queue_id)
            scanned = 0
            budget = self.scan_budget
            deadline = budget.deadline()
            exhausted = False
            for k, gk in cur:
                if not k.startswith(prefix):
                    break
                qo = layout.qindex_offset(k)
                if qo != nxt or qo >= end:
                    if not recs and qo > nxt and nxt == offset:
                        # retention removed the head while we looked
                        return ReadResult(PullStatus.OFFSET_TOO_SMALL, [], [], qo, hi, qo)
                    break
                if qo in skips:  # an operator skipped it (equeue message skip)
                    nxt += 1
                    continue
                rec = get(gk, db=mdb)
                if rec is None:
                    break
                if verify:
                    try:
                        check_record(rec, info, queue_id, qo, gk)
                    except CorruptRecord:
                        if recs:
                            break
                        raise
                scanned += 1
                if tag_filter is not None:
                    tags = record_entry_meta(rec).tags
                    if tags not in tag_filter:
                        nxt += 1
                        if budget.spent(scanned, deadline):
                            exhausted = True
                            break
                        continue
                if recs and size + len(rec) > max_bytes:
                    break
                gbes.append(layout.global_of(gk))
                recs.append(rec)
                size += len(rec)
                nxt += 1
                if len(recs) >= max_messages:
                    break
        if recs:
            status = PullStatus.FOUND
        else:
            status = PullStatus.NO_MATCHED_MSG if exhausted else PullStatus.NO_NEW_MESSAGE
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
                if not cur.set_key(layout.qindex_key(topic_id, queue_id, offset)):
                    return None
                gks = list(islice(cur.iternext(keys=False), count))
                last = txn.get(layout.qindex_key(topic_id, queue_id, offset + count - 1), db=qdb)
                if len(gks) != count or last != gks[-1]:
                    return None  # keys are unique and sorted: first and last right => all dense
                got = txn.cursor(db=mdb).getmulti(gks)
                if len(got) != count:
                    return None
                recs = [v for _k, v in got]
                globals_: Sequence[int] = list(map(layout.global_of, gks))
            else:
                cur = txn.cursor(db=mdb)
                recs = []
                for g, m in runs:
                    if not cur.set_key(layout.global_key(g)):
                        return None
                    run = list(islice(cur.iternext(keys=False), m))
                    if len(run) != m or (m > 1 and cur.key() != layout.global_key(g + m - 1)):
                        return None
                    recs += run
                globals_ = array("Q", chain.from_iterable(range(g, g + m) for g, m in runs))
        if len(recs) > 1 and sum(map(len, recs)) > max_bytes:
            keep = max(1, bisect_right(list(accumulate(map(len, recs))), max_bytes))
            recs, globals_ = recs[:keep], globals_[:keep]
        if verify and not (records_intact(recs) and records_placed(recs, topic_id, queue_id, offset)):
            return None
        return globals_, recs

    def _last_committed(self, topic_id: int, queue_id: int) -> int:
        """Highest committed queue offset of a queue according to LMDB (-1 if empty)."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"qindex"])
            ok = cur.prev() if cur.set_range(layout.qindex_key(topic_id, queue_id + 1, 0)) else cur.last()
            if ok:
                t, q, off = layout.unpack_qindex_key(cur.key())
                if (t, q) == (topic_id, queue_id):
                    return int(off)
        return -1

    # ------------------------------------------------------------------ lookups
    def get_global(self, global_offset: int) -> bytes | None:
        """The stored record at ``global_offset``, or None; only what the published
        view shows (a replicated store's readers see what is below its high watermark)."""
        if global_offset >= self.view.next_global:
            return None
        with self.env.begin() as txn:
            rec: bytes | None = txn.get(layout.global_key(global_offset), db=self.db[b"messages"])
            return rec

    def get_queue_offset(self, info: control.TopicInfo, queue_id: int, offset: int) -> tuple[int, bytes] | None:
        """(global offset, stored record) at a queue offset, or None (none there, or
        an operator skipped it).

        Raises CorruptRecord when the record fails its checksum or its header names
        another position than the one asked for (an index pointer gone wrong): never
        another message in its place."""
        view = self.view
        if offset in view.skips(info.topic_id, queue_id) or offset >= view.queue(info.topic_id, queue_id).next_offset:
            return None  # skipped, or past what the published view shows (the high watermark)
        with self.env.begin() as txn:
            gk = txn.get(layout.qindex_key(info.topic_id, queue_id, offset), db=self.db[b"qindex"])
            if gk is None:
                return None
            rec = txn.get(gk, db=self.db[b"messages"])
            if rec is None:
                return None
            check_record(rec, info, queue_id, offset, gk)
            return layout.global_of(gk), rec

    def global_position_ok(self, global_offset: int, h: RecordHeader) -> bool:
        """Whether the queue index agrees that the record at ``global_offset`` (header
        ``h``) is the one at its queue offset: a record reached by its global offset
        is checked against the index as a queue-offset read is against its header."""
        with self.env.begin() as txn:
            gk = txn.get(layout.qindex_key(h.topic_id, h.queue_id, h.queue_offset), db=self.db[b"qindex"])
        return gk is not None and layout.global_of(gk) == global_offset

    def find_by_key(
        self, info: control.TopicInfo, key: str, limit: int, before: int = -1, max_bytes: int = 1 << 62
    ) -> KeyHits:
        """Messages of ``info`` with ``key``, newest first (hash index + exact check),
        at global offsets below ``before`` (-1: all).

        The walk visits the topic's key-index buckets newest first (one seek each;
        empty buckets are skipped). Keys whose crc32 collide share the index prefix,
        so it checks at most :attr:`scan_budget` candidates, and visits at most as
        many buckets, within its time; when that runs out first,
        ``KeyHits.resume_before`` says where it stopped (pass it as ``before`` to go on).
        The hits' records (plus 12 bytes each in an answer) stay within ``max_bytes``
        (the first hit always goes), so the answer fits in a frame; a hit left out
        for that is where ``resume_before`` resumes.
        """
        shown = self.view.next_global  # only what the published view shows
        before = shown if before < 0 or before > shown else before
        if before <= 0:
            return KeyHits([])
        kb = key.encode()
        h = key_hash(kb)
        tid = info.topic_id
        tprefix = layout.topic_prefix(tid)
        bits = layout.KINDEX_BUCKET_BITS
        out: list[tuple[int, bytes]] = []
        budget = self.scan_budget
        deadline = budget.deadline()
        examined = hops = size = 0
        bucket: int | None = (before - 1) >> bits
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"kindex"])
            mdb = self.db[b"messages"]
            while bucket is not None and len(out) < limit:
                end = min(before, (bucket + 1) << bits)  # this bucket's part below ``before``
                if budget.spent(hops, deadline):
                    return KeyHits(out, end)
                hops += 1
                prefix = layout.kindex_prefix(tid, bucket, h)
                ok = _last_below(cur, layout.kindex_key_after(tid, h, end - 1))
                while ok and len(out) < limit:
                    k = cur.key()
                    if not k.startswith(prefix):
                        break
                    g = layout.kindex_global(k)
                    if budget.spent(examined, deadline):
                        return KeyHits(out, g + 1)
                    examined += 1
                    rec = txn.get(layout.global_key(g), db=mdb)
                    if rec is not None and record_entry_meta(rec).key == kb:
                        size += len(rec) + 12
                        if out and size > max_bytes:
                            return KeyHits(out, g + 1)
                        out.append((g, rec))
                    ok = cur.prev()
                if len(out) >= limit:
                    break
                # the next older bucket holding anything of this topic (empty ones skipped)
                ok = _last_below(cur, layout.kindex_bucket_start(tid, bucket))
                bucket = layout.kindex_bucket(cur.key()) if ok and cur.key().startswith(tprefix) else None
        return KeyHits(out)

    def offset_for_time(self, info: control.TopicInfo, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after ``ts_ms`` (binary search on store time)."""
        st = self.view.queue(info.topic_id, queue_id)
        lo, hi = st.min_offset, st.next_offset
        with self.env.begin() as txn:
            qdb, mdb = self.db[b"qindex"], self.db[b"messages"]

            def ts_at(off: int) -> int:
                gk = txn.get(layout.qindex_key(info.topic_id, queue_id, off), db=qdb)
                rec = txn.get(gk, db=mdb) if gk else None
                return record_timestamp(rec) if rec else 0

            while lo < hi:
                mid = (lo + hi) // 2
                if ts_at(mid) < ts_ms:
                    lo = mid + 1
                else:
                    hi = mid
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


def check_record(rec: bytes, info: control.TopicInfo, queue_id: int, offset: int, gk: bytes) -> RecordHeader:
    """The header of the record the index entry (``info``, ``queue_id``, ``offset``)
    -> ``gk`` led to, checked: its checksum, and that it names that same position.

    Raises CorruptRecord naming the position, what is wrong, and the way past it, and
    logs it (rate-limited: consumers ask for the same record again and again)."""
    try:
        h = record_header(rec)
    except CorruptRecord as exc:
        why = str(exc)
    else:
        if (h.topic_id, h.queue_id, h.queue_offset) == (info.topic_id, queue_id, offset):
            return h
        why = (
            f"the index points to global offset {layout.global_of(gk)}, a record of topic id "
            f"{h.topic_id} queue {h.queue_id} offset {h.queue_offset}"
        )
    corrupt = CorruptRecord(
        f"corrupt record at {info.name}/{queue_id} offset {offset}: {why}; restore the store from "
        f"a copy, or skip it: equeue message skip --topic {info.name} --queue {queue_id} --offset {offset}"
    )
    corrupt_log.log(logging.ERROR, f"{info.name}/{queue_id}", "%s", corrupt)
    raise corrupt


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
    key = layout.qindex_key
    while i < count:
        if len(runs) >= budget:
            return None
        gi = txn.get(key(topic_id, queue_id, offset + i), db=qdb)
        if gi is None:
            return None
        g = layout.global_of(gi)
        lo, hi = i, count - 1  # invariant: offset+lo is in the run; find its last member
        while lo < hi:
            mid = (lo + hi + 1) // 2
            gm = txn.get(key(topic_id, queue_id, offset + mid), db=qdb)
            if gm is None:
                return None
            if layout.global_of(gm) - g == mid - i:
                lo = mid
            else:
                hi = mid - 1
        runs.append((g, lo - i + 1))
        i = lo + 1
    return runs
