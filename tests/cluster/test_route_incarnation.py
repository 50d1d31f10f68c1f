"""Route tables across an etcd that lost its data (docs/cluster.md, "Routing"): a
REAL etcd and real brokers in this test's trio loop, over TCP.

A cluster has an incarnation id (``/equeue/cluster``, created if absent by the
first broker that finds it missing) that every GET_ROUTES answer carries. An etcd
restarted without its data gets a new one; its revisions start low again, and a
client takes its tables anyway (the revision rule holds within one incarnation).
"""

from __future__ import annotations

import shutil
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.broker.cluster.etcd import EtcdClient
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.client.retry import RetryPolicy
from equeue.client.routing import Router
from equeue.errors import ClusterUnavailable
from equeue.placement import CLUSTER_KEY, decode_cluster
from tests.chaos.etcdproxy import EtcdProxyProcess, set_mode
from tests.cluster.conftest import recover_alone
from tests.conftest import make_config, wait_until


def config(tmp_path: Path, etcd: EtcdProcess, group: str) -> Any:
    return make_config(tmp_path / group, cluster=etcd.endpoint, broker_group=group)


def _registered(c: AsyncClient, b: Broker, group: str) -> Any:
    async def check() -> bool:
        status = await c.cluster_status()
        g = next((g for g in status.groups if g.name == group), None)
        return status.etcd_ok and g is not None and g.available and g.brokers[0].address == b.address

    return check


async def test_a_client_takes_the_routes_of_an_etcd_that_lost_its_data(tmp_path: Path, own_etcd: EtcdProcess) -> None:
    """The client held a table at a high revision; etcd restarts empty (revisions
    start low again), a second group registers and a topic is created over both:
    the client's refreshes take the new tables, so it routes to the new group and
    forgets the topic the new etcd lacks."""
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            b1 = await stack.enter_async_context(open_broker(config(tmp_path, own_etcd, "g1")))
            c = await stack.enter_async_context(AsyncClient(b1.address))
            router = await stack.enter_async_context(Router(c, refresh_interval=60))
            await c.create_topic("old", 1)
            for i in range(40):  # move etcd's revision well past where a new etcd gets to below
                await c.alter_topic("old", retention_ms=1000 + i)
            before = await router.refresh(["old"])
            assert router.cached("old") is not None and set(router.group_addresses()) == {"g1"}

            assert b1.cluster is not None
            loads = b1.cluster.view.loads
            own_etcd.stop()
            shutil.rmtree(own_etcd.data_dir)
            await trio.to_thread.run_sync(own_etcd.start)
            await wait_until(lambda: b1.cluster is not None and b1.cluster.view.loads > loads, timeout=20, what="reload")
            await wait_until(_registered(c, b1, "g1"), timeout=20, what="g1 registered again")
            await recover_alone(c, b1)  # g1's store has led: it waits for the operator
            b2 = await stack.enter_async_context(open_broker(config(tmp_path, own_etcd, "g2")))
            await wait_until(_registered(c, b2, "g2"), timeout=20, what="g2 registered")
            await c.create_topic("fresh", 2)
            table = await c.get_routes(["fresh"])
            owners = table.topics[0].owners
            assert Counter(owners) == {"g1": 1, "g2": 1}
            assert table.revision < before.revision, "the new etcd's revision is not behind the old one's"

            async def routed() -> bool:
                await router.refresh(["old", "fresh"])
                return "g2" in router.group_addresses()

            await wait_until(routed, timeout=10, what="the client takes the new etcd's routes")
            assert router.group_addresses() == {"g1": (b1.address,), "g2": (b2.address,)}
            assert router.cached("old") is None  # the new etcd lacks it: not routed any more
            q = owners.index("g2")
            ans = await router.call(
                "fresh", q, lambda cl: cl.produce(wire.ProduceRequest("fresh", q, [wire.encode_entry(Message("x"))])),
                RetryPolicy(attempts=3, timeout=10),
            )  # fmt: skip
            assert ans.stored == 1
            assert table.incarnation and table.incarnation != before.incarnation
            assert router.cache.incarnation == table.incarnation


async def test_every_broker_names_the_one_cluster_incarnation(tmp_path: Path, own_etcd: EtcdProcess) -> None:
    """Two groups: both brokers' route tables name the one incarnation (the
    ``/equeue/cluster`` record, created by whichever came first) as soon as they
    serve; a broker started again keeps it."""
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            brokers = [await stack.enter_async_context(open_broker(config(tmp_path, own_etcd, g))) for g in ("g1", "g2")]
            clients = [await stack.enter_async_context(AsyncClient(b.address)) for b in brokers]

            # (a broker serves once its view holds the record: never an empty incarnation)
            seen = {(await cl.get_routes([])).incarnation for cl in clients}
            assert len(seen) == 1 and "" not in seen, seen
            (first,) = seen
        async with open_broker(config(tmp_path, own_etcd, "g1")) as again, AsyncClient(again.address) as cl:
            assert (await cl.get_routes([])).incarnation == first


