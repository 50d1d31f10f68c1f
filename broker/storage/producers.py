"""Idempotent producers' state: the ``producers`` database, its value, the duplicate /
out-of-order decision, recording a batch's answer, and expiry (:class:`ExpireProducersOp`).

An idempotent producer (``producer_id`` set) numbers its batches per queue; the
``producers`` database keeps, per (producer, topic, queue) (the key is
:func:`equeue.broker.storage.layout.producer_key`), the last sequence seen, when it was
seen, and the answers of the last :data:`PRODUCER_RING` batches, newest first, so a
resent batch gets its original answer instead of being stored twice.

This module owns the value's layout: :func:`encode_state` is its one encoder and
:func:`decode_state` its one decoder::

    u64 last sequence | u64 last seen ms
    | up to 16 x (u64 base seq | u64 first global | u64 first queue offset
                  | u32 stored | u32 scheduled)

Everything but :func:`read_state`, :func:`record_answer` and the op is a pure function
of bytes (:func:`check_sequence` is the dedup decision).
"""

from __future__ import annotations

import struct
from typing import Final

import attrs

from equeue import wire
from equeue.broker.storage.layout import Buf
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import OutOfOrderSequence

__all__ = [
    "PRODUCER_RING",
    "ExpireProducersOp",
    "ProducerState",
    "check_sequence",
    "decode_state",
    "encode_state",
    "read_state",
    "record_answer",
]

#: head of a value: (last sequence, last seen ms)
_HEAD: Final = struct.Struct(">QQ")
#: one remembered answer: (base sequence, first global, first queue offset, stored, scheduled)
_ANSWER: Final = struct.Struct(">QQQII")
#: answers remembered per producer and queue (the dedup window)
PRODUCER_RING: Final = 16
_RING_BYTES: Final = _ANSWER.size * PRODUCER_RING
_NO: Final = wire.NO_OFFSET


@attrs.frozen
class ProducerState:
    """One (producer, topic, queue)'s state as stored."""

    #: the base sequence of its last batch plus that batch's count minus one
    last_sequence: int
    #: wall-clock ms of its last batch (expiry)
    last_seen_ms: int
    #: the packed answers of its last batches, newest first (at most :data:`PRODUCER_RING`)
    ring: bytes = b""

    def answer_of(self, base_sequence: int) -> wire.ProduceResponse:
        """The first answer of the batch that started at ``base_sequence``, marked
        duplicate; a bare duplicate answer when it left the ring."""
        ring = self.ring
        for pos in range(0, len(ring) - _ANSWER.size + 1, _ANSWER.size):
            seq, g, q, stored, sched = _ANSWER.unpack_from(ring, pos)
            if seq == base_sequence:
                return wire.ProduceResponse(-1 if g == _NO else g, -1 if q == _NO else q, stored, sched, True)
        return wire.ProduceResponse(-1, -1, 0, 0, True)


def encode_state(state: ProducerState) -> bytes:
    """The ``producers`` value of ``state`` (its ring cut to :data:`PRODUCER_RING` answers)."""
    return _HEAD.pack(state.last_sequence, state.last_seen_ms) + state.ring[:_RING_BYTES]


def decode_state(value: Buf) -> ProducerState:
    """The state a ``producers`` value holds. Raises struct.error for a value shorter
    than its head."""
    last, seen = _HEAD.unpack_from(value, 0)
    return ProducerState(last, seen, bytes(value[_HEAD.size :]))


def last_seen_ms(value: Buf) -> int:
    """The last-seen time (ms) of a ``producers`` value (0 if truncated): expiry reads
    only this."""
    return int(_HEAD.unpack_from(value, 0)[1]) if len(value) >= _HEAD.size else 0


def check_sequence(state: ProducerState | None, base_sequence: int) -> wire.ProduceResponse | None:
    """The dedup decision for a batch starting at ``base_sequence`` from a producer in
    ``state`` (None: unknown here): None when the batch is the next one (store it);
    its first answer (marked duplicate) when it was stored before.

    Raises OutOfOrderSequence when it skips ahead: an unknown producer must start at 0
    (accepting a later batch first would make the earlier one look like a duplicate
    and drop it), a known one at its last sequence + 1.
    """
    if state is None:
        if base_sequence != 0:
            raise OutOfOrderSequence(
                f"sequence {base_sequence} from a producer this broker does not know: "
                "its batches start at 0 (resend in order, or use a new producer id)"
            )
        return None
    last = state.last_sequence
    if base_sequence <= last:
        return state.answer_of(base_sequence)
    if base_sequence != last + 1:
        raise OutOfOrderSequence(f"sequence {base_sequence} after {last}: resend in order")
    return None


def next_state(
    state: ProducerState | None, base_sequence: int, count: int, answer: wire.ProduceResponse, now_ms: int
) -> ProducerState:
    """The state once the batch of ``count`` entries from ``base_sequence`` was
    stored with ``answer`` at ``now_ms``: its answer first in the ring, the oldest
    beyond :data:`PRODUCER_RING` dropped."""
    item = _ANSWER.pack(
        base_sequence, answer.first_global & _NO, answer.first_queue & _NO, answer.stored, answer.scheduled
    )  # fmt: skip
    ring = item + state.ring[: _RING_BYTES - _ANSWER.size] if state is not None else item
    return ProducerState(base_sequence + count - 1, now_ms, ring)


def read_state(w: WriteContext, key: bytes) -> ProducerState | None:
    """The state stored under ``key`` in the running transaction (None: unknown)."""
    value = w.txn.get(key, db=w.db[b"producers"])
    return decode_state(value) if value else None


def record_answer(
    w: WriteContext, key: bytes, state: ProducerState | None, base_sequence: int, count: int,
    answer: wire.ProduceResponse,
) -> None:  # fmt: skip
    """Store the state after a batch (:func:`next_state`) under ``key``, in the
    running transaction."""
    w.txn.put(key, encode_state(next_state(state, base_sequence, count, answer, w.now)), db=w.db[b"producers"])


@attrs.define
class ExpireProducersOp(WriteOp):
    """Forget the idempotence state of producers silent for longer than ``ttl_ms``.

    Examines at most ``limit`` entries from ``start`` (a key; b"" = the first) and
    returns ``(removed, next_start)``; ``next_start`` is None once the end was reached,
    so the caller walks the whole table in bounded transactions.
    """

    ttl_ms: int
    limit: int = 10_000
    start: bytes = b""

    def apply(self, w: WriteContext) -> tuple[int, bytes | None]:
        cur = w.txn.cursor(db=w.db[b"producers"])
        ok = cur.set_range(self.start) if self.start else cur.first()
        n = seen = 0
        horizon = w.now - self.ttl_ms
        while ok and seen < self.limit:
            seen += 1
            if last_seen_ms(cur.value()) < horizon:
                w.wrote = True
                n += 1
                cur.delete()  # moves to the next entry (key b"" past the end)
                ok = bool(cur.key())
            else:
                ok = cur.next()
        return n, (bytes(cur.key()) or None) if ok else None
