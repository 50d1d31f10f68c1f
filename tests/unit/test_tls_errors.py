"""equeue.client.tls: which failed handshakes are certificate problems (TlsError, not
retried) and which are network trouble (ConnectionBroken, retried)."""

from __future__ import annotations

import ssl

import pytest
import trio

from equeue.client.retry import is_transient
from equeue.client.tls import handshake_error
from equeue.errors import ConnectionBroken, TlsError


def ssl_error(reason: str, cls: type[ssl.SSLError] = ssl.SSLError, **attrs: str) -> ssl.SSLError:
    exc = cls(1, f"[SSL: {reason}] {reason.lower()}")
    exc.reason = reason  # type: ignore[misc]
    for k, v in attrs.items():
        setattr(exc, k, v)
    return exc


def wrapped(exc: BaseException) -> trio.BrokenResourceError:
    """As trio's SSLStream raises it."""
    try:
        raise trio.BrokenResourceError from exc
    except trio.BrokenResourceError as err:
        return err


@pytest.mark.parametrize(
    ("cause", "fatal", "text"),
    [
        (ssl_error("CERTIFICATE_VERIFY_FAILED", ssl.SSLCertVerificationError, verify_message="certificate has expired"),
         True, "broker's certificate is refused (certificate has expired)"),
        (ssl_error("TLSV13_ALERT_CERTIFICATE_REQUIRED"), True, "refused the client certificate"),
        (ssl_error("SSLV3_ALERT_CERTIFICATE_EXPIRED"), True, "refused the client certificate"),
        (ssl_error("TLSV1_ALERT_UNKNOWN_CA"), True, "refused the client certificate"),
        (ssl_error("WRONG_VERSION_NUMBER"), True, "is the broker's port plain TCP?"),
        (ssl_error("UNEXPECTED_EOF_WHILE_READING", ssl.SSLEOFError), False, "UNEXPECTED_EOF_WHILE_READING"),
        (ConnectionResetError(104, "Connection reset by peer"), False, "failed"),
    ],
)
def test_handshake_errors_are_classified(cause: BaseException, fatal: bool, text: str) -> None:
    for exc in (cause, wrapped(cause)):
        err = handshake_error(exc, "h:1")
        assert isinstance(err, ConnectionBroken) and text in str(err) and "h:1" in str(err), err
        assert isinstance(err, TlsError) is fatal
        assert is_transient(err) is not fatal
