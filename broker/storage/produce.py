"""Appending messages: :class:`ProduceOp` (validation, dedup, the log and its
indexes, delayed entries to the schedule, the producer's state).

An idempotent producer's state and the dedup decision are
:mod:`equeue.broker.storage.producers`'; this module asks it before writing and
records the batch's answer there after.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import compress, repeat
from operator import and_, itemgetter

import attrs

from equeue import control, wire
from equeue.broker.storage import layout, producers
from equeue.broker.storage.writes import QueueDraft, WriteContext, WriteOp
from equeue.errors import DelayTooLong, MessageTooLarge, QueueNotFound, TopicNotFound
from equeue.wire import batches

_FLAGS = itemgetter(1)
_DUE = itemgetter(2)
_NONE = batches.Codec.NONE


#: the most records the broker puts in one stored batch it builds (from a request's
#: entries, or due messages): a read of a few records verifies, cuts and sends at most
#: this batch, so its cost stays near the records read (a producer's compressed batch
#: is stored as sent, whatever its size)
STORED_BATCH_RECORDS = 256


@attrs.define
class ProduceOp(WriteOp):
    """Append entries to one queue; entries with a future ``deliver_at`` go to the
    schedule instead. Idempotent when ``producer_id`` is set.

    ``batch`` is the producer's batch the entries were decoded from (checked by the
    produce handler): it is stored as sent when none of its messages is delayed and
    ``codec`` is None or its own codec; otherwise the stored batch is built from the
    entries, its records compressed with ``codec`` (None: uncompressed). ``codec`` is
    the topic's ``compression`` setting (:func:`equeue.control.stored_codec`).

    Raises (before writing anything) TopicNotFound, QueueNotFound, InvalidMessage,
    MessageTooLarge, DelayTooLong or OutOfOrderSequence; returns the
    :class:`~equeue.wire.ProduceResponse` (a duplicate batch: its first answer).
    """

    topic: control.TopicInfo
    queue_id: int
    entries: Sequence[bytes]
    producer_id: bytes | None = None
    base_sequence: int = 0
    max_body: int = 1 << 62
    max_delay_ms: int = 1 << 62
    batch: bytes | None = None
    codec: batches.Codec | None = None
    #: the largest stored batch plus its keep mask a pull answer can carry
    #: (``Limits.max_pull_entry``): a larger one is refused, as no pull could return it
    max_entry: int = 1 << 62

    def inline_size(self) -> int:
        """The entries' bytes (what the loop's worst pause grows with)."""
        return sum(map(len, self.entries))

    def apply(self, w: WriteContext) -> wire.ProduceResponse:
        """Validation and dedup (nothing written yet), then the writes: delayed
        entries to the schedule, the others to the log as one batch and its indexes,
        the producer's state last."""
        headers, dues = self._validate(w)
        pkey = pstate = None
        if self.producer_id is not None:
            pkey = layout.producer_key(self.producer_id, self.topic.topic_id, self.queue_id)
            pstate = producers.read_state(w, pkey)
            first = producers.check_sequence(pstate, self.base_sequence)
            if first is not None:
                return first  # resent: the answer it got the first time
        entries: Sequence[bytes] = self.entries
        all_headers = headers
        if dues is not None:
            live = [i for i, d in enumerate(dues) if not d]
            entries = [self.entries[i] for i in live]
            headers = [headers[i] for i in live]
        # a producer's batch is stored as sent when nothing in it is delayed and the
        # topic keeps its codec; else the records are built before anything is
        # written: a key that is not UTF-8 refuses the whole request (InvalidMessage)
        sent = self.batch
        if sent is not None and (dues is not None or self.codec not in (None, sent[1])):
            sent = None
        if dues is not None and len(entries) < len(self.entries):  # the delayed ones: UTF-8 too
            delayed = [i for i, d in enumerate(dues) if d]
            batches.records_from_entries([self.entries[i] for i in delayed], [all_headers[i] for i in delayed])
        m = len(entries)
        # the stored batches: a producer's batch as sent, else the entries' records cut
        # into batches of at most STORED_BATCH_RECORDS (a read of a few records costs
        # the reader work in proportion to the batch holding them)
        chunks: list[tuple[int, int, bytes]] = []
        if m and sent is not None:
            chunks.append((0, m, sent))
        elif m:
            codec = self.codec or _NONE
            for i in range(0, m, STORED_BATCH_RECORDS):
                j = min(m, i + STORED_BATCH_RECORDS)
                records = batches.records_from_entries(entries[i:j], headers[i:j])
                chunks.append((i, j, batches.seal_records(records, j - i, codec)))
        for i, j, batch in chunks:
            if len(batch) + batches.STORED_HEAD.size + (j - i + 7) // 8 > self.max_entry:
                raise MessageTooLarge(
                    f"these {j - i} messages make a stored batch of {len(batch) + batches.STORED_HEAD.size} bytes, "
                    f"above the {self.max_entry} a pull answer can carry: send them in smaller requests"
                )
        # ---- preconditions done; writes start
        w.wrote = True
        st = w.queue(self.topic.topic_id, self.queue_id)
        first_global, first_queue = w.next_global, st.next_offset
        scheduled = 0
        if dues is not None:
            scheduled = self._schedule(w, dues)
        for i, j, batch in chunks:
            self._append(w, st, entries[i:j], batch, headers[i:j], i)
        answer = wire.ProduceResponse(first_global if m else -1, first_queue if m else -1, m, scheduled)
        if pkey is not None:
            producers.record_answer(w, pkey, pstate, self.base_sequence, len(self.entries), answer)
        return answer

    def _validate(self, w: WriteContext) -> tuple[list[tuple[int, ...]], list[int] | None]:
        """The topic and queue still exist and every entry is servable
        (:func:`_scan_entries`, whose result it returns). Raises TopicNotFound,
        QueueNotFound, InvalidMessage, MessageTooLarge, DelayTooLong."""
        t = self.topic
        now = w.topic(t.name)
        if now is None or now.topic_id != t.topic_id:  # deleted (and maybe created again)
            raise TopicNotFound(f"topic {t.name!r} was deleted")
        if not 0 <= self.queue_id < t.queues:
            raise QueueNotFound(f"topic {t.name!r} has {t.queues} queues; no queue {self.queue_id}")
        return _scan_entries(self.entries, self.max_body, w.now, self.max_delay_ms)

    def _schedule(self, w: WriteContext, dues: list[int]) -> int:
        """Put the delayed entries (``dues[i]`` > 0) in the schedule, in order; returns
        how many were scheduled."""
        tid = self.topic.topic_id
        target = layout.schedule_target(tid, self.queue_id)
        scheduled = 0
        for i, entry in enumerate(self.entries):
            if dues[i]:
                w.schedule_put(dues[i], target + entry)
                scheduled += 1
        w.sched_delta[tid] = w.sched_delta.get(tid, 0) + scheduled
        return scheduled

    def _append(
        self, w: WriteContext, st: QueueDraft, entries: Sequence[bytes], batch: bytes,
        headers: Sequence[tuple[int, ...]], first: int = 0,
    ) -> None:  # fmt: skip
        """Store ``batch`` (the entries' of ``headers``, not empty) at
        the log's end and the queue's (``st``): the stored batch, its queue-index
        entry, the key index's pairs of its keyed messages, and the staged counters.
        The per-message work left here (the key hashes) runs in C loops: this is the
        broker's hottest path (docs/storage.md, "Performance")."""
        tid, qid, m = self.topic.topic_id, self.queue_id, len(headers)
        g, first_queue = w.next_global, st.next_offset
        pid = self.producer_id
        seq = self.base_sequence + first if pid is not None else 0  # (without a producer id it means nothing)
        value = batches.encode_stored(tid, qid, first_queue, w.now, w.now, pid, seq, batch)
        w.txn.put(layout.global_key(g), value, db=w.db[b"messages"], append=True)
        w.txn.put(layout.qindex_key(tid, qid, first_queue), layout.pack_qindex_value(g, m), db=w.db[b"qindex"])
        keyed = list(compress(range(m), map(and_, map(_FLAGS, headers), repeat(wire.FLAG_KEY, m))))
        if keyed:
            _index_keys(w, tid, g, keyed, entries, headers)
        w.next_global = g + m
        st.next_offset = first_queue + m
        st.bytes += len(value)
        w.stored += len(value)
        w.touched.add((tid, qid))


