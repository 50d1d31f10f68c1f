"""Retention: :class:`RetentionOp` deletes the oldest messages past their topic's
limits (time, size, consumed) and the data of deleted topics, in bounded batches."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping

import attrs

from equeue import control
from equeue.broker.storage import layout
from equeue.broker.storage.topics import set_deleting
from equeue.broker.storage.view import NO_QUEUES, QueueState, StoreView
from equeue.broker.storage.writes import QueueDraft, WriteContext, WriteOp
from equeue.errors import CorruptRecord
from equeue.retention import retention_limit
from equeue.wire import batches

log = logging.getLogger("equeue.store")


@attrs.define
class RetentionOp(WriteOp):
    """Delete the oldest messages past their topic's retention, at most ``limit`` per
    transaction (the caller repeats while a full batch was removed).

    Per topic (its overrides, else the broker defaults, read by
    :func:`equeue.retention.retention_limit`: -1, None or any other value that is
    not a positive number is no limit, so nothing is deleted on it):

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

    def apply(self, w: WriteContext) -> int:
        removed = 0
        for tid in w.deleting_now():
            removed += _purge_topic(w, tid, self.limit - removed)
            if removed >= self.limit:
                return removed
        for t in list(w.base.topics.values()):
            if removed >= self.limit:
                break
            removed += self._topic(w, t, self.limit - removed)
        return removed

    def _topic(self, w: WriteContext, t: control.TopicInfo, budget: int) -> int:
        """Remove whole batches of one topic past its limits: a batch goes when its
        last record is past them (time: its last store time; consumed: every record
        below the slowest group's offset; size: oldest batches first). Returns the
        records removed."""
        rms = retention_limit(t.retention_ms, self.default_retention_ms)
        rbytes = retention_limit(t.retention_bytes, self.default_retention_bytes)
        cutoff = w.now - rms if rms is not None else None
        consumed = self._consumed(w.base, t) if self.delete_consumed else {}
        mdb = w.db[b"messages"]
        tid = t.topic_id
        removed = 0
        if cutoff is not None or consumed:
            for q in range(t.queues):
                st: QueueDraft | QueueState = w.queue_now(tid, q)
                upto = consumed.get(q, 0)
                while removed < budget and st.min_offset < st.next_offset:
                    head = _head_batch(w, tid, q, st.min_offset)
                    if head is None:
                        break
                    g, count = head
                    if st.min_offset + count > upto:
                        if cutoff is None:
                            break
                        value = w.txn.get(layout.global_key(g), db=mdb)
                        if value is not None and _last_ms(value) >= cutoff:
                            break
                    draft = w.queue(tid, q)
                    _delete_head(w, tid, q, draft, g, count)
                    st = draft
                    removed += count
        if rbytes is not None:
            total = sum(w.queue_now(tid, q).bytes for q in range(t.queues))
            heads: list[tuple[int, int, int]] = []
            if total > rbytes:
                for q in range(t.queues):
                    st = w.queue_now(tid, q)
                    hb = _head_batch(w, tid, q, st.min_offset) if st.min_offset < st.next_offset else None
                    if hb is not None:
                        heapq.heappush(heads, (hb[0], q, hb[1]))
            while removed < budget and total > rbytes and heads:
                g, q, count = heapq.heappop(heads)
                draft = w.queue(tid, q)
                total -= _delete_head(w, tid, q, draft, g, count)
                removed += count
                if draft.min_offset < draft.next_offset:
                    nxt = _head_batch(w, tid, q, draft.min_offset)
                    if nxt is not None:
                        heapq.heappush(heads, (nxt[0], q, nxt[1]))
        return removed

    def _consumed(self, v: StoreView, t: control.TopicInfo) -> dict[int, int]:
        """Per queue, the offset below which every interested group has committed."""
        groups = {g for (g, tt, _q) in v.offsets if tt == t.name}
        groups |= self.live_groups.get(t.name, frozenset())
        if not groups:
            return {}
        return {q: min(v.offsets.get((g, t.name, q), 0) for g in groups) for q in range(t.queues)}


def _head_batch(w: WriteContext, tid: int, q: int, off: int) -> tuple[int, int] | None:
    """The (global base, record count) of the batch at a queue's head offset."""
    v = w.txn.get(layout.qindex_key(tid, q, off), db=w.db[b"qindex"])
    if v is None:
        log.warning("queue %d/%d has no index entry at its head offset %d", tid, q, off)
        return None
    try:
        g, count = layout.unpack_qindex_value(v)
    except CorruptRecord as exc:  # that queue keeps its head; the others go on
        log.warning("queue %d/%d: the index entry at its head offset %d is damaged (%s)", tid, q, off, exc)
        return None
    return g, count


def _last_ms(value: bytes | memoryview) -> int:
    """The last store time of a stored batch (a damaged header: 0, so time retention
    removes it with its neighbours)."""
    try:
        return batches.stored_head(value).last_ms
    except CorruptRecord:
        return 0


def _delete_head(w: WriteContext, tid: int, q: int, st: QueueDraft, g: int, count: int) -> int:
    """Delete the head batch of a queue (global base ``g``, ``count`` records): the
    stored batch, its queue-index entry, its records' key-index pairs. Returns its size."""
    w.wrote = True
    value = w.txn.pop(layout.global_key(g), db=w.db[b"messages"])
    w.txn.delete(layout.qindex_key(tid, q, st.min_offset), db=w.db[b"qindex"])
    size = len(value) if value else 0
    kdb = w.db[b"kindex"]
    b = layout.KINDEX_BUCKET
    for bucket in range(g // b, (g + count - 1) // b + 1):
        kk = layout.kindex_key(tid, bucket)
        kv = w.txn.get(kk, db=kdb)
        if kv is None:
            continue
        hashes, offs = layout.unpack_kindex_value(kv)
        lo, hi = g - bucket * b, g + count - bucket * b
        keep = [i for i, o in enumerate(offs) if not lo <= o < hi]
        if len(keep) == len(offs):
            continue
        if keep:
            w.txn.put(kk, layout.pack_kindex_value([hashes[i] for i in keep], [offs[i] for i in keep]), db=kdb)
        else:
            w.txn.delete(kk, db=kdb)
    st.min_offset += count
    st.bytes = max(0, st.bytes - size)
    w.touched.add((tid, q))
    return size


def _purge_topic(w: WriteContext, tid: int, limit: int) -> int:
    """Remove up to about ``limit`` records (whole batches) of a deleted topic; forget
    it when done."""
    cur = w.txn.cursor(db=w.db[b"qindex"])
    prefix = layout.topic_prefix(tid)
    n_prefix = len(prefix)
    n = 0
    w.wrote = True
    if cur.set_range(prefix):
        while n < limit and cur.key()[:n_prefix] == prefix:
            g, count = layout.unpack_qindex_value(cur.value())
            w.txn.delete(layout.global_key(g), db=w.db[b"messages"])
            n += count
            cur.delete()
    if n < limit:
        kc = w.txn.cursor(db=w.db[b"kindex"])
        if kc.set_range(prefix):
            while n < limit and kc.key()[:n_prefix] == prefix:
                n += 1
                kc.delete()
    if n < limit:
        qc = w.txn.cursor(db=w.db[b"qstats"])
        if qc.set_range(prefix):
            while qc.key()[:n_prefix] == prefix:
                qc.delete()
        set_deleting(w, [x for x in w.deleting_now() if x != tid])
        for q in w.base.queues.get(tid, NO_QUEUES):
            w.queues.pop((tid, q), None)
    return n
