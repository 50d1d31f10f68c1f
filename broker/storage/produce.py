"""Appending messages: :class:`ProduceOp` (validation, the log and its indexes,
delayed entries to the schedule) and idempotent producers' dedup state.

An idempotent producer (``producer_id`` set) numbers its batches per queue; the
``producers`` database keeps, per (producer, topic, queue), the last sequence seen
and the answers of the last :data:`~equeue.broker.storage.layout.PRODUCER_RING` batches,
so a resent batch gets its original answer instead of being stored twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, getitem
from zlib import crc32

import attrs

from equeue import control, wire
from equeue.broker.storage import layout
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import (
    DelayTooLong,
    OutOfOrderSequence,
    QueueNotFound,
    TopicNotFound,
)
from equeue.wire.records import encode_records

_EH = wire.ENTRY_HEADER
_PSTATE = layout.PRODUCER_STATE
_PRING = layout.PRODUCER_ANSWER


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
        t = self.topic
        now = w.topic(t.name)
        if now is None or now.topic_id != t.topic_id:  # deleted (and maybe created again)
            raise TopicNotFound(f"topic {t.name!r} was deleted")
        if not 0 <= self.queue_id < t.queues:
            raise QueueNotFound(f"topic {t.name!r} has {t.queues} queues; no queue {self.queue_id}")
        keyed, klens, dues = _scan_entries(self.entries, self.max_body, w.now, self.max_delay_ms)
        pkey = None
        pstate = b""
        n = len(self.entries)
        if self.producer_id is not None:
            pkey = layout.producer_key(self.producer_id, t.topic_id, self.queue_id)
            pstate = bytes(w.txn.get(pkey, db=w.db[b"producers"]) or b"")
            if not pstate and self.base_sequence != 0:
                # An unknown producer starts at 0. Accepting a later batch first would
                # make the earlier one look like a duplicate and drop it.
                raise OutOfOrderSequence(
                    f"sequence {self.base_sequence} from a producer this broker does not know: "
                    "its batches start at 0 (resend in order, or use a new producer id)"
                )
            if pstate:
                last_seq, _ = _PSTATE.unpack_from(pstate, 0)
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
            target = layout.schedule_target(tid, qid)
            for i, entry in enumerate(entries):
                if dues[i]:
                    w.schedule_put(dues[i], target + entry)
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
            g = first_global
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
        if scheduled:
            w.sched_delta[tid] = w.sched_delta.get(tid, 0) + scheduled
        answer = wire.ProduceResponse(
            first_global if m else -1, first_queue if m else -1, m, scheduled
        )
        if pkey is not None:
            last = self.base_sequence + n - 1
            ring = pstate[_PSTATE.size :] if pstate else b""
            item = _PRING.pack(
                self.base_sequence, answer.first_global & wire.NO_OFFSET,
                answer.first_queue & wire.NO_OFFSET, answer.stored, answer.scheduled,
            )  # fmt: skip
            ring = (item + ring)[: _PRING.size * layout.PRODUCER_RING]
            w.txn.put(pkey, _PSTATE.pack(last, w.now) + ring, db=w.db[b"producers"])
        return answer


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


def _duplicate_answer(pstate: bytes, base_seq: int) -> wire.ProduceResponse:
    """The original answer of a batch seen before, or a bare 'duplicate'."""
    for pos in range(_PSTATE.size, len(pstate), _PRING.size):
        seq, g, q, stored, sched = _PRING.unpack_from(pstate, pos)
        if seq == base_seq:
            return wire.ProduceResponse(
                -1 if g == wire.NO_OFFSET else g, -1 if q == wire.NO_OFFSET else q, stored, sched, True
            )
    return wire.ProduceResponse(-1, -1, 0, 0, True)
