"""The clients across a failover (docs/cluster.md, "Clients across a failover"): a REAL
etcd and one broker group of two replicas as real processes (``equeue broker start
--cluster URL --broker-group g1 --cluster-lease-ttl 2 --min-insync 2``). The leader is
SIGKILLed under a producer and a consumer member: the producer follows the group to
its new leader, which refuses writes with NOT_ENOUGH_REPLICAS (its in-sync set is
itself) until the old leader is back as a follower and in sync; the producer waits
that out with its sequences, and every acknowledged message is stored once. The
member keeps consuming; the CLI shows the replication state and ``cluster verify``
compares the replicas; a Spark range read goes on at the new leader from the offset
it reached (no row skipped or repeated).

The issue's six big scenarios are in tests/cluster/replication/ (not here)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from equeue import control, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.cli import app
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer
from equeue.producer import AsyncProducer, Producer
from tests.conftest import wait_until, wait_until_sync

GROUP = "g1"
TTL = "2"


class Replicas:
    """One etcd and one broker group of ``n`` replica processes."""

    def __init__(self, root: Path, etcd: EtcdProcess, n: int) -> None:
        self.root = root
        self.etcd = etcd
        self.brokers = [self._start(i) for i in range(n)]

    def _args(self) -> tuple[str, ...]:
        return ("--cluster", self.etcd.endpoint, "--broker-group", GROUP, "--cluster-lease-ttl", TTL,
                "--min-insync", "2")  # fmt: skip

    def _start(self, i: int, port: int = 0) -> BrokerProcess:
        return BrokerProcess(self.root / f"r{i}", *self._args(), port=port).start()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def status(self) -> control.ClusterStatus | None:
        for b in self.brokers:
            if b.proc is None or b.proc.poll() is not None:
                continue
            try:
                with Client(b.address, connect_timeout=2) as c:
                    return c.cluster_status()
            except Exception:
                continue
        return None

    def group(self) -> control.GroupStatus | None:
        st = self.status()
        return None if st is None else next((g for g in st.groups if g.name == GROUP), None)

    def settled(self) -> bool:
        """A leader, and every replica in its ISR."""
        g = self.group()
        return g is not None and bool(g.leader) and len(g.isr) == len(self.brokers)

    def leader(self) -> tuple[int, BrokerProcess]:
        g = self.group()
        assert g is not None and g.leader, g
        address = next(b.address for b in g.brokers if b.broker_id == g.leader)
        return next((i, b) for i, b in enumerate(self.brokers) if b.address == address)

    def led_by_another(self, old: BrokerProcess) -> bool:
        """The group has a leader, and it is not ``old``."""
        g = self.group()
        if g is None or not g.leader:
            return False
        return next((b.address for b in g.brokers if b.broker_id == g.leader), "") != old.address

    def restart(self, i: int) -> None:
        old = self.brokers[i]
        self.brokers[i] = self._start(i, old.port)

    def close(self) -> None:
        for b in self.brokers:
            b.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    with EtcdProcess() as etcd:
        r = Replicas(tmp_path_factory.mktemp("replicas"), etcd, 2)
        try:
            wait_until_sync(r.settled, timeout=60, what="a leader with both replicas in sync")
            yield r
        finally:
            r.close()


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout + res.stderr


def test_the_web_console_shows_the_group_its_leader_and_each_replica(replicas: Replicas) -> None:
    """The console's cluster and overview pages (docs/console.md) on a real replicated
    group: its leader, epoch and ISR as etcd has them, a row per replica, each
    broker's statistics, and the leader the sampler saw."""
    from starlette.testclient import TestClient

    from equeue.cli.console import Console, ConsoleConfig
    from equeue.security import ClientSecurity
    from tests.integration.test_console import texts

    group = replicas.group()
    assert group is not None
    con = Console(ConsoleConfig(replicas.bootstrap, security=ClientSecurity(), sample_interval=0.2))
    with TestClient(con.app(), backend="trio") as client:
        page = client.get("/cluster")
        assert page.status_code == 200
        assert texts(page.text, "group-leader") == [group.leader]
        assert texts(page.text, "group-epoch") == [str(group.epoch)]
        assert texts(page.text, "group-isr") == [", ".join(group.isr)]
        assert texts(page.text, "etcd-health") == ["reachable"]
        assert page.text.count('data-testid="replica-row"') == 2
        home = client.get("/")
        assert home.text.count('data-testid="broker-version"') == 2  # both replicas answered STATS
        wait_until_sync(lambda: len(con.sampler.elections) > 0, what="the sampler saw the leader")
        assert 'data-testid="election-row"' in client.get("/cluster").text
        assert con.sampler.elections[0].leader == group.leader


