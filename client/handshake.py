"""A connection's handshake, client side, after the broker's HelloAck: nothing to
do (OK), or the SCRAM-SHA-256 exchange of docs/security.md (AUTH_REQUIRED), with
the credentials of :class:`equeue.security.ClientSecurity` (from the environment
or a file, never a command line), run by `scramp
<https://github.com/tlocke/scramp>`_. The exchange is mutual: the broker proves it
holds the user's verifier too.

Raises :class:`~equeue.errors.AuthRequired` (the broker authenticates and no
credentials are set), :class:`~equeue.errors.AuthFailed` (refused, or a broker
that could not prove itself), :class:`~equeue.errors.UnsupportedMechanism`, the
mapped error of any other HelloAck code, :class:`~equeue.errors.ConnectionBroken`
when the broker closes during the exchange. None of them is transient.
"""

from __future__ import annotations

from scramp import ScramClient, ScramException

from client.link import _Link
from equeue.codec import NEED_DATA, AuthReply, AuthRequest, HelloAck
from equeue.errors import (
    AuthFailed,
    AuthRequired,
    ConnectionBroken,
    ErrorCode,
    RemoteProtocolError,
    error_for_code,
)
from equeue.security import Credentials

__all__ = ["MECHANISM", "authenticate"]

MECHANISM = "SCRAM-SHA-256"


async def authenticate(link: _Link, ack: HelloAck, credentials: Credentials | None) -> None:
    """Finish the handshake the broker's ``ack`` asks for (see the module doc)."""
    if ack.code == ErrorCode.OK:
        return
    if ack.code != ErrorCode.AUTH_REQUIRED:
        raise error_for_code(ack.code, f"broker {link.address} refused the connection")
    if credentials is None:
        raise AuthRequired(
            f"broker {link.address} requires authentication: set EQUEUE_USERNAME and "
            "EQUEUE_PASSWORD, or EQUEUE_CREDENTIALS_FILE (docs/security.md)"
        )
    try:
        scram = ScramClient([MECHANISM], credentials.username, credentials.password)
        first = scram.get_client_first()
    except ScramException as exc:
        raise AuthFailed(f"cannot authenticate as {credentials.username!r}: {exc}") from None
    reply = await _exchange(link, AuthRequest(MECHANISM, first.encode()))
    try:
        scram.set_server_first(reply.data.decode())
        final = scram.get_client_final()
    except (ScramException, UnicodeDecodeError) as exc:
        raise AuthFailed(f"broker {link.address}: malformed SCRAM challenge ({exc})") from None
    reply = await _exchange(link, AuthRequest("", final.encode()))
    if not reply.final:
        raise RemoteProtocolError(f"broker {link.address}: the SCRAM exchange did not end")
    try:
        scram.set_server_final(reply.data.decode())
    except (ScramException, UnicodeDecodeError):
        raise AuthFailed(f"broker {link.address} could not prove it knows the password: not trusted") from None


async def _exchange(link: _Link, request: AuthRequest) -> AuthReply:
    """Send one auth request, read the broker's reply; raise for a refusal."""
    await link.stream.send_all(link.codec.send(request))
    while True:
        ev = link.codec.next_event()
        if ev is NEED_DATA:
            data = await link.stream.receive_some(65536)
            if not data:
                raise ConnectionBroken(f"broker {link.address} closed during authentication")
            link.codec.receive_data(data)
            continue
        if not isinstance(ev, AuthReply):
            raise RemoteProtocolError(f"unexpected {type(ev).__name__} during authentication")
        if ev.code != ErrorCode.OK:
            raise error_for_code(ev.code, f"broker {link.address}: {ev.data.decode('utf-8', 'replace')}")
        return ev
