"""Hand-over of a group's leadership to an in-sync follower (docs/cluster.md,
"Hand-over"): on request (`equeue cluster handover`, Kafka's preferred-leader
election) and when a leader is stopped cleanly. Under the load of producers with
acks all, nothing acknowledged is lost or moved, and the new leader is the follower
asked for (or one that has every entry)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.cluster.replication.conftest import Load, ReplicaGroup, check_store
from tests.conftest import wait_until_sync

pytestmark = [pytest.mark.timeout(180)]

Replicas = Callable[..., ReplicaGroup]


def test_handover_moves_the_leadership_to_the_follower_asked_for(replicas: Replicas) -> None:
    rs = replicas("h", 3, "--acks", "all")
    leader = rs.leader()
    rs.client(leader).create_topic("t", 2)
    rs.wait_isr(3)
    before = rs.status(leader)
    assert before is not None
    to = next(i for i in range(3) if i != leader)
    with Load(rs.bootstrap, "t", producers=2) as load:
        load.wait_more(200)
        cmd = [sys.executable, "-m", "equeue", "cluster", "handover", "--group", "h", "--to", rs.broker_id(to),
               "--broker", rs.bootstrap]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert rs.leader() == to
        load.wait_more(200)  # the producers moved to the new leader
    after = rs.status(to)
    assert after is not None and after.epoch == before.epoch + 1
    check_store(rs, "t", 2, load.acked, load.sent)
    assert not load.errors
    bad = subprocess.run([*cmd[:-4], "--to", "no-such-broker", "--broker", rs.bootstrap], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "not an in-sync follower" in bad.stdout + bad.stderr
    rs.wait_isr(3)
    rs.check_verify()
    assert not rs.errors()


def test_a_leader_stopped_cleanly_hands_over_to_an_in_sync_follower_first(replicas: Replicas) -> None:
    rs = replicas("s", 2, "--acks", "all", "--log-level", "info")
    leader = rs.leader()
    follower = 1 - leader
    rs.client(leader).create_topic("t", 1)
    rs.wait_isr(2)
    with Load(rs.bootstrap, "t", producers=2) as load:
        load.wait_more(200)
        rs.brokers[leader].stop()
        handed = "handed the leadership over to " + rs.broker_id(follower)
        wait_until_sync(lambda: any(handed in line for line in rs.brokers[leader].stderr_tail), timeout=10,
                        what="the stopped leader's hand-over line")  # fmt: skip
        assert rs.leader() == follower
        load.wait_more(200)
    check_store(rs, "t", 1, load.acked, load.sent)
    assert not load.errors
