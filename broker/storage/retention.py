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
from equeue.errors import EQueueError
from equeue.retention import retention_limit
from equeue.routing import key_hash
from equeue.wire.records import record_entry_meta, record_timestamp

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
                    g = _head_global(w, tid, q, st.min_offset)
                    if g is None:
                        break
                    if st.min_offset >= upto:
                        if cutoff is None:
                            break
                        rec = w.txn.get(layout.global_key(g), db=mdb)
                        if rec is not None and record_timestamp(rec) >= cutoff:
                            break
                    draft = w.queue(tid, q)
                    _delete_head(w, tid, q, draft, g)
                    st = draft
                    removed += 1
        if rbytes is not None:
            total = sum(w.queue_now(tid, q).bytes for q in range(t.queues))
            heads: list[tuple[int, int]] = []
            if total > rbytes:
                for q in range(t.queues):
                    st = w.queue_now(tid, q)
                    g = _head_global(w, tid, q, st.min_offset) if st.min_offset < st.next_offset else None
                    if g is not None:
                        heapq.heappush(heads, (g, q))
            while removed < budget and total > rbytes and heads:
                g, q = heapq.heappop(heads)
                draft = w.queue(tid, q)
                total -= _delete_head(w, tid, q, draft, g)
                removed += 1
                if draft.min_offset < draft.next_offset:
                    nxt = _head_global(w, tid, q, draft.min_offset)
                    if nxt is not None:
                        heapq.heappush(heads, (nxt, q))
        return removed

    def _consumed(self, v: StoreView, t: control.TopicInfo) -> dict[int, int]:
        """Per queue, the offset below which every interested group has committed."""
        groups = {g for (g, tt, _q) in v.offsets if tt == t.name}
        groups |= self.live_groups.get(t.name, frozenset())
        if not groups:
            return {}
        return {q: min(v.offsets.get((g, t.name, q), 0) for g in groups) for q in range(t.queues)}


def _head_global(w: WriteContext, tid: int, q: int, off: int) -> int | None:
    v = w.txn.get(layout.qindex_key(tid, q, off), db=w.db[b"qindex"])
    if v is None:
        log.warning("queue %d/%d has no index entry at its head offset %d", tid, q, off)
        return None
    return layout.global_of(v)


def _delete_head(w: WriteContext, tid: int, q: int, st: QueueDraft, g: int) -> int:
    """Delete the head message of a queue (record, queue index, key index)."""
    w.wrote = True
    rec = w.txn.pop(layout.global_key(g), db=w.db[b"messages"])
    w.txn.delete(layout.qindex_key(tid, q, st.min_offset), db=w.db[b"qindex"])
    size = len(rec) if rec else 0
    if rec:
        try:
            key = record_entry_meta(rec).key
        except EQueueError:
            key = None
        if key is not None:
            w.txn.delete(layout.kindex_key(tid, key_hash(key), g), db=w.db[b"kindex"])
    st.min_offset += 1
    st.bytes = max(0, st.bytes - size)
    w.touched.add((tid, q))
    return size


def _purge_topic(w: WriteContext, tid: int, limit: int) -> int:
    """Remove up to ``limit`` records of a deleted topic; forget it when done."""
    cur = w.txn.cursor(db=w.db[b"qindex"])
    prefix = layout.topic_prefix(tid)
    n_prefix = len(prefix)
    n = 0
    w.wrote = True
    if cur.set_range(prefix):
        while n < limit and cur.key()[:n_prefix] == prefix:
            w.txn.delete(cur.value(), db=w.db[b"messages"])
            n += 1
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
