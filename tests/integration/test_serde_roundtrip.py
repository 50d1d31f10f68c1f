"""Serializers end to end: producer serializers and consumer deserializers (JSON,
msgpack) through a real broker on both fronts; a deserializer that raises takes the
handler-failure path (retry, then dead letter) and the consumer goes on; strict
properties and serializer errors refuse a message before anything is buffered."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from equeue import Message, PullStatus, SerializationError, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.names import dlq_topic
from equeue.producer import AsyncProducer, Producer
from equeue.serde import (
    json_deserializer,
    json_key_deserializer,
    json_key_serializer,
    json_serializer,
    msgpack_deserializer,
    msgpack_serializer,
)
from tests.conftest import wait_until, wait_until_sync

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0,
)  # fmt: skip


async def test_json_round_trip_async(broker: Broker) -> None:
    values = [{"order": i, "items": ["tea", i * 1.5], "note": "ž"} for i in range(6)]
    with trio.fail_after(20):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(
                broker.address, value_serializer=json_serializer, key_serializer=json_key_serializer
            ) as p,
        ):
            await c.create_topic("orders", 2)
            r0 = await p.send("orders", values[0], key={"user": 0})
            h1 = await p.send_async("orders", values[1], key={"user": 1}, properties={"src": "web"})
            await h1
            await p.send_batch("orders", values[2:5])
            # a Message goes as it is: its body is wire form already
            await p.send_batch("orders", [Message(json_serializer(values[5]), key='{"user":5}')])
            # the body on the wire is the compact, sorted JSON
            r = await c.pull(wire.PullRequest("orders", r0.queue_id, r0.queue_offset, 1))
            assert (r.messages[0].body, r.messages[0].key) == (
                json_serializer(values[0]),
                '{"user":0}',
            )
        got: list[tuple[Any, Any, bytes]] = []
        async with AsyncConsumer(
            broker.address, "g", "orders", start_from="earliest",
            value_deserializer=json_deserializer, key_deserializer=json_key_deserializer, **FAST,
        ) as con:  # fmt: skip

            async def handler(m: Message) -> None:
                got.append((m.value, m.key_value, m.body))
                if len(got) == len(values):
                    con.stop()

            await con.run(handler)
    assert sorted((v["order"], k) for v, k, _ in got) == [
        (0, {"user": 0}), (1, {"user": 1}), (2, None), (3, None), (4, None), (5, {"user": 5}),
    ]  # fmt: skip
    assert all(v == values[v["order"]] and body == json_serializer(v) for v, _, body in got)


def test_msgpack_round_trip_sync(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    values: list[Any] = [{"n": i, "raw": bytes([i]), 1: [None, True]} for i in range(5)]
    with Client(addr) as c:
        c.create_topic("mp", 1)
    with Producer(addr, value_serializer=msgpack_serializer) as p:
        p.send("mp", values[0], key="k0")
        p.send_async("mp", values[1]).result(10)
        p.send_batch("mp", values[2:])
    got: list[Any] = []
    with Consumer(
        addr, "gm", "mp", start_from="earliest", value_deserializer=msgpack_deserializer, **FAST
    ) as con:

        def handler(m: Message) -> None:  # a sync handler (threads, then inline)
            got.append((m.value, m.key_value))
            if len(got) == len(values):
                con.stop()

        con.run(handler)
    got.sort(key=lambda vk: vk[0]["n"])  # handlers run concurrently: any order
    assert got == [(values[0], "k0")] + [(v, None) for v in values[1:]]
    # the iterator form deserializes too
    seen: list[Any] = []
    with Consumer(
        addr, "gi", "mp", start_from="earliest", value_deserializer=msgpack_deserializer, **FAST
    ) as con:
        for m in con:
            seen.append(m.value)
            if len(seen) == len(values):
                con.stop()
    assert seen == values


async def test_async_iteration_and_msgpack(broker: Broker) -> None:
    with trio.fail_after(20):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(broker.address, value_serializer=msgpack_serializer) as p,
        ):
            await c.create_topic("mpa", 1)
            await p.send_batch("mpa", [[i, "x"] for i in range(3)])
        seen: list[Any] = []
        async with AsyncConsumer(broker.address, "ga", "mpa", start_from="earliest",
                                 value_deserializer=msgpack_deserializer, **FAST) as con:  # fmt: skip
            async for m in con:
                seen.append(m.value)
                if len(seen) == 3:
                    con.stop()
    assert seen == [[0, "x"], [1, "x"], [2, "x"]]


async def test_a_failing_deserializer_is_a_handler_failure(broker: Broker) -> None:
    """The handler never sees the message its deserializer fails on: it is retried,
    then dead-lettered, and the messages after it are handled meanwhile."""
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address) as p:
            await c.create_topic("mixed", 1)
            await p.send("mixed", b'{"n":0}')
            await p.send("mixed", b"not json", key="bad")
            await p.send_batch("mixed", [b'{"n":1}', b'{"n":2}'])
            got: list[Any] = []
            async with AsyncConsumer(broker.address, "gd", "mixed", start_from="earliest", retry_delays=[0.1],
                                     max_reconsume_times=1, value_deserializer=json_deserializer, **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    got.append(m.value)

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_until(
                        lambda: con.statistics().dead_lettered == 1, what="a dead letter"
                    )
                    await wait_until(lambda: len(got) == 3, what="the good messages handled")
                    con.stop()
                st = con.statistics()
            assert sorted(v["n"] for v in got) == [0, 1, 2]
            assert (st.failed, st.retried, st.dead_lettered) == (2, 1, 1)
            res = await c.pull(wire.PullRequest(dlq_topic("gd"), 0, 0, 10))
            assert [(m.body, m.key, m.reconsume_times) for m in res.messages] == [
                (b"not json", "bad", 1)
            ]
            assert await c.query_offset("gd", "mixed", 0) == 4


def test_a_failing_deserializer_in_sync_handlers_and_iteration(
    embedded_broker: EmbeddedBroker,
) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("mx", 1)
        c.produce(
            wire.ProduceRequest(
                "mx", 0, [wire.encode_entry(Message(b)) for b in (b"[1]", b"{", b"[2]")]
            )
        )
    got: list[Any] = []
    with Consumer(addr, "gs", "mx", start_from="earliest", max_reconsume_times=0,
                  value_deserializer=json_deserializer, handler_threads="always", **FAST) as con:  # fmt: skip
        t = threading.Thread(target=con.run, args=(lambda m: got.append(m.value),))
        t.start()
        stats = con.statistics
        wait_until_sync(
            lambda: stats().dead_lettered == 1 and len(got) == 2, what="a dead letter and the rest"
        )
        con.stop()
        t.join(10)
        assert not t.is_alive()
    assert sorted(got) == [[1], [2]]
    with Client(addr) as c:
        r = c.pull(wire.PullRequest(dlq_topic("gs"), 0, 0, 10))
        assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"{"]
    # iteration has no retry path: the message is handed out, its value raises
    seen: list[Any] = []
    with Consumer(
        addr, "gi", "mx", start_from="earliest", value_deserializer=json_deserializer, **FAST
    ) as con:
        for m in con:
            try:
                seen.append(m.value)
            except SerializationError as exc:
                seen.append(("failed", m.body, "mx/0@1" in str(exc)))
            if len(seen) == 3:
                con.stop()
    assert seen == [[1], ("failed", b"{", True), [2]]


async def test_serializer_errors_and_bad_properties_buffer_nothing(broker: Broker) -> None:
    with trio.fail_after(20):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(
                broker.address, value_serializer=json_serializer, key_serializer=json_key_serializer
            ) as p,
        ):
            await c.create_topic("t", 1)
            await p.queue_count("t")
            with pytest.raises(
                SerializationError, match="value_serializer json_serializer"
            ) as info:
                await p.send("t", {1, 2})
            assert isinstance(info.value.__cause__, TypeError)
            with pytest.raises(SerializationError, match="key_serializer json_key_serializer"):
                p.send_nowait("t", [1], key=object())
            with pytest.raises(SerializationError):
                await p.send_batch("t", [[1], object()])  # none of the batch is buffered
            with pytest.raises(TypeError, match="property 'n' must be a str, not int"):
                await p.send_async("t", [1], properties={"n": 1})
            assert p.pending_messages() == 0 and p.statistics()["buffered_bytes"] == 0
            await p.send("t", "ok", key=["k"], properties={"n": "1"})
            r = await c.pull(wire.PullRequest("t", 0, 0, 10))
            assert [(m.body, m.key, m.properties) for m in r.messages] == [
                (b'"ok"', '["k"]', {"n": "1"})
            ]


def test_blocking_producer_refuses_before_buffering(embedded_broker: EmbeddedBroker) -> None:
    with Producer(embedded_broker.address, value_serializer=json_serializer) as p:
        with pytest.raises(SerializationError, match="json_serializer"):
            p.send("t", float("nan"))
        with pytest.raises(SerializationError):
            p.send_async("t", object())
        with pytest.raises(TypeError, match="property 'p' must be a str, not float"):
            p.send("t", 1, properties={"p": 1.5})
        assert p.pending_messages() == 0
