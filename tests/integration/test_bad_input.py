"""Hostile and broken clients, each against a live broker that keeps serving a
well-behaved client at the same time (the broker lives on)."""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker
from equeue.client import AsyncClient
from equeue.codec import HEADER, MAGIC, PROTOCOL_VERSION
from equeue.errors import (
    ErrorCode,
    InvalidName,
    MessageTooLarge,
    QueueNotFound,
    RemoteProtocolError,
    ReservedTopic,
    UnknownRequest,
)
from equeue.protocol import RequestCode
from tests.conftest import wait_until

HELLO = struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, 0)


async def read_until_closed(s: trio.SocketStream, limit: float = 5.0) -> bytes:
    """Everything the broker sends until it closes the connection (fails if it doesn't)."""
    out = b""
    with trio.fail_after(limit):
        while True:
            try:
                data = await s.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the peer: also closed
                return out
            if not data:
                return out
            out += data


async def connect(broker: Broker, handshake: bool = True) -> trio.SocketStream:
    s = await trio.open_tcp_stream("127.0.0.1", broker.port)
    if handshake:
        await s.send_all(HELLO)
        ack = b""
        while len(ack) < 8:
            ack += await s.receive_some(8 - len(ack))
        assert ack == struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, ErrorCode.OK)
    return s


def request(rid: int, code: int, payload: bytes) -> bytes:
    return HEADER.pack(7 + len(payload), 0, code, rid) + payload


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while pos + 11 <= len(data):
        n, kind, code, rid = HEADER.unpack_from(data, pos)
        out.append((kind, code, rid, data[pos + 11 : pos + 4 + n]))
        pos += 4 + n
    return out


@pytest.fixture
async def served(broker: Broker) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """A good client producing and pulling in the background the whole time; yields
    a check that it is still being served right now."""
    errors: list[BaseException] = []
    rounds = [0]
    async with AsyncClient(broker.address) as good:
        await good.create_topic("good", 1)

        async def loop() -> None:
            try:
                while True:
                    a = await good.produce(wire.ProduceRequest("good", 0, [wire.encode_entry(Message(b"ok"))]))
                    r = await good.pull(wire.PullRequest("good", 0, a.first_queue, 1))
                    assert r.messages[0].body == b"ok"
                    rounds[0] += 1
                    await trio.sleep(0.01)
            except Exception as exc:  # pragma: no cover - reported by check()
                errors.append(exc)

        async def check() -> None:
            start = rounds[0]
            await wait_until(lambda: errors or rounds[0] >= start + 2, timeout=5, what="two more rounds served")
            assert not errors, errors

        async with trio.open_nursery() as n:
            n.start_soon(loop)
            await check()
            yield check
            await check()
            n.cancel_scope.cancel()


async def test_garbage_bytes(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker, handshake=False)
    await s.send_all(os.urandom(4096))
    reply = await read_until_closed(s)
    # a handshake-shaped refusal: magic, version, PROTOCOL_ERROR
    assert reply == struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, ErrorCode.PROTOCOL_ERROR)
    await served()


async def test_wrong_magic(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker, handshake=False)
    await s.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = await read_until_closed(s)
    assert reply[:4] == MAGIC and struct.unpack(">H", reply[6:8])[0] == ErrorCode.PROTOCOL_ERROR
    await served()


async def test_unsupported_version(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker, handshake=False)
    await s.send_all(struct.pack(">4sHH", MAGIC, 999, 0))
    reply = await read_until_closed(s)
    assert reply == struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, ErrorCode.UNSUPPORTED_VERSION)
    await served()


async def test_two_gib_length_prefix(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker)
    await s.send_all(struct.pack(">I", 2**31) + b"\0" * 64)
    frames = parse_frames(await read_until_closed(s))
    assert [(kind, code, rid) for kind, code, rid, _ in frames] == [(1, ErrorCode.FRAME_TOO_LARGE, 0)]
    assert b"exceeds" in frames[0][3]
    await served()


