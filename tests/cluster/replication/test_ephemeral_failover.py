"""An ephemeral group (``<name>#ephemeral``) across a failover: one broker group of 2
replicas (real broker processes on the session etcd). Its offsets live in the leader's
memory only, so unlike a persistent group's they are not replicated: the new leader
does not know the group until a member's heartbeat makes it again, and its queues then
start at the member's ``start_from`` (docs/consumer.md, "Ephemeral groups")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from equeue import Message, control, wire
from tests.cluster.replication.conftest import ReplicaGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

EPHEMERAL, PERSISTENT = "tap#ephemeral", "keep"


def test_an_ephemeral_groups_offsets_do_not_survive_a_failover(
    replicas: Callable[..., ReplicaGroup],
) -> None:
    rs = replicas("e", 2)
    leader = rs.leader()
    c = rs.client(leader)
    c.create_topic("t", 1)
    c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(f"m{i}")) for i in range(3)]))
    for group in (EPHEMERAL, PERSISTENT):
        answer = c.heartbeat(control.Heartbeat(group, f"{group}-member", ["t"], acquire=["t/0"]))
        assert "t/0" in answer.held, answer
        c.commit_offset(group, "t", 0, 2, f"{group}-member")
    assert {g.group: g.ephemeral for g in c.list_groups()} == {EPHEMERAL: True, PERSISTENT: False}
    rs.wait_isr(2)  # the persistent group's commit is replicated before the leader dies
    rs.kill(leader)
    new = rs.leader()
    assert new != leader
    n = rs.client(new)
    assert n.query_offset(PERSISTENT, "t", 0) == 2
    assert n.query_offset(EPHEMERAL, "t", 0) == -1  # it was in the old leader's memory only
    assert EPHEMERAL not in {g.group for g in n.list_groups()}
    gone = n.describe_group(EPHEMERAL)
    assert (gone.members, gone.queues) == ([], []), gone
    # the member's next heartbeat, at the new leader, makes the group again, empty
    n.heartbeat(control.Heartbeat(EPHEMERAL, f"{EPHEMERAL}-member", ["t"], acquire=["t/0"]))
    d = n.describe_group(EPHEMERAL)
    assert d.ephemeral and [m.consumer_id for m in d.members] == [f"{EPHEMERAL}-member"]
    assert n.query_offset(EPHEMERAL, "t", 0) == -1
