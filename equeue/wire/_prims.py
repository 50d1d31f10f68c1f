"""Primitives shared by the wire layouts: fixed-width integers, length-prefixed
UTF-8 strings and the malformed-input error."""

from __future__ import annotations

import struct
from typing import Final

from equeue.errors import RemoteProtocolError

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
#: an absent offset on the wire (u64 all ones)
NO_OFFSET: Final = 0xFFFFFFFFFFFFFFFF


def _bad(msg: str) -> RemoteProtocolError:
    return RemoteProtocolError(msg)


def pack_str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise ValueError("string too long for the wire (65535 bytes)")
    return _U16.pack(len(b)) + b


def unpack_str(buf: bytes, pos: int) -> tuple[str, int]:
    try:
        (n,) = _U16.unpack_from(buf, pos)
    except struct.error as exc:
        raise _bad("truncated string") from exc
    end = pos + 2 + n
    if end > len(buf):
        raise _bad("truncated string")
    try:
        return buf[pos + 2 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise _bad("string is not UTF-8") from exc
