"""One live connection of a client: the stream, the codec state, the pending answers
(:class:`PendingReply`), and the broker address list parser.

:class:`equeue.client.transport.Transport` owns at most one :class:`_Link` at a time and
replaces it when it breaks; every pending answer of a broken link fails with the
link's error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from equeue.codec import Connection, Response
from equeue.config import parse_address
from equeue.errors import ConfigError

__all__ = ["PendingReply", "parse_brokers"]


def parse_brokers(brokers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h:p"``, ``"h1:p1,h2:p2"`` or a list of them → [(host, port), ...]."""
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    out = [parse_address(b) for b in items if b and b.strip()]
    if not out:
        raise ConfigError("no broker address given")
    return out


class _Slot:
    """A pending answer: ``done`` is set once ``result`` holds the response or the
    failure; ``notify`` (optional) is called right after, in the loop thread."""

    __slots__ = ("done", "notify", "result")

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self.done = trio.Event()
        self.result: Response | BaseException | None = None
        self.notify = notify

    def set(self, result: Response | BaseException) -> None:
        self.result = result
        self.done.set()
        if self.notify is not None:
            self.notify()


PendingReply = _Slot


class _Link:
    """One live connection: stream, codec (past the handshake:
    :class:`equeue.client.handshake.ClientHandshake` made it), pending requests."""

    def __init__(self, stream: trio.abc.Stream, address: str, codec: Connection) -> None:
        self.stream = stream
        #: the socket a plain TCP link writes directly (non-blocking); None with TLS,
        #: whose bytes only the SSLStream may write
        self.socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.address = address
        self.codec = codec
        self.pending: dict[int, _Slot] = {}
        self.send_lock = trio.Lock()
        #: encoded frames waiting for the next write (in request order)
        self.outbox: list[bytes] = []
        self.broken: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
        pending, self.pending = self.pending, {}
        for slot in pending.values():
            slot.set(exc)
