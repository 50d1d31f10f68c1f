"""Write operations for dead letters: resend a group's letters exactly once.

A resent letter is recorded in the store's ``meta`` database under
``b"dlq-resent/" + group + b"/" + u64 id`` (value: u64 ms of the resend), written in
the same transaction as the resend itself (:class:`ResendOp`), so a second resend
of the same letter -- a rerun of ``equeue dlq resend --all``, or two running at
once -- finds the record and writes nothing. Group names cannot contain ``/``, so
the keys of two groups never collide. A record outlives its letter (retention
removes letters, not records); it is 8 bytes plus the key.
"""

from __future__ import annotations

import struct

import attrs

from broker.store import ProduceOp, WriteOp, _Writer
from equeue.errors import EQueueError

__all__ = ["Letter", "ResendOp", "ResentMarksOp"]

_U64 = struct.Struct(">Q")


def _marker(group: str, letter_id: int) -> bytes:
    return b"dlq-resent/" + group.encode() + b"/" + _U64.pack(letter_id)


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

    def apply(self, w: _Writer) -> set[int]:
        meta = w.db[b"meta"]
        return {i for i in self.ids if w.txn.get(_marker(self.group, i), db=meta) is not None}


@attrs.define
class ResendOp(WriteOp):
    """Write each letter not yet resent to its origin topic (queue: its origin queue
    modulo the topic's queue count now) and record it, in this one transaction.

    Returns (resent ids, already resent ids, {id: reason} for letters that could not
    be written: origin topic gone, entry refused). Never raises once it wrote.
    """

    group: str
    letters: list[Letter]

    def apply(self, w: _Writer) -> tuple[list[int], list[int], dict[int, str]]:
        meta = w.db[b"meta"]
        resent: list[int] = []
        already: list[int] = []
        failed: dict[int, str] = {}
        stamp = _U64.pack(w.now)
        for letter in self.letters:
            key = _marker(self.group, letter.id)
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
        return resent, already, failed
