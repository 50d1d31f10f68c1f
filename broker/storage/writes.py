"""The frame every write operation runs in: :class:`WriteOp` (one unit of work),
:class:`WriteContext` (the open write transaction plus the state it staged) and
:class:`WriteOutcome` (what a committed transaction hands back).

An op reads the committed state from ``ctx.base`` (the :class:`StoreView` the
transaction started from) merged with what earlier ops of the same transaction
staged, checks its preconditions, then writes to LMDB through ``ctx.txn`` and
stages its in-memory changes on the context. Nothing is published until the
transaction committed: :meth:`WriteContext.next_view` then builds the new view.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import lmdb
import outcome

from equeue import control
from equeue.broker.storage import layout
from equeue.broker.storage.recorder import RecordingCursor, RecordingTxn
from equeue.broker.storage.view import NO_QUEUES, QueueState, StoreView, frozen_map
from equeue.errors import EQueueError, StoreError, StoreFull


def now_ms() -> int:
    """Wall-clock time in ms: the store's timestamps and due times."""
    return time.time_ns() // 1_000_000


@attrs.define(slots=True)
class QueueDraft:
    """A queue's range as staged by the running transaction (mutable, writer only)."""

    next_offset: int = 0
    min_offset: int = 0
    bytes: int = 0


class WriteOp:
    """One unit of work inside a group-commit transaction.

    :meth:`apply` returns the op's result, or raises an
    :class:`~equeue.errors.EQueueError` before it wrote anything (then only this op
    fails); any other exception aborts the whole transaction.
    """

    def apply(self, ctx: WriteContext) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def inline_size(self) -> int | None:
        """About how many bytes this op writes, when it is small and bounded enough
        to be committed on the event loop (``--flush async``, see
        :meth:`equeue.broker.appender.Appender.kick`); None: always in the writer thread."""
        return None


def settled(result: outcome.Outcome[Any]) -> Any:
    """What an outcome holds, without raising: its value, or its exception."""
    if isinstance(result, outcome.Value):
        return result.value
    assert isinstance(result, outcome.Error)
    return result.error


@attrs.frozen
class WriteOutcome:
    """A committed transaction: per op, ``outcome.Value(result)`` or
    ``outcome.Error(exc)`` (the EQueueError it raised), in op order."""

    results: list[outcome.Outcome[Any]]
    #: (topic id, queue id) of every queue whose messages changed
    touched: set[tuple[int, int]]
    #: some op added delayed messages to the schedule
    scheduled: bool = False
    #: replicated store: its log position right after this outcome's last commit (an
    #: outcome that wrote nothing: the position before it); 0 when not replicated
    position: int = 0

    def settled(self) -> list[Any]:
        """Each op's result, or the exception it failed with."""
        return list(map(settled, self.results))

    @classmethod
    def merge(cls, parts: list[WriteOutcome]) -> WriteOutcome:
        """The outcomes of consecutive transactions over consecutive ops, as one."""
        touched: set[tuple[int, int]] = set()
        for p in parts:
            touched |= p.touched
        return cls(
            [r for p in parts for r in p.results], touched, any(p.scheduled for p in parts),
            max(p.position for p in parts),
        )  # fmt: skip


