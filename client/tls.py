"""The client side of TLS: the SSL context of a :class:`~equeue.security.TlsSettings`
and the meaning of a failed handshake.

Every client builds its context here: :class:`equeue.client.AsyncClient` (and so the
producers, the consumers and the CLI) and the Spark reader's blocking puller
(``spark/puller.py``). The context verifies the broker's certificate against
``ca_file`` (or the system's CA store) and its name against ``server_hostname``
(the caller passes the broker address's host when the settings name none); it
offers ``cert_file``/``key_file`` to a broker that asks for a client certificate
(mutual TLS). TLS 1.2 is the oldest version spoken.

A handshake that fails over a certificate -- on either side -- is a
:class:`~equeue.errors.TlsError`, not transient, so the retry policy
(:mod:`equeue.client.retry`) does not spin on it; any other failure (the peer vanished
mid-handshake) stays a transient :class:`~equeue.errors.ConnectionBroken`.
"""

from __future__ import annotations

import ssl

from equeue.errors import ConfigError, ConnectionBroken, TlsError
from equeue.security import TlsSettings

__all__ = ["client_context", "handshake_error"]

#: OpenSSL alert reasons of a broker that refused the client's certificate (or the
#: lack of one), and of a peer that dislikes ours: certificate problems, not network ones
_CERTIFICATE_ALERTS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "CERTIFICATE_UNKNOWN",
    "UNSUPPORTED_CERTIFICATE",
    "ACCESS_DENIED",
    "HANDSHAKE_FAILURE",
    "PROTOCOL_VERSION",
)


def client_context(settings: TlsSettings) -> ssl.SSLContext:
    """An SSL context for ``settings`` (files are read now).

    Raises ConfigError naming the file when a CA file, certificate or key cannot be
    read or does not fit (e.g. a key that is not the certificate's).
    """
    try:
        ctx = ssl.create_default_context(
            cafile=str(settings.ca_file) if settings.ca_file is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS CA file {settings.ca_file}: {_why(exc)}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.cert_file is not None:
        try:
            ctx.load_cert_chain(
                settings.cert_file, settings.key_file if settings.key_file is not None else None
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the TLS client certificate {settings.cert_file}"
                f"{f' with key {settings.key_file}' if settings.key_file else ''}: {_why(exc)}"
            ) from None
    return ctx


def handshake_error(exc: BaseException, address: str) -> ConnectionBroken:
    """The error of a TLS handshake with ``address`` that failed with ``exc`` (an
    ``ssl.SSLError``, or trio's BrokenResourceError caused by one): a TlsError for a
    certificate problem, else a (transient) ConnectionBroken."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        # our side refused the broker's certificate
        return TlsError(
            f"TLS handshake with {address} failed: the broker's certificate is refused "
            f"({cause.verify_message or cause.reason}); check the CA file (EQUEUE_TLS_CA / "
            "tls.ca) and the broker name (EQUEUE_TLS_SERVER_NAME / tls.serverName)"
        )
    if isinstance(cause, ssl.SSLError):
        reason = str(cause.reason or cause)
        if any(alert in reason.upper() for alert in _CERTIFICATE_ALERTS):
            # the broker refused ours (or our lack of one)
            return TlsError(
                f"TLS handshake with {address} failed: the broker refused the client "
                f"certificate ({reason}); it needs a valid one, signed by a CA it trusts "
                "(EQUEUE_TLS_CERT / EQUEUE_TLS_KEY, tls.cert / tls.key)"
            )
        if "WRONG_VERSION_NUMBER" in reason.upper() or "PACKET_LENGTH_TOO_LONG" in reason.upper():
            return TlsError(f"TLS handshake with {address} failed ({reason}): is the broker's port plain TCP?")
        return ConnectionBroken(f"TLS handshake with {address} failed: {reason}")
    return ConnectionBroken(f"TLS handshake with {address} failed: {exc or type(exc).__name__}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
