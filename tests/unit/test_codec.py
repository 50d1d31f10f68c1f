"""The sans-I/O framing state machine (equeue.codec): round trips, chunking,
garbage, caps and misuse."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue.codec import (
    DEFAULT_MAX_FRAME,
    MAGIC,
    NEED_DATA,
    PROTOCOL_VERSION,
    Connection,
    Event,
    Hello,
    HelloAck,
    Push,
    Request,
    Response,
    Role,
    encode_handshake_answer,
    encode_push,
    encode_response,
)
from equeue.errors import EQueueError, ErrorCode, LocalProtocolError, RemoteProtocolError

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
payloads = st.binary(max_size=5000)

requests = st.builds(Request, request_id=u32, code=u16, payload=payloads)
responses = st.builds(Response, request_id=u32, code=u16, payload=payloads)
pushes = st.builds(Push, code=u16, payload=payloads)
server_events = st.one_of(responses, pushes)


# ------------------------------------------------------------------------- helpers
def drain(conn: Connection) -> list[Event]:
    """Every complete event currently buffered in ``conn``."""
    out: list[Event] = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            return out
        assert isinstance(ev, Hello | HelloAck | Request | Response | Push)
        out.append(ev)


def pair(**kwargs: int) -> tuple[Connection, Connection]:
    """A client and a server that completed the handshake."""
    client = Connection(Role.CLIENT, **kwargs)
    server = Connection(Role.SERVER, **kwargs)
    server.receive_data(client.send(Hello()))
    assert server.next_event() == Hello()
    client.receive_data(server.send(HelloAck()))
    assert client.next_event() == HelloAck()
    assert client.handshake_done and server.handshake_done
    assert client.next_event() is NEED_DATA and server.next_event() is NEED_DATA
    return client, server


def server_after_hello() -> Connection:
    server = Connection(Role.SERVER)
    server.receive_data(Connection(Role.CLIENT).send(Hello()))
    assert server.next_event() == Hello()
    server.send(HelloAck())
    return server


def client_after_ack() -> Connection:
    client = Connection(Role.CLIENT)
    client.send(Hello())
    client.receive_data(MAGIC + struct.pack(">HH", PROTOCOL_VERSION, 0))
    assert client.next_event() == HelloAck()
    return client


def frame(kind: int, code: int, rid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBHI", 7 + len(payload), kind, code, rid) + payload


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# ------------------------------------------------------------------------- handshake
@given(version=u16, flags=u16)
def test_hello_round_trip(version: int, flags: int) -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    data = client.send(Hello(version, flags))
    assert len(data) == 8 and data.startswith(MAGIC)
    server.receive_data(data)
    assert server.next_event() == Hello(version, flags)
    assert server.next_event() is NEED_DATA
    assert not server.handshake_done  # the server has not answered yet


@given(version=u16, code=u16)
def test_hello_ack_round_trip(version: int, code: int) -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(Hello()))
    server.next_event()
    data = server.send(HelloAck(version, code))
    assert server.handshake_done
    client.receive_data(data)
    assert client.next_event() == HelloAck(version, code)
    assert client.handshake_done
    assert client.next_event() is NEED_DATA


def test_handshake_byte_at_a_time() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    data = client.send(Hello(3, 9))
    for i, b in enumerate(data):
        assert server.next_event() is NEED_DATA
        server.receive_data(bytes([b]))
        if i < len(data) - 1:
            assert server.next_event() is NEED_DATA
    assert server.next_event() == Hello(3, 9)


def test_hello_and_first_requests_pipelined_in_one_chunk() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    data = client.send(Hello()) + client.send(Request(1, 20, b"x")) + client.send(Request(2, 21))
    server.receive_data(data)
    assert drain(server) == [Hello(), Request(1, 20, b"x"), Request(2, 21, b"")]


def test_defaults() -> None:
    assert Hello() == Hello(PROTOCOL_VERSION, 0)
    assert HelloAck() == HelloAck(PROTOCOL_VERSION, ErrorCode.OK)
    assert Request(1, 2).payload == b"" and Response(1, 2).payload == b""
    assert Push(1).payload == b""
    assert repr(NEED_DATA) == "NEED_DATA"


# ------------------------------------------------------------------------- frames
@settings(max_examples=150)
@given(ev=requests)
def test_request_round_trip(ev: Request) -> None:
    client, server = pair()
    data = client.send(ev)
    assert len(data) == 11 + len(ev.payload)
    server.receive_data(data)
    assert server.next_event() == ev
    assert server.next_event() is NEED_DATA
    assert server.buffered == 0


@settings(max_examples=150)
@given(ev=server_events)
def test_response_and_push_round_trip(ev: Response | Push) -> None:
    client, server = pair()
    client.receive_data(server.send(ev))
    assert client.next_event() == ev
    assert client.next_event() is NEED_DATA
    assert client.buffered == 0


@settings(max_examples=100)
@given(evs=st.lists(requests, max_size=20))
def test_requests_byte_at_a_time(evs: list[Request]) -> None:
    client, server = pair()
    data = b"".join(client.send(ev) for ev in evs)
    got: list[Event] = []
    for b in data:
        server.receive_data(bytes([b]))
        got += drain(server)
    assert got == evs
    assert server.buffered == 0


@settings(max_examples=100)
@given(evs=st.lists(server_events, max_size=20))
def test_server_events_byte_at_a_time(evs: list[Response | Push]) -> None:
    client, server = pair()
    data = b"".join(server.send(ev) for ev in evs)
    got: list[Event] = []
    for b in data:
        client.receive_data(bytes([b]))
        got += drain(client)
    assert got == evs


@settings(max_examples=100)
@given(evs=st.lists(requests, max_size=40))
def test_many_requests_in_one_chunk(evs: list[Request]) -> None:
    client, server = pair()
    server.receive_data(b"".join(client.send(ev) for ev in evs))
    assert drain(server) == evs
    assert server.buffered == 0


@settings(max_examples=100)
@given(evs=st.lists(server_events, max_size=40))
def test_many_server_events_in_one_chunk(evs: list[Response | Push]) -> None:
    client, server = pair()
    client.receive_data(b"".join(server.send(ev) for ev in evs))
    assert drain(client) == evs


@settings(max_examples=100)
@given(
    evs=st.lists(requests, min_size=1, max_size=20),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
)
def test_requests_arbitrary_chunking(evs: list[Request], cuts: list[int]) -> None:
    client, server = pair()
    data = b"".join(client.send(ev) for ev in evs)
    got: list[Event] = []
    for chunk in split_at(data, cuts):
        server.receive_data(chunk)
        got += drain(server)
    assert got == evs


def test_push_request_id_is_not_carried() -> None:
    client, server = pair()
    data = server.send(Push(1, b"p"))
    assert struct.unpack_from(">IBHI", data) == (8, 2, 1, 0)
    client.receive_data(data)
    assert client.next_event() == Push(1, b"p")


def test_byte_layout_of_a_request() -> None:
    client, _ = pair()
    assert client.send(Request(0x01020304, 0x0A0B, b"xy")) == (
        b"\x00\x00\x00\x09" + b"\x00" + b"\x0a\x0b" + b"\x01\x02\x03\x04" + b"xy"
    )


def test_send_parts_splits_large_payloads_without_changing_bytes() -> None:
    client, server = pair()
    small = Request(1, 2, b"a" * 10)
    big = Request(2, 3, b"b" * 100_000)
    assert client.send_parts(small) == [client.send(small)]
    parts = client.send_parts(big)
    assert len(parts) == 2 and parts[1] is big.payload
    server.receive_data(b"".join(parts))
    assert server.next_event() == big


def test_long_stream_with_buffer_compaction() -> None:
    """Enough traffic that the receive buffer is compacted while a frame is half in."""
    client, server = pair()
    evs = [Request(i, i % 7, bytes([i % 256]) * (500 + i * 37 % 1500)) for i in range(400)]
    data = b"".join(client.send(ev) for ev in evs)
    assert len(data) > 4 * (1 << 16)
    got: list[Event] = []
    # receive a lot before draining so the consumed prefix grows past the slack
    for start in range(0, len(data), 90_001):
        server.receive_data(data[start : start + 90_001])
        got += drain(server)
        assert server.buffered < 2 * (7 + 11 + 2100)
    assert got == evs
    assert server.buffered == 0


def test_frame_exactly_at_the_cap_is_accepted() -> None:
    client, server = pair(max_frame=64)
    ev = Request(1, 2, b"z" * (64 - 11))
    server.receive_data(client.send(ev))
    assert server.next_event() == ev


# ------------------------------------------------------------------------- end of stream
def test_clean_eof_between_frames() -> None:
    client, server = pair()
    server.receive_data(client.send(Request(1, 1)))
    server.receive_data(b"")
    assert server.next_event() == Request(1, 1)
    assert server.next_event() is NEED_DATA
    assert server.peer_closed


def test_peer_closed_only_after_complete_events_are_taken() -> None:
    client, server = pair()
    server.receive_data(client.send(Request(1, 1)) + client.send(Request(2, 2)))
    server.receive_data(b"")
    assert not server.peer_closed
    assert server.next_event() == Request(1, 1)
    assert not server.peer_closed
    assert server.next_event() == Request(2, 2)
    assert server.peer_closed


def test_eof_before_anything() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"")
    assert server.next_event() is NEED_DATA
    assert server.peer_closed


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 10, 11, 12, 20])
def test_truncated_frame_at_eof_raises(cut: int) -> None:
    client, server = pair()
    data = client.send(Request(5, 6, b"0123456789"))
    assert len(data) == 21
    server.receive_data(data[:cut])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize("cut", [1, 4, 5, 7])
def test_truncated_handshake_at_eof_raises(cut: int) -> None:
    server = Connection(Role.SERVER)
    server.receive_data(Connection(Role.CLIENT).send(Hello())[:cut])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        server.next_event()


def test_truncated_frame_on_client_side_at_eof_raises() -> None:
    client, server = pair()
    client.receive_data(server.send(Response(1, 0, b"abc"))[:-1])
    client.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        client.next_event()


# ------------------------------------------------------------------------- bad peers
@pytest.mark.parametrize(
    "prefix", [b"G", b"GET ", b"EQ\x00", b"HTTP/1.1 200 OK\r\n", b"EQMX\x00\x01"]
)
def test_wrong_magic_rejected_early(prefix: bytes) -> None:
    server = Connection(Role.SERVER)
    server.receive_data(prefix)
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


def test_wrong_magic_rejected_on_client() -> None:
    client = Connection(Role.CLIENT)
    client.send(Hello())
    client.receive_data(b"XQMQ\x00\x01\x00\x00")
    with pytest.raises(RemoteProtocolError):
        client.next_event()


def test_connection_stays_failed_after_a_remote_error() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"nope!!!!")
    with pytest.raises(RemoteProtocolError):
        server.next_event()
    with pytest.raises(RemoteProtocolError):
        server.next_event()


def test_two_gib_length_prefix_rejected_before_buffering() -> None:
    server = server_after_hello()
    tracemalloc.start()
    try:
        server.receive_data(b"\x80\x00\x00\x00" + b"\x00\x00\x00\x00\x00\x00\x00" + b"junk")
        assert server.buffered < 64
        with pytest.raises(RemoteProtocolError) as info:
            server.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert server.buffered < 64
    assert peak < 1 << 20


def test_length_prefix_alone_is_enough_to_reject() -> None:
    server = server_after_hello()
    server.receive_data(struct.pack(">I", 0xFFFFFFFF))
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_default_cap_boundary() -> None:
    server = server_after_hello()
    server.receive_data(struct.pack(">I", DEFAULT_MAX_FRAME - 3))
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    ok = server_after_hello()
    ok.receive_data(struct.pack(">I", DEFAULT_MAX_FRAME - 4))
    assert ok.next_event() is NEED_DATA  # accepted, waiting for the payload


def test_custom_cap_rejects_larger_frames_on_client() -> None:
    client, _ = pair(max_frame=32)
    client.receive_data(frame(1, 0, 1, b"x" * 40))
    with pytest.raises(RemoteProtocolError) as info:
        client.next_event()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


@pytest.mark.parametrize("length", [0, 1, 6])
def test_frame_shorter_than_header_raises(length: int) -> None:
    server = server_after_hello()
    server.receive_data(struct.pack(">I", length) + b"\x00" * 16)
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize("kind", [1, 2, 3, 255])
def test_server_rejects_non_request_frames(kind: int) -> None:
    server = server_after_hello()
    server.receive_data(frame(kind, 0, 1))
    with pytest.raises(RemoteProtocolError):
        server.next_event()


@pytest.mark.parametrize("kind", [0, 3, 255])
def test_client_rejects_request_and_unknown_frames(kind: int) -> None:
    client = client_after_ack()
    client.receive_data(frame(kind, 0, 1))
    with pytest.raises(RemoteProtocolError):
        client.next_event()


def _feed_garbage(conn: Connection, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            if not chunk:
                continue
            conn.receive_data(chunk)
            drain(conn)
        conn.receive_data(b"")
        drain(conn)
    except RemoteProtocolError as exc:
        assert isinstance(exc.code, ErrorCode)
        assert exc.code in (ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_TOO_LARGE)
        # and it stays failed
        with pytest.raises(RemoteProtocolError):
            conn.next_event()


@settings(max_examples=200)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_garbage_to_fresh_server_only_raises_remote_protocol_error(chunks: list[bytes]) -> None:
    _feed_garbage(Connection(Role.SERVER), chunks)


@settings(max_examples=200)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_garbage_after_handshake_only_raises_remote_protocol_error(chunks: list[bytes]) -> None:
    _feed_garbage(server_after_hello(), chunks)
    _feed_garbage(client_after_ack(), chunks)


@settings(max_examples=200)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_garbage_after_magic_only_raises_remote_protocol_error(chunks: list[bytes]) -> None:
    _feed_garbage(Connection(Role.SERVER, max_frame=256), [MAGIC, *chunks])


@settings(max_examples=150)
@given(
    kind=st.integers(0, 255),
    code=u16,
    rid=u32,
    payload=st.binary(max_size=64),
    declared=st.integers(0, 0xFFFFFFFF),
)
def test_plausible_frames_with_lying_lengths(
    kind: int, code: int, rid: int, payload: bytes, declared: int
) -> None:
    server = server_after_hello()
    data = struct.pack(">IBHI", declared, kind, code, rid) + payload
    _feed_garbage(server, [data])


# ------------------------------------------------------------------------- misuse
def test_local_misuse_before_handshake() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, 1))  # before Hello
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, 0))  # before the handshake
    with pytest.raises(LocalProtocolError):
        server.send(Push(1))
    with pytest.raises(LocalProtocolError):
        server.send(HelloAck())  # before the client's Hello arrived
    with pytest.raises(LocalProtocolError):
        server.send(Hello())  # servers do not send Hello
    with pytest.raises(LocalProtocolError):
        client.send(HelloAck())  # clients do not send HelloAck
    client.send(Hello())
    with pytest.raises(LocalProtocolError):
        client.send(Hello())  # only once


def test_local_misuse_after_handshake() -> None:
    client, server = pair()
    with pytest.raises(LocalProtocolError):
        server.send(Request(1, 1))
    with pytest.raises(LocalProtocolError):
        client.send(Response(1, 0))
    with pytest.raises(LocalProtocolError):
        client.send(Push(1))
    with pytest.raises(LocalProtocolError):
        server.send(HelloAck())  # only once
    with pytest.raises(LocalProtocolError):
        client.send(Hello())


@pytest.mark.parametrize(
    "ev",
    [Request(-1, 1), Request(1 << 32, 1), Request(1, -1), Request(1, 1 << 16)],
)
def test_out_of_range_fields_are_local_errors(ev: Request) -> None:
    client, _ = pair()
    with pytest.raises(LocalProtocolError):
        client.send(ev)


def test_out_of_range_push_and_response_codes_are_local_errors() -> None:
    _, server = pair()
    with pytest.raises(LocalProtocolError):
        server.send(Push(1 << 16))
    with pytest.raises(LocalProtocolError):
        server.send(Response(1 << 32, 0))


@pytest.mark.parametrize("ev", [Hello(1 << 16, 0), Hello(1, -1)])
def test_out_of_range_hello_is_a_local_error(ev: Hello) -> None:
    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT).send(ev)


def test_sending_more_than_the_cap_is_a_local_error() -> None:
    client, server = pair(max_frame=64)
    client.send(Request(1, 1, b"x" * 53))
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, 1, b"x" * 54))
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, 0, b"x" * 54))


def test_receive_after_eof_is_a_local_error() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"EQMQ")


def test_protocol_errors_are_eqeue_errors_with_codes() -> None:
    assert issubclass(LocalProtocolError, EQueueError)
    assert issubclass(RemoteProtocolError, EQueueError)
    assert LocalProtocolError("x").code == ErrorCode.PROTOCOL_ERROR


def test_rejected_hello_leaves_the_state_unchanged() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        client.send(Hello(1 << 16))
    server.receive_data(client.send(Hello()))
    assert server.next_event() == Hello()
    with pytest.raises(LocalProtocolError):
        server.send(HelloAck(code=-1))
    assert not server.handshake_done
    client.receive_data(server.send(HelloAck()))
    assert client.next_event() == HelloAck()


# ---------------------------------------------------------------- server encoders
@given(
    code=u16,
    request_id=u32,
    parts=st.lists(st.binary(max_size=300), max_size=6),
    chunk=st.integers(1, 64),
)
def test_encode_response_is_decoded_by_the_client(
    code: int, request_id: int, parts: list[bytes], chunk: int
) -> None:
    client, _server = pair()
    data = b"".join(encode_response(code, request_id, parts))
    for i in range(0, len(data), chunk):
        client.receive_data(data[i : i + chunk])
    assert drain(client) == [Response(request_id, code, b"".join(parts))]


@given(response=responses)
def test_encode_response_matches_the_state_machine(response: Response) -> None:
    _client, server = pair()
    assert b"".join(
        encode_response(response.code, response.request_id, [response.payload])
    ) == server.send(response)


@given(push=pushes)
def test_encode_push_is_decoded_by_the_client(push: Push) -> None:
    client, server = pair()
    data = b"".join(encode_push(push.code, push.payload))
    assert data == server.send(push)
    client.receive_data(data)
    assert drain(client) == [push]


@given(code=u16)
def test_encode_handshake_answer_is_a_hello_ack(code: int) -> None:
    client = Connection(Role.CLIENT)
    client.send(Hello())
    client.receive_data(encode_handshake_answer(code))
    assert client.next_event() == HelloAck(PROTOCOL_VERSION, code)


def test_encode_response_keeps_payload_pieces_uncopied() -> None:
    big = b"x" * 10_000
    parts = encode_response(0, 7, [b"head", big])
    assert parts[2] is big and len(parts) == 3
