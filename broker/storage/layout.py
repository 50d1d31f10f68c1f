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
    messages     u64 global of the batch's first record -> stored batch
                                   (equeue.wire.batches.encode_stored)
    qindex       u32 topic | u32 queue | u64 base queue offset
                                   -> u64 global of the batch's first record | u32 record count
    kindex       u32 topic | u32 bucket (global // KINDEX_BUCKET)
                                   -> (u16 hash, u16 global - bucket start) pairs, one per
                                      keyed message, in offset order (lookup by key)
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

    (topic t, queue q, offset o) --qindex: last key <= (t, q, o)--> (g, count), base
                      --messages g--> batch; the record is number o - base in it
    (topic t, key k)  --kindex (t, bucket), newest bucket first: the pairs of hash(k)-->
                      global offsets --messages: last key <= each--> batch, key compared
    queue range: first qindex key's base .. last qindex key's base + count
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from typing import Final

from equeue.errors import CorruptRecord

#: the on-disk format this code reads and writes (meta "format"): record batches. A
#: store of an older format (:data:`FORMATS_CONVERTED`) is converted when opened
FORMAT_VERSION: Final = 3
#: the formats of one stored record per message (``equeue.wire.records``), converted to
#: batches when opened: 1 (key index without buckets) and 2 (bucketed key index)
FORMATS_CONVERTED: Final = (1, 2)
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


#: value of ``qindex``: (global offset of the batch's first record, record count)
_QVAL = struct.Struct(">QI")
pack_qindex_value: Final = _QVAL.pack
#: size of a ``qindex`` value (a format-2 value is a bare u64 global offset)
QINDEX_VALUE_SIZE: Final = _QVAL.size


def unpack_qindex_value(value: Buf) -> tuple[int, int]:
    """The (global base, record count) of a ``qindex`` value. Raises CorruptRecord for
    a value of another size (a damaged page)."""
    if len(value) != QINDEX_VALUE_SIZE:
        raise CorruptRecord(f"a queue-index entry of {len(value)} bytes, not {QINDEX_VALUE_SIZE}")
    g, n = _QVAL.unpack(value)
    return int(g), int(n)


def qindex_offset(key: Buf) -> int:
    """The queue offset of a ``qindex`` key."""
    return int(_U64.unpack_from(key, QUEUE_PREFIX)[0])


def topic_prefix(topic_id: int) -> bytes:
    """The prefix of every ``qindex``, ``kindex`` and ``qstats`` key of a topic."""
    return _U32.pack(topic_id)


# ---------------------------------------------------------------- kindex
#: global offsets per key-index bucket: one value per (topic, bucket) holds the
#: (hash, offset in bucket) pairs of its keyed messages, so the index costs 4 bytes
#: per keyed message and a transaction rewrites one small value (docs/storage.md,
#: "The key index")
KINDEX_BUCKET: Final = 1000
#: one (u16 hash, u16 global - bucket start) pair of a ``kindex`` value
KINDEX_PAIR: Final = struct.Struct(">HH")


def kindex_key(topic_id: int, bucket: int) -> bytes:
    """Key of ``kindex``: (topic id, bucket = global offset // :data:`KINDEX_BUCKET`)."""
    return _TQ.pack(topic_id, bucket)


def kindex_bucket(key: Buf) -> int:
    """The bucket of a ``kindex`` key."""
    return int(_U32.unpack_from(key, _U32.size)[0])


def kindex_hash(key_bytes: bytes) -> int:
    """The 16-bit hash of a message key in the key index: the top half of its crc32
    (:func:`equeue.routing.key_hash`)."""
    return zlib.crc32(key_bytes) >> 16


def kindex_pairs(hashes: Iterable[int], globals_: Iterable[int]) -> bytes:
    """The packed pairs of keyed messages (``globals_`` all in one bucket) to append to
    that bucket's value (C loops: the produce path)."""
    b = KINDEX_BUCKET
    return b"".join(map(KINDEX_PAIR.pack, hashes, map(int.__mod__, globals_, repeat(b))))


def unpack_kindex_value(value: Buf) -> tuple[array[int], array[int]]:
    """The (hashes, offsets in the bucket) columns of a ``kindex`` value."""
    a = array("H", bytes(value)[: len(value) & ~3])
    if sys.byteorder == "little":
        a.byteswap()
    return a[0::2], a[1::2]


def pack_kindex_value(hashes: Sequence[int], offsets: Sequence[int]) -> bytes:
    """A ``kindex`` value from its columns (the encoder :func:`unpack_kindex_value` reads)."""
    a = array("H", bytes(4 * len(hashes)))
    a[0::2] = array("H", hashes)
    a[1::2] = array("H", offsets)
    if sys.byteorder == "little":
        a.byteswap()
    return a.tobytes()


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
