"""Record batches: what a producer sends for one queue, and what the store keeps.

A **batch** is built by the producer and stored verbatim::

    +-------+-------+-------+-------+-------------+---------+
    | magic | codec | count | crc32 | records_len | records |
    | u8    | u8    | u32   | u32   | u32         |         |
    +-------+-------+-------+-------+-------------+---------+
    magic = 1; codec: 0 none, 1 zstd, 2 lz4 (frame); count >= 1 records;
    crc32 (zlib/IEEE) covers ``records`` as carried (compressed when codec != 0);
    records_len: their size uncompressed, the cap every decompression is held to.

The **stored batch** (a ``messages`` value of store format 3) is the broker's header
in front of the batch, keyed by the batch's first global offset::

    +------+-----+-------+-------+-------------+-----------+----------+-------------+----------+-------+
    | hcrc | ver | topic | queue | base offset | first ms  | last ms  | producer id | base seq | batch |
    | u32  | u8  | u32   | u32   | u64 (queue) | u64 store | u64      | 16 bytes    | u64      |       |
    +------+-----+-------+-------+-------------+-----------+----------+-------------+----------+-------+
    hcrc covers the rest of this header (the batch has its own crc32); ver = 3.
    Record i has queue offset base + i, global offset key + i, and store time
    first ms + its ts delta.

A **record** (inside ``records``, uncompressed), compact with varints (unsigned
LEB128, at most 9 bytes) as Kafka's v2 records are::

    length varint (the bytes after it) | attrs u8
    | [ts delta varint       if attrs & 32] | [reconsume varint      if attrs & 16]
    | [deliver_at ms varint  if attrs & 4 ] | [key len varint, key   if attrs & 1 ]
    | [tags len varint, tags if attrs & 2 ]
    | [props len varint, repeated (varint klen, name, varint vlen, value) if attrs & 8]
    | body (the rest)

One encoder and one decoder per layout: :func:`encode_batch` / :func:`batch_head` +
:func:`batch_records` + :func:`decode_records`, and :func:`encode_stored` /
:func:`stored_head`. Decompression never produces more than ``records_len`` bytes,
and a caller caps ``records_len`` itself (``max_records_len``): a decompression bomb
is refused before any memory is spent on it.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import lz4.frame
import zstandard

from equeue.errors import ConfigError, CorruptRecord, InvalidMessage, MessageTooLarge
from equeue.models import Message, check_props
from equeue.wire.entries import ENTRY_HEADER, decode_props, encode_props

BATCH_HEAD: Final = struct.Struct(">BBIII")  # magic, codec, count, crc32, records_len
BATCH_MAGIC: Final = 1
STORED_HEAD: Final = struct.Struct(">IBIIQQQ16sQ")  # hcrc, ver, topic, queue, base, first, last, pid, seq
STORED_VERSION: Final = 3
#: the producer id of a batch sent without one
NO_PRODUCER: Final = bytes(16)

A_KEY: Final = 1
A_TAGS: Final = 2
A_DELIVER: Final = 4
A_PROPS: Final = 8
A_RECONSUME: Final = 16
A_TS: Final = 32
_A_KNOWN: Final = 63
_A_KEY_ONLY: Final = A_KEY


class Codec(enum.IntEnum):
    """How a batch's records are compressed (the batch header's ``codec`` byte)."""

    NONE = 0
    ZSTD = 1
    LZ4 = 2

    @classmethod
    def parse(cls, name: str) -> Codec:
        """``"none"``, ``"zstd"`` or ``"lz4"`` (any case). Raises ValueError naming the choices."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown compression {name!r}: choose none, zstd or lz4") from None


#: zstd level 1: as small as level 3 on record batches, and faster (docs/storage.md)
ZSTD_LEVEL: Final = 1


# python-zstandard's compressor and decompressor objects are not thread-safe (two
# threads compressing with one crashed the interpreter), and a producer's loop thread,
# a broker's loop and its writer thread all (de)compress; the core holds no
# per-thread state (it imports no threading), so each call makes its own: about 9 us
# more per batch (measured: 6 -> 15 us to compress 11 KB, 2 -> 10 us to decompress)


