"""The client's Router against a standalone broker: every queue is owned by group ""
(the bootstrap connection), so producers and consumers route exactly as before; a
broker that does not know GET_ROUTES (an older one) is routed as standalone."""

from __future__ import annotations

import json

import pytest
import trio
from typer.testing import CliRunner

from equeue.broker import Broker, EmbeddedBroker
from equeue.cli import app
from equeue.client import AsyncClient, Client
from equeue.client.routing import BOOTSTRAP, Router
from equeue.consumer import AsyncConsumer
from equeue.errors import QueueNotFound, TopicNotFound
from equeue.producer import AsyncProducer
from equeue.protocol import RequestCode


async def test_standalone_routes_every_queue_to_the_bootstrap(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, Router(c, refresh_interval=60) as router:
            await c.create_topic("a", 3)
            route = await router.route("a")
            assert route.owners == [BOOTSTRAP] * 3 and not router.cluster
            assert [router.owner("a", q) for q in range(3)] == ["", "", ""]
            assert all(router.available("a", q) for q in range(3)) and not router.available("a", 3)
            assert all([await router.client_for("a", q) is c for q in range(3)])
            assert await router.clients_for_topics(["a", "missing"]) == {"": c}
            assert await router.all_clients() == {"": c}
            stats = await router.call("a", 1, lambda client: client.queue_offsets("a", 1))
            assert (stats.queue_id, stats.max_offset) == (1, 0)
            with pytest.raises(TopicNotFound):
                await router.route("missing")
            with pytest.raises(QueueNotFound):
                await router.client_for("a", 3)
            created = await router.route("auto", auto_create=True)
            assert created.owners == [""] * created.info.queues
            # a refresh sees an alter
            await c.alter_topic("a", queues=5)
            assert router.owner("a", 4) is None  # the held count is stale...
            assert await router.client_for("a", 4) is c  # ...and refreshed when a queue is past it
            table = await router.refresh()
            assert {t.info.name: len(t.owners) for t in table.topics} == {"a": 5, "auto": created.info.queues}
            assert router.owner("a", 4) == ""


async def test_an_older_broker_without_get_routes_is_routed_as_standalone(broker: Broker) -> None:
    del broker.handlers.table[RequestCode.GET_ROUTES]  # what a broker without cluster routing answers: UNKNOWN_REQUEST
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c, Router(c, refresh_interval=60) as router:
            await c.create_topic("a", 2)
            assert (await router.route("a")).owners == ["", ""]
            assert router.legacy and await router.client_for("a", 1) is c
            with pytest.raises(TopicNotFound):
                await router.route("missing")
        async with AsyncProducer(broker.address, linger=0) as p:
            results = [await p.send("a", b"m", key=f"k{i}") for i in range(10)]
            assert {r.queue_id for r in results} == {0, 1}
        async with AsyncConsumer(broker.address, "g", "a", start_from="earliest") as cons:
            got = []
            async for m in cons:
                got.append(m.key)
                if len(got) == 10:
                    break
            assert sorted(k or "" for k in got) == sorted(f"k{i}" for i in range(10))


async def test_producer_and_consumer_route_through_the_bootstrap(broker: Broker) -> None:
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 4)
        async with AsyncProducer(broker.address, linger=0.001) as p:
            handles = [await p.send_async("t", f"m{i}".encode(), key=f"k{i % 7}") for i in range(200)]
            handles += [await p.send_async("t", b"keyless") for _ in range(40)]
            await p.flush()
            results = [await h for h in handles]
            assert p.router.owner("t", 0) == "" and p.router.client_now("t", 0) is p.client
        keyless = [r.queue_id for r in results[200:]]
        assert sorted(set(keyless)) == [0, 1, 2, 3]  # round-robin over every (available) queue
        async with AsyncConsumer(broker.address, "g", "t", start_from="earliest") as cons:
            seen: dict[str, list[int]] = {}
            n = 0
            async for m in cons:
                n += 1
                if m.key is not None:
                    seen.setdefault(m.key, []).append(m.queue_offset)
                if n == 240:
                    break
            assert cons.coordinator.reached == [""]
            assert all(offs == sorted(offs) for offs in seen.values())  # queue order per key


def test_cli_cluster_status_and_topic_describe_standalone(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("t", 2)
    r = CliRunner().invoke(app, ["cluster", "status", "--json", "-b", addr])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert not report["status"]["cluster"] and [g["name"] for g in report["status"]["groups"]] == [""]
    [health] = report["health"]
    assert health["reachable"] and health["rtt_ms"] >= 0 and health["address"] == addr
    r = CliRunner().invoke(app, ["cluster", "status", "-b", addr])
    assert r.exit_code == 0 and "standalone" in r.stdout and "yes" in r.stdout, r.output
    r = CliRunner().invoke(app, ["topic", "describe", "t", "--json", "-b", addr])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["owners"] == ["", ""] and [q["queue_id"] for q in d["queues"]] == [0, 1]


async def test_describe_topic_of_a_topic_grown_since_the_route_was_read(broker: Broker) -> None:
    from equeue.client.async_admin import AsyncAdminClient

    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncAdminClient(broker.address) as admin:
            await c.create_topic("grown", 2)
            assert len((await admin.describe_topic("grown")).queues) == 2  # the route is held now
            await c.alter_topic("grown", queues=3)
            merged = await admin.describe_topic("grown")
            assert merged.info.queues == 3 and len(merged.owners) == 3
            assert [q.queue_id for q in merged.queues if q is not None] == [0, 1, 2]