class WriteContext:
    """The open write transaction of :meth:`Store.write` and the state its ops staged.

    On a replicated store ``txn`` is a :class:`~equeue.broker.storage.recorder.RecordingTxn`
    (and :meth:`cursor` hands out recording cursors): every change an op makes is
    recorded for the replication log; ops use ``txn`` and :meth:`cursor` alike either
    way and never reach LMDB otherwise."""

    def __init__(
        self,
        base: StoreView,
        txn: lmdb.Transaction | RecordingTxn,
        db: dict[bytes, Any],
        now: int,
        next_sched_seq: Callable[[], int],
    ) -> None:
        self.base = base
        self.txn = txn
        self.db = db
        #: the transaction's timestamp (ms): store time of every record it writes
        self.now = now
        self.next_sched_seq = next_sched_seq
        self.next_global = base.next_global
        self.next_topic_id: int | None = None
        self.queues: dict[tuple[int, int], QueueDraft] = {}
        #: topic name -> new description, or None once deleted
        self.topics: dict[str, control.TopicInfo | None] = {}
        self.deleting: list[int] | None = None
        self.offsets: dict[tuple[str, str, int], int] = {}
        #: committed offsets deleted by this transaction (DELETE_GROUP)
        self.offsets_removed: set[tuple[str, str, int]] = set()
        self.sched_delta: dict[int, int] = {}
        self.touched: set[tuple[int, int]] = set()
        self.moved = 0
        self.move_transactions = 0
        #: queue offsets skipped by this transaction (:mod:`equeue.broker.storage.skips`)
        self.skipped: dict[tuple[int, int], set[int]] = {}
        #: (kind, name) -> paused, as staged by this transaction (:mod:`equeue.broker.storage.pauses`)
        self.paused: dict[tuple[str, str], bool] = {}
        #: something was written (else the transaction is aborted, not committed)
        self.wrote = False
        #: record bytes appended by this transaction's ops
        self.stored = 0
        self._cursors: dict[bytes, lmdb.Cursor | RecordingCursor] = {}

    def cursor(self, db: bytes) -> lmdb.Cursor | RecordingCursor:
        """A cursor on named database ``db`` in this transaction (reused across ops)."""
        cur = self._cursors.get(db)
        if cur is None:
            cur = self._cursors[db] = self.txn.cursor(db=self.db[db])
        return cur

    def put_many(self, db: bytes, keys: Iterable[bytes], values: Iterable[bytes], *, append: bool = False) -> None:
        """Put ``keys[i] -> values[i]`` (equal counts) into named database ``db`` with
        one LMDB call (recorded as one run when replicated)."""
        cur = self.cursor(db)
        if isinstance(cur, RecordingCursor):
            cur.put_lists(keys, values, append=append)
        else:
            cur.putmulti(zip(keys, values, strict=True), append=append)

    def queue(self, topic_id: int, queue_id: int) -> QueueDraft:
        """A queue's staged range, to change (staged on first use)."""
        key = (topic_id, queue_id)
        st = self.queues.get(key)
        if st is None:
            cur = self.base.queue(topic_id, queue_id)
            st = self.queues[key] = QueueDraft(cur.next_offset, cur.min_offset, cur.bytes)
        return st

    def queue_now(self, topic_id: int, queue_id: int) -> QueueDraft | QueueState:
        """A queue's range as this transaction sees it, without staging it (read only)."""
        return self.queues.get((topic_id, queue_id)) or self.base.queue(topic_id, queue_id)

    def topic(self, name: str) -> control.TopicInfo | None:
        """A topic as this transaction sees it (None: no such topic)."""
        if name in self.topics:
            return self.topics[name]
        return self.base.topics.get(name)

    def topic_ids(self) -> dict[int, control.TopicInfo]:
        """Every topic this transaction sees, by id."""
        out: dict[int, control.TopicInfo] = {}
        for name in {*self.base.topics, *self.topics}:
            info = self.topic(name)
            if info is not None:
                out[info.topic_id] = info
        return out

    def deleting_now(self) -> list[int]:
        """Deleted topics whose data is still being removed, as this transaction sees them."""
        return list(self.deleting if self.deleting is not None else self.base.deleting)

    def schedule_put(self, due: int, value: bytes) -> None:
        """Add one entry to the schedule under (due, seq). Never overwrites: if a key
        exists (sequence reused after a clock step back across a restart) take the next
        sequence, so a pending delayed message can never be lost to a collision."""
        db = self.db[b"schedule"]
        while not self.txn.put(layout.schedule_key(due, self.next_sched_seq()), value, db=db, overwrite=False):
            pass

    # ------------------------------------------------------------------ commit
    def stage_counters(self) -> None:
        """Write the counters the ops changed (meta, qstats, sched_count) before commit."""
        txn, db, base = self.txn, self.db, self.base
        if self.next_global != base.next_global:
            txn.put(b"next_global", layout.pack_u64(self.next_global), db=db[b"meta"])
        if self.next_topic_id is not None:
            txn.put(b"next_topic_id", layout.pack_u32(self.next_topic_id), db=db[b"meta"])
        qstats = db[b"qstats"]
        for (tid, q), st in self.queues.items():
            txn.put(layout.queue_key(tid, q), layout.pack_qstats(st.next_offset, st.bytes), db=qstats)
        for tid, d in self.sched_delta.items():
            n = max(0, base.sched_pending.get(tid, 0) + d)
            txn.put(layout.sched_count_key(tid), layout.pack_u64(n), db=db[b"sched_count"])

    def next_view(self) -> StoreView:
        """The view after this transaction committed (built from the base, never
        changing it: maps that changed are copied)."""
        b = self.base
        topics, queues, offsets, pending = b.topics, b.queues, b.offsets, b.sched_pending
        if self.topics:
            t = topics.copy()
            for name, info in self.topics.items():
                if info is None:
                    t.pop(name, None)
                else:
                    t[name] = info
            topics = frozen_map(t)
        deleting = b.deleting if self.deleting is None else tuple(self.deleting)
        if self.queues or self.deleting is not None:
            q = queues.copy()  # topic id -> its queues: only the touched topics' maps are copied
            touched: dict[int, dict[int, QueueState]] = {}
            for (tid, qid), draft in self.queues.items():
                inner = touched.get(tid)
                if inner is None:
                    inner = touched[tid] = dict(q.get(tid, NO_QUEUES))
                inner[qid] = QueueState(draft.next_offset, draft.min_offset, draft.bytes)
            for tid, inner in touched.items():
                q[tid] = frozen_map(inner)
            if self.deleting is not None:
                for tid in deleting:
                    q.pop(tid, None)
            queues = frozen_map(q)
        if self.offsets or self.offsets_removed:
            o = offsets.copy()
            o.update(self.offsets)
            for where in self.offsets_removed:
                o.pop(where, None)
            offsets = frozen_map(o)
        if self.sched_delta:
            p = pending.copy()
            for tid, d in self.sched_delta.items():
                p[tid] = max(0, p.get(tid, 0) + d)
            pending = frozen_map(p)
        skipped = b.skipped
        if self.skipped:
            s = skipped.copy()
            for key, offs in self.skipped.items():
                s[key] = s.get(key, frozenset()) | offs
            skipped = frozen_map(s)
        paused_topics, paused_groups = b.paused_topics, b.paused_groups
        if self.paused:
            paused_topics = _staged(paused_topics, self.paused, "topic")
            paused_groups = _staged(paused_groups, self.paused, "group")
        return StoreView(
            topics, queues, offsets, pending, deleting, self.next_global,
            b.next_topic_id if self.next_topic_id is None else self.next_topic_id,
            b.transactions + 1, b.moved + self.moved, b.move_transactions + self.move_transactions,
            skipped, paused_topics, paused_groups,
        )  # fmt: skip

    def is_paused(self, kind: str, name: str) -> bool:
        """Whether topic or group ``name`` is paused, as this transaction sees it."""
        staged = self.paused.get((kind, name))
        if staged is not None:
            return staged
        return name in (self.base.paused_topics if kind == "topic" else self.base.paused_groups)


def _staged(base: frozenset[str], staged: dict[tuple[str, str], bool], kind: str) -> frozenset[str]:
    """``base`` with the pauses and resumes of ``kind`` a transaction staged."""
    names = set(base)
    for (k, name), paused in staged.items():
        if k == kind:
            (names.add if paused else names.discard)(name)
    return frozenset(names)


def store_error(exc: lmdb.Error, path: Path) -> EQueueError:
    """The coded error an LMDB failure of a write transaction of the store at
    ``path`` is answered with: StoreFull for a full map or disk, else StoreError."""
    if isinstance(exc, lmdb.MapFullError):
        return StoreFull(
            f"the store's LMDB map is full ({path}): nothing was written. Raise --map-size "
            "(restart the broker with a larger value) or lower retention to free space."
        )
    text = str(exc)
    if "No space" in text or "ENOSPC" in text or isinstance(exc, lmdb.DiskError):
        return StoreFull(f"the disk holding {path} is full: nothing was written. Free disk space.")
    return StoreError(f"store write failed ({path}): {text}")
