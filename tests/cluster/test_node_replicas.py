"""ClusterNode with two replicas of one group against a real etcd (real stores and
appenders, no broker around them): only the replica running ``run_leader_duties``
writes its store; the follower keeps the placements (routes, ownership) without
writing, and its record of which etcd topic its copies are lets it take over the
materialization later without deleting anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from equeue import control
from equeue.broker.appender import Appender
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.cluster.node import ClusterNode, load_materialized
from equeue.broker.cluster.view import GroupState
from equeue.broker.storage import Store
from equeue.placement import BrokerRecord, IsrRecord, LeaderRecord
from tests.conftest import make_config, wait_until


@asynccontextmanager
async def replica(tmp_path: Path, etcd: EtcdProcess, name: str) -> AsyncIterator[tuple[ClusterNode, Store]]:
    cfg = make_config(tmp_path / name, cluster=etcd.endpoint, broker_group="g1", cluster_lease_ttl=2)
    cfg.data_dir.mkdir(parents=True)
    store = Store(cfg.data_dir, map_size=1 << 28, sync=False)
    appender = Appender(store)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender.run)
            node = ClusterNode(cfg, store, appender.submit)
            async with node.serving(5800 + len(name)):
                yield node, store
            appender.close()
    finally:
        store.close()


async def test_only_the_replica_with_leader_duties_writes_its_store(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(60):
        async with replica(tmp_path, etcd, "a") as (a, a_store), trio.open_nursery() as duties:
            await duties.start(a.run_leader_duties)
            assert a.election.is_leader()  # a new group's first broker leads when serving() returns
            async with replica(tmp_path, etcd, "bb") as (b, b_store):
                assert b.election.state.leader_id == a.broker_id and not b.election.is_leader()
                await a.create_topic(control.CreateTopic("t", 3))
                assert a_store.topics["t"].queues == 3
                # the follower knows the topic (routes, ownership) but does not write it
                await wait_until(lambda: "t" in b.owned, what="the follower saw t")
                assert b.owned["t"] == frozenset({0, 1, 2}) and "t" not in b_store.topics
                route = b.route_table([await b.require("t", None)], [])
                assert route.topics[0].owners == ["g1"] * 3 and route.topics[0].info.topic_id == 0
                assert {g.name: g.addresses for g in route.groups} == {"g1": [a.address]}
                assert "t" not in b_store.topics  # (require on a follower writes nothing either)
                await wait_until(lambda: "t" in load_materialized(b._config.data_dir)[1], what="b recorded t")
                # the leader deletes and re-creates u: the follower's record follows etcd,
                # so when it takes over the materialization it creates what etcd has
                await a.create_topic(control.CreateTopic("u", 1))
                await a.delete_topic("u")
                await a.create_topic(control.CreateTopic("u", 2))
                await wait_until(lambda: b.owned.get("u") == frozenset({0, 1}), what="the follower saw u again")
                u = a.view.topic("u")
                assert u is not None and u.queues == 2
                await wait_until(
                    lambda: load_materialized(b._config.data_dir)[1].get("u") == u.created_ms,
                    what="b recorded u's second incarnation",
                )  # fmt: skip
                async with trio.open_nursery() as b_duties:
                    await b_duties.start(b.run_leader_duties)
                    assert b_store.topics["t"].queues == 3 and b_store.topics["u"].queues == 2
                    b_duties.cancel_scope.cancel()
            duties.cancel_scope.cancel()


def test_a_groups_route_is_its_leader() -> None:
    b1 = BrokerRecord("g", "b1", "h:1", 1, 1)
    b2 = BrokerRecord("g", "b2", "h:2", 1, 1)
    leader = LeaderRecord("g", "b2", "h:2", 3, 1)
    isr = IsrRecord("g", 3, "b2", ("b2", "b1"))
    assert GroupState("g", (b1, b2), None, leader, isr).addresses == ["h:2"]
    assert GroupState("g", (b1, b2), None, None, isr).addresses == []  # no leader: unavailable
    assert GroupState("g", (b1,), None, None, isr).addresses == []  # (even with one broker left)
    assert GroupState("g", (b1, b2)).addresses == []
    assert GroupState("g", (b1,)).addresses == ["h:1"]  # never elected: a group's single broker without replicas
    assert GroupState("g").addresses == []
