"""Fast decoding of pull responses for the consumer hot path.

Same result as :func:`equeue.wire.decode_pull_response` (a test checks they agree),
with the item, record and entry headers unpacked by one struct call per message, and
each :class:`~equeue.models.Message` filled in through its slot descriptors instead of
its ``__init__`` (whose converters and ``on_setattr`` hooks cost about as much as the
rest of decoding; what they would convert is already bytes / str / a fresh dict here).
The broker verifies every record's checksum when it reads it; the consumer re-checks
it only when asked (``verify_checksums=True``), since it costs about 15 % of decoding.
"""

from __future__ import annotations

import struct
import zlib

import attrs

from equeue import wire
from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.models import Message
from equeue.protocol import PullStatus

__all__ = ["decode_pull"]

_RESP = struct.Struct(">BQQQI")  # status, min, max, next, count  (wire._PULL_RESP)
_ITEM = struct.Struct(">QI")  # global offset, record length     (wire._PULL_ITEM)
# record header (crc, ver, topic id, queue id, queue offset, ts) + entry header
# (len, flags, deliver_at, reconsume, key len, tags len, props len)
_HEAD = struct.Struct(">IBIIQQIBQHHHI")
_ENTRY_START = wire.RECORD_HEADER.size + wire.ENTRY_HEADER.size
_REC_PLUS_LEN = wire.RECORD_HEADER.size + 4  # record header + the entry length field
# item + record header + entry header in one call
_ITEM_HEAD = struct.Struct(">QI" + _HEAD.format[1:])
assert _RESP.size == 29 and _ITEM.size == 12 and _HEAD.size == _ENTRY_START
assert _ITEM_HEAD.size == _ITEM.size + _HEAD.size

_new_message = Message.__new__
# slot setters of Message (attrs slots class): one C call each, no hooks
_SET = {f.name: Message.__dict__[f.name].__set__ for f in attrs.fields(Message)}
assert list(_SET) == ["body", "key", "tags", "properties", "deliver_at", "topic", "queue_id",
                      "queue_offset", "global_offset", "timestamp", "reconsume_times"]  # fmt: skip


def decode_pull(
    topic: str, buf: bytes, verify: bool = False
) -> tuple[PullStatus, int, int, int, list[Message]]:
    """(status, min offset, max offset, next offset, messages) of a pull answer.

    Raises RemoteProtocolError for a malformed answer, CorruptRecord for a record
    whose lengths (or, with ``verify``, checksum) are wrong.
    """
    try:
        status, lo, hi, nxt, count = _RESP.unpack_from(buf, 0)
        pull_status = PullStatus(status)
    except (struct.error, ValueError) as exc:
        raise RemoteProtocolError(f"malformed pull response: {exc}") from exc
    out: list[Message] = []
    if not count:
        return pull_status, lo, hi, nxt, out
    if type(buf) is not bytes:
        buf = bytes(buf)
    append = out.append
    item_head = _ITEM_HEAD.unpack_from
    crc32 = zlib.crc32
    decode_props = wire.decode_props
    new = _new_message
    s_body, s_key, s_tags, s_props, s_deliver, s_topic, s_qid, s_qoff, s_global, s_ts, s_rc = _SET.values()
    mv = memoryview(buf) if verify else None
    cls = Message
    entry_start, rec_plus_len = _ENTRY_START, _REC_PLUS_LEN
    pos = _RESP.size
    size = len(buf)
    try:
        for _ in range(count):
            g, n, crc, _ver, _tid, qid, qoff, ts, elen, flags, _da, rc, kl, tl, pl = item_head(buf, pos)
            pos += 12
            end = pos + n
            p = pos + entry_start
            if end > size or pos + rec_plus_len + elen != end or p + kl + tl + pl > end:
                raise CorruptRecord(f"malformed record at global offset {g}")
            if mv is not None and crc32(mv[pos + 4 : end]) != crc:
                raise CorruptRecord(f"checksum mismatch in record at global offset {g}")
            m = new(cls)
            if flags & 3 or pl:
                s_key(m, buf[p : p + kl].decode("utf-8", "replace") if flags & 1 else None)
                p += kl
                s_tags(m, buf[p : p + tl].decode("utf-8", "replace") if flags & 2 else None)
                p += tl
                s_props(m, decode_props(buf[p : p + pl]) if pl else {})
                p += pl
            else:  # no key, tags or properties: the common case
                s_key(m, None)
                s_tags(m, None)
                s_props(m, {})
                p += kl + tl
            s_body(m, buf[p:end])
            s_deliver(m, 0)
            s_topic(m, topic)
            s_qid(m, qid)
            s_qoff(m, qoff)
            s_global(m, g)
            s_ts(m, ts)
            s_rc(m, rc)
            append(m)
            pos = end
    except struct.error as exc:
        raise RemoteProtocolError(f"truncated pull response: {exc}") from exc
    return pull_status, lo, hi, nxt, out
