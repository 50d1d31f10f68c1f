"""HTTP serving shared by the broker's HTTP port (:mod:`equeue.broker.http`) and the
web console (:mod:`equeue.cli.console.server`): an ASGI application served by
Hypercorn's trio per-connection server behind our own accept loop, with limits so
that a slow or hostile client cannot hold resources.

- :class:`HeadLimit`: a request line and headers of at most :data:`MAX_REQUEST_HEAD`
  bytes (more: 431 and closed);
- :func:`hypercorn_config`: a connection without a complete request within
  :data:`REQUEST_TIMEOUT` seconds of its opening (or of its last answer) is closed
  (slowloris), and so is a TLS handshake slower than that;
- :func:`bind_listeners`: the port bound here (the caller learns it, a taken port
  fails at once), ``TCP_USER_TIMEOUT`` on it (an answer left unread that long gets
  the connection dropped by the kernel), wrapped in TLS when given a context;
- :class:`ConnectionCap` and :func:`serve_listeners`: at most ``limit``
  connections served at once, one more refused at once (503 then closed); a
  connection that fails inside Hypercorn is closed and logged (rate-limited), and
  the server goes on.

It imports neither the broker nor the console (``.importlinter``).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from equeue.logs import RateLimitedLog

__all__ = [
    "BUSY_ANSWER",
    "MAX_REQUEST_HEAD",
    "REQUEST_TIMEOUT",
    "Bound",
    "ConnectionCap",
    "HeadLimit",
    "bind_listeners",
    "hypercorn_config",
    "serve_listeners",
]

_log = logging.getLogger("equeue.http")

#: bytes of a request line and headers
MAX_REQUEST_HEAD = 8192
#: seconds a connection may take to send a whole request (or a TLS handshake)
REQUEST_TIMEOUT = 5.0
#: ms an answer may stay unread (unacknowledged, or held by a zero window) before
#: the kernel drops the connection (TCP_USER_TIMEOUT): Hypercorn's writes ignore
#: cancellation, so a client that never reads would otherwise hold its connection,
#: and the server's stop, for ever
SEND_TIMEOUT_MS = int(REQUEST_TIMEOUT * 1000)
_BUSY_BODY = b"too many connections to the HTTP port\n"
#: what a connection past the cap gets over plain HTTP before it is closed
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\nretry-after: 1\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
#: seconds a refused connection may take to take BUSY_ANSWER (a fresh socket's
#: buffer takes it at once: this only bounds a pathological peer)
_REFUSE_TIMEOUT = 1.0


class HeadLimit:
    """ASGI middleware: 431 for a request whose line and headers exceed ``limit``
    bytes. Hypercorn caps what it buffers of an incomplete head
    (``h11_max_incomplete_size``), but a whole head that arrives in one read (up to
    64 KiB) passes that cap: this checks the parsed head."""

    def __init__(self, app: ASGIApp, limit: int = MAX_REQUEST_HEAD) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            size += sum(len(k) + len(v) + 4 for k, v in scope["headers"])
            if size > self.limit:
                answer = PlainTextResponse(
                    "request header fields too large\n",
                    status_code=431,
                    headers={"connection": "close"},
                )
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ConnectionCap:
    """A connection cap (Hypercorn has none): at most ``limit`` connections are
    served at once; one more is refused at once, what it sent discarded
    (:data:`BUSY_ANSWER` and a FIN over plain HTTP; closed over HTTPS, where an
    answer would need a handshake first). ``open`` and ``refused`` count the
    connections served now and refused so far (loop thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0

    async def serve(self, stream: trio.abc.Stream, serve: Callable[[trio.abc.Stream], Awaitable[None]]) -> None:
        """``await serve(stream)`` when under the cap, else refuse ``stream``; closes it either way."""
        if self.open >= self.limit:
            self.refused += 1
            if isinstance(stream, trio.SocketStream):
                with trio.move_on_after(_REFUSE_TIMEOUT):
                    try:
                        await stream.send_all(BUSY_ANSWER)
                        stream.socket.shutdown(socket.SHUT_WR)  # the answer, then a FIN
                        _discard_received(stream.socket.fileno())
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
            await trio.aclose_forcefully(stream)
            return
        self.open += 1
        try:
            await serve(stream)
        finally:
            self.open -= 1
            await trio.aclose_forcefully(stream)


def _discard_received(fd: int) -> None:
    """Read and drop what a refused client sent already (non-blocking, a few reads at
    most): a socket closed with unread data is reset at once, which may drop the
    answer still on its way and show the client a reset instead of the 503."""
    for _ in range(4):
        try:
            if not os.read(fd, 65536):
                return
        except (BlockingIOError, OSError):
            return


class _Connection(TCPServer):
    """Hypercorn's per-connection server, which ends with its peer: Hypercorn's own
    keeps the connection's task (and so its place under the cap) until the idle
    timer it started runs out, seconds after the peer left."""

    async def _read_data(self) -> None:
        await super()._read_data()
        await self.idle_task.stop()  # the peer left or the connection closed: no timer to wait for


def hypercorn_config(
    errorlog: logging.Logger, *, read_timeout: float = REQUEST_TIMEOUT, h2_max_concurrent_streams: int = 8
) -> Config:
    """Hypercorn's settings with the limits of the module docstring; ``errorlog``
    gets Hypercorn's errors (an exception in a request), no access log.
    ``read_timeout``: seconds a read may wait while a request is answered."""
    config = Config()
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD
    config.h2_max_header_list_size = MAX_REQUEST_HEAD
    config.h2_max_concurrent_streams = h2_max_concurrent_streams
    config.keep_alive_timeout = REQUEST_TIMEOUT
    config.read_timeout = int(read_timeout)
    config.ssl_handshake_timeout = REQUEST_TIMEOUT
    config.graceful_timeout = 1.0
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = errorlog
    return config


@attrs.frozen
class Bound:
    """Listeners bound by :func:`bind_listeners`: the ``port`` (the first listener's)
    and the ``listeners`` to serve (TLS-wrapped when a context was given)."""

    port: int
    listeners: list[trio.abc.Listener[Any]]


@asynccontextmanager
async def bind_listeners(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Bound]:
    """Bind ``host:port`` (0: a free port) with ``TCP_USER_TIMEOUT`` (accepted
    sockets inherit it: see :data:`SEND_TIMEOUT_MS`); with ``ssl_context`` the
    listeners serve TLS only. The sockets close at the block's end. Raises OSError
    when the port cannot be bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        bound: int = listeners[0].socket.getsockname()[1]
        for listener in listeners:
            listener.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, SEND_TIMEOUT_MS)
        served: list[trio.abc.Listener[Any]] = list(listeners)
        if ssl_context is not None:
            served = [trio.SSLListener(listener, ssl_context, https_compatible=True) for listener in listeners]
        yield Bound(bound, served)
    finally:
        for listener in listeners:
            listener.socket.close()


async def serve_listeners(
    app: ASGIApp, config: Config, listeners: list[trio.abc.Listener[Any]], cap: ConnectionCap,
    shutdown: Callable[[], Awaitable[None]] | None = None,
) -> None:  # fmt: skip
    """Hypercorn's trio worker, less what we do not use (lifespan events: the caller
    runs its application's own; QUIC; several workers), with the connection ``cap``
    in front of its per-connection server: accept until ``shutdown`` returns (None:
    until cancelled), then give the connections in flight ``config.graceful_timeout``
    seconds."""
    context = WorkerContext(None)
    errorlog = config.errorlog if isinstance(config.errorlog, logging.Logger) else _log
    failures = RateLimitedLog(errorlog, 10.0, trio.current_time)
    wrapped = ASGIWrapper(app)  # type: ignore[arg-type]  # Starlette types ASGI loosely

    async def connection(stream: trio.abc.Stream) -> None:
        server = _Connection(wrapped, config, context, ConnectionState({}), stream)  # type: ignore[arg-type]
        try:
            await server.run()
        except Exception as exc:
            # a fault inside Hypercorn ends this connection, never the server (an HTTP/2
            # client can reach states it does not handle: a body still arriving after
            # its answer raises KeyError in its h2 protocol)
            failures.log(logging.WARNING, "connection", "an HTTP connection failed inside the server: closed",
                         fields={"error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            await trio.aclose_forcefully(stream)

    async def handle(stream: trio.abc.Stream) -> None:
        await cap.serve(stream, connection)

    async with trio.open_nursery() as connections:
        try:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(functools.partial(trio.serve_listeners, handle, listeners, handler_nursery=connections))
                if shutdown is None:
                    await trio.sleep_forever()
                await shutdown()
                accepting.cancel_scope.cancel()
        finally:
            # keep-alive connections close after their answer in flight; the rest is cut
            await context.terminated.set()
            connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
