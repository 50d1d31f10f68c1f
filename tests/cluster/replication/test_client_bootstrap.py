"""Clients find every replica (docs/cluster.md, "Routing"): a real etcd and one
broker group of 3 replicas, each a real broker process, on loopback.

A producer and a consumer bootstrapped from ONE broker (the group's leader) learn
the group's replicas from the route table; when that broker is SIGKILLed they fetch
the routes from another replica they learnt, find the new leader and go on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from equeue import Message
from equeue.consumer import Consumer
from equeue.producer import Producer
from tests.cluster.replication.conftest import ReplicaGroup
from tests.conftest import wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

Replicas = Callable[..., ReplicaGroup]


def test_a_producer_bootstrapped_from_the_dead_leader_alone_finds_the_new_leader(replicas: Replicas) -> None:
    rs = replicas("pb", 3)
    leader = rs.leader()
    rs.client(leader).create_topic("t", 2)
    rs.wait_isr(3)
    every = sorted(rs.address(i) for i in range(3))
    for i in range(3):  # the leader and the followers answer GET_ROUTES alike
        (group,) = rs.ask(i, lambda c: c.get_routes(["t"])).groups
        assert (group.name, group.addresses, sorted(group.replicas)) == ("pb", [rs.address(leader)], every)
    with Producer(rs.address(leader), send_timeout=40.0) as p:
        before = p.send("t", "before", key="k")
        rs.kill(leader)
        after = p.send("t", "after", key="k")  # waits out the failover, then stored at the new leader
    assert (after.queue_id, after.queue_offset) == (before.queue_id, before.queue_offset + 1)
    new = rs.leader()
    assert new != leader
    assert [m.text for m in rs.read_queue("t", before.queue_id)] == ["before", "after"]
    assert not rs.errors(), rs.errors()[:5]


def test_a_consumer_bootstrapped_from_the_dead_leader_alone_finds_the_new_leader(replicas: Replicas) -> None:
    rs = replicas("cb", 3)
    leader = rs.leader()
    rs.client(leader).create_topic("t", 2)
    rs.wait_isr(3)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(m: Message) -> None:
        with lock:
            seen.append(m.text)

    def has(n: int) -> bool:
        with lock:
            return len(set(seen)) >= n

    with Producer(rs.bootstrap, send_timeout=40.0) as p:
        c = Consumer(
            rs.address(leader), "cg", "t", start_from="earliest", heartbeat_interval=0.3, rebalance_interval=0.3,
            commit_interval=0.2,
        )  # fmt: skip
        runner = threading.Thread(target=c.run, args=(handler,), daemon=True)
        runner.start()
        try:
            for i in range(10):
                p.send("t", f"before-{i}", key=f"k{i}")
            wait_until_sync(lambda: has(10), timeout=30, interval=0.05, what="10 consumed before the kill")
            rs.kill(leader)
            for i in range(10):
                p.send("t", f"after-{i}", key=f"k{i}")  # the producer knows every replica
            wait_until_sync(lambda: has(20), timeout=60, interval=0.05, what="the 10 sent after the kill consumed")
        finally:
            c.stop()
            c.close()
            runner.join(30)
    with lock:
        assert set(seen) == {f"before-{i}" for i in range(10)} | {f"after-{i}" for i in range(10)}
    assert not rs.errors(), rs.errors()[:5]