async def test_truncated_frame(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker)
    await s.send_all(request(1, RequestCode.STATS, b"{}" + b" " * 100)[:40])
    await s.send_eof()  # the frame can never complete
    frames = parse_frames(await read_until_closed(s))
    assert [(code, rid) for _, code, rid, _ in frames] == [(ErrorCode.PROTOCOL_ERROR, 0)]
    await served()


async def test_frame_shorter_than_its_header(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    s = await connect(broker)
    await s.send_all(struct.pack(">I", 3) + b"abc")
    frames = parse_frames(await read_until_closed(s))
    assert [(code, rid) for _, code, rid, _ in frames] == [(ErrorCode.PROTOCOL_ERROR, 0)]
    await served()


async def test_unknown_request_code_keeps_the_connection(
    broker: Broker, served: Callable[[], Awaitable[None]]
) -> None:
    s = await connect(broker)
    await s.send_all(request(7, 12345, b"whatever"))
    await s.send_all(request(8, RequestCode.STATS, b"{}"))
    data = b""
    with trio.fail_after(5):
        while len(parse_frames(data)) < 2:
            data += await s.receive_some(65536)
    answers = {rid: (code, payload) for _, code, rid, payload in parse_frames(data)}
    assert answers[7][0] == ErrorCode.UNKNOWN_REQUEST
    assert answers[8][0] == ErrorCode.OK and b"messages_in" in answers[8][1]
    await s.aclose()
    async with AsyncClient(broker.address) as c:
        with pytest.raises(UnknownRequest):
            await c.request(999, b"")
    await served()


async def test_malformed_payloads_answer_bad_request(
    broker: Broker, served: Callable[[], Awaitable[None]]
) -> None:
    s = await connect(broker)
    await s.send_all(request(1, RequestCode.PRODUCE, b"\x00\x05ab"))  # truncated topic
    await s.send_all(request(2, RequestCode.PULL, b"\x00"))
    await s.send_all(request(3, RequestCode.CREATE_TOPIC, b"{not json"))
    # a produce batch announcing 1,000,000 entries but carrying one
    bad = bytearray(wire.ProduceRequest("good", 0, [wire.encode_entry(Message(b"x"))]).encode())
    struct.pack_into(">I", bad, 2 + 4 + 5, 1_000_000)
    await s.send_all(request(4, RequestCode.PRODUCE, bytes(bad)))
    data = b""
    with trio.fail_after(5):
        while len(parse_frames(data)) < 4:
            data += await s.receive_some(65536)
    codes = {rid: code for _, code, rid, _ in parse_frames(data)}
    assert codes == dict.fromkeys((1, 2, 3, 4), ErrorCode.BAD_REQUEST)
    await s.aclose()
    await served()


async def test_invalid_topic_name(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    with trio.fail_after(5):
        async with AsyncClient(broker.address) as c:
            for name in ("bad name!", "", "x" * 129, "a/b"):
                with pytest.raises(InvalidName):
                    await c.produce(wire.ProduceRequest(name, 0, [wire.encode_entry(Message(b"x"))]))
            with pytest.raises(InvalidName):
                await c.create_topic("no spaces", 1)
            with pytest.raises(ReservedTopic):
                await c.create_topic("%RETRY%g", 1)
            assert "bad name!" not in {t.name for t in await c.list_topics()}
    await served()


async def test_queue_id_out_of_range(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    with trio.fail_after(5):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("four", 4)
            for q in (4, 2**32 - 1):
                with pytest.raises(QueueNotFound):
                    await c.produce(wire.ProduceRequest("four", q, [wire.encode_entry(Message(b"x"))]))
                with pytest.raises(QueueNotFound):
                    await c.pull(wire.PullRequest("four", q, 0))
            assert sum(q.count for q in (await c.describe_topic("four")).queues) == 0
    await served()


async def test_message_over_max_size(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    limit = broker.config.max_message_bytes
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("big", 1)
            ok = wire.encode_entry(Message(b"small"))
            huge = wire.encode_entry(Message(b"x" * (limit + 1)))
            with pytest.raises(MessageTooLarge):
                await c.produce(wire.ProduceRequest("big", 0, [ok, huge]))
            # the whole batch was refused: nothing stored
            assert (await c.queue_offsets("big", 0)).max_offset == 0
            a = await c.produce(wire.ProduceRequest("big", 0, [wire.encode_entry(Message(b"x" * limit))]))
            assert a.stored == 1
    await served()


async def test_frame_over_the_cap_from_a_real_client(
    broker: Broker, served: Callable[[], Awaitable[None]]
) -> None:
    s = await connect(broker)
    payload = b"x" * (broker.config.max_frame + 10)
    with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
        with trio.fail_after(10):
            await s.send_all(request(1, RequestCode.PRODUCE, payload))
            await read_until_closed(s)
            raise trio.BrokenResourceError  # closed cleanly before we finished: same outcome
    await served()


async def test_silent_client_is_closed_after_the_handshake_timeout(
    broker: Broker, served: Callable[[], Awaitable[None]]
) -> None:
    s = await connect(broker, handshake=False)
    t0 = trio.current_time()
    assert await read_until_closed(s, limit=broker.config.handshake_timeout + 3) == b""
    assert trio.current_time() - t0 >= broker.config.handshake_timeout * 0.9
    await served()


async def test_client_codec_reports_a_refused_handshake(broker: Broker) -> None:
    """A broken peer on the client side maps to a protocol error, not a crash."""
    from equeue.codec import Connection, HelloAck, Role

    codec = Connection(Role.CLIENT)
    codec.receive_data(struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, ErrorCode.PROTOCOL_ERROR))
    ev = codec.next_event()
    assert isinstance(ev, HelloAck) and ev.code == ErrorCode.PROTOCOL_ERROR
    codec2 = Connection(Role.CLIENT)
    codec2.receive_data(b"HTTP/1.1 400")
    with pytest.raises(RemoteProtocolError):
        codec2.next_event()


async def test_connection_reset_by_peer(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    """A client that resets its connection (RST) mid-stream does not hurt the broker."""
    for _ in range(5):
        s = await connect(broker)
        await s.send_all(request(1, RequestCode.PULL, wire.PullRequest("good", 0, 10**6, max_wait_ms=5000).encode()))
        assert await s.receive_some()  # the broker is answering (offset overflow)
        s.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.socket.close()  # RST
    await served()


async def test_no_client_produces_into_an_internal_topic(broker: Broker, served: Callable[[], Awaitable[None]]) -> None:
    """Forged entries into %RETRY%/%DLQ% topics are refused, and a
    produce never auto-creates one (the broker writes them itself: SEND_BACK, DLQ_RESEND)."""
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"x"))]))
            await c.send_back("g", "t", 0, 0, 0, 16, [60_000])  # the broker creates %RETRY%g
            for name in ("%RETRY%g", "%DLQ%junk-1"):
                with pytest.raises(ReservedTopic, match="only the broker writes it"):
                    await c.produce(wire.ProduceRequest(name, 0, [wire.encode_entry(Message(b"forged"))]))
            names = {t.name for t in await c.list_topics(include_internal=True)}
            assert "%RETRY%g" in names and "%DLQ%junk-1" not in names
            retry = await c.describe_topic("%RETRY%g")
            assert sum(q.count for q in retry.queues) + retry.pending_delayed == 1  # only the broker's copy
    await served()


async def test_internal_error_tracebacks_are_rate_limited(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A request a client can repeat must not log a traceback each
    time. A broker bug (simulated: the statistics snapshot raises) is answered
    INTERNAL_ERROR every time, and logged with its traceback once per 10 s."""
    from equeue.errors import InternalBrokerError

    def broken() -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(broker.handlers, "_statistics", broken)
    with trio.fail_after(10), caplog.at_level(logging.ERROR, logger="equeue.broker"):
        async with AsyncClient(broker.address) as c:
            for _ in range(20):
                with pytest.raises(InternalBrokerError, match="simulated bug"):
                    await c.stats()
            tracebacks = [r for r in caplog.records if r.exc_info and "failed" in r.getMessage()]
            assert len(tracebacks) == 1
            await c.create_topic("still-serving", 1)
