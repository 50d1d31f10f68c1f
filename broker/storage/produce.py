"""Appending messages: :class:`ProduceOp` (validation, dedup, the log and its
indexes, delayed entries to the schedule, the producer's state).

An idempotent producer's state and the dedup decision are
:mod:`equeue.broker.storage.producers`'; this module asks it before writing and
records the batch's answer there after.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, getitem
from zlib import crc32

import attrs

from equeue import control, wire
from equeue.broker.storage import layout, producers
from equeue.broker.storage.writes import QueueDraft, WriteContext, WriteOp
from equeue.errors import DelayTooLong, QueueNotFound, TopicNotFound
from equeue.wire.records import encode_records

_EH = wire.ENTRY_HEADER


@attrs.define
class ProduceOp(WriteOp):
    """Append entries to one queue; entries with a future ``deliver_at`` go to the
    schedule instead. Idempotent when ``producer_id`` is set.

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

    def inline_size(self) -> int:
        """The entries' bytes (what the loop's worst pause grows with)."""
        return sum(map(len, self.entries))

    def apply(self, w: WriteContext) -> wire.ProduceResponse:
        """Validation and dedup (nothing written yet), then the writes: delayed
        entries to the schedule, the others to the log and its indexes, the
        producer's state last."""
        keyed, klens, dues = self._validate(w)
        pkey = pstate = None
        if self.producer_id is not None:
            pkey = layout.producer_key(self.producer_id, self.topic.topic_id, self.queue_id)
            pstate = producers.read_state(w, pkey)
            first = producers.check_sequence(pstate, self.base_sequence)
            if first is not None:
                return first  # resent: the answer it got the first time
        # ---- preconditions done; writes start
        w.wrote = True
        st = w.queue(self.topic.topic_id, self.queue_id)
        first_global, first_queue = w.next_global, st.next_offset
        entries, scheduled = self.entries, 0
        if dues is not None:
            entries, keyed, klens, scheduled = self._schedule(w, dues, keyed, klens)
        m = len(entries)
        if m:
            self._append(w, st, entries, keyed, klens)
        answer = wire.ProduceResponse(first_global if m else -1, first_queue if m else -1, m, scheduled)
        if pkey is not None:
            producers.record_answer(w, pkey, pstate, self.base_sequence, len(self.entries), answer)
        return answer

    def _validate(self, w: WriteContext) -> tuple[list[int], list[int], list[int] | None]:
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

    def _schedule(
        self, w: WriteContext, dues: list[int], keyed: list[int], klens: list[int]
    ) -> tuple[list[bytes], list[int], list[int], int]:
        """Put the delayed entries (``dues[i]`` > 0) in the schedule, in order;
        returns the others, the indexes and key lengths of their keyed ones, and how
        many were scheduled."""
        tid = self.topic.topic_id
        live: list[bytes] = []
        live_idx: list[int] = []
        target = layout.schedule_target(tid, self.queue_id)
        for i, entry in enumerate(self.entries):
            if dues[i]:
                w.schedule_put(dues[i], target + entry)
            else:
                live.append(entry)
                live_idx.append(i)
        scheduled = len(self.entries) - len(live)
        w.sched_delta[tid] = w.sched_delta.get(tid, 0) + scheduled
        if keyed:
            kl_of = dict(zip(keyed, klens, strict=True))
            keyed = [j for j, i in enumerate(live_idx) if i in kl_of]
            klens = [kl_of[live_idx[j]] for j in keyed]
        return live, keyed, klens, scheduled

    def _append(
        self, w: WriteContext, st: QueueDraft, entries: Sequence[bytes], keyed: list[int],
        klens: list[int],
    ) -> None:  # fmt: skip
        """Store ``entries`` (not empty) at the log's end and the queue's (``st``):
        the records, the queue index and the key index, and the staged counters.
        Per-message work runs in C loops (map/zip), never Python bytecode: this is
        the broker's hottest loop (docs/storage.md, "Performance")."""
        tid, qid, m = self.topic.topic_id, self.queue_id, len(entries)
        g, first_queue = w.next_global, st.next_offset
        recs = encode_records(tid, qid, first_queue, w.now, entries)
        gks = list(map(layout.global_key, range(g, g + m)))
        w.put_many(b"messages", gks, recs, append=True)
        qks = map(layout.qindex_key, repeat(tid, m), repeat(qid, m), range(first_queue, first_queue + m))
        w.put_many(b"qindex", qks, gks)
        if keyed:  # key index: crc32 of the key bytes == equeue.routing.key_hash
            hs = _EH.size
            k = len(keyed)
            keys = map(getitem, map(entries.__getitem__, keyed), map(slice, repeat(hs, k), map(add, repeat(hs, k), klens)))
            kks = layout.kindex_keys(tid, map(crc32, keys), list(map(add, repeat(g, k), keyed)))  # type: ignore[arg-type]
            w.put_many(b"kindex", kks, repeat(b"", k))
        w.next_global = g + m
        st.next_offset = first_queue + m
        size = sum(map(len, recs))
        st.bytes += size
        w.stored += size
        w.touched.add((tid, qid))


def _scan_entries(
    entries: Sequence[bytes], max_body: int, now: int, max_delay_ms: int
) -> tuple[list[int], list[int], list[int] | None]:
    """Indexes of entries with a key, their key lengths, and due times (None when no
    entry is delayed).

    Every entry is validated in full first (:func:`equeue.wire.check_entries`: its
    lengths, property block and total size), so nothing unservable is stored.
    Raises InvalidMessage / MessageTooLarge / DelayTooLong (before anything is
    written: the whole batch is refused).
    """
    keyed: list[int] = []
    klens: list[int] = []
    dues: list[int] | None = None
    headers = wire.check_entries(entries, max_body)
    for i, (_n, flags, deliver_at, _rc, kl, _tl, _pl) in enumerate(headers):
        if flags & wire.FLAG_KEY:
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
    return keyed, klens, dues
