"""Replication inside one broker group (docs/cluster.md, "Replicas, acks, failover"): a real etcd and
three real broker PROCESSES started with the same ``--broker-group``.

1. acks all: every replica's REPLICA_DIGEST is equal once their positions match; a
   follower answers NOT_LEADER to a produce; the leader SIGKILLed, a follower takes
   over and every acknowledged message is there;
2. ``--min-insync 3`` with a follower frozen (SIGSTOP): NOT_ENOUGH_REPLICAS once it
   left the ISR (``--replica-lag-max 1``), success again after SIGCONT and its rejoin.

(The issue's big scenarios are tests/cluster/replication/.) Waiting is on conditions.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue import Message, control, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.client import Client
from equeue.errors import EQueueError, NotEnoughReplicas, NotLeader
from equeue.producer import Producer
from tests.conftest import wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

GROUP = "g1"


class Replicas:
    """Three broker processes of one group, each with its own data directory."""

    def __init__(self, root: Path, etcd: EtcdProcess, *extra: str) -> None:
        self.brokers = [
            BrokerProcess(
                root / f"r{i}", "--cluster", etcd.endpoint, "--broker-group", GROUP, "--cluster-lease-ttl", "2",
                "--replica-lag-max", "1", *extra,
            )
            for i in range(3)
        ]  # fmt: skip
        self._clients: dict[str, Client] = {}

    def start(self) -> Replicas:
        for b in self.brokers:
            b.start()
        return self

    def client(self, b: BrokerProcess) -> Client:
        c = self._clients.get(b.address)
        if c is None:
            c = self._clients[b.address] = Client(b.address, connect_timeout=5.0)
        return c

    def status(self, b: BrokerProcess) -> control.ReplicationStatus | None:
        try:
            s: control.ReplicationStatus = self.client(b).call(
                control.ReplicationStatusRequest(), control.ReplicationStatus
            )
        except (EQueueError, OSError):
            return None
        return s

    def alive(self) -> list[BrokerProcess]:
        return [b for b in self.brokers if b.proc is not None and b.proc.poll() is None]

    def leader(self, among: list[BrokerProcess] | None = None, isr: int = 0) -> BrokerProcess | None:
        """The replica that says it leads with at least ``isr`` in-sync members."""
        for b in among or self.alive():
            s = self.status(b)
            if s is not None and s.role == "leader" and len(s.isr) >= isr:
                return b
        return None

    def digest(self, b: BrokerProcess) -> control.ReplicaDigest:
        d: control.ReplicaDigest = self.client(b).call(control.ReplicaDigestRequest(), control.ReplicaDigest)
        return d

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        for b in self.brokers:
            if b.proc is not None and b.proc.poll() is None:
                try:
                    os.kill(b.pid, signal.SIGCONT)
                except OSError:
                    pass
            b.close()


@pytest.fixture
def replicas(tmp_path: Path, etcd: EtcdProcess, request: Any) -> Iterator[Replicas]:
    extra = getattr(request, "param", ())
    r = Replicas(tmp_path, etcd, *extra)
    try:
        yield r.start()
    finally:
        r.close()


def _wait_leader(r: Replicas, isr: int, among: list[BrokerProcess] | None = None) -> BrokerProcess:
    found: list[BrokerProcess] = []

    def ok() -> bool:
        b = r.leader(among, isr)
        if b is not None:
            found.append(b)
        return b is not None

    try:
        wait_until_sync(ok, timeout=60, what=f"a leader with {isr} in-sync replicas")
    except AssertionError as exc:
        states = [(b.address, r.status(b)) for b in among or r.alive()]
        logs = ["\n".join(list(b.stderr_tail)[-15:]) for b in among or r.alive()]
        raise AssertionError(f"{exc}; replicas: {states}; logs: {logs}") from None
    return found[-1]


def _produce(c: Client, topic: str, body: bytes) -> wire.ProduceResponse:
    resp: wire.ProduceResponse = c.produce(wire.ProduceRequest(topic, 0, [wire.encode_entry(Message(body))]))
    return resp


def test_acks_all_replicas_agree_and_a_failover_keeps_every_acked_message(replicas: Replicas) -> None:
    r = replicas
    leader = _wait_leader(r, isr=3)
    followers = [b for b in r.brokers if b is not leader]
    r.client(leader).create_topic("rt", 4)
    with pytest.raises(NotLeader):
        _produce(r.client(followers[0]), "rt", b"refused")

    bodies = [b"m%04d" % i for i in range(400)]
    with Producer(",".join(b.address for b in r.brokers), send_timeout=30.0) as p:
        results = [p.send_async("rt", body, key=body) for body in bodies]
        acked = [h.result() for h in results]
    assert len(acked) == len(bodies)

    # every replica reaches the leader's position; then their stores are equal
    def same_position() -> bool:
        return len({r.digest(b).position for b in r.brokers}) == 1

    wait_until_sync(same_position, timeout=30, what="the replicas at one position")
    digests = [r.digest(b) for b in r.brokers]
    assert digests[0].digests == digests[1].digests == digests[2].digests, [d.position for d in digests]

    leader.kill()
    new = _wait_leader(r, isr=1, among=followers)
    c = r.client(new)
    got: list[bytes] = []
    for q in range(4):
        offset = 0
        while True:
            res = c.pull(wire.PullRequest("rt", q, offset, 1000))
            got += [bytes(m.body) for m in res.messages]
            if res.next_offset >= res.max_offset:
                break
            offset = res.next_offset
    assert sorted(got) == bodies, f"{len(got)} of {len(bodies)} acknowledged messages after the failover"


@pytest.mark.parametrize("replicas", [("--min-insync", "3")], indirect=True)
def test_min_insync_refuses_while_a_follower_is_frozen_and_accepts_after_it_rejoins(replicas: Replicas) -> None:
    r = replicas
    leader = _wait_leader(r, isr=3)
    c = r.client(leader)
    c.create_topic("mi", 1)
    _produce(c, "mi", b"before")
    frozen = next(b for b in r.brokers if b is not leader)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        refused: list[EQueueError] = []

        def refuses() -> bool:
            try:
                _produce(c, "mi", b"while frozen")
            except NotEnoughReplicas as exc:
                refused.append(exc)
                return True
            return False

        wait_until_sync(refuses, timeout=30, what="NOT_ENOUGH_REPLICAS once the frozen follower left the ISR")
        s = r.status(leader)
        assert s is not None and frozen.data_dir.joinpath("broker.id").read_text().strip() not in s.isr, s
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    _wait_leader(r, isr=3, among=[leader])
    assert _produce(c, "mi", b"after").stored == 1
