"""Producer batches through a real broker: each codec round-trips, a batch is
stored as sent or recompressed by the topic's ``compression`` setting (and the
broker's ``--compression``), idempotent batches keep their dedup.

Messages are read back at the store (``Broker.store``: what is stored, byte for
byte) and through PULL (what a consumer gets)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from equeue import Message, control, wire
from equeue.broker import Broker, open_broker
from equeue.broker.storage.produce import STORED_BATCH_RECORDS
from equeue.client import AsyncClient
from equeue.errors import BadRequest
from equeue.wire.batches import Codec, batch_head, encode_batch, stored_batch
from tests.conftest import make_config

_MSGS = [
    Message(b"a" * 300, "k1", "t1", {"p": "v"}),
    Message(b"", None, None, {}),
    Message(b"b" * 50, "k2", None, {}),
]


def stored(b: Broker, topic: str, queue_id: int = 0) -> tuple[list[Message], list[bytes]]:
    """The messages of a queue as the store holds them, and its stored batches (the
    producers' batches, without the broker's header)."""
    msgs, r = b.store.read_messages(b.store.topic(topic), queue_id, 0, 100_000)
    return msgs, [bytes(stored_batch(value)) for _, value, _ in r.batches]


def fields(msgs: list[Message]) -> list[tuple[object, ...]]:
    return [(m.body, m.key, m.tags, m.properties) for m in msgs]


@pytest.mark.parametrize("codec", list(Codec))
async def test_a_batch_is_stored_as_sent_and_a_resent_one_is_a_duplicate(codec: Codec, tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        pid = os.urandom(16)
        batch = encode_batch(_MSGS, codec)
        req = wire.ProduceRequest("t", 0, (), pid, 0, batch=batch)
        first = await c.produce(req)
        assert (first.first_queue, first.stored, first.duplicate) == (0, 3, False)
        again = await c.produce(req)
        assert again.duplicate and again.first_queue == 0
        msgs, batches = stored(b, "t")
        assert fields(msgs) == fields(_MSGS)
        assert batches == [batch]  # byte for byte: the producer's batch
        assert [m.global_offset for m in msgs] == [0, 1, 2]
        pulled = await c.pull(wire.PullRequest("t", 0, 1, 10))  # the client decompresses
        assert fields(pulled.messages) == fields(_MSGS[1:])


async def test_the_topic_setting_stores_as_sent_or_recompresses(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        for setting in control.COMPRESSION_SETTINGS:
            info = await c.call(control.CreateTopic(setting, 1, compression=setting), control.TopicInfo)
            assert info.compression == setting
            for sent in Codec:
                await c.produce(wire.ProduceRequest(setting, 0, (), batch=encode_batch(_MSGS, sent)))
            # entries (the older form) go through the same setting
            await c.produce(wire.ProduceRequest(setting, 0, [wire.encode_entry(m) for m in _MSGS]))
            msgs, batches = stored(b, setting)
            assert fields(msgs) == fields(_MSGS) * 4, setting
            codecs = [batch_head(x, 1 << 20).codec for x in batches]
            if setting == "producer":
                assert codecs == [*Codec, Codec.NONE]
                assert batches[:3] == [encode_batch(_MSGS, sent) for sent in Codec]
            else:
                assert codecs == [Codec.parse(setting)] * 4, setting
        # alter, then back to the broker's default (producer)
        info = await c.call(control.AlterTopic("producer", compression="lz4"), control.TopicInfo)
        assert info.compression == "lz4"
        await c.produce(wire.ProduceRequest("producer", 0, (), batch=encode_batch(_MSGS, Codec.ZSTD)))
        assert batch_head(stored(b, "producer")[1][-1], 1 << 20).codec is Codec.LZ4
        info = await c.call(control.AlterTopic("producer", reset=["compression"]), control.TopicInfo)
        assert info.compression is None
        await c.produce(wire.ProduceRequest("producer", 0, (), batch=encode_batch(_MSGS, Codec.ZSTD)))
        assert batch_head(stored(b, "producer")[1][-1], 1 << 20).codec is Codec.ZSTD
        # refused with a coded error, nothing changed
        with pytest.raises(BadRequest, match="compression must be one of"):
            await c.call(control.CreateTopic("bad", 1, compression="gzip"), control.TopicInfo)
        with pytest.raises(BadRequest, match="both set and reset"):
            await c.call(control.AlterTopic("zstd", reset=["compression"], compression="lz4"), control.TopicInfo)
        assert b.store.topic("zstd").compression == "zstd"


async def test_the_broker_default_applies_to_topics_without_a_setting(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d", compression="zstd")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        await c.call(control.CreateTopic("as-sent", 1, compression="producer"), control.TopicInfo)
        for topic in ("t", "as-sent"):
            await c.produce(wire.ProduceRequest(topic, 0, (), batch=encode_batch(_MSGS, Codec.LZ4)))
        assert batch_head(stored(b, "t")[1][0], 1 << 20).codec is Codec.ZSTD
        assert batch_head(stored(b, "as-sent")[1][0], 1 << 20).codec is Codec.LZ4
        assert fields(stored(b, "t")[0]) == fields(_MSGS)


async def test_a_batch_with_delayed_messages_schedules_them_and_stores_the_others(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        later = Message(b"later", deliver_at=b.store.topic("t").created_ms + 3_600_000)
        answer = await c.produce(wire.ProduceRequest("t", 0, (), batch=encode_batch([_MSGS[0], later], Codec.ZSTD)))
        assert (answer.stored, answer.scheduled) == (1, 1)
        msgs, _ = stored(b, "t")
        assert fields(msgs) == fields(_MSGS[:1])


async def test_a_large_uncompressed_batch_is_stored_in_batches_of_at_most_256_records(tmp_path: Path) -> None:
    """A producer's uncompressed batch above ``STORED_BATCH_RECORDS`` is cut into
    stored batches of at most that many (a small read then carries a small batch),
    its keys indexed at their offsets; a compressed one is stored as sent."""
    msgs = [Message(b"%04d" % i, None if i % 3 else f"k{i}") for i in range(600)]
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        await c.produce(wire.ProduceRequest("t", 0, (), batch=encode_batch(msgs, Codec.NONE)))
        got, batches = stored(b, "t")
        assert [batch_head(x, 1 << 20).count for x in batches] == [STORED_BATCH_RECORDS, STORED_BATCH_RECORDS, 88]
        assert [(m.body, m.key, m.global_offset) for m in got] == [(m.body, m.key, i) for i, m in enumerate(msgs)]
        for i in (0, 255, 300, 597):  # keys on both sides of the cuts
            found = await c.find_by_key("t", f"k{i}")
            assert [m.global_offset for m in found.messages] == [i]
        await c.produce(wire.ProduceRequest("t", 0, (), batch=encode_batch(msgs, Codec.ZSTD)))
        assert [batch_head(x, 1 << 20).count for x in stored(b, "t")[1]][3:] == [600]
