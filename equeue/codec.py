"""The equeue wire codec: a sans-I/O state machine (no sockets, no trio).

Feed received bytes with :meth:`Connection.receive_data`, take events with
:meth:`Connection.next_event` until it returns :data:`NEED_DATA`, and turn
events you want to send into bytes with :meth:`Connection.send`.

Byte layout (all integers big-endian)::

    handshake, client -> server (8 bytes)     handshake, server -> client (8 bytes)
    +------+---------+-------+                +------+---------+------+
    | EQMQ | version | flags |                | EQMQ | version | code |
    |  4   |   u16   |  u16  |                |  4   |   u16   | u16  |
    +------+---------+-------+                +------+---------+------+

    every frame after the handshake
    +-----------+------+-------+------------+------------------+
    | length    | kind | code  | request id | payload          |
    | u32       | u8   | u16   | u32        | length - 7 bytes |
    +-----------+------+-------+------------+------------------+

``kind`` is 0 request (code = :class:`~equeue.protocol.RequestCode`), 1 response
(code = :class:`~equeue.errors.ErrorCode`, 0 = OK) or 2 push (server-initiated,
request id 0, code = :class:`~equeue.protocol.PushCode`), or 3 auth (the SASL
exchange, see below). ``length`` is checked against the frame cap *before* any
buffer for the payload is allocated.

Authentication (docs/security.md). A broker that authenticates answers the Hello
with code AUTH_REQUIRED (a client without credentials stops there: the code is
its error), then the client sends :class:`AuthRequest` frames and the broker
answers each with an :class:`AuthReply`, all with kind 3 and request id 0::

    AuthRequest (client -> server), code 0       AuthReply (server -> client), code = ErrorCode
    +---------+-----------+------------+         +-------+------------+
    | mechlen | mechanism | data       |         | flags | data       |
    | u8      | ascii     | the rest   |         | u8    | the rest   |
    +---------+-----------+------------+         +-------+------------+

``mechanism`` names the SASL mechanism on the first request (``SCRAM-SHA-256``) and
is empty afterwards; ``data`` is the mechanism's next message. ``flags`` bit 0 is
*final*: the exchange is over (code OK: authenticated; otherwise refused, and the
broker closes the connection). A server's codec refuses an auth frame after the
final reply or after the first request.

The server's encoders are plain functions (:func:`encode_response`,
:func:`encode_push`, :func:`encode_handshake_answer`): they keep no state, so the
server's output code (and, for parked pulls, the appender's writer thread) frames
an answer without holding the connection's state machine. :meth:`Connection.send`
frames through the same functions.

Rules: the client speaks first (its handshake); nothing else may be sent or
received before the handshake completes; only clients send requests; only servers
send responses and pushes. A violation by the peer raises
:class:`~equeue.errors.RemoteProtocolError` (with the code to report); a
violation by the caller raises :class:`~equeue.errors.LocalProtocolError`. After
a remote error the connection is unusable: close it.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

import attrs

from equeue.errors import ErrorCode, LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "HEADER",
    "MAGIC",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "AuthReply",
    "AuthRequest",
    "Connection",
    "Event",
    "Hello",
    "HelloAck",
    "Push",
    "Request",
    "Response",
    "Role",
    "decode_auth_reply",
    "decode_auth_request",
    "encode_auth_reply",
    "encode_auth_request",
    "encode_handshake_answer",
    "encode_push",
    "encode_response",
]

MAGIC: Final = b"EQMQ"
PROTOCOL_VERSION: Final = 1
DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
#: kind (u8), code (u16), request id (u32) -- after the u32 length prefix
HEADER: Final = struct.Struct(">IBHI")
_HEADER_BODY: Final = 7
_HANDSHAKE: Final = struct.Struct(">4sHH")
_MAX_BUFFER_SLACK: Final = 1 << 16

KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1
KIND_PUSH: Final = 2
KIND_AUTH: Final = 3
#: AuthReply flags: the exchange is over
AUTH_FINAL: Final = 1


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class _NeedData:
    """Sentinel: no complete event is buffered yet."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


