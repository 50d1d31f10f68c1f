"""A replication log entry: the physical changes of one committed store transaction.

The one encoder (:func:`encode_entry`) and the one decoder (:func:`decode_entry`,
and :func:`entry_header` for the header alone) of the values of the store's
``replog`` database, which followers copy verbatim (docs/storage.md, "The
replication log"). Big-endian::

    header   epoch u32 | time_ms u64 | next_global u64              (20 bytes)
    run*     kind u8 (1 PUT, 2 DELETE) | db u8 | count u32
             | count x u16 key length
             | count x u32 value length                              (PUT only)
             | the keys, concatenated
             | the values, concatenated                              (PUT only)

``db`` is an index into ``equeue.broker.storage.layout.DATABASES``; a run holds
consecutive changes of one kind to one database, in the order they were made.
Encoding works per run (one ``struct.pack`` of the lengths, one ``b"".join`` of
the keys and one of the values), so a produce batch of 1,000 messages costs a few
C calls, not 1,000 Python steps. Decoding raises
:class:`~equeue.errors.CorruptRecord` on any malformed input (short, a bad kind, a
length past the end), never another exception.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate
from typing import Final

import attrs

from equeue.errors import CorruptRecord

__all__ = [
    "DELETE",
    "HEADER_SIZE",
    "PUT",
    "EntryHeader",
    "Run",
    "decode_entry",
    "encode_entry",
    "entry_header",
]

#: run kinds
PUT: Final = 1
DELETE: Final = 2

_HEAD = struct.Struct(">IQQ")
_RUN = struct.Struct(">BBI")
#: bytes of an entry's header
HEADER_SIZE: Final = _HEAD.size

#: (kind, database index, keys, values -- None for DELETE)
Run = tuple[int, int, Sequence[bytes], Sequence[bytes] | None]


@attrs.frozen
class EntryHeader:
    """What an entry says besides its changes."""

    #: the leader epoch that wrote it
    epoch: int
    #: the writing transaction's wall-clock time (ms): replication lag in ms
    time_ms: int
    #: the store's next global offset after it: replication lag in messages
    next_global: int


def encode_entry(header: EntryHeader, runs: Sequence[Run]) -> bytes:
    """The bytes of one entry. Raises ValueError for a run that cannot be encoded
    (unknown kind, values missing or of another count, a DELETE with values, a key
    over 65,535 bytes, a database index over 255, a header field out of range)."""
    try:
        parts = [_HEAD.pack(header.epoch, header.time_ms, header.next_global)]
        for kind, db, keys, values in runs:
            n = len(keys)
            parts.append(_RUN.pack(kind, db, n))
            parts.append(struct.pack(f">{n}H", *map(len, keys)))
            if kind == PUT:
                if values is None or len(values) != n:
                    raise ValueError(f"a PUT run of {n} keys needs {n} values")
                parts.append(struct.pack(f">{n}I", *map(len, values)))
                parts.append(b"".join(keys))
                parts.append(b"".join(values))
            elif kind == DELETE:
                if values is not None:
                    raise ValueError("a DELETE run has no values")
                parts.append(b"".join(keys))
            else:
                raise ValueError(f"unknown run kind {kind}")
    except struct.error as exc:
        raise ValueError(f"cannot encode a replication log entry: {exc}") from exc
    return b"".join(parts)


def entry_header(data: bytes | memoryview) -> EntryHeader:
    """The header of an entry, without decoding its changes. Raises CorruptRecord
    when ``data`` is shorter than a header."""
    if len(data) < HEADER_SIZE:
        raise CorruptRecord(f"replication log entry of {len(data)} bytes: shorter than its header")
    epoch, time_ms, next_global = _HEAD.unpack_from(data, 0)
    return EntryHeader(epoch, time_ms, next_global)


def decode_entry(data: bytes | memoryview) -> tuple[EntryHeader, list[tuple[int, int, list[bytes], list[bytes] | None]]]:
    """The header and the runs of an entry (lists of bytes). Raises CorruptRecord
    on anything malformed: truncated, a bad kind, lengths past the end."""
    buf = bytes(data)
    header = entry_header(buf)
    size = len(buf)
    pos = HEADER_SIZE
    runs: list[tuple[int, int, list[bytes], list[bytes] | None]] = []
    get = buf.__getitem__
    while pos < size:
        if size - pos < _RUN.size:
            raise CorruptRecord(f"replication log entry: a run header cut at byte {pos} of {size}")
        kind, db, n = _RUN.unpack_from(buf, pos)
        pos += _RUN.size
        if kind != PUT and kind != DELETE:
            raise CorruptRecord(f"replication log entry: unknown run kind {kind} at byte {pos - _RUN.size}")
        lens_size = n * 6 if kind == PUT else n * 2
        if size - pos < lens_size:
            raise CorruptRecord(f"replication log entry: a run of {n} changes cut at byte {pos} of {size}")
        klens = struct.unpack_from(f">{n}H", buf, pos)
        pos += 2 * n
        vlens: tuple[int, ...] = ()
        if kind == PUT:
            vlens = struct.unpack_from(f">{n}I", buf, pos)
            pos += 4 * n
        kends = list(accumulate(klens, initial=pos))
        vends = list(accumulate(vlens, initial=kends[-1]))
        end = vends[-1]
        if end > size:
            raise CorruptRecord(f"replication log entry: a run's data ends at byte {end}, past its {size}")
        keys = list(map(get, map(slice, kends, kends[1:])))
        values = list(map(get, map(slice, vends, vends[1:]))) if kind == PUT else None
        runs.append((kind, db, keys, values))
        pos = end
    return header, runs
