"""A topic's compression setting across a failover: one broker group of 2 replicas
(real broker processes on the session etcd). The setting lives in the topic's placement
in etcd and in the replicated store: after the leader is SIGKILLed, the new leader
stores with it, and an alter there reaches the old leader, which follows it as a
replica and keeps it when it leads again."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from equeue import Message, wire
from tests.cluster.replication.conftest import ReplicaGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_the_new_leader_keeps_the_topic_compression(replicas: Callable[..., ReplicaGroup]) -> None:
    rs = replicas("z", 2)
    leader = rs.leader()
    c = rs.client(leader)
    assert c.create_topic("t", 1, compression="zstd").compression == "zstd"
    c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("m"))]))
    rs.wait_isr(2)
    rs.kill(leader)
    new = rs.leader()
    assert new != leader
    n = rs.client(new)
    assert [t.compression for t in n.list_topics()] == ["zstd"]  # the new leader's store
    assert n.alter_topic("t", compression="lz4").compression == "lz4"
    n.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("after"))]))
    rs.restart(leader)
    rs.wait_isr(2)
    rs.kill(new)  # back to the first broker, which followed the alter as a replica
    assert rs.leader() == leader
    assert [t.compression for t in rs.client(leader).list_topics()] == ["lz4"]