@attrs.frozen
class Hello:
    """Client handshake."""

    version: int = PROTOCOL_VERSION
    flags: int = 0


@attrs.frozen
class HelloAck:
    """Server handshake answer; ``code`` is OK or UNSUPPORTED_VERSION."""

    version: int = PROTOCOL_VERSION
    code: int = ErrorCode.OK


@attrs.frozen
class Request:
    request_id: int
    code: int
    payload: bytes = b""


@attrs.frozen
class Response:
    request_id: int
    code: int
    payload: bytes = b""


@attrs.frozen
class Push:
    code: int
    payload: bytes = b""


@attrs.frozen
class AuthRequest:
    """A client's SASL message: ``mechanism`` on the first one, "" after."""

    mechanism: str = ""
    data: bytes = b""


@attrs.frozen
class AuthReply:
    """The broker's SASL answer: ``code`` (an ErrorCode, OK = go on), ``data`` (the
    mechanism's next message, or the refusal's text), ``final`` (the exchange is over)."""

    code: int = ErrorCode.OK
    data: bytes = b""
    final: bool = False


Event = Hello | HelloAck | Request | Response | Push | AuthRequest | AuthReply


def _pack_handshake(version: int, extra: int) -> bytes:
    if not (0 <= version <= 0xFFFF and 0 <= extra <= 0xFFFF):
        raise LocalProtocolError("handshake version, flags or code out of range")
    return _HANDSHAKE.pack(MAGIC, version, extra)


def encode_frame(kind: int, code: int, request_id: int, parts: list[bytes]) -> list[bytes]:
    """One frame as pieces: the header, then ``parts`` (the payload) uncopied.

    The one frame encoder (requests, responses and pushes all pass here). Raises
    ``struct.error`` for a code or request id out of range; callers that take them
    from users check first (:meth:`Connection.send_parts`).
    """
    return [HEADER.pack(_HEADER_BODY + sum(map(len, parts)), kind, code, request_id), *parts]


def encode_response(code: int, request_id: int, parts: list[bytes]) -> list[bytes]:
    """A response frame (``code``: an ErrorCode, 0 = OK) to request ``request_id``
    (0 = a connection-level error), payload ``parts`` uncopied."""
    return encode_frame(KIND_RESPONSE, code, request_id, parts)


def encode_push(code: int, payload: bytes) -> list[bytes]:
    """A push frame (``code``: a PushCode; request id 0)."""
    return encode_frame(KIND_PUSH, code, 0, [payload])


def encode_auth_request(event: AuthRequest) -> list[bytes]:
    """An auth frame from the client (the one encoder of :class:`AuthRequest`).

    Raises LocalProtocolError for a mechanism name that is not short ASCII."""
    try:
        mech = event.mechanism.encode("ascii")
    except UnicodeEncodeError:
        raise LocalProtocolError(f"mechanism name {event.mechanism!r} is not ASCII") from None
    if len(mech) > 0xFF:
        raise LocalProtocolError("mechanism name longer than 255 bytes")
    return encode_frame(KIND_AUTH, 0, 0, [bytes((len(mech),)) + mech + event.data])


def decode_auth_request(payload: bytes) -> AuthRequest:
    """The one decoder of :class:`AuthRequest`; RemoteProtocolError when malformed."""
    if not payload:
        raise RemoteProtocolError("empty auth frame")
    n = payload[0]
    if len(payload) < 1 + n:
        raise RemoteProtocolError("auth frame: mechanism name overruns the frame")
    try:
        mech = payload[1 : 1 + n].decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("auth frame: mechanism name is not ASCII") from None
    return AuthRequest(mech, payload[1 + n :])


def encode_auth_reply(event: AuthReply) -> list[bytes]:
    """An auth frame from the server (the one encoder of :class:`AuthReply`)."""
    if not 0 <= event.code <= 0xFFFF:
        raise LocalProtocolError("auth reply code out of range")
    return encode_frame(KIND_AUTH, event.code, 0, [bytes((AUTH_FINAL if event.final else 0,)) + event.data])


