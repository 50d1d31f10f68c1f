"""A tiny HTTP/1.1 endpoint for monitoring: ``GET /metrics`` (Prometheus text
format 0.0.4) and ``GET /stats`` (JSON of the broker's statistics).

Started by :meth:`broker.server.Broker.serve` when ``BrokerConfig.http_port`` is not
0. One request per connection (``Connection: close``); requests are capped at 8 KiB
and 5 s, so a slow or hostile scraper cannot hold resources.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

import trio

from broker.storage import StoreReader
from equeue import control

log = logging.getLogger("equeue.http")

__all__ = ["render_metrics", "serve_http"]

_MAX_REQUEST = 8192
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
    ("pending_delayed", "equeue_pending_delayed", "gauge", "Delayed messages not yet due."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: the broker's statistics now
Snapshot = Callable[[], control.BrokerStats]


def render_metrics(statistics: Snapshot, store: StoreReader) -> str:
    """The broker's metrics in the Prometheus text exposition format."""
    s = statistics()
    out: list[str] = []
    for field, name, kind, text in _METRICS:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {getattr(s, field)}"]
    out += [
        "# HELP equeue_info Broker version and flush policy.",
        "# TYPE equeue_info gauge",
        f'equeue_info{{version="{_label(s.version)}",flush="{_label(s.flush)}"}} 1',
    ]
    per_queue = (
        ("equeue_queue_min_offset", "Lowest retained queue offset."),
        ("equeue_queue_max_offset", "Next queue offset to be written."),
        ("equeue_queue_messages", "Messages retained in the queue."),
        ("equeue_queue_bytes", "Bytes of records retained in the queue."),
    )
    rows: list[tuple[str, int, Any]] = []
    for info in sorted(store.topics.values(), key=lambda t: t.name):
        for q in range(info.queues):
            rows.append((info.name, q, store.queue_state(info.topic_id, q)))
    for i, (name, text) in enumerate(per_queue):
        out += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for topic, q, st in rows:
            value = (st.min_offset, st.next_offset, st.next_offset - st.min_offset, st.bytes)[i]
            out.append(f'{name}{{topic="{_label(topic)}",queue="{q}"}} {value}')
    return "\n".join(out) + "\n"


def _response(status: str, ctype: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def _handle(statistics: Snapshot, store: StoreReader, stream: trio.abc.Stream) -> None:
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
            path = parts[1].split("?", 1)[0]
            if path == "/metrics":
                body = render_metrics(statistics, store).encode()
                reply = _response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
            elif path == "/stats":
                stats = control.converter.unstructure(statistics())
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


async def serve_http(
    statistics: Snapshot, store: StoreReader, host: str, port: int, *,
    ssl_context: ssl.SSLContext | None = None, task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve /metrics and /stats until cancelled; ``task_status.started(bound_port)``.
    With ``ssl_context`` (the broker's, :mod:`broker.tls`) it serves HTTPS; the TLS
    handshake happens within the request's time cap."""
    tcp = await trio.open_tcp_listeners(port, host=host)
    bound = tcp[0].socket.getsockname()[1]
    listeners: list[trio.abc.Listener[Any]] = list(tcp)
    if ssl_context is not None:
        listeners = [trio.SSLListener(lst, ssl_context, https_compatible=True) for lst in tcp]
    log.info("metrics on %s://%s:%d/metrics", "https" if ssl_context else "http", host, bound)
    task_status.started(bound)

    async def handler(stream: trio.abc.Stream) -> None:
        await _handle(statistics, store, stream)

    await trio.serve_listeners(handler, listeners)
