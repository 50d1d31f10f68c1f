"""Cluster benchmarks: a 2-group cluster against one standalone broker, in
the same run, alternating; every broker (and etcd) is a process of its own.

- P1: N x 100-byte keyed messages, streaming ``Producer.send_async`` + ``flush``
  (as ``bench_produce.py``), to a topic of 4 queues (2 per group in the cluster).
- C1: one ``Consumer`` member drains that topic (fresh group, no-op handler), as
  ``bench_consume.py``'s c1s.
- route refresh: the GET_ROUTES round trip (``Client.get_routes``), p50/p99 over 1,000.
- NOT_OWNER: a producer whose route table says the other group owns a queue sends one
  message there: the owner's broker answers NOT_OWNER, the producer refreshes its
  routes and retries at the owner. Reported: the time of such a send minus the median
  time of a send on a fresh route (= from the NOT_OWNER answer to the retry's
  success), p50/p99 over ``--stale`` sends.

CPU per message is the CPU time (user + system, all threads) of this client process,
of every broker process and, for the cluster, of etcd, divided by the messages: on a
shared 2-core machine it is steadier than msg/s, and it shows what a cluster costs.

    .venv/bin/python bench/bench_cluster.py [--messages 200000] [--rounds 2]
        [--only p1,c1,routes,notowner] [--stale 200] [--flush async]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue import Message  # noqa: E402
from equeue.broker.cluster.etcdproc import EtcdProcess  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.consumer import Consumer  # noqa: E402
from equeue.control import TopicRoute  # noqa: E402
from equeue.producer import Producer  # noqa: E402
from equeue.routing import queue_for_key  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
FAST = dict(heartbeat_interval=0.5, rebalance_interval=0.5, commit_interval=1.0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


class Target:
    """A standalone broker, or a cluster of ``groups`` groups on one etcd."""

    def __init__(self, name: str, root: Path, groups: int, flush: str) -> None:
        self.name = name
        self.etcd: EtcdProcess | None = None
        self.brokers: list[BrokerProcess] = []
        if groups == 0:
            self.brokers.append(BrokerProcess(root / "standalone", "--flush", flush).start())
        else:
            self.etcd = EtcdProcess(root / "etcd").start()
            for i in range(groups):
                self.brokers.append(
                    BrokerProcess(
                        root / f"g{i + 1}", "--flush", flush, "--cluster", self.etcd.endpoint,
                        "--broker-group", f"g{i + 1}",
                    ).start()
                )  # fmt: skip
            with Client(self.brokers[0].address) as c:
                deadline = time.monotonic() + 60
                while sum(g.available for g in c.cluster_status().groups) < groups:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{name}: the groups did not all register within 60 s")
                    time.sleep(0.1)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def pids(self) -> list[int]:
        return [b.pid for b in self.brokers] + ([self.etcd.pid] if self.etcd is not None else [])

    def close(self) -> None:
        for b in self.brokers:
            b.close()
        if self.etcd is not None:
            self.etcd.close()


class Meter:
    """Wall time and CPU (this process, and the target's processes) over a section."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.t0 = self.c0 = 0.0
        self.s0: list[float] = []

    def start(self) -> None:
        self.s0 = [cpu_seconds(p) for p in self.target.pids()]
        self.c0 = time.process_time()
        self.t0 = time.perf_counter()

    def stop(self, n: int) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        client = time.process_time() - self.c0
        servers = sum(cpu_seconds(p) - s for p, s in zip(self.target.pids(), self.s0, strict=True))
        return {
            "msg/s": n / wall, "wall": wall, "client_us": 1e6 * client / n, "servers_us": 1e6 * servers / n,
            "total_us": 1e6 * (client + servers) / n,
        }  # fmt: skip


def p1(target: Target, topic: str, n: int) -> dict[str, float]:
    body = b"x" * 100
    with Client(target.brokers[0].address) as c:
        c.create_topic(topic, 4)
    with Producer(target.bootstrap) as p:
        p.send(topic, b"warm-up", key="w")
        m = Meter(target)
        m.start()
        for i in range(n):
            p.send_async(topic, body, key=f"k{i}")
        p.flush()
        return m.stop(n)


def c1(target: Target, topic: str, n: int) -> dict[str, float]:
    count = 0
    m = Meter(target)
    with Consumer(target.bootstrap, f"c1-{topic}", topic, start_from="earliest", **FAST) as c:  # type: ignore[arg-type]

        def handler(_msg: Message) -> None:
            nonlocal count
            if not count:
                m.start()
            count += 1
            if count == n:
                c.stop()

        c.run(handler)
    return m.stop(n - 1)  # from the first message on


def route_refresh(target: Target, topic: str, rounds: int = 1000) -> dict[str, float]:
    lat = []
    with Client(target.brokers[0].address) as c:
        c.get_routes([topic])
        for _ in range(rounds):
            t0 = time.perf_counter()
            c.get_routes([topic])
            lat.append(time.perf_counter() - t0)
    return {"p50_ms": 1e3 * pct(lat, 0.5), "p99_ms": 1e3 * pct(lat, 0.99)}


def make_stale(p: Producer, topic: str, queue_id: int, wrong_group: str) -> None:
    """Make the producer's held route say ``wrong_group`` owns ``queue_id`` (the same
    revision, so the refresh after NOT_OWNER takes the true table back) and point the
    queue's lane at that group's connection. Reaches into the producer's router and
    lane on its loop thread: a benchmark-only hack."""

    async def poison(core: Any) -> None:
        cache = core.router.cache
        t = cache.topics[topic]
        owners = list(t.owners)
        owners[queue_id] = wrong_group
        cache.topics[topic] = TopicRoute(t.info, owners)
        lane = core._routes.topics[topic].lanes[queue_id]  # its resolved connection, too
        lane.owner = wrong_group
        lane.client = await core.router.client_for(topic, queue_id)

    p._call(poison)


def not_owner(target: Target, topic: str, rounds: int) -> dict[str, float]:
    """Sends on a deliberately stale route (module docstring)."""
    with Client(target.brokers[0].address) as c:
        c.create_topic(topic, 2)  # one queue per group
        owners = c.get_routes([topic]).topics[0].owners
    assert len(set(owners)) == 2, owners
    key0 = next(f"k{i}" for i in range(1000) if queue_for_key(f"k{i}", 2) == 0)
    key1 = next(f"k{i}" for i in range(1000) if queue_for_key(f"k{i}", 2) == 1)
    with Producer(target.bootstrap, route_refresh=3600.0) as p:
        p.send(topic, b"warm-up", key=key0)
        p.send(topic, b"warm-up", key=key1)  # both groups' connections open
        fresh = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            p.send(topic, b"x", key=key0)
            fresh.append(time.perf_counter() - t0)
        base = statistics.median(fresh)
        stale = []
        for _ in range(rounds):
            make_stale(p, topic, 0, owners[1])
            t0 = time.perf_counter()
            r = p.send(topic, b"x", key=key0)
            stale.append(time.perf_counter() - t0)
            assert r.queue_id == 0
    extra = [s - base for s in stale]
    return {
        "fresh_p50_ms": 1e3 * base, "p50_ms": 1e3 * pct(extra, 0.5), "p99_ms": 1e3 * pct(extra, 0.99),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of P1 and C1 per target")
    ap.add_argument("--only", default="p1,c1,routes,notowner")
    ap.add_argument("--stale", type=int, default=200, help="sends on a stale route")
    ap.add_argument("--flush", default="async", choices=["sync", "async"])
    args = ap.parse_args()
    only = set(args.only.lower().split(","))
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; {args.messages:,} messages x 100 B; --flush {args.flush}")
    with tempfile.TemporaryDirectory(prefix="equeue-bench-cluster-") as tmp:
        targets = [Target("standalone", Path(tmp) / "s", 0, args.flush), Target("cluster-2", Path(tmp) / "c", 2, args.flush)]
        try:
            print(f"{'target':11} {'work':5} {'msg/s':>10} {'wall s':>7} {'client us':>10} {'brokers us':>11} {'total us':>9}")
            for r in range(args.rounds):
                for t in targets:
                    topic = f"bench-{r}"
                    runs: list[tuple[str, Callable[..., dict[str, float]]]] = []
                    if "p1" in only or "c1" in only:
                        runs.append(("P1", p1))
                    if "c1" in only:
                        runs.append(("C1", c1))
                    for name, fn in runs:
                        res = fn(t, topic, args.messages)
                        print(
                            f"{t.name:11} {name:5} {res['msg/s']:>10,.0f} {res['wall']:>7.2f} {res['client_us']:>10.2f} "
                            f"{res['servers_us']:>11.2f} {res['total_us']:>9.2f}", flush=True,
                        )  # fmt: skip
            for t in targets:
                if "routes" in only:
                    rt = route_refresh(t, "bench-0")
                    print(f"{t.name:11} GET_ROUTES round trip: p50 {rt['p50_ms']:.3f} ms, p99 {rt['p99_ms']:.3f} ms")
            if "notowner" in only:
                no = not_owner(targets[1], "bench-stale", args.stale)
                print(
                    f"cluster-2   NOT_OWNER -> retry succeeded: p50 {no['p50_ms']:.3f} ms, p99 {no['p99_ms']:.3f} ms "
                    f"(over {args.stale} sends; a send on a fresh route: p50 {no['fresh_p50_ms']:.3f} ms)"
                )
        finally:
            for t in targets:
                t.close()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
