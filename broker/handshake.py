"""A connection's handshake, broker side: Hello/HelloAck, then (with a users file)
the SCRAM-SHA-256 exchange of docs/security.md.

:func:`serve_handshake` runs it under the handshake deadline and returns the
connection's :class:`Session` (its user, None when authentication is off), or
None when the connection must close: a bad Hello, an unsupported version, a
refused authentication (AUTH_FAILED after a short pause, the same answer for an
unknown user and a wrong password), a request before the exchange succeeded
(AUTH_REQUIRED), a protocol violation, the peer leaving, or the deadline. Bytes
the client pipelined after the handshake stay in the codec for the reader.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from equeue.broker.auth import Authenticator, ScramExchange
from equeue.broker.output import Output
from equeue.codec import (
    NEED_DATA,
    PROTOCOL_VERSION,
    AuthRequest,
    Connection,
    Hello,
    HelloAck,
    Request,
    encode_response,
)
from equeue.errors import ErrorCode, ProtocolError, RemoteProtocolError

log = logging.getLogger("equeue.broker")

__all__ = ["Session", "serve_handshake"]

_RECV = 64 * 1024


@attrs.frozen
class Session:
    """Who is on a connection: ``principal`` (the authenticated user; None when the
    broker does not authenticate) and ``peer`` (host:port)."""

    principal: str | None
    peer: str


async def serve_handshake(
    stream: trio.abc.ReceiveStream, codec: Connection, output: Output, *, peer: str, timeout: float,
    authenticator: Authenticator | None, fatal: Callable[[ProtocolError], Awaitable[None]],
) -> Session | None:  # fmt: skip
    """Run the handshake on ``stream`` (answers go through ``output``); the session,
    or None to close. ``fatal`` reports a protocol violation to the peer."""
    with trio.move_on_after(timeout) as hs:
        return await _exchange(stream, codec, output, peer, authenticator, fatal)
    if hs.cancelled_caught:
        log.info("client %s: no handshake within %.0f s; closing", peer, timeout)
    return None


async def _exchange(
    stream: trio.abc.ReceiveStream, codec: Connection, output: Output, peer: str,
    authenticator: Authenticator | None, fatal: Callable[[ProtocolError], Awaitable[None]],
) -> Session | None:  # fmt: skip
    scram: ScramExchange | None = None
    while True:
        while True:
            try:
                ev = codec.next_event()
            except RemoteProtocolError as exc:
                await fatal(exc)
                return None
            if ev is NEED_DATA:
                break
            if isinstance(ev, Hello):
                if ev.version != PROTOCOL_VERSION:
                    output.queue([codec.send(HelloAck(PROTOCOL_VERSION, ErrorCode.UNSUPPORTED_VERSION))])
                    log.info("client %s: unsupported protocol version %d", peer, ev.version)
                    return None
                if authenticator is None:
                    output.queue([codec.send(HelloAck(PROTOCOL_VERSION, ErrorCode.OK))])
                    return Session(None, peer)
                output.queue([codec.send(HelloAck(PROTOCOL_VERSION, ErrorCode.AUTH_REQUIRED))])
                scram = authenticator.start()
            elif isinstance(ev, AuthRequest) and scram is not None and authenticator is not None:
                reply = scram.step(ev)
                if reply.code != ErrorCode.OK:
                    authenticator.failed(scram, peer)
                    await trio.sleep(authenticator.failure_delay)
                    output.queue([codec.send(reply)])
                    return None
                output.queue([codec.send(reply)])
                if reply.final:
                    log.debug("client %s: authenticated as %s", peer, scram.principal)
                    return Session(scram.principal, peer)
            elif isinstance(ev, Request):
                # nothing but the exchange before it succeeded: refuse, then close
                output.queue(encode_response(
                    ErrorCode.AUTH_REQUIRED, ev.request_id, [b"authenticate first (SCRAM-SHA-256, docs/security.md)"]
                ))  # fmt: skip
                log.info("client %s: request %d before authentication; closing", peer, ev.code)
                return None
            else:  # an auth frame without an AUTH_REQUIRED answer: the codec refuses it
                await fatal(RemoteProtocolError(f"unexpected {type(ev).__name__} during the handshake"))
                return None
        if codec.peer_closed:
            return None
        data = await stream.receive_some(_RECV)
        codec.receive_data(data)
        if not data and codec.buffered == 0:
            return None
