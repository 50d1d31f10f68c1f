"""The clients' connect handshake as a sans-I/O machine (equeue.client.handshake
ClientHandshake): bytes in, bytes out, no socket. The broker's side is the broker's
own sans-I/O pieces: the server codec and, for SCRAM, the broker's SCRAM exchange
(broker/auth.py) over a real users file."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from equeue.acl import UsersFile
from equeue.broker.auth import ScramExchange, UserStore
from equeue.client.handshake import ClientHandshake
from equeue.codec import (
    PROTOCOL_VERSION,
    AuthRequest,
    Connection,
    Hello,
    HelloAck,
    Push,
    Request,
    Role,
)
from equeue.errors import (
    AuthFailed,
    AuthRequired,
    ConnectionBroken,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    TlsError,
    TooManyConnections,
    error_for_code,
)
from equeue.security import Credentials
from equeue.users import make_user, update_users_file

ADDRESS = "broker.test:5800"


class Broker:
    """The broker's side of one connection's handshake, sans I/O: the server codec, and
    the broker's SCRAM exchange when ``store`` is given."""

    def __init__(self, store: UserStore | None = None, ack: HelloAck | None = None) -> None:
        self.codec = Connection(Role.SERVER)
        self.exchange = ScramExchange(store, b"s" * 32) if store is not None else None
        code = ErrorCode.AUTH_REQUIRED if store is not None else ErrorCode.OK
        self.ack = ack if ack is not None else HelloAck(PROTOCOL_VERSION, code)

    def receive(self, data: bytes) -> bytes:
        """What the broker answers to ``data`` from the client."""
        self.codec.receive_data(data)
        out = []
        while True:
            ev = self.codec.next_event()
            if isinstance(ev, Hello):
                out.append(self.codec.send(self.ack))
            elif isinstance(ev, AuthRequest):
                assert self.exchange is not None
                out.append(self.codec.send(self.exchange.step(ev)))
            else:
                return b"".join(out)


def converse(shake: ClientHandshake, broker: Broker, chunk: int = 1 << 20) -> None:
    """Run the handshake to its end, the broker's answers delivered ``chunk`` bytes at a time."""
    to_broker = shake.start()
    while not shake.done:
        answer = broker.receive(to_broker)
        assert answer, "the broker has nothing to say: the client should be done"
        to_broker = b""
        for i in range(0, len(answer), chunk):
            to_broker += shake.receive_data(answer[i : i + chunk])


@pytest.fixture
def store(tmp_path: Path) -> UserStore:
    path = tmp_path / "users.toml"
    update_users_file(path, lambda _: UsersFile().with_user(make_user("alice", "s3cret-pass")))
    users = UserStore(path)
    users.load()
    return users


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_a_broker_without_authentication_is_done_after_its_hello_ack(chunk: int) -> None:
    shake = ClientHandshake(ADDRESS, None)
    converse(shake, Broker(), chunk)
    assert shake.done
    # the codec goes on with the requests
    assert shake.codec.handshake_done
    assert shake.codec.send(Request(1, 1, b"x"))


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_scram_happy_path(store: UserStore, chunk: int) -> None:
    broker = Broker(store)
    shake = ClientHandshake(ADDRESS, Credentials("alice", "s3cret-pass"))
    converse(shake, broker, chunk)
    assert shake.done
    assert broker.exchange is not None and broker.exchange.principal == "alice"


def test_bytes_past_the_handshake_stay_in_the_codec_for_the_reader() -> None:
    broker = Broker()
    shake = ClientHandshake(ADDRESS, None)
    ack = broker.receive(shake.start())
    push = broker.codec.send(Push(7, b"group changed"))
    assert shake.receive_data(ack + push) == b""  # one read: the ack and a push behind it
    assert shake.done
    assert shake.codec.next_event() == Push(7, b"group changed")


def test_wrong_password_is_auth_failed(store: UserStore) -> None:
    shake = ClientHandshake(ADDRESS, Credentials("alice", "not-the-password"))
    with pytest.raises(AuthFailed):
        converse(shake, Broker(store))
    assert not shake.done


