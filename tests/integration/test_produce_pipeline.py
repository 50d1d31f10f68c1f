"""A connection's produce pipeline (``ProducePipeline``, ``broker/handlers/produce.py``):
the reader feeds it each produce request, the pipeline defers them and commits them,
one transaction per received chunk, and stages the answers; nothing it deferred is
left unwritten. On a real broker in this test's loop, through raw frames and through
the broker's own produce handler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.broker.handlers.produce import ProducePipeline
from equeue.client import AsyncClient
from equeue.codec import Connection, Hello, HelloAck, Response, Role, encode_handshake_answer
from equeue.errors import BadRequest, ErrorCode, TopicNotFound
from equeue.protocol import RequestCode
from tests.conftest import make_config, wait_until
from tests.hostile.test_limits import Raw


def _payload(topic: str, body: bytes, auto_create: bool = True) -> bytes:
    entries = [wire.encode_entry(Message(body))]
    return wire.ProduceRequest(topic, 0, entries, auto_create=auto_create).encode()


async def _writer_parked(broker: Broker) -> None:
    app = broker.appender
    await wait_until(lambda: app._writer_waiting and not app._pending, what="the writer thread parked")


async def _responses(raw: Raw, n: int) -> list[Response]:
    """Read ``n`` responses (no push is expected here)."""
    got: list[Response] = []
    while len(got) < n:
        data = await raw.stream.receive_some(1 << 16)
        assert data, "the broker closed the connection"
        raw.codec.receive_data(data)
        while isinstance(ev := raw.codec.next_event(), Response):
            got.append(ev)
    return got


@pytest.mark.parametrize("flush", ["sync", "async"])
async def test_a_chunk_of_produces_followed_by_silence_is_one_transaction_and_all_answered(
    tmp_path: Path, flush: str
) -> None:
    """Five produce frames sent in one write, then nothing: the reader feeds them to the
    pipeline, which commits them as one transaction (inline with --flush async) before
    the reader waits for more input; all five are answered, in order."""
    cfg = make_config(tmp_path / "data", flush=flush)
    with trio.fail_after(20):
        async with open_broker(cfg) as broker:
            async with AsyncClient(broker.address) as c:
                await c.create_topic("t", 1)
            raw = await Raw.connect(broker.address)
            try:
                await _writer_parked(broker)
                app = broker.appender
                tx, inline = app.transactions, app.inline_transactions
                chunk = b"".join(raw.frame(RequestCode.PRODUCE, _payload("t", b"m%d" % i)) for i in range(5))
                await raw.stream.send_all(chunk)  # one write, then silence
                answers = await _responses(raw, 5)
                assert [a.request_id for a in answers] == [1, 2, 3, 4, 5]
                assert all(a.code == ErrorCode.OK for a in answers), answers
                offsets = [wire.ProduceResponse.decode(a.payload).first_queue for a in answers]
                assert offsets == [0, 1, 2, 3, 4]
                assert app.transactions == tx + 1
                assert app.inline_transactions == inline + (flush == "async")
            finally:
                await raw.aclose()


class Answers:
    """What a pipeline hands back: the staged answer frames, decoded, and the count of
    produces it reported answered."""

    def __init__(self) -> None:
        self.codec = Connection(Role.CLIENT)  # past its handshake: it reads answer frames
        self.codec.send(Hello())
        self.codec.receive_data(encode_handshake_answer(ErrorCode.OK))
        assert isinstance(self.codec.next_event(), HelloAck)
        self.frames: list[Response] = []
        self.answered = 0

    def stage(self, parts: list[bytes]) -> None:
        self.codec.receive_data(b"".join(parts))
        ev = self.codec.next_event()
        assert isinstance(ev, Response), ev
        self.frames.append(ev)

    def done(self) -> None:
        self.answered += 1

    @staticmethod
    def error(exc: Exception, request_id: int, code: int) -> tuple[int, list[bytes]]:
        return ErrorCode.INTERNAL_ERROR, [repr(exc).encode()]

    def open(self, broker: Broker) -> Any:
        return broker.handlers.produce.pipeline(None, self.stage, self.done, self.error)


@pytest.fixture
async def broker(tmp_path: Path) -> Any:
    """A live broker in this test's loop, with topic ``t`` (one queue)."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        async with AsyncClient(b.address) as c:
            await c.create_topic("t", 1)
        yield b


