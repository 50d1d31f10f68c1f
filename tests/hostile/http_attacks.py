"""Hostile HTTP clients, each a function of ``(host, port)``, for any HTTP port of the
project (the broker's, a web console's): the hostile tests use them, and so does
``bench/bench_http_hostile.py``. Plain HTTP/1.1 over TCP; every loop is bounded.

- :func:`oversized_headers`: one request whose head is far over a sane cap; returns
  the answer (its status line is what matters: 431 expected).
- :func:`slowloris`: a request head sent one byte per ``interval`` seconds; returns
  whether the server closed the connection before ``give_up`` seconds (and how many
  bytes it took until then).
- :func:`idle_connections`: ``async with idle_connections(host, port, n) as idle:``
  ``n`` connections that send nothing; ``idle.refused`` counts those answered 503,
  ``idle.closed`` those the server closed (refused or timed out); all are closed on
  exit.
- :func:`http_status`: one ``GET`` on a fresh connection: its status code, or None
  when the connection was closed without an answer.
- :func:`raise_fd_limit`: the soft limit on open files raised to the hard one (a
  thousand connections need two thousand descriptors when both ends are here).
"""

from __future__ import annotations

import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

__all__ = [
    "IdleConnections",
    "Slowloris",
    "http_status",
    "idle_connections",
    "oversized_headers",
    "raise_fd_limit",
    "slowloris",
]

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it);
    returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return int(soft)


async def _read_all(stream: trio.abc.Stream, limit: int = 1 << 20) -> bytes:
    """Read until the peer closes (or resets) the connection, at most ``limit`` bytes."""
    data = b""
    try:
        while len(data) < limit and (chunk := await stream.receive_some(65536)):
            data += chunk
    except _CLOSED:
        pass
    return data


async def http_status(host: str, port: int, path: str = "/healthz") -> int | None:
    """``GET path`` on a fresh connection (``Connection: close``): the answer's status
    code, or None when the server closed the connection without one."""
    try:
        s = await trio.open_tcp_stream(host, port)
    except OSError:
        return None
    async with s:
        try:
            await s.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        except _CLOSED:
            pass
        answer = await _read_all(s)
    parts = answer.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return None
    return int(parts[1])


async def oversized_headers(host: str, port: int, size: int = 64 * 1024) -> bytes:
    """One ``GET /`` whose head carries a ``size``-byte header; returns whatever the
    server answered before it closed the connection (``b""``: nothing)."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    s = await trio.open_tcp_stream(host, port)
    async with s:
        try:
            await s.send_all(head)
        except _CLOSED:
            pass  # closed while sending: what it answered first is still read
        return await _read_all(s)


@attrs.frozen
class Slowloris:
    """How a slowloris connection ended: ``closed`` by the server (True) or given up
    on by the client; ``sent`` bytes of the head sent until then; ``answer`` what
    the server sent (e.g. a 408, or nothing)."""

    closed: bool
    sent: int
    answer: bytes


async def slowloris(host: str, port: int, *, interval: float = 1.0, give_up: float = 30.0) -> Slowloris:
    """Open a connection, send a request line, then one byte of a header every
    ``interval`` seconds (the head never ends), until the server closes the
    connection or ``give_up`` seconds passed."""
    s = await trio.open_tcp_stream(host, port)
    sent = 0
    got: list[bytes] = []
    async with s:
        with trio.move_on_after(give_up):
            async with trio.open_nursery() as n:

                async def watch() -> None:
                    got.append(await _read_all(s))
                    n.cancel_scope.cancel()

                n.start_soon(watch)
                try:
                    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "
                    await s.send_all(head)
                    sent = len(head)
                    while True:
                        await trio.sleep(interval)  # the attacker's pace, not a synchronisation
                        await s.send_all(b"a")
                        sent += 1
                except _CLOSED:
                    await trio.sleep_forever()  # the watcher sees the close
    return Slowloris(closed=bool(got), sent=sent, answer=got[0] if got else b"")


@attrs.define
class IdleConnections:
    """Connections that send nothing: each one's answer once the server closed it."""

    opened: int = 0
    #: what each connection the server closed received (in the order they closed)
    answers: list[bytes] = attrs.field(factory=list)

    @property
    def closed(self) -> int:
        """Connections the server closed (refused, or timed out)."""
        return len(self.answers)

    @property
    def refused(self) -> int:
        """Connections answered ``503`` (refused past a connection cap)."""
        return sum(1 for a in self.answers if a.startswith(b"HTTP/1.1 503") or a.startswith(b"HTTP/1.0 503"))


@asynccontextmanager
async def idle_connections(host: str, port: int, n: int) -> AsyncIterator[IdleConnections]:
    """Open ``n`` connections that send nothing (one after the other), watch each for
    the server's close; close them all on exit. Raises OSError when one cannot be
    opened (e.g. out of file descriptors: see :func:`raise_fd_limit`)."""
    idle = IdleConnections()
    streams: list[trio.SocketStream] = []
    try:
        async with trio.open_nursery() as nursery:

            async def watch(s: trio.SocketStream) -> None:
                idle.answers.append(await _read_all(s, 4096))

            try:
                for _ in range(n):
                    s = await trio.open_tcp_stream(host, port)
                    streams.append(s)
                    idle.opened += 1
                    nursery.start_soon(watch, s)
                yield idle
            finally:
                nursery.cancel_scope.cancel()
    finally:
        for s in streams:
            s.socket.close()
