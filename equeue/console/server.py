"""Serving the console: Hypercorn's trio worker on a port this module binds.

The protections are the broker's HTTP port's (``broker/http.py``): a request head
of at most :data:`~equeue.console.app.MAX_REQUEST_HEAD` bytes (more: 431 and
closed), a connection without a whole request within :data:`REQUEST_TIMEOUT` s of
its opening or its last answer is closed (slowloris: Hypercorn's keep-alive
timeout runs while no request is being answered), and so is a TLS handshake
slower than that; an answer left unread that long gets the connection dropped by the
kernel (``TCP_USER_TIMEOUT``).

:func:`serve_console` serves until cancelled; :func:`open_console` serves in the
background of an ``async with`` (port 0: a free port) and yields the URL.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio import serve

from equeue.console.app import MAX_REQUEST_HEAD, PAGE_BUDGET, Console, ConsoleConfig
from equeue.errors import ConfigError

__all__ = ["REQUEST_TIMEOUT", "open_console", "serve_console", "server_context"]

log = logging.getLogger("equeue.console")
_server_log = logging.getLogger("equeue.console.server")
_server_log.setLevel(logging.WARNING)

#: seconds a connection may take to send a whole request (or a TLS handshake)
REQUEST_TIMEOUT = 5.0
_SEND_TIMEOUT_MS = int(REQUEST_TIMEOUT * 1000)
#: seconds a read may wait while a request is answered: longer than a page's
#: budget (a page asks the brokers), else the answer would be cut off
_READ_TIMEOUT = int(PAGE_BUDGET) + 5


def server_context(certfile: str | Path, keyfile: str | Path | None = None) -> ssl.SSLContext:
    """The console's HTTPS context from a PEM certificate chain and key. Raises
    ConfigError for a missing or unreadable file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the console's certificate {certfile}: {exc}") from None
    return ctx


class _Config(Config):
    """Hypercorn's settings with our TLS context and the sockets bound here."""

    def __init__(self, ssl_context: ssl.SSLContext | None, sockets: list[socket.socket]) -> None:
        self._ssl_context = ssl_context
        self._sockets = sockets

    @property
    def ssl_enabled(self) -> bool:
        return self._ssl_context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl_context

    def create_sockets(self) -> Sockets:
        if self._ssl_context is not None:
            return Sockets(list(self._sockets), [], [])
        return Sockets([], list(self._sockets), [])


def _config(sockets: list[socket.socket], ssl_context: ssl.SSLContext | None) -> Config:
    config = _Config(ssl_context, sockets)
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD
    config.h2_max_header_list_size = MAX_REQUEST_HEAD
    config.h2_max_concurrent_streams = 16
    config.keep_alive_timeout = REQUEST_TIMEOUT
    config.read_timeout = _READ_TIMEOUT
    config.ssl_handshake_timeout = REQUEST_TIMEOUT
    config.graceful_timeout = 1.0
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = _server_log
    return config


async def serve_console(
    config: ConsoleConfig, host: str = "127.0.0.1", port: int = 5880, *,
    ssl_context: ssl.SSLContext | None = None, task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve the console until cancelled; ``task_status.started(url)`` once the port
    is bound. Raises OSError when it cannot be bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound: int = listeners[0].socket.getsockname()[1]
    for listener in listeners:
        listener.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _SEND_TIMEOUT_MS)
    sockets = [socket.socket(fileno=listener.socket.detach()) for listener in listeners]
    try:
        if ssl_context is not None:  # its cookie then goes over HTTPS only
            config = attrs.evolve(config, https=True)
        console = Console(config)
        app = console.app()
        shown = f"[{host}]" if ":" in host else host
        url = f"{'https' if ssl_context else 'http'}://{shown}:{bound}"
        task_status.started(url)
        # Starlette types the ASGI interface loosely (MutableMapping scopes), Hypercorn strictly
        await serve(app, _config(sockets, ssl_context), mode="asgi")  # type: ignore[arg-type]
    finally:
        for sock in sockets:
            sock.close()


@asynccontextmanager
async def open_console(
    config: ConsoleConfig, host: str = "127.0.0.1", port: int = 0, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Serve the console in the background (port 0: a free one) and yield its URL;
    stop it at the block's end."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve_console(
            config, host, port, ssl_context=ssl_context, task_status=task_status))  # fmt: skip
        try:
            yield url
        finally:
            nursery.cancel_scope.cancel()
