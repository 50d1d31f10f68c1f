"""A tiny HTTP/1.1 endpoint for monitoring: ``GET /metrics`` (Prometheus text
format 0.0.4) and ``GET /stats`` (JSON of the broker's statistics).

Started by :meth:`equeue.broker.server.Broker.serve` when ``BrokerConfig.http_port`` is not
None (0: on a free port, ``Broker.http_port`` says which). One request per connection (``Connection: close``); requests are capped at 8 KiB
and 5 s, so a slow or hostile scraper cannot hold resources.

``/metrics`` is bounded whatever the broker holds: by default it has the broker's
series and per-topic totals (a few lines per topic; 200 topics x 1,024 queues used
to be 48 MB of per-queue series and a second of the event loop per scrape).
Per-queue series come only on request, ``?queues=1`` (every topic) or
``?topic=NAME`` (repeatable), for at most ``metrics_queue_limit`` queues; the
``equeue_metrics_queues_omitted`` gauge counts the queues left out. The text is
rendered in a worker thread, one scrape at a time, from the store's published view
(immutable: nothing the writer thread does changes it); only the statistics
snapshot (the loop's counters) is taken on the loop.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import attrs
import trio

from equeue import control
from equeue.broker.storage import StoreReader, StoreView

log = logging.getLogger("equeue.http")

__all__ = [
    "Metrics", "QueueSeries", "open_http_listeners", "render_broker", "render_metrics", "render_queues", "serve_http",
]

_MAX_REQUEST = 8192
#: queues summed between two GIL releases of the render thread
_YIELD_EVERY = 2048
#: seconds a rendered set of topic and queue series is served again
RENDER_INTERVAL = 1.0
#: distinct /metrics queries whose series are kept for RENDER_INTERVAL
CACHED_QUERIES = 8
_REQUEST_TIMEOUT = 5.0

#: (BrokerStats field, metric name, type, help)
_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("uptime_s", "equeue_uptime_seconds", "gauge", "Seconds since the broker started."),
    ("connections", "equeue_connections", "gauge", "Open client connections."),
    ("topics", "equeue_topics", "gauge", "Topics, internal ones included."),
    ("messages_in", "equeue_messages_in_total", "counter", "Messages stored by produce requests."),
    ("messages_out", "equeue_messages_out_total", "counter", "Messages returned by pulls."),
    ("bytes_in", "equeue_bytes_in_total", "counter", "Bytes of produce request payloads."),
    ("bytes_out", "equeue_bytes_out_total", "counter", "Bytes sent to clients."),
    ("produce_rate", "equeue_produce_rate", "gauge", "Messages stored per second (recent)."),
    ("pull_rate", "equeue_pull_rate", "gauge", "Messages pulled per second (recent)."),
    ("parked_pulls", "equeue_parked_pulls", "gauge", "Pulls waiting for a message (long-poll)."),
    ("next_global_offset", "equeue_next_global_offset", "gauge", "Global offset of the next stored message."),
    ("store_bytes", "equeue_store_bytes", "gauge", "Bytes of the LMDB map in use."),
    ("map_size", "equeue_map_size_bytes", "gauge", "LMDB map size (the store's maximum)."),
    ("transactions", "equeue_write_transactions_total", "counter", "Group-commit write transactions."),
    ("inline_transactions", "equeue_write_transactions_inline_total", "counter", "Write transactions committed on the event loop (--flush async inline commits)."),
    ("inline_max_seconds", "equeue_write_inline_max_seconds", "gauge", "Longest inline commit (the event loop's worst pause from one)."),
    ("pending_delayed", "equeue_pending_delayed", "gauge", "Delayed messages not yet due."),
    ("connections_refused", "equeue_connections_refused_total", "counter", "Connections refused past --max-connections."),
    ("connections_dropped", "equeue_connections_dropped_total", "counter", "Connections closed by a limit (output buffer, frame or idle timeout)."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: the broker's statistics now
Snapshot = Callable[[], control.BrokerStats]


#: per-topic totals: (metric name, type, help)
_PER_TOPIC: tuple[tuple[str, str, str], ...] = (
    ("equeue_topic_queues", "gauge", "Queues of the topic."),
    ("equeue_topic_messages", "gauge", "Messages retained in the topic."),
    ("equeue_topic_bytes", "gauge", "Bytes of records retained in the topic."),
    ("equeue_topic_appended_total", "counter", "Messages ever appended to the topic (sum of its queues' max offsets)."),
)
_PER_QUEUE: tuple[tuple[str, str], ...] = (
    ("equeue_queue_min_offset", "Lowest retained queue offset."),
    ("equeue_queue_max_offset", "Next queue offset to be written."),
    ("equeue_queue_messages", "Messages retained in the queue."),
    ("equeue_queue_bytes", "Bytes of records retained in the queue."),
)


@attrs.frozen
class QueueSeries:
    """Which per-queue series a scrape asked for: ``every`` topic (``?queues=1``),
    or the ``topics`` named (``?topic=``); none by default."""

    every: bool = False
    topics: frozenset[str] = frozenset()

    @classmethod
    def from_query(cls, query: str) -> QueueSeries:
        q = parse_qs(query)
        return cls(q.get("queues", ["0"])[-1] in ("1", "true", "yes"), frozenset(q.get("topic", ())))

    def wants(self, topic: str) -> bool:
        return self.every or topic in self.topics


def render_metrics(
    s: control.BrokerStats, view: StoreView, series: QueueSeries | None = None, queue_limit: int = 10_000
) -> str:
    """The broker's metrics in the Prometheus text exposition format: the broker's
    series from ``s``, then :func:`render_queues`. Pure: any thread may run it."""
    return render_broker(s) + render_queues(view, series, queue_limit)


def render_broker(s: control.BrokerStats) -> str:
    """The broker-wide series (cheap: a few dozen lines)."""
    out: list[str] = []
    for field, name, kind, text in _METRICS:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {getattr(s, field)}"]
    out += [
        "# HELP equeue_info Broker version and flush policy.",
        "# TYPE equeue_info gauge",
        f'equeue_info{{version="{_label(s.version)}",flush="{_label(s.flush)}"}} 1',
    ]
    return "\n".join(out) + "\n"


def render_queues(view: StoreView, series: QueueSeries | None = None, queue_limit: int = 10_000) -> str:
    """Per-topic totals, and the per-queue series ``series`` asks for (at most
    ``queue_limit`` queues), from ``view``: one pass over its queues. Pure: any
    thread may run it (it lets the GIL go now and then)."""
    series = series or QueueSeries()
    out: list[str] = []
    # one pass over the queues the view knows (a queue never written to has no entry);
    # in a worker thread, let the GIL go now and then so the event loop never waits
    # a whole switch interval for it
    sums: dict[int, list[int]] = {}
    for i, (topic_id, _q, st) in enumerate(view.all_queues()):
        if not i % _YIELD_EVERY:
            time.sleep(0)
        acc = sums.get(topic_id)
        if acc is None:
            acc = sums[topic_id] = [0, 0, 0]
        acc[0] += st.next_offset - st.min_offset
        acc[1] += st.bytes
        acc[2] += st.next_offset
    totals: list[tuple[str, tuple[int, int, int, int]]] = []
    rows: list[tuple[str, int, int, int, int, int]] = []  # topic, queue, min, max, messages, bytes
    omitted = 0
    for info in sorted(view.topics.values(), key=lambda t: t.name):
        retained, size, appended = sums.get(info.topic_id, (0, 0, 0))
        totals.append((_label(info.name), (info.queues, retained, size, appended)))
        if not series.wants(info.name):
            continue
        room = max(0, min(info.queues, queue_limit - len(rows)))
        omitted += info.queues - room
        time.sleep(0)
        for q in range(room):
            st = view.queue(info.topic_id, q)
            rows.append((info.name, q, st.min_offset, st.next_offset, st.next_offset - st.min_offset, st.bytes))
    for i, (name, kind, text) in enumerate(_PER_TOPIC):
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        out += [f'{name}{{topic="{topic}"}} {values[i]}' for topic, values in totals]
    out += [
        "# HELP equeue_metrics_queues_omitted Queues whose per-queue series this scrape left out (over the limit).",
        "# TYPE equeue_metrics_queues_omitted gauge",
        f"equeue_metrics_queues_omitted {omitted}",
    ]
    if rows:
        for i, (name, text) in enumerate(_PER_QUEUE):
            out += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
            out += [f'{name}{{topic="{_label(r[0])}",queue="{r[1]}"}} {r[2 + i]}' for r in rows]
    return "\n".join(out) + "\n"


class Metrics:
    """Renders ``/metrics`` off the loop, one scrape at a time: the broker's series
    from a statistics snapshot taken on the loop, the topic and queue series in a
    worker thread from the store's immutable published view.

    The topic and queue part is reused for :data:`RENDER_INTERVAL` seconds (per
    query, the last :data:`CACHED_QUERIES` of them), so scrapes back to back cost
    one pass over the queues a second at most; the broker's series are always fresh.
    """

    def __init__(self, statistics: Snapshot, store: StoreReader, queue_limit: int) -> None:
        self._statistics = statistics
        self._store = store
        self._queue_limit = queue_limit
        self._limiter = trio.CapacityLimiter(1)
        #: query -> (trio time rendered, its topic and queue series)
        self._recent: dict[QueueSeries, tuple[float, str]] = {}

    async def render(self, series: QueueSeries) -> bytes:
        """The metrics text (UTF-8); waits for a scrape already rendering."""
        async with self._limiter:
            now = trio.current_time()
            hit = self._recent.get(series)
            if hit is None or now - hit[0] >= RENDER_INTERVAL:
                view = self._store.view
                queues = await trio.to_thread.run_sync(render_queues, view, series, self._queue_limit)
                self._recent.pop(series, None)
                self._recent[series] = hit = (now, queues)
                while len(self._recent) > CACHED_QUERIES:
                    del self._recent[next(iter(self._recent))]
            text = render_broker(self._statistics()) + hit[1]
        return text.encode()

    def stats(self) -> control.BrokerStats:
        return self._statistics()


def _response(status: str, ctype: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def _handle(metrics: Metrics, stream: trio.abc.Stream) -> None:
    try:
        buf = b""
        with trio.move_on_after(_REQUEST_TIMEOUT):
            while b"\r\n\r\n" not in buf and len(buf) < _MAX_REQUEST:
                data = await stream.receive_some(4096)
                if not data:
                    break
                buf += data
        line = buf.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if b"\r\n\r\n" not in buf or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            reply = _response("400 Bad Request", "text/plain", b"bad request\n")
        elif parts[0] not in ("GET", "HEAD"):
            reply = _response("405 Method Not Allowed", "text/plain", b"only GET\n")
        else:
            path, _, query = parts[1].partition("?")
            if path == "/metrics":
                body = await metrics.render(QueueSeries.from_query(query))
                reply = _response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
            elif path == "/stats":
                stats = control.converter.unstructure(metrics.stats())
                reply = _response("200 OK", "application/json", json.dumps(stats, indent=1).encode() + b"\n")
            else:
                reply = _response("404 Not Found", "text/plain", b"try /metrics or /stats\n")
            if parts[0] == "HEAD":
                reply = reply.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
        with trio.move_on_after(_REQUEST_TIMEOUT):
            await stream.send_all(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:  # a bug must not take the broker down
        log.exception("HTTP request failed")
    finally:
        await trio.aclose_forcefully(stream)


async def open_http_listeners(
    host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[int, list[trio.abc.Listener[Any]]]:
    """The endpoint's bound port and listeners: TCP, wrapped in TLS when
    ``ssl_context`` is given."""
    tcp = await trio.open_tcp_listeners(port, host=host)
    bound: int = tcp[0].socket.getsockname()[1]
    if ssl_context is None:
        return bound, list(tcp)
    return bound, [trio.SSLListener(lst, ssl_context, https_compatible=True) for lst in tcp]


async def serve_http(
    statistics: Snapshot, store: StoreReader, host: str, port: int, *, queue_limit: int = 10_000,
    ssl_context: ssl.SSLContext | None = None, task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve /metrics and /stats until cancelled; ``task_status.started(bound_port)``.
    ``queue_limit``: most queues with per-queue series in one scrape. With
    ``ssl_context`` (the broker's, :mod:`equeue.broker.tls`) it serves HTTPS; the TLS
    handshake happens within the request's time cap."""
    bound, listeners = await open_http_listeners(host, port, ssl_context)
    log.info("metrics on %s://%s:%d/metrics", "https" if ssl_context else "http", host, bound)
    task_status.started(bound)
    metrics = Metrics(statistics, store, queue_limit)

    async def handler(stream: trio.abc.Stream) -> None:
        await _handle(metrics, stream)

    await trio.serve_listeners(handler, listeners)
