"""The broker's cluster role against a REAL etcd (the ``etcd`` fixture) and real
brokers (in this test's trio loop, over TCP): placement, materialization, ownership
(NOT_OWNER, QUEUE_UNAVAILABLE), leases and retries per group, and etcd outages."""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, control, wire
from equeue.broker import Broker, open_broker
from equeue.broker.cluster.etcd import prefix_range_end
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.client import AsyncClient
from equeue.errors import ClusterUnavailable, NotOwner, QueueUnavailable
from equeue.names import retry_topic
from tests.conftest import make_config, wait_until, wait_until_sync


def config(tmp_path: Path, etcd: EtcdProcess, group: str, **kw: Any) -> Any:
    return make_config(tmp_path / group, cluster=etcd.endpoint, broker_group=group, **kw)


@asynccontextmanager
async def cluster(tmp_path: Path, etcd: EtcdProcess, *groups: str, **kw: Any) -> AsyncIterator[list[Broker]]:
    """One broker per group; returns once each one's view has every group live."""
    async with AsyncExitStack() as stack:
        brokers = [await stack.enter_async_context(open_broker(config(tmp_path, etcd, g, **kw))) for g in groups]
        for b in brokers:
            await wait_until(lambda b=b: _live(b) == set(groups), what=f"{b.config.broker_group} sees {groups}")
        yield brokers


def _live(b: Broker) -> set[str]:
    assert b.cluster is not None
    return set(b.cluster.view.live_groups())


def entry(text: str) -> bytes:
    return wire.encode_entry(Message(text))


def local(b: Broker, topic: str) -> int:
    """The queue count of ``topic`` in ``b``'s local store (0: absent)."""
    info = b.store.topics.get(topic)
    return 0 if info is None else info.queues


