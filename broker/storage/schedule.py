"""Delayed delivery, store side: :class:`MoveDueOp` moves due messages from the
``schedule`` database into their queues (:class:`~equeue.broker.storage.produce.ProduceOp`
schedules them, through :meth:`WriteContext.schedule_put`)."""

from __future__ import annotations

import logging

import attrs

from equeue import control, wire
from equeue.broker.storage import layout
from equeue.broker.storage.produce import ProduceOp
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import CorruptRecord, EQueueError

log = logging.getLogger("equeue.store")

_EH = wire.ENTRY_HEADER


@attrs.define
class MoveDueOp(WriteOp):
    """Move delayed messages due at ``w.now`` into their queues: remove them from the
    schedule and append them to the log in the same transaction, earliest due first
    (ties in produce order), at most ``limit`` per transaction so a burst never makes
    one huge transaction. Returns the number of schedule entries consumed.

    The batches are compressed with the topic's ``compression`` codec (else the
    broker's, ``compression``; ``producer``: uncompressed).

    Entries whose topic was deleted (or is now too small for their queue) and
    entries that are malformed are dropped with a log line; they never make the
    transaction fail, so one bad entry cannot block the schedule.
    """

    limit: int = 2000
    #: the broker's ``--compression``, for topics without their own setting: the
    #: moved messages' batches are compressed as a produce's would be
    compression: str = "producer"

    def apply(self, w: WriteContext) -> int:
        cur = w.txn.cursor(db=w.db[b"schedule"])
        if not cur.first() or layout.schedule_due(cur.key()) > w.now:
            return 0  # nothing due: stay read-only
        w.wrote = True
        by_id = w.topic_ids()
        groups: dict[tuple[int, int], list[bytes]] = {}
        delta: dict[int, int] = {}
        moved = 0
        while moved < self.limit:
            k = cur.key()
            if not k or layout.schedule_due(k) > w.now:
                break
            v = bytes(cur.value())
            moved += 1
            tid, qid = layout.unpack_schedule_target(v)
            entry = v[layout.SCHEDULE_TARGET :]
            delta[tid] = delta.get(tid, 0) - 1
            t = by_id.get(tid)
            if t is None or qid >= t.queues:
                log.warning("dropping a delayed message of deleted topic id %d (queue %d)", tid, qid)
            elif not _entry_ok(entry):
                log.error("dropping a malformed delayed message for topic %s queue %d", t.name, qid)
            else:
                groups.setdefault((tid, qid), []).append(_undelay(entry))
            cur.delete()  # moves to the next entry
        for (tid, qid), entries in groups.items():
            # cannot raise: the topic exists in this txn, the queue is in range and the
            # entries are well-formed and no longer delayed. If it did, abort the whole
            # transaction (a RuntimeError does) rather than commit half a move.
            try:
                t = by_id[tid]
                codec = control.stored_codec(t.compression or self.compression)
                for part in _by_bytes(entries):  # batches any pull answer can carry
                    ProduceOp(t, qid, part, codec=codec).apply(w)
            except EQueueError as exc:
                raise RuntimeError(f"moving delayed messages into {tid}/{qid} failed: {exc}") from exc
        for tid, d in delta.items():
            w.sched_delta[tid] = w.sched_delta.get(tid, 0) + d
        w.moved += moved
        w.move_transactions = 1
        return moved


#: the most entry bytes moved into one stored batch: due messages of one queue (up to
#: ``limit``, each up to ``--max-message``) would otherwise make a batch no pull
#: answer can carry
MOVE_BATCH_BYTES = 1 << 20


def _by_bytes(entries: list[bytes]) -> list[list[bytes]]:
    """``entries`` in order, cut into runs of at most :data:`MOVE_BATCH_BYTES` (a
    larger entry alone)."""
    parts: list[list[bytes]] = [[]]
    size = 0
    for e in entries:
        if parts[-1] and size + len(e) > MOVE_BATCH_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(e)
        size += len(e)
    return parts


def _entry_ok(entry: bytes) -> bool:
    """Everything ProduceOp checks holds: the lengths are consistent, and the key,
    tags and properties decode (UTF-8). One entry that did not would fail the whole
    move, and every later due message with it, for ever; a schedule written by an
    earlier version may hold such an entry."""
    if len(entry) < _EH.size:
        return False
    n, _flags, _due, _rc, kl, tl, pl = _EH.unpack_from(entry, 0)
    if n + 4 != len(entry) or kl + tl + pl > n + 4 - _EH.size:
        return False
    p = _EH.size
    try:
        entry[p : p + kl].decode()
        entry[p + kl : p + kl + tl].decode()
        if pl:
            wire.decode_props(entry[p + kl + tl : p + kl + tl + pl])
    except (UnicodeDecodeError, CorruptRecord):
        return False
    return True


def _undelay(entry: bytes) -> bytes:
    """The entry with deliver_at cleared (it is being delivered now), so it is never
    scheduled again if it passes through a produce path a second time."""
    return entry[:5] + b"\0" * 8 + entry[13:]
