"""The store's on-disk layout: one LMDB environment, ten named databases (three
more when replicated), and the encoders and decoders of their keys (and fixed-width
values; the ``producers`` value is :mod:`equeue.broker.storage.producers`'). No other
module packs or unpacks a key.

Every integer in a key is big-endian, so LMDB's byte order is numeric order: a
cursor walks a queue in offset order, the schedule in due order, and a prefix (a
topic id, a topic and queue) selects one contiguous key range::

    meta         "format"          -> u32 format version
                 "next_global"     -> u64 next global offset (survives retention)
                 "next_topic_id"   -> u32
                 "deleting"        -> JSON list of topic ids whose data is being removed
                 "dlq-resent/" group "/" u64 letter id -> u64 ms of its resend
                 "skip/" u32 topic | u32 queue | u64 queue offset -> u64 ms of the skip
                                   (an operator's ``equeue message skip``: never served)
                 "pause/topic/" topic name -> u64 ms of the pause (``equeue topic pause``)
                 "pause/group/" group name -> u64 ms of the pause (``equeue group pause``)
    topics       topic name        -> JSON TopicInfo
    messages     u64 global        -> stored record (equeue.wire.records)
    qindex       u32 topic | u32 queue | u64 queue offset -> u64 global
    kindex       u32 topic | u32 bucket | u32 crc32(key) | u64 global -> b""
                                   (lookup by key; bucket = global >> KINDEX_BUCKET_BITS)
    qstats       u32 topic | u32 queue -> u64 next queue offset | u64 retained bytes
    offsets      group \\0 topic \\0 u32 queue -> u64 committed offset
    schedule     u64 due ms | u64 seq -> u32 topic | u32 queue | entry  (delayed)
    sched_count  u32 topic -> u64 pending delayed messages
    producers    16-byte producer id | u32 topic | u32 queue
                 -> u64 last sequence | u64 last seen ms
                    | up to 16 x (u64 base seq | u64 global | u64 queue offset
                                 | u32 stored | u32 scheduled)
                 (the value's encoder and decoder: broker/storage/producers.py)

A replicated store (``Store(..., replicated=True)``) adds three databases, which the
log does not record (docs/storage.md, "The replication log")::

    replog       u64 position      -> one log entry (equeue.wire.replog)
    repl_epochs  u32 epoch         -> u64 first position of that epoch
    repl_state   "log_start"       -> u64 first position still in the log
                 "consistent_at"   -> u64 position from which the store may lead
                 "log_bytes"       -> u64 bytes of the entries kept

How a produced message is found again::

    (topic t, queue q, offset o) --qindex--> g --messages--> record
    (topic t, key k)  --kindex prefix (t, bucket, crc32(k)), newest bucket first-->
                      g ... --messages--> record
    queue range: first and last qindex key under the prefix (t, q)
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import repeat
from operator import rshift
from typing import Final

#: the on-disk format this code reads and writes (meta "format"); a store of
#: format 1 (``kindex`` keys without the bucket) is converted when opened
FORMAT_VERSION: Final = 2
#: the format whose key index has no buckets (keys of :data:`KINDEX_V1_SIZE` bytes,
#: converted with :func:`kindex_from_v1`)
FORMAT_UNBUCKETED: Final = 1
#: the named databases, in the order they are opened
DATABASES: Final = (
    b"meta", b"topics", b"messages", b"qindex", b"kindex", b"qstats", b"offsets",
    b"schedule", b"sched_count", b"producers",
)  # fmt: skip

#: indexes (into DATABASES) of the databases a replicated store copies to its
#: followers (the replication log's entries name databases by index): all of them
REPLICATED_DATABASES: Final = tuple(range(len(DATABASES)))
#: the replication log's own databases (opened only by a replicated store; never
#: recorded in the log themselves): entries by position, epoch starts, log state
REPL_DATABASES: Final = (b"replog", b"repl_epochs", b"repl_state")
#: keys of ``repl_state``
REPL_LOG_START: Final = b"log_start"
REPL_CONSISTENT_AT: Final = b"consistent_at"
REPL_LOG_BYTES: Final = b"log_bytes"
#: the epoch a store's data written before its replication log is counted in (absent: 0)
REPL_CONVERTED_EPOCH: Final = b"converted_epoch"

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TQ = struct.Struct(">II")
_QKEY = struct.Struct(">IIQ")
_KKEY = struct.Struct(">IIIQ")
_TBH = struct.Struct(">III")
_QSTAT = struct.Struct(">QQ")
_SKEY = struct.Struct(">QQ")
_PKEY = struct.Struct(">16sII")

# ---------------------------------------------------------------- meta values
#: u32 values of ``meta`` ("format", "next_topic_id")
pack_u32: Final = _U32.pack
#: u64 values (``meta`` "next_global", ``offsets``, ``sched_count``)
pack_u64: Final = _U64.pack


#: what LMDB hands back: bytes, or a memoryview with ``buffers=True``
Buf = bytes | memoryview


def unpack_u32(b: Buf) -> int:
    return int(_U32.unpack(b)[0])


def unpack_u64(b: Buf) -> int:
    return int(_U64.unpack(b)[0])


# ---------------------------------------------------------------- messages
#: key of ``messages``: the global offset; also the value of ``qindex``
global_key: Final = _U64.pack
#: the global offset of a ``messages`` key (or ``qindex`` value)
global_of: Final[Callable[[Buf], int]] = partial(int.from_bytes, byteorder="big")

# ---------------------------------------------------------------- qindex, qstats
#: key of ``qindex``: (topic id, queue id, queue offset)
qindex_key: Final = _QKEY.pack
#: key of ``qstats`` and the prefix of one queue's ``qindex`` keys: (topic id, queue id)
queue_key: Final = _TQ.pack
#: the (topic id, queue id, queue offset) of a ``qindex`` key
unpack_qindex_key: Final = _QKEY.unpack
#: value of ``qstats``: (next queue offset, retained bytes)
pack_qstats: Final = _QSTAT.pack
unpack_qstats: Final = _QSTAT.unpack
QUEUE_PREFIX: Final = _TQ.size


def qindex_offset(key: Buf) -> int:
    """The queue offset of a ``qindex`` key."""
    return int(_U64.unpack_from(key, QUEUE_PREFIX)[0])


def topic_prefix(topic_id: int) -> bytes:
    """The prefix of every ``qindex``, ``kindex`` and ``qstats`` key of a topic."""
    return _U32.pack(topic_id)


# ---------------------------------------------------------------- kindex
#: the key index is cut into buckets of 2**KINDEX_BUCKET_BITS global offsets: a
#: transaction's keys land in the newest bucket's few pages instead of one random
#: page each (a 100-message keyed commit dirtied ~100 pages, ~4.5 ms of fsync), and a
#: lookup walks the topic's non-empty buckets, newest first (docs/storage.md, "The key
#: index")
KINDEX_BUCKET_BITS: Final = 10


def kindex_key(topic_id: int, key_hash: int, global_offset: int) -> bytes:
    """Key of ``kindex``: (topic id, bucket of the global offset, crc32 of the key
    bytes, global offset)."""
    return _KKEY.pack(topic_id, global_offset >> KINDEX_BUCKET_BITS, key_hash, global_offset)


def kindex_keys(topic_id: int, key_hashes: Iterable[int], global_offsets: Sequence[int]) -> Iterator[bytes]:
    """:func:`kindex_key` for many messages of one topic (in C loops: the produce path)."""
    n = len(global_offsets)
    return map(
        _KKEY.pack, repeat(topic_id, n), map(rshift, global_offsets, repeat(KINDEX_BUCKET_BITS, n)),
        key_hashes, global_offsets,
    )  # fmt: skip


def kindex_key_after(topic_id: int, key_hash: int, global_offset: int) -> bytes:
    """A key just above :func:`kindex_key` ``(topic_id, key_hash, global_offset)`` and
    below the next possible one: a cursor seeking it and stepping back lands on the
    newest entry of that key hash at or below ``global_offset``."""
    return kindex_key(topic_id, key_hash, global_offset) + b"\0"


def kindex_prefix(topic_id: int, bucket: int, key_hash: int) -> bytes:
    """The prefix of one key hash's ``kindex`` keys in one bucket."""
    return _TBH.pack(topic_id, bucket, key_hash)