# ---------------------------------------------------------------- varints
def _uvarint(n: int) -> bytes:
    """Unsigned LEB128 of ``n`` (>= 0)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it). Raises IndexError past the end, CorruptRecord
    for a varint longer than 9 bytes (63 bits hold every field of a record, and an
    int64 column of a vectorised reader holds them too)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    n = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos + 1
        shift += 7
        if shift > 56:
            raise CorruptRecord("varint longer than 9 bytes")


# ---------------------------------------------------------------- records
def encode_record(msg: Message, ts_delta: int = 0) -> bytes:
    """One record of ``msg`` (its produce-side fields, and ``reconsume_times``)."""
    attrs_ = 0
    parts: list[bytes] = []
    if ts_delta:
        attrs_ |= A_TS
        parts.append(_uvarint(ts_delta))
    if msg.reconsume_times:
        attrs_ |= A_RECONSUME
        parts.append(_uvarint(msg.reconsume_times))
    if msg.deliver_at:
        attrs_ |= A_DELIVER
        parts.append(_uvarint(msg.deliver_at))
    if msg.key is not None:
        attrs_ |= A_KEY
        k = msg.key.encode()
        parts += (_uvarint(len(k)), k)
    if msg.tags is not None:
        attrs_ |= A_TAGS
        t = msg.tags.encode()
        parts += (_uvarint(len(t)), t)
    if msg.properties:
        attrs_ |= A_PROPS
        p = _encode_props(msg.properties)
        parts += (_uvarint(len(p)), p)
    parts.append(msg.body)
    rest = bytes((attrs_,)) + b"".join(parts)
    return _uvarint(len(rest)) + rest


def _encode_props(props: Mapping[str, str]) -> bytes:
    """A record's properties block. Raises TypeError naming a property whose name or
    value is not a str."""
    out: list[bytes] = []
    for k, v in props.items():
        if type(k) is not str or type(v) is not str:
            check_props({k: v})  # raises TypeError naming it (str subclasses pass)
        kb, vb = k.encode(), v.encode()
        out += (_uvarint(len(kb)), kb, _uvarint(len(vb)), vb)
    return b"".join(out)


def decode_record_props(buf: bytes) -> dict[str, str]:
    """A record's properties block (its repeated varint-length name and value pairs).
    Raises CorruptRecord when a pair overruns the block, IndexError when a length is
    cut off, UnicodeDecodeError for a name or value that is not UTF-8."""
    out: dict[str, str] = {}
    pos, end = 0, len(buf)
    while pos < end:
        kl, pos = _read_uvarint(buf, pos)
        k = buf[pos : pos + kl]
        pos += kl
        vl, pos = _read_uvarint(buf, pos)
        v = buf[pos : pos + vl]
        pos += vl
        if pos > end:
            raise CorruptRecord("a property overruns its block")
        out[k.decode()] = v.decode()
    return out


class _Filling(Message):
    """A Message being filled in by :func:`decode_records_into`: the same slots
    without Message's ``__setattr__`` (its converters and ``on_setattr`` hooks cost
    about as much as the rest of decoding, and what they would convert is already
    bytes / str / a fresh dict here), so each field is one plain slot store. A record
    without properties leaves ``properties`` unset: :meth:`Message.__getattr__` makes
    the empty dict when it is first read. Once filled, the object's class becomes
    :class:`Message` (same layout): nothing else ever sees a ``_Filling``."""

    __slots__ = ()
    __setattr__ = object.__setattr__


_new_filling = _Filling.__new__
assert [f.name for f in attrs.fields(Message)] == ["body", "key", "tags", "properties", "deliver_at", "topic",
                                                   "queue_id", "queue_offset", "global_offset", "timestamp",
                                                   "reconsume_times"]  # fmt: skip
_NO_END: Final = 1 << 64


def _skip_records(records: bytes, pos: int, n: int) -> int:
    """The position after the ``n`` records from ``pos``, stepped over by their length
    prefixes (one-byte varints inline). Raises CorruptRecord for an empty record,
    IndexError past the end."""
    uvarint = _read_uvarint
    for _ in range(n):
        size = records[pos]
        if size < 0x80:
            if not size:
                raise CorruptRecord("an empty record")
            pos += size + 1
        else:  # a longer varint, of 0 too when it is not minimal
            size, pos = uvarint(records, pos)
            if not size:
                raise CorruptRecord("an empty record")
            pos += size
    return pos


def decode_records_into(
    out: list[Message],
    records: bytes,
    count: int,
    mask: bytes,
    topic: str,
    qid: int,
    base: int,
    gbase: int,
    first_ms: int,
    start: int,
    stop: int,
    cap: int,
) -> None:
    """Append the delivered records of one batch's (uncompressed) records section to
    ``out`` as Messages: the one record decoder. Record ``i`` is delivered when its
    queue offset ``base + i`` is in [``start``, ``stop``) and its ``mask`` bit is set
    (no mask: every record), until ``out`` holds ``cap``; it gets global offset
    ``gbase + i`` and store time ``first_ms`` + its delta. Messages are filled in
    through their slots (one allocation per delivered record; the consumer's hot
    path); records not delivered are stepped over by their length.

    Raises CorruptRecord when a record overruns the section, the section holds more
    or fewer records than ``count``, an attribute bit is unknown, or a key, tags or
    property is not UTF-8 (of a delivered record)."""
    append = out.append
    new, filling, cls = _new_filling, _Filling, Message
    uvarint = _read_uvarint
    pos, size = 0, len(records)
    # the records before ``start`` are stepped over by their lengths alone
    lo = min(count, max(0, start - base))
    hi = max(lo, min(count, stop - base))
    try:
        pos = _skip_records(records, 0, lo)
        if pos > size:
            raise CorruptRecord("a record overruns its batch")
        # varints below 128 (nearly every length and small field) are read inline:
        # a call per field costs as much as the rest of a record's decoding
        for i in range(lo, hi):
            n = records[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = uvarint(records, pos)
            e = pos + n
            if e > size or n < 1:
                raise CorruptRecord(f"record {i} overruns its batch")
            if mask and not mask[i >> 3] >> (i & 7) & 1:
                pos = e
                continue
            a = records[pos]
            pos += 1
            m = new(filling)
            ts = rc = deliver = 0
            if a & ~_A_KEY_ONLY:  # anything but a key: the general path
                if a & ~_A_KNOWN:
                    raise CorruptRecord(f"unknown record attributes {a:#x}")
                if a & A_TS:
                    ts, pos = uvarint(records, pos)
                if a & A_RECONSUME:
                    rc, pos = uvarint(records, pos)
                if a & A_DELIVER:
                    deliver, pos = uvarint(records, pos)
                if a & A_KEY:
                    kl, pos = uvarint(records, pos)
                    m.key = records[pos : pos + kl].decode()
                    pos += kl
                else:
                    m.key = None
                if a & A_TAGS:
                    tl, pos = uvarint(records, pos)
                    m.tags = records[pos : pos + tl].decode()
                    pos += tl
                else:
                    m.tags = None
                if a & A_PROPS:
                    pl, pos = uvarint(records, pos)
                    if pos + pl > e:
                        raise CorruptRecord(f"record {i}'s properties overrun it")
                    m.properties = decode_record_props(records[pos : pos + pl])
                    pos += pl
            else:
                if a:
                    kl = records[pos]
                    if kl < 0x80:
                        pos += 1
                    else:
                        kl, pos = uvarint(records, pos)
                    m.key = records[pos : pos + kl].decode()
                    pos += kl
                else:
                    m.key = None
                m.tags = None
            if pos > e:
                raise CorruptRecord(f"record {i}'s fields overrun it")
            m.body = records[pos:e]
            m.deliver_at = deliver
            m.topic = topic
            m.queue_id = qid
            m.queue_offset = base + i
            m.global_offset = gbase + i
            m.timestamp = first_ms + ts
            m.reconsume_times = rc
            m.__class__ = cls  # type: ignore[assignment]  # a Message from here on
            append(m)
            pos = e
            if len(out) >= cap:
                return  # the rest is not delivered: not decoded either
        pos = _skip_records(records, pos, count - hi)
    except IndexError:
        raise CorruptRecord("a record is truncated") from None
    except UnicodeDecodeError as exc:
        raise CorruptRecord(f"a record's key, tags or property is not UTF-8: {exc}") from None
    if pos != size:
        raise CorruptRecord(f"{size - pos} bytes after the batch's {count} records")


def decode_records(records: bytes, count: int) -> list[Message]:
    """Every record of an (uncompressed) records section as a Message with no
    position: ``queue_offset`` and ``global_offset`` are the record's index,
    ``timestamp`` its store-time delta (:func:`decode_records_into`, which raises)."""
    out: list[Message] = []
    decode_records_into(out, records, count, b"", "", -1, 0, 0, 0, 0, _NO_END, _NO_END)
    return out


_EH_SIZE: Final = ENTRY_HEADER.size
_SMALL: Final = [bytes((i,)) for i in range(128)]


def records_from_entries(entries: Sequence[bytes], headers: Sequence[tuple[int, ...]]) -> bytes:
    """The records section of produced entries (validated, with their ``headers`` from
    :func:`equeue.wire.entries.check_entries`), store-time delta 0: what the broker
    stores for a produce request. Equal to joining :func:`encode_record` of the
    decoded messages, without decoding them (the produce path: one pass, the body and
    a key-only entry's key copied as one slice).

    Raises InvalidMessage (naming the entry) for a key or tags that is not UTF-8: a
    stored record's key and tags are text.
    """
    out: list[bytes] = []
    hs = _EH_SIZE
    uv = _uvarint
    for i, (entry, (_n, flags, deliver, rc, kl, tl, pl)) in enumerate(zip(entries, headers, strict=True)):
        a = 0
        head: list[bytes] = []
        if rc:
            a |= A_RECONSUME
            head.append(uv(rc))
        if deliver:
            a |= A_DELIVER
            head.append(uv(deliver))
        p = hs
        try:
            if flags & 1:
                a |= A_KEY
                entry[p : p + kl].decode()
            if flags & 2:
                entry[p + kl : p + kl + tl].decode()
        except UnicodeDecodeError:
            raise InvalidMessage(f"message {i}: its key or tags is not UTF-8") from None
        if not (flags & 2 or pl):
            # key (if any) then body, contiguous in the entry as in the record
            if flags & 1:
                head.append(_SMALL[kl] if kl < 128 else uv(kl))
            rest = entry[p:]
        else:
            parts: list[bytes] = []
            if flags & 1:
                parts += (uv(kl), entry[p : p + kl])
            p += kl
            if flags & 2:
                a |= A_TAGS
                parts += (uv(tl), entry[p : p + tl])
            p += tl
            if pl:
                a |= A_PROPS
                props = _encode_props(decode_props(entry[p : p + pl]))
                parts += (uv(len(props)), props)
            p += pl
            parts.append(entry[p:])
            rest = b"".join(parts)
        prefix = bytes((a,)) + b"".join(head) if head else _SMALL[a]
        length = len(prefix) + len(rest)
        out += (_SMALL[length] if length < 128 else uv(length), prefix, rest)
    return b"".join(out)


def record_bounds(records: bytes, count: int) -> list[int]:
    """Where each of the ``count`` records of a records section starts, and where the
    last one ends (``count + 1`` positions): record i is ``records[b[i]:b[i + 1]]``, one
    record for :func:`decode_records`. Reads only the length prefixes (a lookup that
    needs one record of a large batch). Raises CorruptRecord when they overrun the
    section, do not end exactly at its end, or a record is empty (every record holds
    at least its attributes byte)."""
    out = [0]
    append, uvarint = out.append, _read_uvarint
    pos, end = 0, len(records)
    try:
        for _ in range(count):
            n = records[pos]
            if n < 0x80:  # inline: a call per record costs more than the rest
                if not n:
                    raise CorruptRecord("an empty record")
                pos += n + 1
            else:  # a longer varint, of 0 too when it is not minimal
                n, pos = uvarint(records, pos)
                if not n:
                    raise CorruptRecord("an empty record")
                pos += n
            append(pos)
    except IndexError:
        raise CorruptRecord("a record is truncated") from None
    if pos != end:
        raise CorruptRecord(f"the batch's {count} records do not end at its end")
    return out


# ---------------------------------------------------------------- produce side
def produced_record(
    body: bytes,
    key: bytes | None,
    tags: bytes | None,
    props: Mapping[str, str] | None,
    deliver_at: int,
    max_content: int,
) -> bytes:
    """One record as a producer sends it (store-time delta 0, no reconsume count):
    what :func:`encode_record` builds for these fields, from raw bytes, with the
    common shapes (no tags, properties or due time; a key under 128 bytes) built in
    one join. ``key`` and ``tags`` must be UTF-8 (the caller's text, encoded).

    Raises ConfigError for a key or tags above 65535 bytes (or a property name),
    MessageTooLarge when the content (key + tags + properties + body, the properties
    counted as the entry layout holds them: 6 bytes per pair plus the names and values,
    so every message stored can be copied as an entry to the retry or dead-letter
    topic) is above ``max_content``, and TypeError for a property name or value that
    is not a str."""
    if tags is None and not props and not deliver_at:
        if key is None:
            if len(body) > max_content:
                raise MessageTooLarge(f"message content is {len(body)} bytes; the limit is {max_content}")
            n = len(body) + 1
            return b"".join((_SMALL[n] if n < 128 else _uvarint(n), b"\0", body))
        kl = len(key)
        if kl < 128:
            if kl + len(body) > max_content:
                raise MessageTooLarge(
                    f"message content (key + tags + properties + body) is {kl + len(body)} bytes; "
                    f"the limit is {max_content}"
                )
            n = 2 + kl + len(body)
            return b"".join((_SMALL[n] if n < 128 else _uvarint(n), b"\1", _SMALL[kl], key, body))
    if (key is not None and len(key) > 0xFFFF) or (tags is not None and len(tags) > 0xFFFF):
        raise ConfigError("key and tags are limited to 65535 bytes each")
    a = 0
    parts: list[bytes] = []
    content = len(body)
    if deliver_at:
        a |= A_DELIVER
        parts.append(_uvarint(deliver_at))
    if key is not None:
        a |= A_KEY
        parts += (_uvarint(len(key)), key)
        content += len(key)
    if tags is not None:
        a |= A_TAGS
        parts += (_uvarint(len(tags)), tags)
        content += len(tags)
    if props:
        content += len(encode_props(props))  # TypeError, ConfigError (a name above 65535 bytes)
        a |= A_PROPS
        pb = _encode_props(props)
        parts += (_uvarint(len(pb)), pb)
    if content > max_content:
        raise MessageTooLarge(
            f"message content (key + tags + properties + body) is {content} bytes; the limit is {max_content}"
        )
    parts.append(body)
    rest = bytes((a,)) + b"".join(parts)
    return _uvarint(len(rest)) + rest


@attrs.frozen(slots=True)
class ProducedRecords:
    """A producer batch's records as :func:`scan_produced` checked them: what the
    store needs of them (the keyed records and their keys, for the key index) without
    decoding each record into a message."""

    #: the records section, uncompressed
    records: bytes
    count: int
    #: the indexes of the keyed records, ascending, and their keys (UTF-8 bytes)
    keyed: list[int]
    keys: list[bytes]
    #: some record carries a due time (the broker schedules it: the general path)
    delayed: bool


def scan_produced(records: bytes, count: int, max_content: int) -> ProducedRecords:
    """Check a produced records section in one pass, as the broker does before it
    stores a producer's batch as sent: every record is read back by
    :func:`decode_records_into` without error, and meets the produce rules.

    Raises CorruptRecord when a record overruns the section, is empty, has unknown
    attributes, a key, tags or property that is not UTF-8, or the section holds more
    or fewer than ``count`` records; InvalidMessage for a store-time delta (only the
    broker sets store times), a reconsume count above 65535, or a key or tags above
    65535 bytes (or a property name); MessageTooLarge for a content (key + tags +
    properties + body, the properties counted as the entry layout holds them, as
    :func:`produced_record` counts them) above ``max_content``. Each names the record
    by its index."""
    keyed: list[int] = []
    keys: list[bytes] = []
    add_index, add_key = keyed.append, keys.append
    uvarint = _read_uvarint
    pos, size = 0, len(records)
    delayed = False
    try:
        for i in range(count):
            n = records[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = uvarint(records, pos)
            e = pos + n
            if e > size or n < 1:
                raise CorruptRecord(f"record {i} overruns its batch" if n else f"record {i} is an empty record")
            a = records[pos]
            pos += 1
            if a == A_KEY:  # the common shape, read inline
                kl = records[pos]
                if kl < 0x80:
                    pos += 1
                else:
                    kl, pos = uvarint(records, pos)
                    if kl > 0xFFFF:
                        raise InvalidMessage(f"message {i}: its key is {kl} bytes, above 65535")
                key = records[pos : pos + kl]
                key.decode()
                pos += kl
                add_index(i)
                add_key(key)
                extra = kl
            elif a:
                pos, extra, k, due = _scan_fields(records, pos, e, a, i)
                delayed = delayed or due
                if k is not None:
                    add_index(i)
                    add_key(k)
            else:
                extra = 0
            if pos > e:
                raise CorruptRecord(f"record {i}'s fields overrun it")
            if e - pos + extra > max_content:
                raise MessageTooLarge(
                    f"message {i} is {e - pos + extra} bytes (key + tags + properties + body); "
                    f"the broker's limit is {max_content}"
                )
            pos = e
    except IndexError:
        raise CorruptRecord("a record is truncated") from None
    except UnicodeDecodeError as exc:
        raise CorruptRecord(f"a record's key, tags or property is not UTF-8: {exc}") from None
    if pos != size:
        raise CorruptRecord(f"{size - pos} bytes after the batch's {count} records")
    return ProducedRecords(records, count, keyed, keys, delayed)


def _scan_fields(records: bytes, pos: int, e: int, a: int, i: int) -> tuple[int, int, bytes | None, bool]:
    """:func:`scan_produced`'s general case: the fields of record ``i`` (ending at
    ``e``) after its attributes byte ``a``. Returns where its body starts, the bytes
    of its key, tags and properties block, its key (None: unkeyed), and whether it
    carries a due time. Raises what :func:`scan_produced` raises."""
    if a & ~_A_KNOWN:
        raise CorruptRecord(f"record {i}: unknown record attributes {a:#x}")
    if a & A_TS:
        raise InvalidMessage(f"message {i} carries a store-time delta: only the broker sets store times")
    uvarint = _read_uvarint
    extra = 0
    key: bytes | None = None
    due = False
    if a & A_RECONSUME:
        rc, pos = uvarint(records, pos)
        if rc > 0xFFFF:
            raise InvalidMessage(f"message {i}: its reconsume count {rc} is above 65535")
    if a & A_DELIVER:
        deliver, pos = uvarint(records, pos)
        due = deliver > 0
    if a & A_KEY:
        kl, pos = uvarint(records, pos)
        if kl > 0xFFFF:
            raise InvalidMessage(f"message {i}: its key is {kl} bytes, above 65535")
        key = records[pos : pos + kl]
        key.decode()
        pos += kl
        extra += kl
    if a & A_TAGS:
        tl, pos = uvarint(records, pos)
        if tl > 0xFFFF:
            raise InvalidMessage(f"message {i}: its tags are {tl} bytes, above 65535")
        records[pos : pos + tl].decode()
        pos += tl
        extra += tl
    if a & A_PROPS:
        pl, pos = uvarint(records, pos)
        if pos + pl > e:
            raise CorruptRecord(f"record {i}'s properties overrun it")
        try:  # counted as the entry layout holds them (the retry and DLQ copies)
            extra += len(encode_props(decode_record_props(records[pos : pos + pl])))
        except ConfigError as exc:
            raise InvalidMessage(f"message {i}: {exc}") from None
        pos += pl
    return pos, extra, key, due


# ---------------------------------------------------------------- batches
def _compress(codec: Codec, data: bytes) -> bytes:
    if codec is Codec.ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(data))
    return data


def encode_batch(messages: Sequence[Message], codec: Codec = Codec.NONE) -> bytes:
    """The batch of ``messages`` (at least one), its records compressed with ``codec``:
    the one batch encoder. Raises InvalidMessage for an empty batch."""
    if not messages:
        raise InvalidMessage("a batch holds at least one message")
    return seal_records(b"".join(map(encode_record, messages)), len(messages), codec)


def seal_records(records: bytes, count: int, codec: Codec = Codec.NONE) -> bytes:
    """The batch of an (uncompressed) records section of ``count`` records, compressed
    with ``codec``: its header and the records as carried (what :func:`encode_batch`
    and the broker's recompression build)."""
    carried = _compress(codec, records)
    return BATCH_HEAD.pack(BATCH_MAGIC, codec, count, zlib.crc32(carried), len(records)) + carried


@attrs.frozen(slots=True)
class BatchHead:
    """A batch's header, checked: its codec, record count, the crc32 of the records
    as carried, and their size uncompressed."""

    codec: Codec
    count: int
    crc: int
    records_len: int


def batch_head(batch: bytes | memoryview, max_records_len: int, *, verify: bool = True) -> BatchHead:
    """Parse and check a batch's header: magic, codec, count >= 1, the uncompressed
    size within ``max_records_len`` (and, uncompressed, equal to what is carried),
    and with ``verify`` the crc32 of the records carried.

    Raises CorruptRecord naming what is wrong."""
    if len(batch) < BATCH_HEAD.size:
        raise CorruptRecord(f"batch of {len(batch)} bytes is shorter than its {BATCH_HEAD.size}-byte header")
    magic, codec, count, crc, records_len = BATCH_HEAD.unpack_from(batch, 0)
    if magic != BATCH_MAGIC:
        raise CorruptRecord(f"unknown batch magic {magic}")
    try:
        c = Codec(codec)
    except ValueError:
        raise CorruptRecord(f"unknown batch codec {codec}") from None
    if count < 1:
        raise CorruptRecord("a batch holds no record")
    if records_len > max_records_len:
        raise CorruptRecord(f"batch records of {records_len} bytes exceed the limit of {max_records_len}")
    carried = len(batch) - BATCH_HEAD.size
    if c is Codec.NONE and carried != records_len:
        raise CorruptRecord(f"batch announces {records_len} bytes of records and carries {carried}")
    head = BatchHead(c, count, crc, records_len)
    if verify:
        verify_batch(batch, head)
    return head


def verify_batch(batch: bytes | memoryview, head: BatchHead) -> None:
    """Check the crc32 of the records ``batch`` carries against its ``head``'s (for a
    reader that parsed the header with ``verify=False`` and checks only the batches it
    delivers from). Raises CorruptRecord on a mismatch."""
    if zlib.crc32(memoryview(batch)[BATCH_HEAD.size :]) != head.crc:
        raise CorruptRecord("batch checksum mismatch")


def batch_records(batch: bytes | memoryview, head: BatchHead) -> bytes:
    """The batch's records section, decompressed; never more than ``head.records_len``
    bytes are produced. Raises CorruptRecord when the records do not decompress to
    exactly that size."""
    carried = memoryview(batch)[BATCH_HEAD.size :]
    if head.codec is Codec.NONE:
        return bytes(carried)
    cap = head.records_len + 1  # one byte more tells a longer output from an exact one
    try:
        if head.codec is Codec.ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(bytes(carried)) as reader:
                out = reader.read(cap)
        else:
            out = lz4.frame.LZ4FrameDecompressor().decompress(bytes(carried), max_length=cap)
    except (zstandard.ZstdError, RuntimeError, ValueError) as exc:
        raise CorruptRecord(f"batch does not decompress ({head.codec.name.lower()}): {exc}") from None
    if len(out) != head.records_len:
        raise CorruptRecord(f"batch decompresses to {len(out)} bytes, not the {head.records_len} announced")
    return bytes(out)


def decode_batch(batch: bytes | memoryview, max_records_len: int) -> list[Message]:
    """Every record of a batch (checked, decompressed, decoded)."""
    head = batch_head(batch, max_records_len)
    return decode_records(batch_records(batch, head), head.count)


# ---------------------------------------------------------------- stored batches
def encode_stored(
    topic_id: int,
    queue_id: int,
    base_offset: int,
    first_ms: int,
    last_ms: int,
    producer_id: bytes | None,
    base_sequence: int,
    batch: bytes,
) -> bytes:
    """The ``messages`` value of a batch: the one stored-batch encoder."""
    rest = STORED_HEAD.pack(
        0, STORED_VERSION, topic_id, queue_id, base_offset, first_ms, last_ms, producer_id or NO_PRODUCER,
        base_sequence,
    )[4:]  # fmt: skip
    return struct.pack(">I", zlib.crc32(rest)) + rest + batch


@attrs.frozen(slots=True)
class StoredHead:
    """A stored batch's header (the broker's fields)."""

    topic_id: int
    queue_id: int
    base_offset: int
    first_ms: int
    last_ms: int
    producer_id: bytes | None
    base_sequence: int


def stored_head(value: bytes | memoryview) -> StoredHead:
    """Parse and check a stored batch's header (version, its crc32). The batch behind
    it is checked by :func:`batch_head`. Raises CorruptRecord."""
    if len(value) < STORED_HEAD.size + BATCH_HEAD.size:
        raise CorruptRecord("stored batch is truncated")
    hcrc, ver, topic, queue, base, first, last, pid, seq = STORED_HEAD.unpack_from(value, 0)
    if ver != STORED_VERSION:
        raise CorruptRecord(f"unknown stored batch version {ver}")
    if zlib.crc32(memoryview(value)[4 : STORED_HEAD.size]) != hcrc:
        raise CorruptRecord(f"header checksum mismatch in the batch of queue {queue} at offset {base}")
    return StoredHead(topic, queue, base, first, last, None if pid == NO_PRODUCER else pid, seq)


def stored_batch(value: bytes | memoryview) -> memoryview:
    """The producer's batch inside a stored value (no checks: see :func:`stored_head`)."""
    return memoryview(value)[STORED_HEAD.size :]


def slice_stored(value: bytes, first: int, stop: int) -> bytes | None:
    """A stored batch of only records ``first`` .. ``stop - 1`` of the uncompressed
    stored batch ``value`` (its base offset moved by ``first``; sealed anew, with its
    own checksums), or None when the batch is compressed (its records cannot be cut
    without inflating them: readers take it whole). A pull that needs part of a large
    batch sends this part instead of the whole batch. Raises CorruptRecord when the
    batch does not decode (its checksums are not checked here: the caller's read did)."""
    h = stored_head(value)
    inner = stored_batch(value)
    head = batch_head(inner, 1 << 62, verify=False)
    if head.codec is not Codec.NONE:
        return None
    records = bytes(inner[BATCH_HEAD.size :])
    b = record_bounds(records, head.count)
    seq = h.base_sequence + first if h.producer_id is not None else 0
    return encode_stored(
        h.topic_id, h.queue_id, h.base_offset + first, h.first_ms, h.last_ms, h.producer_id, seq,
        seal_records(records[b[first] : b[stop]], stop - first),
    )  # fmt: skip


def decode_stored(topic: str, global_base: int, value: bytes, max_records_len: int) -> list[Message]:
    """The consumer-side messages of a stored batch whose first global offset is
    ``global_base``. Raises CorruptRecord."""
    h = stored_head(value)
    inner = stored_batch(value)
    head = batch_head(inner, max_records_len)
    out: list[Message] = []
    decode_records_into(out, batch_records(inner, head), head.count, b"", topic, h.queue_id, h.base_offset,
                        global_base, h.first_ms, 0, _NO_END, _NO_END)  # fmt: skip
    return out