async def test_what_a_pipeline_deferred_is_committed_when_it_is_left(broker: Broker) -> None:
    """Fed requests wait, unwritten, until a commit; leaving the pipeline's block
    commits them even without one (nothing deferred is ever left unwritten)."""
    info = broker.store.topics["t"]
    answers = Answers()
    with trio.fail_after(10):
        await _writer_parked(broker)
        with answers.open(broker) as pipeline:
            assert isinstance(pipeline, ProducePipeline)
            for i in range(3):
                assert pipeline.feed(i + 1, _payload("t", b"d%d" % i)) is None
            await trio.testing.wait_all_tasks_blocked()
            assert len(broker.appender._pending) == 3  # deferred: the writer was not woken
            assert broker.store.view.queue(info.topic_id, 0).next_offset == 0
        await wait_until(lambda: answers.answered == 3, what="the three answered")
    assert [f.request_id for f in answers.frames] == [1, 2, 3]
    assert [wire.ProduceResponse.decode(f.payload).first_queue for f in answers.frames] == [0, 1, 2]
    assert broker.store.view.queue(info.topic_id, 0).next_offset == 3


async def test_commit_writes_what_was_fed_and_a_bad_request_queues_nothing(broker: Broker) -> None:
    answers = Answers()
    with trio.fail_after(10):
        await _writer_parked(broker)
        with answers.open(broker) as pipeline:
            pipeline.feed(1, _payload("t", b"a"))
            with pytest.raises(BadRequest, match="empty produce batch"):
                pipeline.feed(2, wire.ProduceRequest("t", 0, []).encode())
            pipeline.commit()
            await wait_until(lambda: answers.answered == 1, what="the first answered")
            tx = broker.appender.transactions
            pipeline.commit()  # nothing deferred since: no transaction
            await trio.testing.wait_all_tasks_blocked()
            assert broker.appender.transactions == tx and not broker.appender._pending
    assert [(f.request_id, f.code) for f in answers.frames] == [(1, ErrorCode.OK)]


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The payloads the produce handler decodes from now on (its ``_decode`` wrapped)."""
    from equeue.broker.handlers import produce

    decoded: list[bytes] = []
    decode = produce._decode

    def counting(buf: bytes) -> wire.ProduceRequest:
        decoded.append(buf)
        return decode(buf)

    monkeypatch.setattr(produce, "_decode", counting)
    return decoded


async def test_a_produce_to_a_new_topic_is_decoded_once_and_queued_after_its_creation(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = _count_decodes(monkeypatch)
    answers = Answers()
    with trio.fail_after(10):
        with answers.open(broker) as pipeline:
            payload = _payload("fresh", b"new")
            req = pipeline.feed(7, payload)
            assert isinstance(req, wire.ProduceRequest) and req.topic == "fresh"  # nothing queued
            await pipeline.feed_missing(7, payload, req)
            with pytest.raises(TopicNotFound):  # no auto-create: refused, nothing queued
                missing = pipeline.feed(8, _payload("absent", b"x", auto_create=False))
                assert missing is not None
                await pipeline.feed_missing(8, b"", missing)
        await wait_until(lambda: answers.answered == 1, what="the new topic's produce answered")
    assert len(decoded) == 2  # one per request
    assert [(f.request_id, f.code) for f in answers.frames] == [(7, ErrorCode.OK)]
    assert "fresh" in broker.store.topics


async def test_the_general_path_decodes_once_and_answers(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ProduceHandler.handle`` (a request task), for a topic it must create first."""
    from equeue.broker.handlers.context import RequestContext

    decoded = _count_decodes(monkeypatch)
    with trio.fail_after(10):
        parts = await broker.handlers.produce.handle(_payload("other", b"x"), RequestContext(1))
    assert wire.ProduceResponse.decode(b"".join(parts)).first_queue == 0
    assert len(decoded) == 1

