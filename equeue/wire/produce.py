"""Produce requests and their answers.

A request carries messages for one queue in one of two forms: *entries*
(:mod:`equeue.wire.entries`, one per message) or one producer *batch*
(:mod:`equeue.wire.batches`: the records, compressed or not, that the broker stores as
sent). The form is told by the ``PRODUCE_BATCH`` flag::

    topic str | queue u32 | flags u8 | [producer id 16s, base sequence u64  if IDEMPOTENT]
    | entries form: count u32, entries          (flag PRODUCE_BATCH clear)
    | batch form:   length u32, batch           (flag PRODUCE_BATCH set)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from equeue.errors import InvalidMessage
from equeue.models import SendResult
from equeue.wire._prims import _U32, NO_OFFSET, _bad, pack_str, unpack_str
from equeue.wire.batches import Codec, records_from_entries, seal_records
from equeue.wire.entries import check_entries, split_entries

_PRODUCE_FIXED = struct.Struct(">IB")  # queue id, flags
_PRODUCE_IDEM = struct.Struct(">16sQ")  # producer id, base sequence
PRODUCE_IDEMPOTENT: Final = 1
#: do not auto-create the topic even when the broker would
PRODUCE_NO_AUTO_CREATE: Final = 2
#: the request carries one producer batch (:mod:`equeue.wire.batches`), not entries
PRODUCE_BATCH: Final = 4


@attrs.frozen(slots=True)
class ProduceRequest:
    """Messages for one queue of one topic: ``entries`` or one ``batch``.

    ``entries`` are encoded message entries (see :func:`~equeue.wire.entries.pack_entry`);
    ``batch``, when not None, is one producer batch
    (:func:`~equeue.wire.batches.encode_batch`) and ``entries`` is then empty. With a
    ``producer_id`` (16 bytes) the request is idempotent: ``base_sequence`` is the
    sequence number of its first message for this (producer, topic, queue).
    """

    topic: str
    queue_id: int
    entries: Sequence[bytes]
    producer_id: bytes | None = None
    base_sequence: int = 0
    auto_create: bool = True
    batch: bytes | None = None

    def encode(self) -> bytes:
        """The request's payload: the one encoder. Raises ValueError for a request
        with both entries and a batch."""
        flags = (
            (PRODUCE_IDEMPOTENT if self.producer_id else 0)
            | (0 if self.auto_create else PRODUCE_NO_AUTO_CREATE)
            | (0 if self.batch is None else PRODUCE_BATCH)
        )
        parts = [pack_str(self.topic), _PRODUCE_FIXED.pack(self.queue_id, flags)]
        if self.producer_id:
            parts.append(_PRODUCE_IDEM.pack(self.producer_id, self.base_sequence))
        if self.batch is not None:
            if self.entries:
                raise ValueError("a produce request carries entries or a batch, not both")
            parts += (_U32.pack(len(self.batch)), self.batch)
        else:
            parts.append(_U32.pack(len(self.entries)))
            parts.extend(self.entries)
        return b"".join(parts)

    @classmethod
    def decode(cls, buf: bytes) -> ProduceRequest:
        topic, pos = unpack_str(buf, 0)
        try:
            queue_id, flags = _PRODUCE_FIXED.unpack_from(buf, pos)
            pos += _PRODUCE_FIXED.size
            pid: bytes | None = None
            seq = 0
            if flags & PRODUCE_IDEMPOTENT:
                pid, seq = _PRODUCE_IDEM.unpack_from(buf, pos)
                pos += _PRODUCE_IDEM.size
            (count,) = _U32.unpack_from(buf, pos)
            pos += 4
        except struct.error as exc:
            raise _bad("truncated produce request") from exc
        if flags & PRODUCE_BATCH:
            if pos + count != len(buf):
                raise _bad(f"produce batch announces {count} bytes and {len(buf) - pos} follow")
            return cls(topic, queue_id, (), pid, seq, not flags & PRODUCE_NO_AUTO_CREATE, buf[pos:])
        entries = split_entries(buf, pos, count)
        return cls(topic, queue_id, entries, pid, seq, not flags & PRODUCE_NO_AUTO_CREATE)


def entries_batch(entries: Sequence[bytes], codec: Codec = Codec.NONE) -> bytes:
    """The producer batch of encoded ``entries`` (at least one), its records
    compressed with ``codec``: how the producer turns what it buffered into a batch
    request (the records built from the entries in one pass, as the broker builds
    them). Raises InvalidMessage for no entries or a malformed one."""
    if not entries:
        raise InvalidMessage("a batch holds at least one message")
    records = records_from_entries(entries, check_entries(entries, _NO_LIMIT))
    return seal_records(records, len(entries), codec)


#: the producer checks each message's size itself (its ``max_message_bytes``)
_NO_LIMIT: Final = 1 << 62


_PRODUCE_RESP = struct.Struct(">BQQII")  # duplicate, first global, first queue, stored, scheduled


@attrs.frozen(slots=True)
class ProduceResponse:
    """Offsets of a stored batch: non-delayed entries, in order, got consecutive
    offsets from ``first_global``/``first_queue``; delayed ones were scheduled."""

    first_global: int
    first_queue: int
    stored: int
    scheduled: int
    duplicate: bool = False

    def encode(self) -> bytes:
        return _PRODUCE_RESP.pack(
            1 if self.duplicate else 0,
            self.first_global & NO_OFFSET,
            self.first_queue & NO_OFFSET,
            self.stored,
            self.scheduled,
        )

    @classmethod
    def decode(cls, buf: bytes) -> ProduceResponse:
        try:
            dup, g, q, stored, sched = _PRODUCE_RESP.unpack(buf)
        except struct.error as exc:
            raise _bad("malformed produce response") from exc
        return cls(
            -1 if g == NO_OFFSET else g, -1 if q == NO_OFFSET else q, stored, sched, bool(dup)
        )

    def results(self, topic: str, queue_id: int, delayed: Iterable[bool]) -> list[SendResult]:
        """One :class:`SendResult` per entry of the request, in request order."""
        out: list[SendResult] = []
        i = 0
        for is_delayed in delayed:
            if is_delayed:
                out.append(SendResult(topic, queue_id, -1, -1, scheduled=True, duplicate=self.duplicate))
            elif self.first_global < 0:
                out.append(SendResult(topic, queue_id, -1, -1, duplicate=True))
            else:
                out.append(
                    SendResult(topic, queue_id, self.first_queue + i, self.first_global + i, False, self.duplicate)
                )
                i += 1
        return out