async def test_placement_routes_ownership_and_groups(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(45):
        async with cluster(tmp_path, etcd, "g1", "g2", "g3", default_queues=1) as brokers, AsyncExitStack() as stack:
            c = [await stack.enter_async_context(AsyncClient(b.address)) for b in brokers]
            await c[1].create_topic("t", 12)
            owners = (await c[0].get_routes(["t"])).topics[0].owners
            assert Counter(owners) == {"g1": 4, "g2": 4, "g3": 4}
            for client, b in zip(c, brokers, strict=True):  # every broker agrees and has the topic
                table = await client.get_routes(["t"])
                assert table.cluster and table.topics[0].owners == owners and table.missing == []
                assert {g.name: g.addresses for g in table.groups} == {x.config.broker_group: [x.address] for x in brokers}
                await wait_until(lambda b=b: local(b, "t") == 12, what=f"{b.config.broker_group} materialized t")

            mine = owners.index("g1")
            other = owners.index("g2")
            ans = await c[0].produce(wire.ProduceRequest("t", mine, [entry("a"), entry("b")]))
            assert ans.stored == 2
            with pytest.raises(NotOwner, match="'g2'"):
                await c[0].produce(wire.ProduceRequest("t", other, [entry("x")]))
            info = brokers[0].store.topics["t"]
            assert brokers[0].store.queue_state(info.topic_id, other).next_offset == 0  # nothing written
            for refused in (
                c[0].pull(wire.PullRequest("t", other, 0)),
                c[0].commit_offset("cg", "t", other, 0),
                c[0].query_offset("cg", "t", other),
                c[0].queue_offsets("t", other),
                c[0].get_message("t", other, 0),
            ):
                with pytest.raises(NotOwner, match="owned by broker group 'g2'"):
                    await refused
            assert len((await c[0].pull(wire.PullRequest("t", mine, 0))).messages) == 2
            await c[0].commit_offset("cg", "t", mine, 1)

            # leases: granted only for owned queues; describe only owned rows, named
            hb = control.Heartbeat("cg", "m1", ["t"], acquire=[f"t/{q}" for q in range(12)])
            held = (await c[0].heartbeat(hb)).held
            assert sorted(held) == sorted(f"t/{q}" for q in range(12) if owners[q] == "g1")
            desc = await c[0].describe_group("cg")
            assert {(r.queue_id, r.broker_group) for r in desc.queues} == {(q, "g1") for q in range(12) if owners[q] == "g1"}
            assert {q.queue_id for q in (await c[0].describe_topic("t")).queues} == {q for q in range(12) if owners[q] == "g1"}

            # alter 8 -> 12: old queues stay, new ones on the least loaded, everyone grows
            await c[2].create_topic("u", 8)
            before = (await c[0].get_routes(["u"])).topics[0].owners
            await c[0].alter_topic("u", queues=12)
            after = (await c[2].get_routes(["u"])).topics[0].owners
            assert after[:8] == before and len(after) == 12
            total = Counter(owners) + Counter(after)
            assert max(total.values()) - min(total.values()) <= 1
            for b in brokers:
                await wait_until(lambda b=b: local(b, "u") == 12, what=f"{b.config.broker_group} grew u")

            # SEND_BACK lands in a retry queue of the sender's own group: the first one
            # creates the retry topic (1 queue: default_queues), the others place a
            # queue on their own group first
            for i, (client, b) in enumerate(zip(c, brokers, strict=True)):
                g = b.config.broker_group
                q = owners.index(g)
                sent = await client.produce(wire.ProduceRequest("t", q, [entry(f"r{i}")]))
                back = await client.send_back("cg", "t", q, sent.first_queue, 0)
                assert back.topic == retry_topic("cg")
                route = (await client.get_routes([back.topic])).topics[0]
                assert route.owners[back.queue_id] == g

            # delete propagates to every broker
            await c[1].delete_topic("u")
            for b in brokers:
                await wait_until(lambda b=b: local(b, "u") == 0, what=f"{b.config.broker_group} deleted u")
            assert (await c[0].get_routes(["u"])).missing == ["u"]

            # deleted and created again at once: no broker keeps the old incarnation's data
            await c[0].create_topic("v", 3)
            v_owners = (await c[0].get_routes(["v"])).topics[0].owners
            await c[0].produce(wire.ProduceRequest("v", v_owners.index("g1"), [entry("old")]))
            await c[1].delete_topic("v")
            await c[1].create_topic("v", 3)
            await wait_until(lambda: _appended(brokers[0], "v") == 0, what="g1 dropped the old v")
            assert local(brokers[0], "v") == 3


async def test_group_down_second_replica_etcd_outage(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(50):
        async with open_broker(config(tmp_path, etcd, "g1")) as b1, AsyncClient(b1.address) as c1:
            # a second broker in the same group is a replica: routes keep naming the leader
            async with open_broker(make_config(tmp_path / "dup", cluster=etcd.endpoint, broker_group="g1")) as dup:
                await wait_until(lambda: len(b1.cluster.view.groups()["g1"].brokers) == 2, what="two replicas")  # type: ignore[union-attr]
                assert {g.name: g.addresses for g in (await c1.get_routes([])).groups} == {"g1": [b1.address]}
                (g1,) = (await c1.cluster_status()).groups
                assert b1.cluster is not None and dup.cluster is not None
                assert (g1.leader, g1.epoch, g1.isr) == (b1.cluster.broker_id, 1, [b1.cluster.broker_id])
                assert len(g1.brokers) == 2 and g1.available
            async with open_broker(config(tmp_path, etcd, "g2")) as b2, AsyncClient(b2.address) as c2:
                await wait_until(lambda: _live(b1) == {"g1", "g2"}, what="g1 sees g2")
                await c1.create_topic("t", 4)
                owners = (await c1.get_routes(["t"])).topics[0].owners
                assert Counter(owners) == {"g1": 2, "g2": 2}
                await c1.create_topic("v", 2)
                await c1.create_topic("w", 1)
                v_owners = (await c2.get_routes(["v"])).topics[0].owners
                await c2.produce(wire.ProduceRequest("v", v_owners.index("g2"), [entry("old")]))
                await wait_until(lambda: local(b2, "t") == 4 and local(b2, "w") == 1, what="g2 materialized t, w")

            # while g2 is down, v is deleted and created again, w deleted: g2 follows at
            # its next start, before it serves (it knows which etcd topic each copy was)
            await wait_until(lambda: _down(b1, "g2"), what="g2 down")
            await c1.delete_topic("v")
            await c1.create_topic("v", 2)
            await c1.delete_topic("w")
            async with open_broker(config(tmp_path, etcd, "g2")) as b2:
                assert (local(b2, "t"), local(b2, "w"), local(b2, "v"), _appended(b2, "v")) == (4, 0, 2, 0)
            # g2 stopped: down in every view, its queues unavailable (not gone)
            gone = owners.index("g2")
            await wait_until(lambda: _down(b1, "g2"), what="g2 down")
            table = await c1.get_routes(["t"])
            assert {g.name: g.addresses for g in table.groups} == {"g1": [b1.address], "g2": []}
            with pytest.raises(QueueUnavailable, match="'g2'"):
                await c1.produce(wire.ProduceRequest("t", gone, [entry("x")]))
            status = await c1.cluster_status()
            assert status.etcd_ok and {g.name: g.available for g in status.groups} == {"g1": True, "g2": False}

            # etcd down: owned queues keep serving; topic changes answer CLUSTER_UNAVAILABLE
            mine = owners.index("g1")
            etcd.stop()
            await c1.produce(wire.ProduceRequest("t", mine, [entry("during")]))
            assert [m.text for m in (await c1.pull(wire.PullRequest("t", mine, 0))).messages] == ["during"]
            with pytest.raises(ClusterUnavailable):
                await c1.create_topic("new", 2)
            assert not (await c1.cluster_status()).etcd_ok
            etcd.start()
            await wait_until(_registered(c1, b1), timeout=20, what="g1 registered again")
            await c1.create_topic("new", 2)
            assert (await c1.get_routes(["new"])).topics[0].owners == ["g1", "g1"]


def _appended(b: Broker, topic: str) -> int:
    """Messages ever written to ``topic`` in ``b``'s store (-1: no such topic)."""
    info = b.store.topics.get(topic)
    if info is None:
        return -1
    return sum(b.store.queue_state(info.topic_id, q).next_offset for q in range(info.queues))


def _down(b: Broker, group: str) -> bool:
    assert b.cluster is not None
    return b.cluster.view.address_of(group) is None


def _registered(c: AsyncClient, b: Broker) -> Any:
    async def check() -> bool:
        status = await c.cluster_status()
        g1 = next((g for g in status.groups if g.name == "g1"), None)
        return status.etcd_ok and g1 is not None and g1.available and g1.brokers[0].address == b.address

    return check


async def test_etcd_losing_its_data_deletes_nothing(tmp_path: Path, own_etcd: EtcdProcess) -> None:
    """etcd restarted without its data (its revision goes back): a broker keeps the
    topics the new etcd lacks (not served) instead of deleting them as "deleted in
    etcd"; a topic that etcd really deletes is deleted."""
    with trio.fail_after(50):
        async with open_broker(config(tmp_path, own_etcd, "g1")) as b, AsyncClient(b.address) as c:
            await c.create_topic("kept", 2)
            await c.create_topic("gone", 1)
            for i in range(20):  # move etcd's revision well past where a new etcd starts
                await c.alter_topic("kept", retention_ms=1000 + i)
            await c.produce(wire.ProduceRequest("kept", 0, [entry("precious")]))
            await c.delete_topic("gone")
            assert local(b, "gone") == 0
            assert b.cluster is not None
            # asking for a topic etcd lacks, again and again, reads etcd once per ABSENT_TTL
            lookups: list[str] = []
            real_lookup = b.cluster.view.lookup

            async def counting(name: str) -> Any:
                lookups.append(name)
                return await real_lookup(name)

            b.cluster.view.lookup = counting  # type: ignore[method-assign]
            for _ in range(3):
                assert (await c.get_routes(["nope"])).missing == ["nope"]
            assert lookups == ["nope"]
            loads = b.cluster.view.loads
            own_etcd.stop()
            shutil.rmtree(own_etcd.data_dir)
            await trio.to_thread.run_sync(own_etcd.start)
            await wait_until(lambda: b.cluster is not None and b.cluster.view.loads > loads, timeout=20, what="reload")
            await wait_until(_registered(c, b), timeout=20, what="g1 registered again")
            assert _appended(b, "kept") == 1  # kept, with its message
            assert (await c.get_routes(["kept"])).missing == ["kept"]  # not served: etcd lacks it
        # and at the next start too (the broker follows the new etcd from now on)
        async with open_broker(config(tmp_path, own_etcd, "g1")) as b:
            assert _appended(b, "kept") == 1


def test_a_second_broker_in_a_group_is_a_replica_that_never_takes_over_outside_the_isr(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """``equeue broker start --cluster``: a second broker of a live group starts (a
    replica); the group's first broker leads (its ISR is itself); when it dies
    (SIGKILL) its lease expires and the replica outside the ISR does not take over
    (no unclean election: the group has no leader); a clean stop (SIGTERM) leaves
    the group at once."""
    args = ("--cluster", etcd.endpoint, "--broker-group", "g1", "--cluster-lease-ttl", "2")
    first = BrokerProcess(tmp_path / "a", *args).start()
    try:
        wait_until_sync(lambda: _etcd_keys(etcd, "/equeue/leaders/g1") == 1, what="the first broker leads")
        second = BrokerProcess(tmp_path / "b", *args).start()
        assert _etcd_keys(etcd, "/equeue/brokers/g1/") == 2
        first.kill()
        wait_until_sync(lambda: _etcd_keys(etcd, "/equeue/brokers/g1/") == 1, timeout=15, what="the lease to expire")
        assert _etcd_keys(etcd, "/equeue/leaders/g1") == 0  # (it went with the lease)
        time.sleep(1.0)  # the replica would have campaigned at the delete event, within ms
        assert _etcd_keys(etcd, "/equeue/leaders/g1") == 0, "a broker outside the ISR took over"
        assert second.stop() == 0
        assert _etcd_keys(etcd, "/equeue/brokers/g1/") == 0  # a clean stop revokes its lease at once
    finally:
        first.kill()


def _etcd_keys(etcd: EtcdProcess, prefix: str) -> int:
    """How many keys etcd holds under ``prefix`` (a plain HTTP call, no trio)."""
    body = json.dumps({
        "key": base64.b64encode(prefix.encode()).decode(),
        "range_end": base64.b64encode(prefix_range_end(prefix)).decode(),
        "count_only": True,
    }).encode()  # fmt: skip
    with urllib.request.urlopen(urllib.request.Request(etcd.endpoint + "/v3/kv/range", data=body), timeout=10) as r:
        return int(json.loads(r.read()).get("count", 0))
