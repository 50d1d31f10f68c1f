"""Serving the console: :mod:`equeue.client.httpserve` (shared with the broker's HTTP
port) on a port this module binds, Hypercorn's per-connection server behind our
accept loop.

The protections are the broker's HTTP port's: at most
``ConsoleConfig.max_connections`` connections at once (one more: 503 and closed at
once); a request head of at most :data:`~equeue.client.httpserve.MAX_REQUEST_HEAD` bytes
(more: 431 and closed); a connection without a whole request within
:data:`REQUEST_TIMEOUT` s of its opening or its last answer is closed (slowloris:
Hypercorn's keep-alive timeout runs while no request is being answered), and so is
a TLS handshake slower than that; an answer left unread that long gets the
connection dropped by the kernel (``TCP_USER_TIMEOUT``).

:func:`serve_console` serves until cancelled; :func:`open_console` serves in the
background of an ``async with`` (port 0: a free port) and yields the URL.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from equeue.cli.console.app import PAGE_BUDGET, Console, ConsoleConfig
from equeue.client.httpserve import (
    REQUEST_TIMEOUT,
    ConnectionCap,
    bind_listeners,
    hypercorn_config,
    serve_listeners,
)
from equeue.errors import ConfigError

__all__ = ["REQUEST_TIMEOUT", "open_console", "serve_console", "server_context"]

log = logging.getLogger("equeue.cli.console")
_server_log = logging.getLogger("equeue.cli.console.server")
_server_log.setLevel(logging.WARNING)

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


async def serve_console(
    config: ConsoleConfig, host: str = "127.0.0.1", port: int = 5880, *,
    ssl_context: ssl.SSLContext | None = None, task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve the console until cancelled; ``task_status.started(url)`` once the port
    is bound; at most ``config.max_connections`` connections at once. Raises OSError
    when the port cannot be bound."""
    async with bind_listeners(host, port, ssl_context) as bound:
        if ssl_context is not None:  # its cookie then goes over HTTPS only
            config = attrs.evolve(config, https=True)
        console = Console(config)
        app = console.app()
        shown = f"[{host}]" if ":" in host else host
        url = f"{'https' if ssl_context else 'http'}://{shown}:{bound.port}"
        task_status.started(url)
        settings = hypercorn_config(_server_log, read_timeout=_READ_TIMEOUT, h2_max_concurrent_streams=16)
        async with console.lifespan(app):  # the application's lifespan: the accept loop sends no events
            await serve_listeners(app, settings, bound.listeners, ConnectionCap(config.max_connections))


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