async def test_producer_consumer_and_cli_across_a_leader_kill(replicas: Replicas) -> None:
    _, leader = await trio.to_thread.run_sync(replicas.leader)
    group = await trio.to_thread.run_sync(replicas.group)
    assert group is not None
    follower = next(b for b in replicas.brokers if b is not leader)
    # topic administration asked of a follower is done by the leader
    code, out = await trio.to_thread.run_sync(cli, "topic", "create", "t", "--queues", "4", "-b", follower.address)
    assert code == 0, out
    code, out = await trio.to_thread.run_sync(cli, "cluster", "status", "--json", "-b", follower.address)
    assert code == 0, out
    report = json.loads(out)
    (repl,) = report["replication"]
    assert repl["status"]["role"] == "leader" and repl["status"]["broker_id"] == group.leader, repl
    assert [f["address"] for f in repl["status"]["replicas"]] == [follower.address], repl

    acked: list[tuple[str, float]] = []  # (body, when its send began), once acknowledged
    seen: list[str] = []
    killed_at: list[float] = []
    with trio.fail_after(150):
        async with AsyncProducer(replicas.bootstrap, linger=0.001, send_timeout=60) as p, AsyncConsumer(
            replicas.bootstrap, "cg", "t", start_from="earliest", heartbeat_interval=0.3, rebalance_interval=0.3,
        ) as c:  # fmt: skip

            async def consume() -> None:
                async for m in c:
                    seen.append(m.text)

            async def produce() -> None:
                i = 0
                while len(killed_at) == 0 or sum(1 for _, t in acked if t > killed_at[0]) < 300:
                    body = f"m{i}"
                    began = time.monotonic()
                    await p.send("t", body.encode(), key=f"k{i % 16}")
                    acked.append((body, began))
                    i += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                nursery.start_soon(produce)
                await wait_until(lambda: len(acked) >= 300 and len(seen) >= 100, timeout=60, what="traffic")
                leader.kill()
                killed_at.append(time.monotonic())
                await trio.to_thread.run_sync(lambda: wait_until_sync(
                    lambda: replicas.led_by_another(leader), timeout=30, what="a new leader"))  # fmt: skip
                # the new leader refuses writes (NOT_ENOUGH_REPLICAS) until the old one is back in sync
                stalled = len(acked)
                await trio.to_thread.run_sync(replicas.restart, replicas.brokers.index(leader))
                await wait_until(lambda: sum(1 for _, t in acked if t > killed_at[0]) >= 300, timeout=90,
                                 what="300 acknowledged sends begun after the kill")  # fmt: skip
                first = min(t for _, t in acked if t > killed_at[0]) - killed_at[0]
                want = {body for body, _ in acked}
                await wait_until(lambda: want <= set(seen), timeout=60,
                                 what=f"the member consumed every acknowledged message (first send after the "
                                      f"kill began {first:.2f} s after it; {stalled} acked before the restart)")  # fmt: skip
                nursery.cancel_scope.cancel()

    # every acknowledged message is stored exactly once at the new leader
    _, new = await trio.to_thread.run_sync(replicas.leader)
    stored: list[str] = []
    async with AsyncClient(new.address) as admin:
        for q in range(4):
            end = (await admin.queue_offsets("t", q)).max_offset
            offset = 0
            while offset < end:
                res = await admin.pull(wire.PullRequest("t", q, offset, 1000, 4 << 20))
                stored += [m.text for m in res.messages]
                offset = res.next_offset
    assert len(stored) == len(set(stored)), "a message stored twice"
    assert {body for body, _ in acked} <= set(stored)

    # the old leader is back as a follower and in sync; the replicas compare equal
    await trio.to_thread.run_sync(lambda: wait_until_sync(replicas.settled, timeout=60, what="both in sync again"))
    code, out = await trio.to_thread.run_sync(cli, "cluster", "verify", "--json", "--timeout", "30",
                                              "-b", replicas.bootstrap)  # fmt: skip
    assert code == 0, out
    (verdict,) = json.loads(out)["groups"]
    assert verdict["verdict"] == "equal" and len(verdict["replicas"]) == 2, verdict
    code, out = await trio.to_thread.run_sync(cli, "cluster", "verify", "-b", replicas.bootstrap)
    assert code == 0 and "equal" in out, out
    # a replica that does not answer: could not compare (exit 2), and it is named
    _, current = await trio.to_thread.run_sync(replicas.leader)
    frozen = next(b for b in replicas.brokers if b is not current)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        code, out = await trio.to_thread.run_sync(cli, "cluster", "verify", "--json", "--timeout", "1",
                                                  "-b", current.address)  # fmt: skip
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert code == 2, out
    (verdict,) = json.loads(out)["groups"]
    assert verdict["verdict"] == "incomparable" and frozen.address in verdict["detail"], verdict
    await trio.to_thread.run_sync(lambda: wait_until_sync(replicas.settled, timeout=60, what="both in sync again"))


def test_a_spark_range_read_goes_on_at_the_new_leader(replicas: Replicas) -> None:
    pa = pytest.importorskip("pyarrow")
    from equeue.spark.source import RangePartition, read_range
    from tests.unit.test_columns import SCHEMA

    n = 60_000
    code, out = cli("topic", "create", "s", "--queues", "1", "-b", replicas.bootstrap)
    assert code == 0, out
    with Producer(replicas.bootstrap) as p:
        for i in range(n):
            p.send_async("s", f"{i:08d}".encode() + b"x" * 200)
        assert p.flush(120) == 0
    _, leader = replicas.leader()
    part = RangePartition("s", 0, 0, n, leader.address, GROUP)
    offsets: list[int] = []
    bodies: list[bytes] = []
    it = read_range(leader.address, part, SCHEMA, bootstrap=replicas.bootstrap, failover_timeout=60)
    first = next(it)
    assert isinstance(first, pa.RecordBatch)
    offsets += first.column("queue_offset").to_pylist()
    bodies += first.column("body").to_pylist()
    leader.kill()
    replicas_back = False
    for batch in it:
        if not replicas_back and replicas.led_by_another(leader):
            replicas.restart(replicas.brokers.index(leader))
            replicas_back = True
        offsets += batch.column("queue_offset").to_pylist()
        bodies += batch.column("body").to_pylist()
    assert offsets == list(range(n)), "rows skipped or repeated"
    assert [b[:8] for b in bodies] == [f"{i:08d}".encode() for i in range(n)]
    if not replicas_back:
        wait_until_sync(lambda: replicas.led_by_another(leader), timeout=30, what="a new leader")
        replicas.restart(replicas.brokers.index(leader))
    wait_until_sync(replicas.settled, timeout=60, what="both in sync again")

