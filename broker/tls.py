"""The broker side of TLS: the server's SSL context and the accept-time handshake.

With ``BrokerConfig.tls_cert`` set, :meth:`equeue.broker.server.Broker.serve` builds one
context (:func:`server_context`) at start -- a missing or unreadable file stops the
start with one :class:`~equeue.errors.ConfigError` line -- and serves both ports
with it: every accepted client connection is wrapped by :class:`TlsAcceptor`
(``trio.SSLStream``) and the HTTP port serves HTTPS (``trio.SSLListener``).

Defaults: TLS 1.2 or newer, the server's cipher order, no compression, no
renegotiation; with ``tls_client_auth`` ``optional`` or ``required`` the broker
asks for a client certificate signed by a CA of ``tls_ca`` (mutual TLS).

A TLS connection's output goes through the connection's writer task only (see
:mod:`equeue.broker.output`, "write modes"); the plain-TCP fast paths stay as they are.

A handshake that fails (a scanner, a plain-TCP client, an untrusted or expired
client certificate) or does not finish within ``handshake_timeout`` closes the
connection with one INFO line, rate-limited per reason: a client can trigger it
again and again.
"""

from __future__ import annotations

import logging
import ssl
import time

import trio

from equeue.config import BrokerConfig, TlsClientAuth
from equeue.errors import ConfigError
from equeue.logs import RateLimitedLog

log = logging.getLogger("equeue.broker")

__all__ = ["TlsAcceptor", "server_context"]

_VERIFY = {
    TlsClientAuth.NONE: ssl.CERT_NONE,
    TlsClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
    TlsClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}


def server_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    """The broker's SSL context (None without ``tls_cert``: plain TCP).

    Raises ConfigError naming the file when the certificate, key or CA file cannot
    be read or do not fit together.
    """
    if cfg.tls_cert is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    except (OSError, ssl.SSLError) as exc:
        key = f" with key {cfg.tls_key}" if cfg.tls_key else ""
        raise ConfigError(f"cannot load the TLS certificate {cfg.tls_cert}{key}: {_why(exc)}") from None
    if cfg.tls_ca is not None:
        try:
            ctx.load_verify_locations(cafile=cfg.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS CA file {cfg.tls_ca}: {_why(exc)}") from None
    ctx.verify_mode = _VERIFY[cfg.tls_client_auth]
    return ctx


class TlsAcceptor:
    """Wraps accepted connections in TLS and runs the handshake, bounded by
    ``timeout`` seconds (the broker's ``handshake_timeout``)."""

    def __init__(self, context: ssl.SSLContext, timeout: float) -> None:
        self.context = context
        self.timeout = timeout
        self._failures = RateLimitedLog(log, 10.0, time.monotonic)

    def reload(self, cfg: BrokerConfig) -> None:
        """Read ``cfg``'s certificate, key and CA files again (certificate rotation
        without a restart): new handshakes, on both ports, use them; open connections
        keep theirs. The files are checked in a fresh context first, so a bad file
        raises ConfigError and changes nothing. CAs are added to the ones trusted so
        far (a CA is dropped by a restart)."""
        server_context(cfg)  # ConfigError for a missing, unreadable or mismatched file
        assert cfg.tls_cert is not None
        self.context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        if cfg.tls_ca is not None:
            self.context.load_verify_locations(cafile=cfg.tls_ca)

    async def handshake(self, stream: trio.SocketStream) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS stream over ``stream`` once its handshake is done; None when it
        failed or timed out (logged, rate-limited; the caller closes ``stream``)."""
        tls = trio.SSLStream(stream, self.context, server_side=True)
        reason = f"no TLS handshake within {self.timeout:g} s"
        with trio.move_on_after(self.timeout):
            try:
                await tls.do_handshake()
                return tls
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                reason = _why(exc.__cause__ or exc) or "the peer left"
                await _send_alert(tls, stream)
        self._failures.log(logging.INFO, reason, "client %s: TLS handshake failed: %s; closing", _peer(stream), reason)
        return None


async def _send_alert(tls: trio.SSLStream[trio.SocketStream], stream: trio.SocketStream) -> None:
    """Send the TLS alert OpenSSL wrote for a failed handshake (best effort, 1 s).

    trio's SSLStream marks itself broken on a handshake error without sending what
    OpenSSL left in its outgoing buffer: the alert that tells the client *why*
    ("certificate required", "unknown CA", "certificate expired"). Without it the
    client sees a bare EOF and cannot say that its certificate was refused."""
    outgoing = getattr(tls, "_outgoing", None)  # ssl.MemoryBIO; absent in another trio: skip
    alert = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
    if alert:
        with trio.move_on_after(1.0):
            try:
                await stream.send_all(alert)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):  # e.g. "certificate has expired"
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
