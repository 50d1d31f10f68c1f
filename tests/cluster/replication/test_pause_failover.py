"""A pause across a failover: one broker group of 2 replicas (real broker processes on
the session etcd). The pause lives in etcd, not in the leader: after the leader is
SIGKILLed and restarted, the group's new leader still refuses the paused topic's
produce and holds the paused consumer group's pulls."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from equeue import Message, wire
from equeue.errors import TopicPaused
from equeue.protocol import PullStatus
from tests.cluster.replication.conftest import ReplicaGroup
from tests.conftest import wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_the_new_leader_honours_the_pause(replicas: Callable[..., ReplicaGroup]) -> None:
    rs = replicas("p", 2)
    leader = rs.leader()
    c = rs.client(leader)
    c.create_topic("t", 1)
    c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("m"))]))
    assert c.pause_topic("t").changed and c.pause_group("cg").changed
    rs.wait_isr(2)
    rs.kill(leader)
    new = rs.leader()
    assert new != leader
    n = rs.client(new)
    with pytest.raises(TopicPaused):
        n.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("refused"))]))
    r = n.pull(wire.PullRequest("t", 0, 0, group="cg"))
    assert (r.status, r.messages) == (PullStatus.NO_NEW_MESSAGE, [])
    assert [t.paused for t in n.list_topics()] == [True]
    # the old leader restarts as a follower; resumed at the leader, both are served again
    rs.restart(leader)
    rs.wait_isr(2)
    assert not n.resume_topic("t").paused and not n.resume_group("cg").paused
    n.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("after"))]))
    wait_until_sync(lambda: len(n.pull(wire.PullRequest("t", 0, 0, group="cg")).messages) == 2,
                    what="the group reads both messages")  # fmt: skip
