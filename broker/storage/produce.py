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
    """Append one request's messages to one queue; entries with a future
    ``deliver_at`` go to the schedule instead. Idempotent when ``producer_id`` is set.

    The messages come in one of two forms. ``produced``: a producer's batch
    (``batch``) whose records the produce handler checked in one pass
    (:func:`equeue.wire.batches.scan_produced`; none delayed): stored as sent when
    ``codec`` is None or its own codec, else its records sealed again with ``codec``,
    and cut into stored batches of at most :data:`STORED_BATCH_RECORDS` records when
    uncompressed. Else ``entries``: the stored batches are built from them, their
    records compressed with ``codec`` (None: uncompressed); ``batch``, when set, is
    the producer's batch they were decoded from (delayed messages), stored as sent
    when none is delayed and the codec allows. ``codec`` is the topic's
    ``compression`` setting (:func:`equeue.control.stored_codec`).

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
    #: the producer's batch as checked (the messages' form instead of ``entries``)
    produced: batches.ProducedRecords | None = None

    def inline_size(self) -> int:
        """The request's bytes (what the loop's worst pause grows with)."""
        if self.produced is not None:
            return len(self.produced.records)
        return sum(map(len, self.entries))

    def apply(self, w: WriteContext) -> wire.ProduceResponse:
        """Validation and dedup (nothing written yet), then the writes: delayed
        entries to the schedule, the others to the log as stored batches and their
        indexes, the producer's state last."""
        produced = self.produced
        if produced is None:
            headers, dues = self._validate(w)
            total = len(self.entries)
        else:
            self._check_queue(w)
            headers, dues, total = [], None, produced.count
        pkey = pstate = None
        if self.producer_id is not None:
            pkey = layout.producer_key(self.producer_id, self.topic.topic_id, self.queue_id)
            pstate = producers.read_state(w, pkey)
            first = producers.check_sequence(pstate, self.base_sequence)
            if first is not None:
                return first  # resent: the answer it got the first time
        if produced is not None:
            m = produced.count
            chunks = self._produced_chunks(produced)
        else:
            m, chunks = self._entries_chunks(headers, dues)
        for i, j, batch, _keyed, _keys in chunks:
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
        for i, j, batch, keyed, keys in chunks:
            self._append(w, st, batch, j - i, keyed, keys, i)
        answer = wire.ProduceResponse(first_global if m else -1, first_queue if m else -1, m, scheduled)
        if pkey is not None:
            producers.record_answer(w, pkey, pstate, self.base_sequence, total, answer)
        return answer

    def _produced_chunks(self, produced: batches.ProducedRecords) -> list[_Chunk]:
        """The stored batches of a checked producer batch: as sent (its codec kept,
        or uncompressed and within :data:`STORED_BATCH_RECORDS`), else its records
        sealed again: cut into batches of at most that many records when the topic
        stores them uncompressed, compressed whole with the topic's codec otherwise."""
        sent, m = self.batch, produced.count
        assert sent is not None  # produced comes with its batch
        codec = self.codec
        if codec is None or codec == sent[1]:
            if sent[1] != _NONE or m <= STORED_BATCH_RECORDS:
                return [(0, m, sent, produced.keyed, produced.keys)]
            codec = _NONE
        if codec != _NONE:
            return [(0, m, batches.seal_records(produced.records, m, codec), produced.keyed, produced.keys)]
        bounds = batches.record_bounds(produced.records, m)
        chunks: list[_Chunk] = []
        keyed, keys, records = produced.keyed, produced.keys, produced.records
        for i in range(0, m, STORED_BATCH_RECORDS):
            j = min(m, i + STORED_BATCH_RECORDS)
            lo, hi = bisect_left(keyed, i), bisect_left(keyed, j)
            chunk = batches.seal_records(records[bounds[i] : bounds[j]], j - i, _NONE)
            chunks.append((i, j, chunk, [k - i for k in keyed[lo:hi]], keys[lo:hi]))
        return chunks

    def _entries_chunks(
        self, headers: list[tuple[int, ...]], dues: list[int] | None
    ) -> tuple[int, list[_Chunk]]:
        """How many of the entries the log gets (the others are delayed), and their
        stored batches: the producer's batch as sent when nothing in it is delayed and
        the topic keeps its codec, else the entries' records cut into batches of at
        most :data:`STORED_BATCH_RECORDS` (a read of a few records costs the reader
        work in proportion to the batch holding them). The records are built before
        anything is written: a key that is not UTF-8 refuses the whole request
        (InvalidMessage), delayed ones too."""
        entries: Sequence[bytes] = self.entries
        all_headers = headers
        if dues is not None:
            live = [i for i, d in enumerate(dues) if not d]
            entries = [self.entries[i] for i in live]
            headers = [headers[i] for i in live]
        sent = self.batch
        if sent is not None and (dues is not None or self.codec not in (None, sent[1])):
            sent = None
        if dues is not None and len(entries) < len(self.entries):  # the delayed ones: UTF-8 too
            delayed = [i for i, d in enumerate(dues) if d]
            batches.records_from_entries([self.entries[i] for i in delayed], [all_headers[i] for i in delayed])
        m = len(entries)
        chunks: list[_Chunk] = []
        if m and sent is not None:
            chunks.append((0, m, sent, *_entry_keys(entries, headers)))
        elif m:
            codec = self.codec or _NONE
            for i in range(0, m, STORED_BATCH_RECORDS):
                j = min(m, i + STORED_BATCH_RECORDS)
                records = batches.records_from_entries(entries[i:j], headers[i:j])
                chunks.append((i, j, batches.seal_records(records, j - i, codec), *_entry_keys(entries[i:j], headers[i:j])))
        return m, chunks

    def _check_queue(self, w: WriteContext) -> None:
        """The topic and its queue still exist. Raises TopicNotFound, QueueNotFound."""
        t = self.topic
        now = w.topic(t.name)
        if now is None or now.topic_id != t.topic_id:  # deleted (and maybe created again)
            raise TopicNotFound(f"topic {t.name!r} was deleted")
        if not 0 <= self.queue_id < t.queues:
            raise QueueNotFound(f"topic {t.name!r} has {t.queues} queues; no queue {self.queue_id}")

    def _validate(self, w: WriteContext) -> tuple[list[tuple[int, ...]], list[int] | None]:
        """The topic and queue still exist and every entry is servable
        (:func:`_scan_entries`, whose result it returns). Raises TopicNotFound,
        QueueNotFound, InvalidMessage, MessageTooLarge, DelayTooLong."""
        self._check_queue(w)
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
        self, w: WriteContext, st: QueueDraft, batch: bytes, m: int, keyed: list[int], keys: list[bytes],
        first: int = 0,
    ) -> None:  # fmt: skip
        """Store ``batch`` (``m`` records, not empty; the records at indexes ``keyed``
        have keys ``keys``) at the log's end and the queue's (``st``): the stored
        batch, its queue-index entry, the key index's pairs of its keyed messages, and
        the staged counters. The per-message work left here (the key hashes) runs in
        C loops: this is the broker's hottest path (docs/storage.md, "Performance")."""
        tid, qid = self.topic.topic_id, self.queue_id
        g, first_queue = w.next_global, st.next_offset
        pid = self.producer_id
        seq = self.base_sequence + first if pid is not None else 0  # (without a producer id it means nothing)
        value = batches.encode_stored(tid, qid, first_queue, w.now, w.now, pid, seq, batch)
        w.txn.put(layout.global_key(g), value, db=w.db[b"messages"], append=True)
        w.txn.put(layout.qindex_key(tid, qid, first_queue), layout.pack_qindex_value(g, m), db=w.db[b"qindex"])
        if keyed:
            _index_keys(w, tid, g, keyed, keys)
        w.next_global = g + m
        st.next_offset = first_queue + m
        st.bytes += len(value)
        w.stored += len(value)
        w.touched.add((tid, qid))


#: one stored batch of a request: its first and end index among the request's
#: logged messages, the batch, and its keyed records (indexes within it) and keys
_Chunk = tuple[int, int, bytes, list[int], list[bytes]]


def _entry_keys(entries: Sequence[bytes], headers: Sequence[tuple[int, ...]]) -> tuple[list[int], list[bytes]]:
    """The indexes of the keyed entries, and their keys (found in C loops)."""
    m = len(headers)
    keyed = list(compress(range(m), map(and_, map(_FLAGS, headers), repeat(wire.FLAG_KEY, m))))
    hs = wire.ENTRY_HEADER.size
    return keyed, [entries[i][hs : hs + headers[i][4]] for i in keyed]


def _index_keys(w: WriteContext, tid: int, g: int, keyed: list[int], keys: list[bytes]) -> None:
    """Append the (hash, offset) pairs of the keyed records (indexes ``keyed`` of a
    batch stored at global offset ``g``, keys ``keys``) to their key-index buckets."""
    hashes = list(map(layout.kindex_hash, keys))
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