async def test_a_deleted_record_is_created_again_and_an_unreadable_one_blocks_nothing(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """The record deleted under a running broker: it creates a new one (another id),
    which its routes carry. A record that does not decode is logged, the broker starts
    and serves anyway, and its tables name no incarnation (clients judge them by
    revision)."""
    with trio.fail_after(60):
        async with EtcdClient([etcd.endpoint]) as e:
            async with open_broker(config(tmp_path, etcd, "g1")) as b, AsyncClient(b.address) as c:
                first = (await c.get_routes([])).incarnation
                kv = await e.get(CLUSTER_KEY)
                assert kv is not None and decode_cluster(kv.value).id == first
                assert await e.delete(CLUSTER_KEY)

                async def renewed() -> bool:
                    return (await c.get_routes([])).incarnation not in ("", first)

                await wait_until(renewed, timeout=10, what="a new incarnation record")
                kv = await e.get(CLUSTER_KEY)
                assert kv is not None and decode_cluster(kv.value).id == (await c.get_routes([])).incarnation
            await e.put(CLUSTER_KEY, b'{"id":""}')
            async with open_broker(config(tmp_path, etcd, "g1")) as b, AsyncClient(b.address) as c:
                table = await c.get_routes([])
                assert table.cluster and table.incarnation == ""
                kv = await e.get(CLUSTER_KEY)
                assert kv is not None and kv.value == b'{"id":""}'  # left as it is: never overwritten


async def test_a_client_takes_the_routes_of_an_etcd_restored_from_a_backup(
    tmp_path: Path, own_etcd: EtcdProcess
) -> None:
    """etcd restored from a backup (its data directory, copied while it was stopped)
    goes back to the same incarnation record at older revisions than the client
    holds: the broker that followed the later state replaces the record with a new
    id, so the client takes the restored etcd's tables (here: a second group that
    registered after the restore) instead of refusing them as old."""
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            b1 = await stack.enter_async_context(open_broker(config(tmp_path, own_etcd, "g1")))
            c = await stack.enter_async_context(AsyncClient(b1.address))
            router = await stack.enter_async_context(Router(c, refresh_interval=60))
            await c.create_topic("old", 1)
            assert b1.cluster is not None
            first = (await c.get_routes([])).incarnation
            await trio.to_thread.run_sync(own_etcd.stop)
            backup = tmp_path / "etcd-backup"
            shutil.copytree(own_etcd.data_dir, backup)
            await trio.to_thread.run_sync(own_etcd.start)
            for i in range(40):  # move etcd's revision well past the backup's
                await c.alter_topic("old", retention_ms=1000 + i)
            before = await router.refresh(["old"])
            assert before.incarnation == first
            await wait_until(lambda: b1.cluster is not None and b1.cluster._revision >= before.revision,
                             timeout=10, what="g1 followed the latest revision")  # fmt: skip

            loads = b1.cluster.view.loads
            await trio.to_thread.run_sync(own_etcd.stop)
            shutil.rmtree(own_etcd.data_dir)
            shutil.copytree(backup, own_etcd.data_dir)
            await trio.to_thread.run_sync(own_etcd.start)
            await wait_until(lambda: b1.cluster is not None and b1.cluster.view.loads > loads, timeout=20, what="reload")

            async def renewed() -> bool:
                return (await c.get_routes([])).incarnation not in ("", first)

            await wait_until(renewed, timeout=20, what="a new incarnation after the restore")
            b2 = await stack.enter_async_context(open_broker(config(tmp_path, own_etcd, "g2")))
            await wait_until(_registered(c, b2, "g2"), timeout=20, what="g2 registered")
            table = await c.get_routes([])
            assert table.revision < before.revision, "the restored etcd's revision is not behind the client's"

            async def routed() -> bool:
                await router.refresh(["old"])
                return "g2" in router.group_addresses()

            await wait_until(routed, timeout=10, what="the client takes the restored etcd's routes")
            assert router.cache.incarnation == table.incarnation != first


async def test_a_broker_cut_off_from_etcd_sends_clients_elsewhere_for_routes(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """g1's broker reaches etcd through a proxy that goes silent (a partition): once
    no lease renewal got through for the fence window, its view may be stale (here:
    a topic grown since), so GET_ROUTES answers CLUSTER_UNAVAILABLE instead of the
    stale table, and a router asks g2's broker, which answers the current one."""
    control = tmp_path / "proxy.sock"
    proxy = EtcdProxyProcess(control, "127.0.0.1", [0], [etcd.endpoint.removeprefix("http://")])
    await trio.to_thread.run_sync(proxy.start)
    try:
        with trio.fail_after(90):
            async with AsyncExitStack() as stack:
                b1 = await stack.enter_async_context(
                    open_broker(make_config(tmp_path / "g1", cluster=proxy.urls, broker_group="g1")))  # fmt: skip
                b2 = await stack.enter_async_context(open_broker(config(tmp_path, etcd, "g2")))
                c = await stack.enter_async_context(AsyncClient(f"{b1.address},{b2.address}"))
                router = await stack.enter_async_context(Router(c, refresh_interval=60))
                await c.create_topic("t", 2)
                await router.refresh(["t"])
                assert set(router.group_addresses()) == {"g1", "g2"}
                await set_mode(control, "blackhole")
                async with AsyncClient(b2.address) as c2:
                    await c2.alter_topic("t", queues=3)  # through g2's broker: etcd has it, g1 cannot see it

                async def refused() -> bool:
                    try:
                        await c.get_routes(["t"])
                    except ClusterUnavailable:
                        return True
                    return False

                await wait_until(refused, timeout=20, what="g1's broker refuses to answer routes it cannot trust")
                await router.refresh(["t"])
                route = router.cached("t")
                assert route is not None and route.info.queues == 3, route
    finally:
        proxy.stop()
