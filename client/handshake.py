"""A connection's handshake, client side, as one sans-I/O state machine
(:class:`ClientHandshake`): the Hello, the broker's HelloAck and its checks (the
protocol version, a refusal's code), then -- when the broker answers
AUTH_REQUIRED -- the SCRAM-SHA-256 exchange of docs/security.md (:class:`ClientScram`,
run by `scramp <https://github.com/tlocke/scramp>`_), with the credentials of
:class:`equeue.security.ClientSecurity` (from the environment or a file, never a
command line). The exchange is mutual: the broker proves it holds the user's verifier
too.

The machine takes the bytes received and gives the bytes to send; it owns no socket.
Both clients drive it with their own I/O: the trio transport
(:mod:`equeue.client.transport`) and the blocking Spark puller (``spark/puller.py``).
TLS wrapping stays with them (it happens before the first byte of the handshake);
what a failed read or write during the handshake means is decided here
(:meth:`ClientHandshake.io_error`, with :func:`equeue.client.tls.handshake_error`).

Raises :class:`~equeue.errors.AuthRequired` (the broker authenticates and no
credentials are set), :class:`~equeue.errors.AuthFailed` (refused, or a broker
that could not prove itself), :class:`~equeue.errors.UnsupportedMechanism`,
:class:`~equeue.errors.RemoteProtocolError` (bytes that are no equeue handshake, a
protocol version this client does not speak, an unexpected frame), the mapped error
of any other HelloAck code (:class:`~equeue.errors.TooManyConnections`...), and
:class:`~equeue.errors.ConnectionBroken` when the broker closes during the handshake.
The authentication and protocol errors are not transient (retrying cannot help);
ConnectionBroken and TooManyConnections are.
"""

from __future__ import annotations

import enum

from scramp import ScramClient, ScramException

from equeue.client.tls import handshake_error
from equeue.codec import (
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    PROTOCOL_VERSION,
    AuthReply,
    AuthRequest,
    Connection,
    Hello,
    HelloAck,
    Response,
    Role,
)
from equeue.errors import (
    AuthFailed,
    AuthRequired,
    ConnectionBroken,
    EQueueError,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    error_for_code,
)
from equeue.security import Credentials

__all__ = ["MECHANISM", "ClientHandshake", "ClientScram"]

MECHANISM = "SCRAM-SHA-256"

#: the hint of a broker that closed at once on a plain connection
_TLS_HINT = " (does it speak TLS? set EQUEUE_TLS=1 or EQUEUE_TLS_CA)"


class ClientScram:
    """The client's side of the SCRAM exchange, without I/O (a step of
    :class:`ClientHandshake`).

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


class _State(enum.Enum):
    NEW = "new"  # start() not called yet
    HELLO = "hello"  # Hello sent, the HelloAck awaited
    AUTH = "auth"  # an AuthRequest sent, its AuthReply awaited
    DONE = "done"  # connected: the codec is ready for requests
    FAILED = "failed"  # an error was raised; the connection is to be closed


class ClientHandshake:
    """The connect handshake of one connection to broker ``address``, without I/O.

    Drive it so::

        send(hs.start())                       # the Hello
        while not hs.done:
            out = hs.receive_data(receive())   # b"" received: the broker closed
            if out:
                send(out)
        codec = hs.codec                       # for the requests (bytes past the
                                               # handshake stay buffered in it)

    and turn an I/O failure on the way (a reset, a TLS alert) into its error with
    :meth:`io_error`. ``credentials`` answer a broker that asks for SCRAM; ``tls``
    says whether the bytes travel over TLS (it shapes the error messages);
    ``max_frame`` caps the frames the codec accepts afterwards. Any method raises as
    the module doc says; after an error the machine is spent (LocalProtocolError).
    """

    def __init__(
        self,
        address: str,
        credentials: Credentials | None,
        *,
        tls: bool = False,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.address = address
        self.tls = tls
        #: the connection's codec: after :attr:`done`, the one the requests go through
        self.codec = Connection(Role.CLIENT, max_frame=max_frame)
        self._scram = ClientScram(address, credentials)
        self._state = _State.NEW

    @property
    def done(self) -> bool:
        """The handshake succeeded: the connection takes requests."""
        return self._state is _State.DONE

    def start(self) -> bytes:
        """The bytes to send first (the Hello). Raises LocalProtocolError when
        called twice."""
        if self._state is not _State.NEW:
            raise LocalProtocolError("the handshake is started once")
        self._state = _State.HELLO
        return self.codec.send(Hello())

    def receive_data(self, data: bytes | bytearray) -> bytes:
        """Take bytes received from the broker (``b""``: it closed); return the bytes
        to send now (``b""``: nothing, read on unless :attr:`done`). Raises as the
        module doc says."""
        if self._state not in (_State.HELLO, _State.AUTH):
            raise LocalProtocolError(f"the handshake takes no data when {self._state.value}")
        try:
            return self._receive(data)
        except BaseException:
            self._state = _State.FAILED
            raise

    def io_error(self, exc: BaseException) -> EQueueError:
        """The error of a read or write that failed with ``exc`` during the handshake:
        over TLS, a :class:`~equeue.errors.TlsError` for a certificate problem (not
        retried) else a ConnectionBroken (:func:`equeue.client.tls.handshake_error`);
        over plain TCP, a ConnectionBroken."""
        self._state = _State.FAILED
        if self.tls:
            return handshake_error(exc, self.address)
        return ConnectionBroken(f"broker {self.address}: {exc.__cause__ or exc or type(exc).__name__}")

    def _receive(self, data: bytes | bytearray) -> bytes:
        if not data:
            if self._state is _State.AUTH:
                raise ConnectionBroken(f"broker {self.address} closed during authentication")
            hint = "" if self.tls else _TLS_HINT
            raise ConnectionBroken(f"broker {self.address} closed during the handshake{hint}")
        codec = self.codec
        codec.receive_data(data)
        out: list[bytes] = []
        while self._state is not _State.DONE:
            ev = codec.next_event()  # RemoteProtocolError for bytes that are no handshake
            if ev is NEED_DATA:
                break
            if self._state is _State.HELLO:
                assert isinstance(ev, HelloAck)  # a client codec's first event
                request = self._scram.begin(self._check_ack(ev))
            elif isinstance(ev, AuthReply):
                request = self._scram.step(ev)
            elif isinstance(ev, Response) and ev.request_id == 0:  # the connection refused as a whole
                raise error_for_code(ev.code, f"broker {self.address}: {ev.payload.decode('utf-8', 'replace')}")
            else:
                raise RemoteProtocolError(f"unexpected {type(ev).__name__} during authentication")
            if request is None:
                self._state = _State.DONE
            else:
                self._state = _State.AUTH
                out.append(codec.send(request))
        return b"".join(out)

    def _check_ack(self, ack: HelloAck) -> HelloAck:
        """The HelloAck's own checks (the codes ClientScram does not take)."""
        if ack.code == ErrorCode.TOO_MANY_CONNECTIONS:
            raise error_for_code(ack.code, f"broker {self.address} has too many connections")
        if ack.code in (ErrorCode.OK, ErrorCode.AUTH_REQUIRED) and ack.version != PROTOCOL_VERSION:
            raise error_for_code(
                ErrorCode.UNSUPPORTED_VERSION,
                f"broker {self.address} speaks protocol version {ack.version}, this client {PROTOCOL_VERSION}",
            )
        return ack
