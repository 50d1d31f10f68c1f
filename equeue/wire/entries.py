"""Message entries: what a producer sends, stored verbatim inside a record.

::

    +-------+-------+------------+-----------+---------+----------+-----------+-----+------+-------+------+
    | len   | flags | deliver_at | reconsume | key_len | tags_len | props_len | key | tags | props | body |
    | u32   | u8    | u64 ms     | u16       | u16     | u16      | u32       |     |      |       |      |
    +-------+-------+------------+-----------+---------+----------+-----------+-----+------+-------+------+
    len counts the bytes after itself; flags bit 0 = key present, bit 1 = tags present;
    props = repeated (u16 klen, key, u32 vlen, value), UTF-8; body = the rest.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import add, itemgetter, ne
from typing import Final

import attrs

from equeue.errors import ConfigError, CorruptRecord, InvalidMessage, MessageTooLarge
from equeue.models import Message, check_props
from equeue.wire._prims import _U32, _bad

ENTRY_HEADER: Final = struct.Struct(">IBQHHHI")  # len, flags, deliver_at, reconsume, klen, tlen, plen
FLAG_KEY: Final = 1
FLAG_TAGS: Final = 2
_PROP_K = struct.Struct(">H")
_PROP_V = struct.Struct(">I")


def encode_props(props: Mapping[str, str]) -> bytes:
    """The properties block of an entry: repeated (u16 klen, key, u32 vlen, value).
    Raises TypeError naming a property whose name or value is not a str, ConfigError
    for a name above 65535 bytes."""
    if not props:
        return b""
    parts: list[bytes] = []
    for k, v in props.items():
        if type(k) is not str or type(v) is not str:
            check_props({k: v})  # raises TypeError naming it (str subclasses pass)
        kb, vb = k.encode(), v.encode()
        if len(kb) > 0xFFFF:
            raise ConfigError(f"property names are limited to 65535 bytes ({len(kb)}: {k[:40]!r}...)")
        parts += (_PROP_K.pack(len(kb)), kb, _PROP_V.pack(len(vb)), vb)
    return b"".join(parts)


def decode_props(buf: bytes | memoryview) -> dict[str, str]:
    """Decode a properties block (the one decoder of the block).

    Raises CorruptRecord when the block does not parse (a property overruns it, or a
    name or value is not UTF-8): a block reaches a decoder only from a stored record,
    and the broker refuses such a block at produce (:func:`check_entries`), so one
    that does not parse was stored by an older broker or damaged since.
    """
    out: dict[str, str] = {}
    pos, end = 0, len(buf)
    try:
        while pos < end:
            (kl,) = _PROP_K.unpack_from(buf, pos)
            pos += 2
            if pos + kl + 4 > end:
                raise CorruptRecord("property overruns its block")
            k = bytes(buf[pos : pos + kl]).decode()
            pos += kl
            (vl,) = _PROP_V.unpack_from(buf, pos)
            pos += 4
            if pos + vl > end:
                raise CorruptRecord("property overruns its block")
            out[k] = bytes(buf[pos : pos + vl]).decode()
            pos += vl
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"malformed properties: {exc}") from exc
    return out


_pack_header = ENTRY_HEADER.pack
#: header bytes counted by an entry's ``len`` (the header after the length itself)
_AFTER_LEN: Final = ENTRY_HEADER.size - 4
_MAX_SHORT: Final = 0xFFFF


def pack_entry(
    body: bytes,
    key: bytes | None = None,
    tags: bytes | None = None,
    props: Mapping[str, str] | None = None,
    deliver_at: int = 0,
    reconsume: int = 0,
) -> bytes:
    """Encode one message entry from its raw fields: the one encoder of the layout.

    ``key``/``tags`` None means absent (flag bit clear), ``b""`` present and empty.
    This is the produce hot path (the producer calls it once per message), so the
    common shapes (no tags, no properties) are packed without the general join.

    Raises ConfigError (a ValueError) when the key or the tags exceed 65535 bytes.
    """
    if tags is None and not props:
        if key is None:
            return _pack_header(_AFTER_LEN + len(body), 0, deliver_at, reconsume, 0, 0, 0) + body
        kl = len(key)
        if kl <= _MAX_SHORT:
            return b"".join((_pack_header(_AFTER_LEN + kl + len(body), FLAG_KEY, deliver_at, reconsume, kl, 0, 0), key, body))
    kl = len(key) if key is not None else 0
    tl = len(tags) if tags is not None else 0
    if kl > _MAX_SHORT or tl > _MAX_SHORT:
        raise ConfigError("key and tags are limited to 65535 bytes each")
    pb = encode_props(props) if props else b""
    flags = (FLAG_KEY if key is not None else 0) | (FLAG_TAGS if tags is not None else 0)
    head = _pack_header(_AFTER_LEN + kl + tl + len(pb) + len(body), flags, deliver_at, reconsume, kl, tl, len(pb))
    return b"".join((head, key or b"", tags or b"", pb, body))


def encode_entry(msg: Message) -> bytes:
    """Encode one message to send (its produce-side fields) with :func:`pack_entry`;
    ``reconsume_times`` saturates at 65535."""
    return pack_entry(
        msg.body,
        msg.key.encode() if msg.key is not None else None,
        msg.tags.encode() if msg.tags is not None else None,
        msg.properties,
        msg.deliver_at,
        min(msg.reconsume_times, _MAX_SHORT),
    )


@attrs.frozen(slots=True)
class EntryMeta:
    """What the broker needs from an entry without decoding its body."""

    deliver_at: int
    key: bytes | None
    tags: bytes | None
    body_len: int


def entry_meta(entry: bytes | memoryview, base: int = 0) -> EntryMeta:
    """Read the header of the entry at ``base``; validates the lengths."""
    try:
        n, flags, deliver_at, _rc, kl, tl, pl = ENTRY_HEADER.unpack_from(entry, base)
    except struct.error as exc:
        raise _bad("truncated message entry") from exc
    body_len = n - (ENTRY_HEADER.size - 4) - kl - tl - pl
    if body_len < 0 or base + 4 + n > len(entry):
        raise _bad("message entry lengths are inconsistent")
    p = base + ENTRY_HEADER.size
    key = bytes(entry[p : p + kl]) if flags & FLAG_KEY else None
    tags = bytes(entry[p + kl : p + kl + tl]) if flags & FLAG_TAGS else None
    return EntryMeta(deliver_at, key, tags, body_len)


_unpack_header = ENTRY_HEADER.unpack_from
_FLAGS_KNOWN: Final = FLAG_KEY | FLAG_TAGS
_N, _FLAGS, _KL, _TL, _PL = map(itemgetter, (0, 1, 4, 5, 6))  # entry header columns


def check_entries(entries: Sequence[bytes], max_message: int) -> list[tuple[int, ...]]:
    """Validate produced entries fully, before anything of them is stored: the one
    check the broker makes at produce, so that every entry it stores is served
    (every decoder of a record reads it back without error).

    Each entry must be exactly as long as its length prefix says; its flags known,
    with a key (tags) length only when the key (tags) flag is set; its key, tags and
    properties must fit inside it; its property block must parse (every name and
    value inside the block, UTF-8); and its content -- key + tags + properties +
    body -- must be at most ``max_message`` bytes.

    Returns the entries' headers (the :data:`ENTRY_HEADER` fields), in order.
    Raises MessageTooLarge (a content over ``max_message``) or InvalidMessage (any
    other defect), naming the first bad entry by its index in the batch.
    """
    try:
        headers = list(map(_unpack_header, entries))
    except struct.error:
        headers = []
    count = len(entries)
    if headers and len(headers) == count:
        # the common case, checked column by column in C loops (measured the fastest
        # way): no properties, no flags beyond key/tags, the content under the limit,
        # lengths match; with keys or tags, also no key (tags) length without its
        # flag and key and tags inside the entry
        ns = list(map(_N, headers))
        if not (
            any(map(_PL, headers))
            or max(map(_FLAGS, headers)) > _FLAGS_KNOWN
            or max(ns) > max_message + _AFTER_LEN
            or any(map(ne, map(len, entries), map(add, ns, repeat(4, count))))
        ) and (
            not (any(map(_KL, headers)) or any(map(_TL, headers)))
            or all(
                (h[1] & FLAG_KEY or not h[4]) and (h[1] & FLAG_TAGS or not h[5]) and h[4] + h[5] <= h[0] - _AFTER_LEN
                for h in headers
            )
        ):  # fmt: skip
            return headers
    for i, e in enumerate(entries):  # something is off (or has properties): say what
        if len(e) < ENTRY_HEADER.size:
            raise InvalidMessage(
                f"message {i}: entry of {len(e)} bytes is shorter than its {ENTRY_HEADER.size}-byte header"
            )
        n, flags, _da, _rc, kl, tl, pl = _unpack_header(e)
        if n + 4 != len(e):
            raise InvalidMessage(f"message {i}: length prefix {n} does not match the entry's {len(e) - 4} bytes")
        if flags & ~_FLAGS_KNOWN:
            raise InvalidMessage(f"message {i}: unknown entry flags {flags:#x}")
        if (kl and not flags & FLAG_KEY) or (tl and not flags & FLAG_TAGS):
            raise InvalidMessage(f"message {i}: a key or tags length without its flag")
        content = n - _AFTER_LEN
        if kl + tl + pl > content:
            raise InvalidMessage(
                f"message {i}: key ({kl}), tags ({tl}) and properties ({pl}) overrun the entry's {content} bytes"
            )
        if content > max_message:
            raise MessageTooLarge(
                f"message {i} is {content} bytes (key {kl} + tags {tl} + properties {pl} + body "
                f"{content - kl - tl - pl}); the broker's limit is {max_message}"
            )
        if pl:
            p = ENTRY_HEADER.size + kl + tl
            try:
                decode_props(memoryview(e)[p : p + pl])
            except CorruptRecord as exc:
                raise InvalidMessage(f"message {i}: bad property block ({exc})") from None
    return headers


def split_entries(buf: bytes, pos: int, count: int) -> list[bytes]:
    """Slice ``count`` length-prefixed entries from ``buf`` starting at ``pos``.

    Validates only the outer lengths (cheap); the entries must end exactly at the
    end of ``buf``.
    """
    out: list[bytes] = []
    end = len(buf)
    unpack = _U32.unpack_from
    hdr = _AFTER_LEN
    for _ in range(count):
        if pos + 4 > end:
            raise _bad("truncated batch: fewer entries than announced")
        (n,) = unpack(buf, pos)
        stop = pos + 4 + n
        if n < hdr or stop > end:
            raise _bad("message entry overruns the batch")
        out.append(buf[pos:stop])
        pos = stop
    if pos != end:
        raise _bad("trailing bytes after the last entry")
    return out


def entry_fields(
    e: bytes | memoryview, base: int, limit: int
) -> tuple[str | None, str | None, dict[str, str], bytes, int, int]:
    n, flags, deliver_at, rc, kl, tl, pl = ENTRY_HEADER.unpack_from(e, base)
    p = base + ENTRY_HEADER.size
    stop = base + 4 + n
    if stop > limit or p + kl + tl + pl > stop:
        raise CorruptRecord("entry lengths are inconsistent")
    key = bytes(e[p : p + kl]).decode("utf-8", "replace") if flags & FLAG_KEY else None
    p += kl
    tags = bytes(e[p : p + tl]).decode("utf-8", "replace") if flags & FLAG_TAGS else None
    p += tl
    props = decode_props(e[p : p + pl]) if pl else {}
    p += pl
    return key, tags, props, bytes(e[p:stop]), deliver_at, rc


def decode_entries(buf: bytes, pos: int, count: int) -> list[Message]:
    """Decode ``count`` entries into produce-side messages (tests, scheduler)."""
    out = []
    for e in split_entries(buf, pos, count):
        key, tags, props, body, deliver_at, rc = entry_fields(e, 0, len(e))
        out.append(Message(body, key, tags, props, deliver_at, reconsume_times=rc))
    return out