def decode_auth_reply(code: int, payload: bytes) -> AuthReply:
    """The one decoder of :class:`AuthReply`; RemoteProtocolError when malformed."""
    if not payload:
        raise RemoteProtocolError("empty auth frame")
    return AuthReply(code, payload[1:], bool(payload[0] & AUTH_FINAL))


def encode_handshake_answer(code: int, version: int = PROTOCOL_VERSION) -> bytes:
    """The server's handshake answer: OK, or the code refusing the connection (sent
    also to a peer whose own handshake was unreadable, before closing)."""
    return _pack_handshake(version, code)


class Connection:
    """One side of one equeue connection.

    ``max_frame`` caps the frames this side accepts (length prefix included);
    larger frames raise :class:`RemoteProtocolError` with FRAME_TOO_LARGE before
    their payload is buffered.
    """

    def __init__(self, role: Role, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.role = role
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0
        self._their_hello_done = False
        self._our_hello_done = False
        self._eof = False
        self._broken = False
        #: the server: no auth frame is accepted any more (final reply sent, or a request seen)
        self._auth_over = False

    # ------------------------------------------------------------------ state
    @property
    def handshake_done(self) -> bool:
        return self._their_hello_done and self._our_hello_done

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        return len(self._buf) - self._pos

    @property
    def partial_frame_size(self) -> int:
        """The whole size (length prefix included) of the frame being received, once
        its length prefix is buffered; 0 when no frame is partly buffered. Read it
        after :meth:`next_event` returned :data:`NEED_DATA` (the prefix is checked
        against the cap there): a server reserves memory for the frame with it."""
        pos = self._pos
        if not self._their_hello_done or len(self._buf) - pos < 4:
            return 0
        return int.from_bytes(self._buf[pos : pos + 4], "big") + 4

    # ---------------------------------------------------------------- receive
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer received bytes; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("data received after end of stream")
        if self._pos > _MAX_BUFFER_SLACK and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def peer_closed(self) -> bool:
        """The peer closed its side and every complete event has been taken."""
        return self._eof and self.buffered == 0

    def next_event(self) -> Event | _NeedData:
        """Return the next complete event, or :data:`NEED_DATA`.

        Raises :class:`RemoteProtocolError` when the buffered bytes violate the
        protocol (including a truncated frame at end of stream).
        """
        if self._broken:
            raise RemoteProtocolError("connection already failed")
        try:
            return self._next_event()
        except RemoteProtocolError:
            self._broken = True
            raise

    def _next_event(self) -> Event | _NeedData:
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if not self._their_hello_done:
            if avail < _HANDSHAKE.size:
                if self._eof and avail:
                    raise RemoteProtocolError("truncated handshake")
                if avail and bytes(buf[pos : pos + min(avail, 4)]) != MAGIC[: min(avail, 4)]:
                    raise RemoteProtocolError("bad magic: not an equeue peer")
                return NEED_DATA
            magic, version, extra = _HANDSHAKE.unpack_from(buf, pos)
            if magic != MAGIC:
                raise RemoteProtocolError("bad magic: not an equeue peer")
            self._pos = pos + _HANDSHAKE.size
            self._their_hello_done = True
            if self.role is Role.SERVER:
                return Hello(version=version, flags=extra)
            return HelloAck(version=version, code=extra)
        if avail < 4:
            if self._eof and avail:
                raise RemoteProtocolError("truncated frame at end of stream")
            return NEED_DATA
        (length,) = struct.unpack_from(">I", buf, pos)
        if length + 4 > self.max_frame:
            raise RemoteProtocolError(
                f"frame of {length + 4} bytes exceeds the {self.max_frame}-byte cap",
                ErrorCode.FRAME_TOO_LARGE,
            )
        if length < _HEADER_BODY:
            raise RemoteProtocolError(f"frame length {length} shorter than the header")
        if avail < 4 + length:
            if self._eof:
                raise RemoteProtocolError("truncated frame at end of stream")
            return NEED_DATA
        _, kind, code, request_id = HEADER.unpack_from(buf, pos)
        start = pos + 4 + _HEADER_BODY
        end = pos + 4 + length
        payload = bytes(buf[start:end])
        self._pos = end
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        if self.role is Role.SERVER:
            if kind == KIND_REQUEST:
                self._auth_over = True
                return Request(request_id, code, payload)
            if kind == KIND_AUTH:
                if self._auth_over:
                    raise RemoteProtocolError("auth frame after the authentication exchange")
                return decode_auth_request(payload)
            raise RemoteProtocolError(f"client sent frame kind {kind}")
        if kind == KIND_RESPONSE:
            return Response(request_id, code, payload)
        if kind == KIND_PUSH:
            return Push(code, payload)
        if kind == KIND_AUTH:
            return decode_auth_reply(code, payload)
        raise RemoteProtocolError(f"server sent frame kind {kind}")

    # ------------------------------------------------------------------- send
    def send(self, event: Event) -> bytes:
        """Return the bytes for ``event``; raises :class:`LocalProtocolError` on misuse."""
        return b"".join(self.send_parts(event))

    def send_parts(self, event: Event) -> list[bytes]:
        """Like :meth:`send` but returns pieces, to skip copying large payloads."""
        if isinstance(event, Hello):
            if self.role is not Role.CLIENT or self._our_hello_done:
                raise LocalProtocolError("only a client sends Hello, once")
            data = _pack_handshake(event.version, event.flags)
            self._our_hello_done = True
            return [data]
        if isinstance(event, HelloAck):
            if self.role is not Role.SERVER or self._our_hello_done or not self._their_hello_done:
                raise LocalProtocolError("a server sends HelloAck once, after the client's Hello")
            data = _pack_handshake(event.version, event.code)
            self._our_hello_done = True
            # auth frames follow only an AUTH_REQUIRED answer
            self._auth_over = event.code != ErrorCode.AUTH_REQUIRED
            return [data]
        if not self._our_hello_done:
            raise LocalProtocolError("handshake not sent yet")
        if isinstance(event, AuthRequest):
            if self.role is not Role.CLIENT:
                raise LocalProtocolError("only clients send auth requests")
            return self._capped(encode_auth_request(event))
        if isinstance(event, AuthReply):
            if self.role is not Role.SERVER or self._auth_over:
                raise LocalProtocolError("a server sends auth replies until the final one")
            self._auth_over = event.final
            return self._capped(encode_auth_reply(event))
        if isinstance(event, Request):
            if self.role is not Role.CLIENT:
                raise LocalProtocolError("only clients send requests")
            kind, code, rid = KIND_REQUEST, event.code, event.request_id
        elif isinstance(event, Response):
            if self.role is not Role.SERVER:
                raise LocalProtocolError("only servers send responses")
            kind, code, rid = KIND_RESPONSE, event.code, event.request_id
        elif isinstance(event, Push):
            if self.role is not Role.SERVER:
                raise LocalProtocolError("only servers send pushes")
            kind, code, rid = KIND_PUSH, event.code, 0
        else:  # pragma: no cover - type checkers catch this
            raise LocalProtocolError(f"not an event: {event!r}")
        payload = event.payload
        length = _HEADER_BODY + len(payload)
        if not (0 <= code <= 0xFFFF and 0 <= rid <= 0xFFFFFFFF):
            raise LocalProtocolError("code or request id out of range")
        if length + 4 > self.max_frame:
            raise LocalProtocolError(f"frame of {length + 4} bytes exceeds the {self.max_frame}-byte cap")
        if len(payload) < 4096:
            return [b"".join(encode_frame(kind, code, rid, [payload]))]
        return encode_frame(kind, code, rid, [payload])

    def _capped(self, parts: list[bytes]) -> list[bytes]:
        size = sum(map(len, parts))
        if size > self.max_frame:
            raise LocalProtocolError(f"frame of {size} bytes exceeds the {self.max_frame}-byte cap")
        return [b"".join(parts)]
