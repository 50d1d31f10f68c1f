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
here (so the broker learns it and a taken port fails the start); the serving, its
accept loop and its limits are :mod:`equeue.client.httpserve`'s (shared with the web
console), each connection is Hypercorn's. Limits, so a
slow or hostile client cannot hold resources: at most ``max_connections``
connections at once (:class:`ConnectionCap`: one more is refused at once); a request head
of at most :data:`MAX_REQUEST_HEAD` bytes (more: 431 and closed); a connection
without a complete request within :data:`REQUEST_TIMEOUT` seconds of its opening
(or of its last answer) is closed, and so is a TLS handshake slower than that; an
answer left unread that long gets the connection dropped by the kernel.
With the broker's TLS settings the port serves HTTPS only. It stops with the broker.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

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
from equeue.client.httpserve import (
    BUSY_ANSWER,
    MAX_REQUEST_HEAD,
    REQUEST_TIMEOUT,
    ConnectionCap,
    HeadLimit,
    bind_listeners,
    hypercorn_config,
    serve_listeners,
)

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
    async with bind_listeners(host, port, ssl_context) as bound:
        ready = readiness or (lambda: Readiness(True, "standalone"))
        cap = ConnectionCap(max_connections)
        metrics = Metrics(
            statistics, store, queue_limit, ready=lambda: ready().ready, replication=replication,
            counters=counters, http=lambda: (cap.open, cap.refused), ephemeral=ephemeral, paused=paused,
        )  # fmt: skip
        app = http_app(metrics, ready)
        log.info("metrics on %s://%s:%d/metrics", "https" if ssl_context else "http", host, bound.port)
        task_status.started(bound.port)
        await serve_listeners(app, hypercorn_config(_server_log), bound.listeners, cap, shutdown)
