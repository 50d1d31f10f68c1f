"""The cluster scenarios (docs/cluster.md, "What happens on each failure"): a real
etcd and real broker PROCESSES (one per group,
started with ``--cluster ... --broker-group gN``) on loopback.

One etcd and one three-group cluster serve the whole module (starting processes is
what costs time); every test uses its own topics and leaves the cluster healthy
again (the ``healthy`` fixture restarts whatever a failed test left down). Waiting is
on conditions, never on time.

1. keyed produce and consume through the SDK and the CLI, 12 queues over 3 groups;
2. a consumer group of 3 member processes: one SIGKILLed, one joining late, the
   broker-side lease holders sampled throughout;
3. a group stopped: QUEUE_UNAVAILABLE for its queues, the others unaffected, its
   data all there after a restart;
4. a topic altered from 8 to 12 queues while a producer produces;
6. etcd restarted under the cluster.
(5, Spark, is tests/spark/test_spark_cluster.py.) And ``make cluster``'s launcher.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue import Message, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.client import Client
from equeue.consumer import Consumer
from equeue.control import ClusterStatus, TopicRoute
from equeue.errors import EQueueError, ErrorCode, QueueUnavailable
from equeue.producer import Producer
from equeue.routing import queue_for_key
from tests.conftest import ROOT, wait_until_sync
from tests.integration.test_consumer import check_no_overlap_and_order
from tests.integration.test_consumer_cluster import member_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GROUPS = ("g1", "g2", "g3")
#: consumer timers short enough for a quick rebalance
FAST = dict(heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=0.5)
#: the brokers drop a member silent this long (15 s by default): a SIGKILLed member's
#: queues go to the others after this (members heartbeat every 0.2 s)
MEMBER_EXPIRY = "3"


class Cluster:
    """One etcd and a broker process per group, each with its own data directory."""

    def __init__(self, root: Path, etcd: EtcdProcess, groups: tuple[str, ...] = GROUPS, *args: str) -> None:
        self.root = root
        self.etcd = etcd
        self.groups = groups
        self.args = args  # more options of every ``broker start``
        self.brokers: dict[str, BrokerProcess] = {}
        self._clients: dict[str, Client] = {}

    def start_group(self, name: str, port: int = 0) -> BrokerProcess:
        b = BrokerProcess(self.root / name, "--cluster", self.etcd.endpoint, "--broker-group", name, *self.args, port=port)
        self.brokers[name] = b.start()
        return b

    def running(self, name: str) -> bool:
        b = self.brokers.get(name)
        return b is not None and b.proc is not None and b.proc.poll() is None

    def address(self, name: str) -> str:
        return self.brokers[name].address

    @property
    def bootstrap(self) -> str:
        """Every running broker, comma-separated (what a client bootstraps from)."""
        return ",".join(b.address for n, b in self.brokers.items() if self.running(n))

    def client(self, name: str) -> Client:
        """A blocking client of one group's broker (kept open; it reconnects)."""
        addr = self.address(name)
        c = self._clients.get(addr)
        if c is None:
            c = self._clients[addr] = Client(addr, connect_timeout=2.0)
        return c

    def status(self, name: str) -> ClusterStatus:
        return self.client(name).cluster_status()  # type: ignore[no-any-return]

    def healthy(self) -> bool:
        """Every group has its broker running, and every broker sees etcd and every
        group available with every broker alive."""
        if not self.etcd.running or not all(self.running(g) for g in self.groups):
            return False
        try:
            for g in self.groups:
                st = self.status(g)
                seen = {x.name: x for x in st.groups}
                if not (st.cluster and st.etcd_ok and all(n in seen and seen[n].available for n in self.groups)):
                    return False
                if not all(b.alive for x in st.groups for b in x.brokers):
                    return False
        except EQueueError:
            return False
        return True

    def heal(self) -> None:
        if not self.etcd.running:
            self.etcd.start()
        for g in self.groups:
            if not self.running(g):
                old = self.brokers.get(g)
                self.start_group(g, port=old.port if old is not None else 0)
        wait_until_sync(self.healthy, timeout=60, interval=0.1, what="every group registered and available")

    def owners(self, topic: str) -> list[str]:
        """The owner group of each queue of ``topic`` (GET_ROUTES at g1)."""
        table = self.client(self.groups[0]).get_routes([topic])
        return list(table.topics[0].owners)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        for b in self.brokers.values():
            b.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with EtcdProcess() as etcd:
        c = Cluster(tmp_path_factory.mktemp("cluster"), etcd, GROUPS, "--member-expiry", MEMBER_EXPIRY)
        try:
            for g in GROUPS:
                c.start_group(g)
            c.heal()
            yield c
        finally:
            c.close()


