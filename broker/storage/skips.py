"""Skipping a corrupt record: an operator's way past a record consumers cannot read
(``equeue message skip``, the SKIP_MESSAGE request).

The op writes a marker (``meta`` "skip/" topic | queue | offset, see
:mod:`~equeue.broker.storage.layout`) and stages the offset in the view's ``skipped``
map; pulls step over skipped offsets and lookups answer MESSAGE_NOT_FOUND for
them. The record itself is kept (for ``mdb_dump`` / forensics); retention removes
it with its neighbours. A skip is never undone by the broker.
"""

from __future__ import annotations

from typing import Any

import attrs
import lmdb

from equeue import control
from equeue.broker.storage import layout
from equeue.broker.storage.reader import MAX_RECORDS_LEN
from equeue.broker.storage.recorder import RecordingTxn
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import EQueueError, MessageNotFound, QueueNotFound, TopicNotFound
from equeue.wire import batches

__all__ = ["SkipRecordOp", "record_problem"]


@attrs.define
class SkipRecordOp(WriteOp):
    """Mark (topic, queue, queue offset) skipped; returns a :class:`~equeue.control.SkipAnswer`.

    Raises TopicNotFound, QueueNotFound, or MessageNotFound for an offset outside
    the queue's retained range."""

    topic: str
    queue_id: int
    queue_offset: int

    def apply(self, w: WriteContext) -> control.SkipAnswer:
        info = w.topic(self.topic)
        if info is None:
            raise TopicNotFound(f"no topic {self.topic!r}")
        if not 0 <= self.queue_id < info.queues:
            raise QueueNotFound(f"topic {self.topic!r} has {info.queues} queues; no queue {self.queue_id}")
        st = w.queue_now(info.topic_id, self.queue_id)
        if not st.min_offset <= self.queue_offset < st.next_offset:
            raise MessageNotFound(
                f"no message at {self.topic}/{self.queue_id} offset {self.queue_offset} "
                f"(retained range [{st.min_offset}, {st.next_offset}))"
            )
        key = (info.topic_id, self.queue_id)
        done = self.queue_offset in w.base.skips(*key) or self.queue_offset in w.skipped.get(key, ())
        problem = record_problem(w.txn, w.db, info.topic_id, self.queue_id, self.queue_offset)
        answer = control.SkipAnswer(self.topic, self.queue_id, self.queue_offset, done, problem)
        if done:
            return answer
        w.wrote = True
        w.txn.put(
            layout.skip_key(info.topic_id, self.queue_id, self.queue_offset),
            layout.pack_u64(w.now), db=w.db[b"meta"],
        )  # fmt: skip
        w.skipped.setdefault(key, set()).add(self.queue_offset)
        w.touched.add(key)  # parked pulls of the queue look again and step over it
        return answer


def record_problem(txn: lmdb.Transaction | RecordingTxn, db: dict[bytes, Any], topic_id: int, queue_id: int, offset: int) -> str:
    """What is wrong with the record at a queue offset ("" when it reads intact): no
    index entry, a dangling pointer, a damaged batch (header, checksum, records), a
    header naming another position."""
    cur = txn.cursor(db=db[b"qindex"])
    prefix = layout.queue_key(topic_id, queue_id)
    ok = cur.prev() if cur.set_range(layout.qindex_key(topic_id, queue_id, offset + 1)) else cur.last()
    if not ok or not bytes(cur.key()).startswith(prefix):
        return "no index entry"
    base = layout.qindex_offset(cur.key())
    g, count = layout.unpack_qindex_value(cur.value())
    if not base <= offset < base + count:
        return "no index entry"
    value = txn.get(layout.global_key(g), db=db[b"messages"])
    if value is None:
        return f"the index points to global offset {g}, which holds no record"
    try:
        h = batches.stored_head(value)
        records = batches.decode_batch(batches.stored_batch(value), MAX_RECORDS_LEN)
    except EQueueError as exc:
        return str(exc)
    if (h.topic_id, h.queue_id, h.base_offset, len(records)) != (topic_id, queue_id, base, count):
        return (
            f"the index points to global offset {g}, a batch of topic id {h.topic_id} queue "
            f"{h.queue_id} offsets {h.base_offset}..{h.base_offset + len(records) - 1}"
        )
    return ""