def _index_keys(
    w: WriteContext, tid: int, g: int, keyed: list[int], entries: Sequence[bytes], headers: Sequence[tuple[int, ...]]
) -> None:
    """Append the (hash, offset) pairs of the keyed records (indexes ``keyed`` of a
    batch stored at global offset ``g``) to their key-index buckets."""
    hs = wire.ENTRY_HEADER.size
    hashes = [layout.kindex_hash(entries[i][hs : hs + headers[i][4]]) for i in keyed]
    globals_ = [g + i for i in keyed]
    kdb = w.db[b"kindex"]
    b = layout.KINDEX_BUCKET
    lo = 0
    while lo < len(globals_):
        bucket = globals_[lo] // b
        hi = bisect_left(globals_, (bucket + 1) * b, lo)
        kk = layout.kindex_key(tid, bucket)
        old = w.txn.get(kk, db=kdb)
        add = layout.kindex_pairs(hashes[lo:hi], globals_[lo:hi])
        w.txn.put(kk, bytes(old) + add if old else add, db=kdb)
        lo = hi


def _scan_entries(
    entries: Sequence[bytes], max_body: int, now: int, max_delay_ms: int
) -> tuple[list[tuple[int, ...]], list[int] | None]:
    """The entries' headers, and their due times (None when no entry is delayed).

    Every entry is validated in full first (:func:`equeue.wire.check_entries`: its
    lengths, property block and total size), so nothing unservable is stored.
    Raises InvalidMessage / MessageTooLarge / DelayTooLong (before anything is
    written: the whole batch is refused).
    """
    dues: list[int] | None = None
    headers = wire.check_entries(entries, max_body)
    if max(map(_DUE, headers)) <= now:
        return headers, None
    for i, (_n, _flags, deliver_at, _rc, _kl, _tl, _pl) in enumerate(headers):
        if deliver_at > now:
            if deliver_at - now > max_delay_ms:
                raise DelayTooLong(
                    f"message {i} is due in {(deliver_at - now) / 1000:.0f} s; the broker's maximum "
                    f"delay is {max_delay_ms / 1000:.0f} s"
                )
            if dues is None:
                dues = [0] * len(entries)
            dues[i] = deliver_at
    return headers, dues