@pytest.fixture
def healthy(cluster: Cluster) -> Cluster:
    cluster.heal()
    return cluster


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> str:
    """Run ``equeue ARGS`` in a subprocess; its stdout (the test fails on a non-zero exit)."""
    r = subprocess.run(
        [sys.executable, "-m", "equeue", *args], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert r.returncode == 0, f"equeue {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}"
    return r.stdout


def consume(bootstrap: str, group: str, topic: str, n: int, timeout: float = 60) -> list[Message]:
    """Consume at least ``n`` messages of ``topic`` as the only member of ``group``."""
    got: list[Message] = []
    done = threading.Event()
    c = Consumer(bootstrap, group, topic, start_from="earliest", orderly=True, **FAST)

    def handler(m: Message) -> None:
        got.append(m)
        if len(got) >= n:
            done.set()

    t = threading.Thread(target=c.run, args=(handler,), daemon=True)
    t.start()
    try:
        assert done.wait(timeout), f"consumed {len(got)} of {n} messages of {topic} in {timeout} s"
    finally:
        c.close()
        t.join(10)
    return got


def check_key_order(records: list[tuple[str, int]]) -> None:
    """``(key, sequence)`` in consumption order: each key's sequence only grows."""
    last: dict[str, int] = {}
    for key, i in records:
        assert i > last.get(key, -1), f"key {key}: {i} consumed after {last[key]}"
        last[key] = i


# ------------------------------------------------------------------------------ 1
def test_keyed_produce_and_consume_through_sdk_and_cli(healthy: Cluster) -> None:
    cl = healthy
    boot = cl.bootstrap
    cli("topic", "create", "s1", "--queues", "12", "--broker", boot)
    owners = cl.owners("s1")
    assert Counter(owners) == {"g1": 4, "g2": 4, "g3": 4}, f"12 queues spread evenly: {owners}"

    # the SDK: every keyed message lands on crc32(key) mod 12, at that queue's owner
    n_sdk, keys = 1200, 40
    with Producer(boot) as p:
        handles = [p.send_async("s1", f"k{i % keys}:{i}", key=f"k{i % keys}") for i in range(n_sdk)]
        p.flush()
        results = [h.result(0) for h in handles]
    for i, r in enumerate(results):
        assert r.queue_id == queue_for_key(f"k{i % keys}", 12)
    assert {owners[r.queue_id] for r in results} == set(GROUPS)
    got = consume(boot, "sdk", "s1", n_sdk)
    bodies = [m.text for m in got]
    assert sorted(bodies) == sorted(f"k{i % keys}:{i}" for i in range(n_sdk)), "every message exactly once"
    check_key_order([(m.key or "", int(m.text.split(":")[1])) for m in got])

    # the CLI: keyed produce from JSON lines, consume as JSON, describe merged over the groups
    n_cli = 300
    lines = "".join(json.dumps({"k": f"c{i % 25}", "i": i}) + "\n" for i in range(n_cli))
    out = cli("produce", "s1", "--key-field", "k", "--broker", boot, stdin=lines)
    assert f"sent {n_cli} messages" in out
    out = cli("consume", "s1", "-g", "cli", "--from", "earliest", "--max", str(n_sdk + n_cli), "--format", "json",
              "--broker", boot)  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(rows) == n_sdk + n_cli
    assert len({(r["queue_id"], r["queue_offset"]) for r in rows}) == n_sdk + n_cli, "no message twice"
    cli_rows = [r for r in rows if r["body"].startswith("{")]
    assert sorted(json.loads(r["body"])["i"] for r in cli_rows) == list(range(n_cli))
    for r in cli_rows:
        assert r["queue_id"] == queue_for_key(r["key"], 12)
    check_key_order([(r["key"], json.loads(r["body"])["i"]) for r in cli_rows])
    check_key_order([(r["key"], int(r["body"].split(":")[1])) for r in rows if not r["body"].startswith("{")])
    d = json.loads(cli("topic", "describe", "s1", "--json", "--broker", boot))
    per_queue = {q["queue_id"]: q["max_offset"] - q["min_offset"] for q in d["queues"]}
    assert sum(per_queue.values()) == n_sdk + n_cli, f"describe merges every group's queues: {per_queue}"


# ------------------------------------------------------------------------------ 2
class HolderSampler:
    """Samples DESCRIBE_GROUP at every group's broker in a thread: records each
    queue's holders as the brokers report them, and every sample in which one
    queue had two holders (merged over the groups) or a holder reported by a group
    that does not own the queue."""

    def __init__(self, cl: Cluster, group: str, topic: str, owners: list[str]) -> None:
        self.cl, self.group, self.topic, self.owners = cl, group, topic, owners
        self.violations: list[str] = []
        self.samples = 0
        self.full_samples = 0  # samples in which every queue had a holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        holders: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for g in self.cl.groups:
            if not self.cl.running(g):
                continue
            try:
                d = self.cl.client(g).describe_group(self.group)
            except EQueueError:
                return  # a group answering nothing this round: skip the sample
            for row in d.queues:
                if row.topic == self.topic and row.owner:
                    holders[row.queue_id].append((row.broker_group or g, row.owner))
        self.samples += 1
        self.full_samples += len(holders) == len(self.owners)
        for q, hs in holders.items():
            if len(hs) > 1:
                self.violations.append(f"queue {q} held by {hs}")
            if any(bg != self.owners[q] for bg, _ in hs):
                self.violations.append(f"queue {q} (owner {self.owners[q]}) reported held at {hs}")

    def _run(self) -> None:
        while not self._stop.wait(0.05):  # pacing of the sampler, not a synchronisation
            self.sample()

    def __enter__(self) -> HolderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_consumer_group_of_three_kill_one_join_late(healthy: Cluster, tmp_path: Path) -> None:
    cl = healthy
    boot = cl.bootstrap
    backlog, late, queues = 6000, 600, 12
    total = backlog + late
    cl.client("g1").create_topic("s2", queues)
    owners = cl.owners("s2")

    def produce(start: int, n: int) -> None:
        with Producer(boot) as p:
            for i in range(start, start + n):
                p.send_async("s2", f"{i}", key=f"u{i % 300}")
            p.flush()

    def holds_a_queue(name: str) -> bool:
        return any(r.owner == name for g in cl.groups for r in cl.client(g).describe_group("cg2").queues)

    produce(0, backlog)
    script = tmp_path / "member.py"
    script.write_text(member_script("cg2", "s2", sleep=0.002, hold=0.5))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {n: tmp_path / f"{n}.log" for n in ("m1", "m2", "m3")}

    def spawn(name: str) -> None:
        procs[name] = subprocess.Popen(
            [sys.executable, str(script), str(ROOT), boot, name, str(logs[name])],
            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip

    def records() -> list[tuple[str, int, int, float, float]]:
        out = []
        for n, path in logs.items():
            if path.exists():
                for line in path.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 4:
                        out.append((n, int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3])))
        return out

    def progress(at_least: int, by: str = "") -> bool:
        recs = records()
        return len({(q, o) for _, q, o, _, _ in recs}) >= at_least and (not by or any(r[0] == by for r in recs))

    try:
        with HolderSampler(cl, "cg2", "s2", owners) as sampler:
            spawn("m1")
            spawn("m2")
            wait_until_sync(lambda: progress(total // 5), timeout=90, interval=0.2, what="a fifth handled")
            spawn("m3")
            # messages produced once m3 holds queues: some are m3's to handle, however
            # fast m1 and m2 drain the backlog meanwhile (a loaded machine starts m3 late)
            wait_until_sync(lambda: holds_a_queue("m3"), timeout=90, interval=0.1, what="m3 holds queues")
            produce(backlog, late)
            wait_until_sync(lambda: progress(total // 2, by="m3"), timeout=90, interval=0.2, what="m3 at work")
            procs["m1"].send_signal(signal.SIGKILL)
            procs["m1"].wait(10)
            wait_until_sync(lambda: progress(total), timeout=120, interval=0.2, what="every message handled")
            for name in ("m2", "m3"):
                procs[name].send_signal(signal.SIGTERM)
            for name in ("m2", "m3"):
                assert procs[name].wait(30) == 0
    finally:
        for pr in procs.values():
            if pr.poll() is None:
                pr.kill()
    assert not sampler.violations, f"{len(sampler.violations)} bad samples, e.g. {sampler.violations[:5]}"
    assert sampler.full_samples > 0, f"no sample saw all 12 queues held ({sampler.samples} samples)"
    recs = records()
    keys = [(q, o) for _, q, o, _, _ in recs]
    assert len(set(keys)) == total, "every message handled at least once"
    assert {r[0] for r in recs} == {"m1", "m2", "m3"}
    by_m1 = {(q, o) for n, q, o, _, _ in recs if n == "m1"}
    dups = [k for k, n in Counter(keys).items() if n > 1]
    assert all(k in by_m1 for k in dups), "duplicates only from the killed member's uncommitted window"
    check_no_overlap_and_order(recs)


# ------------------------------------------------------------------------------ 3
def test_group_stopped_queue_unavailable_others_unaffected_data_kept(healthy: Cluster) -> None:
    cl = healthy
    cl.client("g1").create_topic("s3", 12)
    owners = cl.owners("s3")
    down = [q for q, g in enumerate(owners) if g == "g2"]
    up = [q for q, g in enumerate(owners) if g != "g2"]
    key_of = {queue_for_key(f"k{i}", 12): f"k{i}" for i in range(500)}
    assert set(key_of) == set(range(12))
    n_before = 600
    with Producer(cl.bootstrap) as p:
        for i in range(n_before):
            p.send_async("s3", f"before-{i}", key=key_of[i % 12])
        p.flush()
    before = {q: cl.client(owners[q]).queue_offsets("s3", q).max_offset for q in range(12)}
    assert all(before[q] == n_before // 12 for q in range(12))

    g2_port = cl.brokers["g2"].port
    assert cl.brokers["g2"].stop() == 0
    wait_until_sync(
        lambda: not {x.name: x for x in cl.status("g1").groups}["g2"].available,
        timeout=30, interval=0.1, what="g1 sees g2 down",
    )  # fmt: skip
    boot = cl.bootstrap  # g1 and g3
    got: list[Message] = []
    c = Consumer(boot, "c3", "s3", start_from="earliest", **FAST)
    t = threading.Thread(target=c.run, args=(got.append,), daemon=True)
    t.start()
    try:
        # a request for one of g2's queues, at another group's broker: coded, names the group
        with pytest.raises(QueueUnavailable) as exc_info:
            cl.client("g1").produce(wire.ProduceRequest("s3", down[0], [wire.encode_entry(Message("x"))]))
        assert exc_info.value.code == ErrorCode.QUEUE_UNAVAILABLE and "g2" in str(exc_info.value)
        # the producer: keyed sends to g2's queues fail after send_timeout, coded
        with Producer(boot, send_timeout=2.0) as p:
            with pytest.raises(QueueUnavailable):
                p.send("s3", "lost?", key=key_of[down[0]])
            # ... the other groups are unaffected: keyed sends succeed, keyless ones avoid g2
            during = [p.send_async("s3", f"during-{q}", key=key_of[q]) for q in up for _ in range(5)]
            keyless = [p.send_async("s3", f"during-nokey-{i}") for i in range(40)]
            p.flush()
            assert all(h.result(0).queue_id in up for h in during + keyless)
        n_up = len(up) * (n_before // 12) + len(during) + len(keyless)
        # the consumer goes on with the queues that are served
        wait_until_sync(lambda: len(got) >= n_up, timeout=60, interval=0.1, what="the live groups' messages consumed")
        assert {m.queue_id for m in got} <= set(up)

        cl.start_group("g2", port=g2_port)  # same data dir, same address
        wait_until_sync(cl.healthy, timeout=60, interval=0.1, what="g2 back")
        # all its data is there, and the consumer resumes its queues
        for q in down:
            assert cl.client("g2").queue_offsets("s3", q).max_offset == before[q]
        n_all = n_before + len(during) + len(keyless)
        wait_until_sync(lambda: len(got) >= n_all, timeout=60, interval=0.1, what="g2's messages consumed after restart")
    finally:
        c.close()
        t.join(10)
    assert len({(m.queue_id, m.queue_offset) for m in got}) == n_all
    assert {m.text for m in got} >= {f"before-{i}" for i in range(n_before)}


# ------------------------------------------------------------------------------ 4
def test_alter_8_to_12_while_producing(healthy: Cluster) -> None:
    cl = healthy
    boot = cl.bootstrap
    cli("topic", "create", "s4", "--queues", "8", "--broker", boot)
    owners_before = cl.owners("s4")
    assert len(owners_before) == 8
    stop = threading.Event()
    acked: list[tuple[str, int, int, str | None]] = []  # (body, queue, offset, key)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(boot, route_refresh=0.5) as p:
                i = 0
                while not stop.is_set():
                    batch = []
                    for _ in range(20):
                        key = f"k{i % 64}" if i % 2 else None
                        batch.append((f"m{i}", key, p.send_async("s4", f"m{i}", key=key)))
                        i += 1
                    p.flush()
                    for body, key, h in batch:
                        r = h.result(0)
                        acked.append((body, r.queue_id, r.queue_offset, key))
                    time.sleep(0.01)  # pacing: a steady producer, not a synchronisation
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        wait_until_sync(lambda: len(acked) >= 400 or errors, timeout=60, interval=0.05, what="producing")
        cli("topic", "alter", "s4", "--queues", "12", "--broker", boot)

        def new_queues_used() -> bool:
            late = [(q, k) for _, q, _, k in acked[-2000:]]
            return bool(errors) or (any(q >= 8 and k for q, k in late) and any(q >= 8 and not k for q, k in late))

        wait_until_sync(new_queues_used, timeout=60, interval=0.05, what="keyed and keyless sends on queues 8..11")
    finally:
        stop.set()
        t.join(30)
    assert not errors, f"the producer failed: {errors[0]!r}"
    owners_after = cl.owners("s4")
    assert len(owners_after) == 12 and owners_after[:8] == owners_before, "existing queues never move"
    assert set(owners_after[8:]) <= set(GROUPS)
    for _, q, _, k in acked:
        assert k is None or q in (queue_for_key(k, 8), queue_for_key(k, 12))
    got = consume(boot, "c4", "s4", len(acked))
    stored = {(q, o): b for b, q, o, _ in acked}
    assert {(m.queue_id, m.queue_offset): m.text for m in got} == stored, "every acked message, where it was acked"


# ------------------------------------------------------------------------------ 6
def test_etcd_restarted_under_the_cluster(healthy: Cluster) -> None:
    cl = healthy
    boot = cl.bootstrap
    cl.client("g1").create_topic("s6", 6)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            with Producer(boot, send_timeout=60.0) as p:
                i = 0
                while not stop.is_set():
                    p.send("s6", f"e{i}", key=f"k{i % 30}")
                    acked.append(f"e{i}")
                    i += 1
                    time.sleep(0.005)  # pacing
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    got: list[Message] = []
    c = Consumer(boot, "c6", "s6", start_from="earliest", **FAST)
    ct = threading.Thread(target=c.run, args=(got.append,), daemon=True)
    pt = threading.Thread(target=produce, daemon=True)
    ct.start()
    pt.start()
    try:
        wait_until_sync(lambda: len(acked) >= 100 or errors, timeout=60, interval=0.05, what="producing")
        cl.etcd.stop()
        wait_until_sync(lambda: not cl.status("g1").etcd_ok, timeout=30, interval=0.1, what="g1 notices etcd down")
        mark = len(acked)
        wait_until_sync(lambda: len(acked) >= mark + 100 or errors, timeout=60, interval=0.05, what="producing without etcd")
        wait_until_sync(lambda: len(got) >= mark, timeout=60, interval=0.05, what="consuming without etcd")
        cl.etcd.start()  # same ports, same data directory
        wait_until_sync(cl.healthy, timeout=60, interval=0.1, what="every broker re-registered")
        mark = len(acked)
        wait_until_sync(lambda: len(acked) >= mark + 100 or errors, timeout=60, interval=0.05, what="producing after")
    finally:
        stop.set()
        pt.join(60)
    try:
        assert not errors, f"the producer failed: {errors[0]!r}"
        wait_until_sync(lambda: len(got) >= len(acked), timeout=60, interval=0.05, what="everything consumed")
    finally:
        c.close()
        ct.join(10)
    assert sorted(m.text for m in got) == sorted(acked), "every acked message once"


# ------------------------------------------------------------------------------ stale routes
def test_each_not_owner_episode_backs_off_from_the_start(healthy: Cluster) -> None:
    """A producer whose route turns stale again and again (here: made stale by hand)
    is rerouted each time after the FIRST backoff step: its count of routing failures
    starts over once the owner answers (it used to grow for the producer's whole
    life, so every later NOT_OWNER waited up to the 5 s cap)."""
    cl = healthy
    cl.client("g1").create_topic("s7", 3)
    owners = cl.owners("s7")
    assert sorted(owners) == sorted(GROUPS)
    key0 = next(f"k{i}" for i in range(1000) if queue_for_key(f"k{i}", 3) == 0)
    wrong = next(g for g in GROUPS if g != owners[0])

    async def make_stale(core: Any) -> Any:
        cache = core.router.cache
        t = cache.topics["s7"]
        cache.topics["s7"] = TopicRoute(t.info, [wrong if q == 0 else g for q, g in enumerate(t.owners)])
        lane = core._routes.topics["s7"].lanes[0]
        lane.owner = wrong
        lane.client = await core.router.client_for("s7", 0)
        return lane

    with Producer(cl.bootstrap, route_refresh=3600.0) as p:
        p.send("s7", "warm-up", key=key0)
        for i in range(3):
            lane = p._call(make_stale)
            stale_client = lane.client
            assert p.send("s7", f"x{i}", key=key0).queue_id == 0
            assert lane.client is not stale_client and lane.reroutes == i + 1, "rerouted after NOT_OWNER"
            assert lane.route_failures == 0, f"episode {i}: {lane.route_failures} routing failures remembered"
    assert cl.client(owners[0]).queue_offsets("s7", 0).max_offset == 4


# ------------------------------------------------------------------------------ make cluster
def test_local_cluster_launcher_prints_addresses_and_stops_on_sigint(tmp_path: Path) -> None:
    """``make cluster``: the ready line, every replica's address and role (one leader
    per group), then Ctrl-C (SIGINT to the whole process group, as a terminal sends
    it) stops the brokers cleanly, then etcd."""
    err = tmp_path / "stderr.txt"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "equeue.broker.cluster.local", "--groups", "2", "--replicas", "2", "--base-port", "0",
             "--data-dir", str(tmp_path / "c")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=err_file, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
        )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    def read_lines() -> None:
        for line in out:
            lines.put(line)

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not (seen and seen[-1].startswith("ready:")):
            alive = time.monotonic() < deadline and proc.poll() is None
            assert alive, f"no ready line: {seen} {err.read_text()[-2000:]}"
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        text = "".join(seen)
        assert re.search(r"^etcd\s+http://127\.0\.0\.1:\d+", text, re.M), text
        replicas = re.findall(r"^group (g\d)\s+replica (\d)\s+broker (127\.0\.0\.1:\d+)\s+(\w+)", text, re.M)
        assert sorted((g, r, role) for g, r, _, role in replicas) == [
            ("g1", "1", "leader"), ("g1", "2", "follower"), ("g2", "1", "leader"), ("g2", "2", "follower"),
        ], text  # fmt: skip
        brokers = {g: addr for g, r, addr, _ in replicas if r == "1"}
        everyone = [addr for *_, addr, _ in replicas]
        with Client(brokers["g2"]) as c:
            wait_until_sync(
                lambda: sum(g.available for g in c.cluster_status().groups) == 2,
                timeout=30, interval=0.1, what="both groups alive",
            )  # fmt: skip
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group gets it
        assert proc.wait(60) == 0, err.read_text()[-2000:]
        reader.join(10)
        rest = "".join(lines.get_nowait() for _ in range(lines.qsize()))
        assert "stopped" in rest and "did not exit cleanly" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for addr in everyone:  # every broker is gone
        host, port = addr.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()

