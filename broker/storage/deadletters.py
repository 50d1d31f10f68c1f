"""Write operations for dead letters: resend a group's letters exactly once.

A resent letter is recorded in the store's ``meta`` database under
:func:`~equeue.broker.storage.layout.dlq_resent_key` (value: u64 ms of the resend), written in
the same transaction as the resend itself (:class:`ResendOp`), so a second resend
of the same letter -- a rerun of ``equeue dlq resend --all``, or two running at
once -- finds the record and writes nothing. Records of letters retention has removed
are deleted by the group's next resend (``prune_below``: every id under the first
retained letter of each queue), so they do not pile up.
"""

from __future__ import annotations

import attrs

from equeue.broker.storage import layout
from equeue.broker.storage.produce import ProduceOp
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import EQueueError

__all__ = ["Letter", "ResendOp", "ResentMarksOp"]


@attrs.frozen
class Letter:
    """A dead letter to resend: its id and the entry to write to its origin."""

    id: int
    origin_topic: str
    origin_queue: int
    entry: bytes


@attrs.define
class ResentMarksOp(WriteOp):
    """Read only: which of ``ids`` were resent already (in the writer's view, so
    a resend committed just before is seen)."""

    group: str
    ids: list[int]

    def apply(self, w: WriteContext) -> set[int]:
        meta = w.db[b"meta"]
        return {i for i in self.ids if w.txn.get(layout.dlq_resent_key(self.group, i), db=meta) is not None}


@attrs.define
class ResendOp(WriteOp):
    """Write each letter not yet resent to its origin topic (queue: its origin queue
    modulo the topic's queue count now) and record it, in this one transaction.

    Returns (resent ids, already resent ids, {id: reason} for letters that could not
    be written: origin topic gone, entry refused). Never raises once it wrote. Also
    deletes the group's records of ids below ``prune_below`` (letters retention
    removed).
    """

    group: str
    letters: list[Letter]
    prune_below: int = 0

    def apply(self, w: WriteContext) -> tuple[list[int], list[int], dict[int, str]]:
        meta = w.db[b"meta"]
        resent: list[int] = []
        already: list[int] = []
        failed: dict[int, str] = {}
        stamp = layout.pack_u64(w.now)
        for letter in self.letters:
            key = layout.dlq_resent_key(self.group, letter.id)
            if w.txn.get(key, db=meta) is not None:
                already.append(letter.id)
                continue
            info = w.topic(letter.origin_topic)
            if info is None:
                failed[letter.id] = f"origin topic {letter.origin_topic!r} does not exist"
                continue
            try:  # a ProduceOp checks everything before it writes
                ProduceOp(info, letter.origin_queue % info.queues, [letter.entry]).apply(w)
            except EQueueError as exc:
                failed[letter.id] = str(exc)
                continue
            w.wrote = True
            w.txn.put(key, stamp, db=meta)
            resent.append(letter.id)
        self._prune(w)
        return resent, already, failed

    def _prune(self, w: WriteContext) -> None:
        prefix = layout.dlq_resent_prefix(self.group)
        cur = w.txn.cursor(db=w.db[b"meta"])
        if not cur.set_range(prefix):
            return
        while True:
            key = bytes(cur.key())
            if not key.startswith(prefix) or layout.dlq_resent_id(key, len(prefix)) >= self.prune_below:
                return
            w.wrote = True
            if not cur.delete():  # moves to the next key
                return
