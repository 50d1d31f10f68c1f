"""The broker's HTTP port: an ASGI application (Starlette) served by Hypercorn's trio
per-connection server in the broker's own trio loop, behind a connection cap.

- ``GET /metrics``: Prometheus text format 0.0.4, through prometheus-client
  (:mod:`equeue.broker.metrics`: bounded, rendered off the loop);
- ``GET /stats``: JSON of the broker's statistics;
- ``GET /healthz``: 200 while the broker process serves (alive);
- ``GET /readyz``: 200 when the broker serves clients (standalone, its group's
  leader, or an in-sync follower, and in a cluster etcd reachable), else 503; the
  JSON body says why (:class:`Readiness`).

Started by :meth:`equeue.broker.server.Broker.serve` when ``BrokerConfig.http_port``
is not None (0: on a free port, ``Broker.http_port`` says which): the port is bound
here (so the broker learns it and a taken port fails the start); the accept loop
is ours (:func:`_serve_listeners`), each connection is Hypercorn's. Limits, so a
slow or hostile client cannot hold resources: at most ``max_connections``
connections at once (:class:`ConnectionCap`: one more is refused at once); a request head
of at most :data:`MAX_REQUEST_HEAD` bytes (more: 431 and closed); a connection
without a complete request within :data:`REQUEST_TIMEOUT` seconds of its opening
(or of its last answer) is closed, and so is a TLS handshake slower than that; an
answer left unread that long gets the connection dropped by the kernel.
With the broker's TLS settings the port serves HTTPS only. It stops with the broker.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from equeue import control
from equeue.broker.metrics import (
    Metrics,
    QueueSeries,
    ReplicationSample,
    Snapshot,
    render_broker,
    render_metrics,
    render_queues,
)
from equeue.broker.stats import Counters
from equeue.broker.storage import StoreReader

log = logging.getLogger("equeue.http")
#: Hypercorn's own log: its start-up lines ("Running on ... CTRL + C to quit") left
#: out, its errors (an exception in a request) kept
_server_log = logging.getLogger("equeue.http.server")
_server_log.setLevel(logging.WARNING)

__all__ = [
    "BUSY_ANSWER",
    "MAX_REQUEST_HEAD",
    "REQUEST_TIMEOUT",
    "ConnectionCap",
    "HeadLimit",
    "Metrics",
    "QueueSeries",
    "Readiness",
    "http_app",
    "render_broker",
    "render_metrics",
    "render_queues",
    "replica_readiness",
    "serve_http",
]

#: bytes of a request line and headers
MAX_REQUEST_HEAD = 8192
#: seconds a connection may take to send a whole request (or a TLS handshake)
REQUEST_TIMEOUT = 5.0
#: ms an answer may stay unread (unacknowledged, or held by a zero window) before
#: the kernel drops the connection (TCP_USER_TIMEOUT): Hypercorn's writes ignore
#: cancellation, so a client that never reads would otherwise hold its connection,
#: and the broker's stop, for ever
_SEND_TIMEOUT_MS = int(REQUEST_TIMEOUT * 1000)
_BUSY_BODY = b"too many connections to the HTTP port\n"
#: what a connection past the cap gets over plain HTTP before it is closed
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\nretry-after: 1\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
#: seconds a refused connection may take to take BUSY_ANSWER (a fresh socket's
#: buffer takes it at once: this only bounds a pathological peer)
_REFUSE_TIMEOUT = 1.0


@attrs.frozen
class Readiness:
    """``/readyz``'s answer: whether this broker serves clients now, its ``role``
    ("standalone", "leader", "follower", "stopping") and, when not ready, why."""

    ready: bool
    role: str
    reason: str = ""


def replica_readiness(
    status: control.ReplicationStatus, *, serving: bool, reads_held: bool, cut_off: bool
) -> Readiness:
    """A cluster member's readiness from its replication ``status``: etcd reachable
    (not ``cut_off``: a lease renewal succeeded lately) and either leading and
    ``serving`` (not fenced, reads not held after a promotion) or following a known
    leader as an in-sync replica that applied up to the high watermark."""
    role = status.role
    if cut_off:
        return Readiness(False, role, "etcd unreachable: no lease renewal succeeded lately")
    if role == "leader":
        if not serving:
            return Readiness(
                False, role, f"leader of group {status.group!r} but fenced or stepping down"
            )
        if reads_held:
            return Readiness(
                False,
                role,
                f"just promoted in group {status.group!r}: catching up the high watermark",
            )
        return Readiness(True, role)
    if not status.leader:
        return Readiness(False, role, f"group {status.group!r} has no leader now")
    if status.broker_id not in status.isr:
        return Readiness(
            False, role, f"not in group {status.group!r}'s in-sync replicas (catching up)"
        )
    if status.position < status.high_watermark:
        return Readiness(
            False, role, f"behind the high watermark ({status.position} < {status.high_watermark})"
        )
    return Readiness(True, role)


def http_app(metrics: Metrics, readiness: Callable[[], Readiness]) -> Starlette:
    """The ASGI application of the HTTP port (GET and HEAD only: other methods 405)."""

    async def get_metrics(request: Request) -> Response:
        params = {name: request.query_params.getlist(name) for name in ("queues", "topic")}
        body = await metrics.render(QueueSeries.from_params(params))
        return Response(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def get_stats(request: Request) -> Response:
        stats = control.converter.unstructure(metrics.stats())
        return Response(json.dumps(stats, indent=1).encode() + b"\n", media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"alive": True})

    async def readyz(request: Request) -> Response:
        r = readiness()
        return JSONResponse(attrs.asdict(r), status_code=200 if r.ready else 503)

    async def http_error(request: Request, exc: Exception) -> Response:
        """404 names the endpoints; other HTTP errors (405) as Starlette words them."""
        if isinstance(exc, HTTPException) and exc.status_code != 404:
            return PlainTextResponse(
                f"{exc.detail}\n", status_code=exc.status_code, headers=exc.headers
            )
        return PlainTextResponse("try /metrics, /stats, /healthz or /readyz\n", status_code=404)

    return Starlette(
        routes=[
            Route("/metrics", get_metrics, methods=["GET"]),
            Route("/stats", get_stats, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(HeadLimit)],
    )


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
    """The HTTP port's connection cap (Hypercorn has none): at most ``limit``
    connections are served at once; one more is refused at once, what it sent
    discarded (:data:`BUSY_ANSWER` and a FIN over plain HTTP; closed over HTTPS,
    where an answer would need a handshake first). ``open`` and ``refused`` are the
    ``equeue_http_connections`` and ``equeue_http_connections_refused_total``
    series (loop thread only)."""

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


async def _serve_listeners(
    app: ASGIApp, config: Config, listeners: list[trio.abc.Listener[Any]], cap: ConnectionCap,
    shutdown: Callable[[], Awaitable[None]] | None,
) -> None:  # fmt: skip
    """Hypercorn's trio worker, less what the broker does not use (lifespan events,
    QUIC, several workers), with the connection cap in front of its per-connection
    server: accept until ``shutdown`` returns (or cancelled), then give the
    connections in flight ``config.graceful_timeout`` seconds."""
    context = WorkerContext(None)
    wrapped = ASGIWrapper(app)  # type: ignore[arg-type]  # Starlette types ASGI loosely

    async def connection(stream: trio.abc.Stream) -> None:
        server = _Connection(wrapped, config, context, ConnectionState({}), stream)  # type: ignore[arg-type]
        await server.run()

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


def _config() -> Config:
    """Hypercorn's settings for the broker's HTTP port (the limits of the module docstring)."""
    config = Config()
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD
    config.h2_max_header_list_size = MAX_REQUEST_HEAD
    config.h2_max_concurrent_streams = 8
    config.keep_alive_timeout = REQUEST_TIMEOUT
    config.read_timeout = int(REQUEST_TIMEOUT)
    config.ssl_handshake_timeout = REQUEST_TIMEOUT
    config.graceful_timeout = 1.0
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = _server_log
    return config


async def serve_http(
    statistics: Snapshot, store: StoreReader, host: str, port: int, *, queue_limit: int = 10_000,
    max_connections: int = 256, ssl_context: ssl.SSLContext | None = None,
    readiness: Callable[[], Readiness] | None = None, shutdown: Callable[[], Awaitable[None]] | None = None,
    replication: Callable[[], ReplicationSample | None] = lambda: None, counters: Counters | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
    ephemeral: Callable[[], Mapping[tuple[str, str, int], int]] = dict,
    paused: Callable[[], tuple[frozenset[str], frozenset[str]]] | None = None,
) -> None:  # fmt: skip
    """Serve the HTTP port until ``shutdown`` returns (then in-flight requests get a
    second) or until cancelled; ``task_status.started(bound_port)``. ``queue_limit``:
    most queues with per-queue series in one scrape; ``max_connections``: connections
    served at once (:class:`ConnectionCap`). ``readiness``: ``/readyz``'s
    answer (default: ready, standalone); ``replication``: a cluster member's state
    for the ``equeue_replication_*`` series (None: standalone); ``counters``: the
    broker's, for the latency histograms (None: none); ``ephemeral``: a copy
    of the live ephemeral groups' offsets, for their lag series; ``paused``: the paused
    topics and groups (None: the store's). With ``ssl_context`` (the broker's,
    :mod:`equeue.broker.tls`) it serves HTTPS. Raises OSError when the port cannot
    be bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        bound: int = listeners[0].socket.getsockname()[1]
        for listener in listeners:  # accepted sockets inherit it: see _SEND_TIMEOUT_MS
            listener.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _SEND_TIMEOUT_MS)
        served: list[trio.abc.Listener[Any]] = list(listeners)
        if ssl_context is not None:
            served = [trio.SSLListener(listener, ssl_context, https_compatible=True) for listener in listeners]
        ready = readiness or (lambda: Readiness(True, "standalone"))
        cap = ConnectionCap(max_connections)
        metrics = Metrics(
            statistics, store, queue_limit, ready=lambda: ready().ready, replication=replication,
            counters=counters, http=lambda: (cap.open, cap.refused), ephemeral=ephemeral, paused=paused,
        )  # fmt: skip
        app = http_app(metrics, ready)
        log.info("metrics on %s://%s:%d/metrics", "https" if ssl_context else "http", host, bound)
        task_status.started(bound)
        await _serve_listeners(app, _config(), served, cap, shutdown)
    finally:
        for listener in listeners:
            listener.socket.close()