def test_auth_required_without_credentials(store: UserStore) -> None:
    shake = ClientHandshake(ADDRESS, None)
    with pytest.raises(AuthRequired, match="EQUEUE_USERNAME"):
        converse(shake, Broker(store))
    assert not shake.done


@pytest.mark.parametrize(
    ("code", "error", "text", "transient"),
    [
        (ErrorCode.TOO_MANY_CONNECTIONS, TooManyConnections, "too many connections", True),  # try later
        (ErrorCode.UNSUPPORTED_VERSION, RemoteProtocolError, "refused the connection", False),
    ],
)
def test_a_refused_hello_ack_raises_its_mapped_error(code: ErrorCode, error: type, text: str, transient: bool) -> None:
    shake = ClientHandshake(ADDRESS, Credentials("alice", "pw"))
    with pytest.raises(error, match=text) as info:
        converse(shake, Broker(ack=HelloAck(PROTOCOL_VERSION, code)))
    assert type(info.value) is type(error_for_code(code, ""))
    assert info.value.transient is transient


def test_a_broker_speaking_another_protocol_version_is_refused() -> None:
    shake = ClientHandshake(ADDRESS, None)
    with pytest.raises(RemoteProtocolError, match=f"version {PROTOCOL_VERSION + 1}") as info:
        converse(shake, Broker(ack=HelloAck(PROTOCOL_VERSION + 1, ErrorCode.OK)))
    assert info.value.code == ErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize("tls", [False, True])
def test_a_broker_closing_before_its_hello_ack(tls: bool) -> None:
    shake = ClientHandshake(ADDRESS, None, tls=tls)
    shake.start()
    with pytest.raises(ConnectionBroken, match="closed during the handshake") as info:
        shake.receive_data(b"EQ")  # half a HelloAck...
        shake.receive_data(b"")  # ...then the end of the stream
    assert info.value.transient
    assert ("does it speak TLS" in str(info.value)) is not tls
    with pytest.raises(LocalProtocolError):  # the machine is spent
        shake.receive_data(b"MQ")


def test_a_broker_closing_during_authentication(store: UserStore) -> None:
    broker = Broker(store)
    shake = ClientHandshake(ADDRESS, Credentials("alice", "s3cret-pass"))
    first = shake.receive_data(broker.receive(shake.start()))  # HelloAck(AUTH_REQUIRED) -> client-first
    assert first and not shake.done
    with pytest.raises(ConnectionBroken, match="closed during authentication"):
        shake.receive_data(b"")


@pytest.mark.parametrize(
    "garbage",
    [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\x15\x03\x03\x00\x02\x02\x46", b"EQMX\x00\x01\x00\x00"],
    ids=["http", "tls-alert", "bad-magic"],
)
def test_garbage_bytes_are_a_protocol_error(garbage: bytes) -> None:
    shake = ClientHandshake(ADDRESS, None)
    shake.start()
    with pytest.raises(RemoteProtocolError, match="not an equeue peer"):
        shake.receive_data(garbage)
    assert not shake.done


def test_a_request_answer_during_authentication_is_a_protocol_error(store: UserStore) -> None:
    broker = Broker(store)
    shake = ClientHandshake(ADDRESS, Credentials("alice", "s3cret-pass"))
    shake.receive_data(broker.receive(shake.start()))
    stray = broker.codec.send(Push(1, b"x"))
    with pytest.raises(RemoteProtocolError, match="unexpected Push during authentication"):
        shake.receive_data(stray)


def test_the_machine_is_driven_in_order() -> None:
    shake = ClientHandshake(ADDRESS, None)
    with pytest.raises(LocalProtocolError):
        shake.receive_data(b"EQMQ")  # before start()
    shake.start()
    with pytest.raises(LocalProtocolError):
        shake.start()


def test_io_errors_map_to_transient_or_certificate_errors() -> None:
    plain = ClientHandshake(ADDRESS, None).io_error(ConnectionResetError(104, "reset by peer"))
    assert isinstance(plain, ConnectionBroken) and plain.transient and ADDRESS in str(plain)
    alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert")
    alert.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    refused = ClientHandshake(ADDRESS, None, tls=True).io_error(alert)
    assert isinstance(refused, TlsError) and not refused.transient
