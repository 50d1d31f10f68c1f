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

from equeue.client.link import _Link
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

__all__ = ["MECHANISM", "ClientScram", "authenticate"]

MECHANISM = "SCRAM-SHA-256"


class ClientScram:
    """The client's side of the SCRAM exchange, without I/O: both the trio client
    (:func:`authenticate`) and the blocking Spark puller drive it.

    ``begin(ack)`` gives the first AuthRequest to send (None: the broker needs no
    authentication), ``step(reply)`` the next one (None: authenticated). Raises as
    the module doc says.
    """

    def __init__(self, address: str, credentials: Credentials | None) -> None:
        self.address = address
        self._credentials = credentials
        self._scram: ScramClient | None = None
        self._sent_final = False

    def begin(self, ack: HelloAck) -> AuthRequest | None:
        if ack.code == ErrorCode.OK:
            return None
        if ack.code != ErrorCode.AUTH_REQUIRED:
            raise error_for_code(ack.code, f"broker {self.address} refused the connection")
        credentials = self._credentials
        if credentials is None:
            raise AuthRequired(
                f"broker {self.address} requires authentication: set EQUEUE_USERNAME and "
                "EQUEUE_PASSWORD, or EQUEUE_CREDENTIALS_FILE (docs/security.md)"
            )
        try:
            self._scram = ScramClient([MECHANISM], credentials.username, credentials.password)
            first = self._scram.get_client_first()
        except ScramException as exc:
            raise AuthFailed(f"cannot authenticate as {credentials.username!r}: {exc}") from None
        return AuthRequest(MECHANISM, first.encode())

    def step(self, reply: AuthReply) -> AuthRequest | None:
        if reply.code != ErrorCode.OK:
            raise error_for_code(reply.code, f"broker {self.address}: {reply.data.decode('utf-8', 'replace')}")
        scram = self._scram
        if scram is None:
            raise RemoteProtocolError(f"broker {self.address}: an auth reply before any request")
        if not self._sent_final:
            if reply.final:
                raise RemoteProtocolError(f"broker {self.address}: the SCRAM exchange ended early")
            try:
                scram.set_server_first(reply.data.decode())
                final = scram.get_client_final()
            except (ScramException, UnicodeDecodeError) as exc:
                raise AuthFailed(f"broker {self.address}: malformed SCRAM challenge ({exc})") from None
            self._sent_final = True
            return AuthRequest("", final.encode())
        if not reply.final:
            raise RemoteProtocolError(f"broker {self.address}: the SCRAM exchange did not end")
        try:
            scram.set_server_final(reply.data.decode())
        except (ScramException, UnicodeDecodeError):
            raise AuthFailed(f"broker {self.address} could not prove it knows the password: not trusted") from None
        return None


async def authenticate(link: _Link, ack: HelloAck, credentials: Credentials | None) -> None:
    """Finish the handshake the broker's ``ack`` asks for (see the module doc)."""
    exchange = ClientScram(link.address, credentials)
    request = exchange.begin(ack)
    while request is not None:
        request = exchange.step(await _exchange(link, request))


async def _exchange(link: _Link, request: AuthRequest) -> AuthReply:
    """Send one auth request, read the broker's reply."""
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
        return ev