def kindex_bucket_start(topic_id: int, bucket: int) -> bytes:
    """The smallest ``kindex`` key a bucket of a topic can hold."""
    return _TQ.pack(topic_id, bucket)


def kindex_bucket(key: Buf) -> int:
    """The bucket of a ``kindex`` key."""
    return int(_U32.unpack_from(key, _U32.size)[0])


def kindex_global(key: Buf) -> int:
    """The global offset of a ``kindex`` key."""
    return int(_U64.unpack_from(key, _TBH.size)[0])


#: size of a ``kindex`` key of format 1: (topic id, crc32 of the key, global offset)
KINDEX_V1_SIZE: Final = _QKEY.size


def kindex_from_v1(key: Buf) -> bytes:
    """The ``kindex`` key of a format-1 key (same topic, key hash and global offset)."""
    tid, h, g = _QKEY.unpack(key)
    return kindex_key(tid, h, g)


# ---------------------------------------------------------------- offsets
def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    """Key of ``offsets``: group, topic, queue id."""
    return group.encode() + b"\0" + topic.encode() + b"\0" + _U32.pack(queue_id)


def unpack_offset_key(key: Buf) -> tuple[str, str, int]:
    group, topic, rest = bytes(key).split(b"\0", 2)
    return group.decode(), topic.decode(), int(_U32.unpack(rest)[0])


