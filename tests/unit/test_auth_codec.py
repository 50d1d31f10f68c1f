"""The SASL handshake frames of equeue.codec: one encoder and one decoder each,
round trips (property-tested), chunking, and the state rules (auth frames only
after an AUTH_REQUIRED answer and before the final reply or the first request)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue.codec import (
    NEED_DATA,
    AuthReply,
    AuthRequest,
    Connection,
    Hello,
    HelloAck,
    Request,
    Role,
    decode_auth_reply,
    decode_auth_request,
    encode_auth_reply,
    encode_auth_request,
)
from equeue.errors import ErrorCode, LocalProtocolError, RemoteProtocolError

mechanisms = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
auth_requests = st.builds(AuthRequest, mechanism=mechanisms, data=st.binary(max_size=2000))
auth_replies = st.builds(AuthReply, code=st.integers(0, 0xFFFF), data=st.binary(max_size=2000), final=st.booleans())


def auth_pair() -> tuple[Connection, Connection]:
    """A client and a server after Hello / HelloAck(AUTH_REQUIRED)."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(Hello()))
    assert server.next_event() == Hello()
    client.receive_data(server.send(HelloAck(code=ErrorCode.AUTH_REQUIRED)))
    assert client.next_event() == HelloAck(code=ErrorCode.AUTH_REQUIRED)
    return client, server


@given(auth_requests)
def test_auth_request_round_trip(req: AuthRequest) -> None:
    frame = b"".join(encode_auth_request(req))
    assert decode_auth_request(frame[11:]) == req
    client, server = auth_pair()
    data = client.send(req)
    for i in range(0, len(data), 7):  # chunked delivery
        server.receive_data(data[i : i + 7])
    assert server.next_event() == req
    assert server.next_event() is NEED_DATA


@given(auth_replies)
def test_auth_reply_round_trip(reply: AuthReply) -> None:
    frame = b"".join(encode_auth_reply(reply))
    assert decode_auth_reply(reply.code, frame[11:]) == reply
    client, server = auth_pair()
    client.receive_data(server.send(reply))
    assert client.next_event() == reply


def test_malformed_auth_frames_are_remote_errors() -> None:
    with pytest.raises(RemoteProtocolError):
        decode_auth_request(b"")
    with pytest.raises(RemoteProtocolError):
        decode_auth_request(b"\x09SCRAM")  # name overruns the frame
    with pytest.raises(RemoteProtocolError):
        decode_auth_request(b"\x02\xff\xfe")  # not ASCII
    with pytest.raises(RemoteProtocolError):
        decode_auth_reply(0, b"")
    with pytest.raises(LocalProtocolError):
        encode_auth_request(AuthRequest("é"))


def test_no_auth_frame_after_the_final_reply() -> None:
    client, server = auth_pair()
    server.receive_data(client.send(AuthRequest("SCRAM-SHA-256", b"n,,n=a,r=x")))
    server.next_event()
    server.send(AuthReply(ErrorCode.OK, b"v=...", final=True))
    with pytest.raises(LocalProtocolError):
        server.send(AuthReply(ErrorCode.OK, b"again"))
    server.receive_data(client.send(AuthRequest("", b"more")))
    with pytest.raises(RemoteProtocolError, match="after the authentication"):
        server.next_event()


def test_no_auth_frame_after_a_request_or_an_ok_hello_ack() -> None:
    client, server = auth_pair()
    server.receive_data(client.send(Request(1, 22, b"{}")) + client.send(AuthRequest("SCRAM-SHA-256", b"x")))
    assert isinstance(server.next_event(), Request)
    with pytest.raises(RemoteProtocolError):
        server.next_event()
    # a broker that does not authenticate (HelloAck OK) accepts no auth frame at all
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(Hello()))
    server.next_event()
    server.send(HelloAck())
    server.receive_data(client.send(AuthRequest("SCRAM-SHA-256", b"x")))
    with pytest.raises(RemoteProtocolError):
        server.next_event()


def test_only_the_right_side_sends_each_auth_frame() -> None:
    client, server = auth_pair()
    with pytest.raises(LocalProtocolError):
        server.send(AuthRequest("SCRAM-SHA-256"))
    with pytest.raises(LocalProtocolError):
        client.send(AuthReply())
