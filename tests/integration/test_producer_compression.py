"""The producer's ``compression`` option: each request carries one batch of
records, compressed with the chosen codec, and the messages come back as sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner, Result

from equeue import ConfigError
from equeue.broker import Broker, EmbeddedBroker
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.producer import AsyncProducer, ProducerOptions
from equeue.wire.batches import Codec, batch_head
from tests.integration.test_produce_batches import stored
from tests.integration.test_producer import read_queue


def test_the_option_parses_names_and_refuses_others() -> None:
    assert ProducerOptions(compression="ZSTD").compression is Codec.ZSTD
    assert ProducerOptions().compression is Codec.NONE
    with pytest.raises(ConfigError, match="choose none, zstd or lz4"):
        ProducerOptions(compression="gzip")


async def test_each_codec_round_trips_and_compresses_on_the_wire(broker: Broker) -> None:
    body = b'{"order": 1234, "customer": "someone", "items": ["a", "b", "c"], "total": 99.5}'
    sent_bytes: dict[str, int] = {}
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            for codec in ("none", "zstd", "lz4"):
                topic = f"t-{codec}"
                await c.create_topic(topic, 1)
                before = broker.stats.bytes_in
                async with AsyncProducer(broker.address, compression=codec, linger=1.0) as p:
                    handles = [
                        await p.send_async(
                            topic, body, key=f"k{i}", tags="tag", properties={"n": str(i)}
                        )
                        for i in range(200)
                    ]
                    await p.flush()
                    assert [(await h).queue_offset for h in handles] == list(range(200))
                sent_bytes[codec] = broker.stats.bytes_in - before
                got = await read_queue(c, topic, 0)  # consumed back through PULL
                _, batches = stored(broker, topic)
                assert {batch_head(x, 1 << 20).codec for x in batches} == {Codec.parse(codec)}
                assert [(m.body, m.key, m.tags, m.properties) for m in got] == [
                    (body, f"k{i}", "tag", {"n": str(i)}) for i in range(200)
                ]
            # a delayed message still goes (as entries) and is scheduled
            async with AsyncProducer(broker.address, compression="zstd") as p:
                assert (await p.send("t-zstd", b"later", delay=3600)).scheduled
    assert sent_bytes["zstd"] < sent_bytes["none"] / 4, sent_bytes
    assert sent_bytes["lz4"] < sent_bytes["none"] / 2, sent_bytes


def test_cli_produce_compression(embedded_broker: EmbeddedBroker, tmp_path: Path) -> None:
    src = tmp_path / "lines.txt"
    src.write_text(
        "".join(
            f'{{"user": "u{i % 3}", "note": "the same words again and again"}}\n'
            for i in range(300)
        )
    )
    runner = CliRunner()
    assert embedded_broker._broker is not None
    stats = embedded_broker._broker.stats

    def produce(codec: str) -> Result:
        args = ["produce", "cli", "--file", str(src), "--compression", codec, "-b", embedded_broker.address]
        return runner.invoke(app, args)

    sent: dict[str, int] = {}
    for codec in ("none", "zstd", "lz4"):
        before = stats.bytes_in
        res = produce(codec)
        assert res.exit_code == 0 and "sent 300 messages" in res.output, res.output
        sent[codec] = stats.bytes_in - before
    assert sent["zstd"] < sent["none"] / 4 and sent["lz4"] < sent["none"] / 2, sent
    b = embedded_broker._broker
    assert b is not None
    got = [m for q in range(4) for m in stored(b, "cli", q)[0]]  # auto-created with 4 queues
    assert len(got) == 900
    res = produce("gzip")
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        "error: --compression: unknown compression 'gzip': choose none, zstd or lz4"
    ]


def test_cli_topic_compression_setting(embedded_broker: EmbeddedBroker) -> None:
    runner = CliRunner()
    addr = ["-b", embedded_broker.address]

    def ok(*args: str) -> str:
        res = runner.invoke(app, [*args, *addr])
        assert res.exit_code == 0, res.output
        return res.stdout

    assert "compression zstd" in ok("topic", "create", "z", "--queues", "1", "--compression", "zstd")
    assert "compression default" in ok("topic", "create", "d", "--queues", "1")
    assert "compression lz4" in ok("topic", "alter", "z", "--compression", "lz4")
    assert "compression lz4" in ok("topic", "describe", "z")
    assert json.loads(ok("topic", "describe", "z", "--json"))["info"]["compression"] == "lz4"
    assert "compression default" in ok("topic", "alter", "z", "--compression", "default")
    res = runner.invoke(app, ["topic", "create", "bad", "--compression", "gzip", *addr])
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        "error: --compression must be one of producer, none, zstd, lz4, got 'gzip'"
    ]


async def test_the_sdk_admin_calls_take_a_compression_setting(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            assert (await c.create_topic("sdk-z", 1, compression="zstd")).compression == "zstd"
            assert (await c.create_topic("sdk-d", 1)).compression is None
            assert (await c.create_topic("sdk-d2", 1, compression="default")).compression is None
            assert (await c.alter_topic("sdk-z", compression="LZ4")).compression == "lz4"
            assert (await c.alter_topic("sdk-z", retention_ms=60_000)).compression == "lz4"  # left as is
            assert (await c.alter_topic("sdk-z", compression="default")).compression is None
            assert (await c.alter_topic("sdk-d", compression="none")).compression == "none"
            assert (await c.alter_topic("sdk-d", reset=["compression"])).compression is None
            with pytest.raises(ConfigError, match="compression must be one of producer, none, zstd, lz4"):
                await c.create_topic("bad", 1, compression="gzip")
            with pytest.raises(ConfigError, match="both set and reset"):
                await c.alter_topic("sdk-d", compression="zstd", reset=["compression"])
            assert "bad" not in {t.name for t in await c.list_topics()}
            # the setting applies: a batch sent uncompressed is stored with zstd
            await c.alter_topic("sdk-z", compression="zstd")
            async with AsyncProducer(broker.address) as p:
                await p.send("sdk-z", b"x" * 100)
            assert {batch_head(x, 1 << 20).codec for x in stored(broker, "sdk-z")[1]} == {Codec.ZSTD}


def test_the_blocking_client_takes_a_compression_setting(embedded_broker: EmbeddedBroker) -> None:
    from equeue.client import Client

    with Client(embedded_broker.address) as c:
        assert c.create_topic("blk", 1, compression="lz4").compression == "lz4"
        assert c.alter_topic("blk", compression="producer").compression == "producer"
        assert c.describe_topic("blk").info.compression == "producer"