# ---------------------------------------------------------------- dead letters
def dlq_resent_prefix(group: str) -> bytes:
    """Prefix (in ``meta``) of the records of a group's resent dead letters. Group
    names cannot contain ``/``, so two groups' keys never collide."""
    return b"dlq-resent/" + group.encode() + b"/"


def dlq_resent_key(group: str, letter_id: int) -> bytes:
    """Key (in ``meta``) recording that dead letter ``letter_id`` of ``group`` was resent."""
    return dlq_resent_prefix(group) + _U64.pack(letter_id)


def dlq_resent_id(key: Buf, prefix_len: int) -> int:
    """The letter id of a key made by :func:`dlq_resent_key`."""
    return int(_U64.unpack_from(key, prefix_len)[0])


# ---------------------------------------------------------------- skipped records
#: prefix (in ``meta``) of the markers of records an operator skipped
SKIP_PREFIX: Final = b"skip/"


def skip_key(topic_id: int, queue_id: int, queue_offset: int) -> bytes:
    """Key (in ``meta``) marking the record at a queue offset as skipped."""
    return SKIP_PREFIX + _QKEY.pack(topic_id, queue_id, queue_offset)


def unpack_skip_key(key: Buf) -> tuple[int, int, int]:
    """The (topic id, queue id, queue offset) of a key made by :func:`skip_key`."""
    t, q, o = _QKEY.unpack_from(key, len(SKIP_PREFIX))
    return int(t), int(q), int(o)


# ---------------------------------------------------------------- pauses
#: prefix (in ``meta``) of the pause markers of topics and consumer groups
PAUSE_PREFIX: Final = b"pause/"
#: what can be paused
PAUSE_KINDS: Final = ("topic", "group")


def pause_key(kind: str, name: str) -> bytes:
    """Key (in ``meta``) marking topic or group ``name`` paused (``kind``: one of
    :data:`PAUSE_KINDS`). Names hold no ``/``, so the kinds never collide."""
    return PAUSE_PREFIX + kind.encode() + b"/" + name.encode()


def unpack_pause_key(key: Buf) -> tuple[str, str]:
    """The (kind, name) of a key made by :func:`pause_key`."""
    kind, _, name = bytes(key)[len(PAUSE_PREFIX) :].partition(b"/")
    return kind.decode(), name.decode()


# ---------------------------------------------------------------- schedule
#: key of ``schedule``: (due ms, sequence)
schedule_key: Final = _SKEY.pack
#: value prefix of ``schedule``: (topic id, queue id), then the entry
schedule_target: Final = _TQ.pack
SCHEDULE_TARGET: Final = _TQ.size


def schedule_due(key: Buf) -> int:
    """The due time (ms) of a ``schedule`` key."""
    return int(_SKEY.unpack(key)[0])


def unpack_schedule_target(value: Buf) -> tuple[int, int]:
    """The (topic id, queue id) a ``schedule`` value is for ((0, 0) if truncated)."""
    if len(value) < _TQ.size:
        return 0, 0
    tid, qid = _TQ.unpack_from(value, 0)
    return int(tid), int(qid)


# ---------------------------------------------------------------- sched_count
#: key of ``sched_count``: the topic id
sched_count_key: Final = _U32.pack
unpack_sched_count_key: Final = unpack_u32


# ---------------------------------------------------------------- producers
#: key of ``producers``: (16-byte producer id, topic id, queue id); its value's
#: layout is :mod:`equeue.broker.storage.producers`'
producer_key: Final = _PKEY.pack


# ---------------------------------------------------------------- replication log
#: key of ``replog``: the entry's position
position_key: Final = _U64.pack
#: key of ``repl_epochs``: the epoch
epoch_key: Final = _U32.pack
