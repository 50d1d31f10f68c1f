"""Replication benchmarks: every broker, and etcd, is a process of its own.

- P1 (replication cost): N x 100-byte keyed messages, streaming ``Producer.send_async``
  + ``flush`` (as ``bench_cluster.py``), to a topic of 4 queues, against, in the same
  run and alternating: a standalone broker; one group of 3 replicas with ``--acks all``;
  the same with ``--acks leader``. msg/s and CPU per message: user + system time of
  this client process, of every broker process and of etcd (``/proc/PID/stat``),
  divided by the messages (all replicas share the machine's 2 cores, so CPU per
  message is the figure that carries over to one replica per machine).
- failover: a group of 3 replicas (``--acks all``) under a light produce load; the
  leader is SIGKILLed ``--kills`` times (each killed replica restarts and rejoins the
  in-sync set before the next kill). Reported: from the SIGKILL to the first
  acknowledgement of a produce sent after it (sends are issued every 5 ms), p50 / p99 /
  max, for each ``--ttl`` (the brokers' ``--cluster-lease-ttl``).
- catch-up: a follower of a 3-replica group is stopped (SIGKILL), ``--catchup``
  x 100-byte messages are produced, and it is started again: from its restart to its
  position reaching the leader's end (and it being back in the in-sync set), with the
  messages per second it applied.

    .venv/bin/python bench/bench_replication.py [--messages 200000] [--rounds 2]
        [--kills 10] [--ttl 3,2] [--catchup 1000000] [--only p1,failover,catchup]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_cluster import cpu_seconds, pct  # noqa: E402

from equeue.broker.cluster.etcdproc import EtcdProcess  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.control import ReplicationStatus, ReplicationStatusRequest  # noqa: E402
from equeue.errors import EQueueError  # noqa: E402
from equeue.producer import Producer  # noqa: E402

BODY = b"x" * 100


def wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Group:
    """A standalone broker (``replicas`` 0) or one broker group of ``replicas``
    replicas on its own etcd; ``args`` go to every broker."""

    def __init__(self, name: str, root: Path, replicas: int, *args: str) -> None:
        self.name = name
        self.etcd: EtcdProcess | None = None
        if replicas == 0:
            self.brokers = [BrokerProcess(root / "standalone", *args)]
        else:
            self.etcd = EtcdProcess(root / "etcd").start()
            common = ("--cluster", self.etcd.endpoint, "--broker-group", "g", *args)
            self.brokers = [BrokerProcess(root / f"r{i}", *common) for i in range(replicas)]
        threads = [threading.Thread(target=b.start, kwargs={"timeout": 60}) for b in self.brokers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.ids = {(b.data_dir / "broker.id").read_text().strip(): i for i, b in enumerate(self.brokers)} if replicas else {}
        if replicas:
            self.wait_isr(replicas)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def pids(self) -> list[int]:
        return [b.pid for b in self.brokers if b.running] + ([self.etcd.pid] if self.etcd is not None else [])

    def status(self, i: int) -> ReplicationStatus | None:
        if not self.brokers[i].running:
            return None
        try:
            with Client(self.brokers[i].address, connect_timeout=2.0) as c:
                st: ReplicationStatus = c.call(ReplicationStatusRequest(), ReplicationStatus)
                return st
        except (EQueueError, OSError):
            return None

    def leader(self) -> tuple[int, ReplicationStatus] | None:
        found = [(i, st) for i in range(len(self.brokers)) if (st := self.status(i)) is not None and st.role == "leader"]
        return found[0] if len(found) == 1 else None

    def wait_isr(self, n: int, timeout: float = 120) -> int:
        """Wait until the leader's in-sync set has ``n`` members; the leader's index."""
        found: list[int] = []

        def check() -> bool:
            lead = self.leader()
            if lead is not None and len(lead[1].isr) == n:
                found.append(lead[0])
                return True
            return False

        wait(check, timeout, f"{self.name}: a leader with {n} in-sync replicas")
        return found[-1]

    def admin_address(self) -> str:
        """Where topic commands go: the standalone broker, or the group's leader."""
        return self.brokers[0 if self.etcd is None else self.wait_isr(len(self.brokers))].address

    def close(self) -> None:
        for b in self.brokers:
            b.close()
        if self.etcd is not None:
            self.etcd.close()


def p1(g: Group, topic: str, n: int) -> dict[str, float]:
    with Client(g.admin_address()) as c:
        c.create_topic(topic, 4)
    with Producer(g.bootstrap) as p:
        p.send(topic, b"warm-up", key="w")
        pids = g.pids()
        s0 = [cpu_seconds(x) for x in pids]
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            p.send_async(topic, BODY, key=f"k{i}")
        p.flush()
        wall = time.perf_counter() - t0
        client = time.process_time() - c0
        servers = sum(cpu_seconds(x) - s for x, s in zip(pids, s0, strict=True))
    return {"msg/s": n / wall, "wall": wall, "client_us": 1e6 * client / n, "servers_us": 1e6 * servers / n}


def run_p1(root: Path, n: int, rounds: int) -> None:
    groups = [
        Group("standalone", root / "s", 0, "--flush", "async"),
        Group("3x acks all", root / "all", 3, "--flush", "async", "--acks", "all"),
        Group("3x acks leader", root / "leader", 3, "--flush", "async", "--acks", "leader"),
    ]
    try:
        print(f"{'target':15} {'msg/s':>9} {'wall s':>7} {'client us':>10} {'brokers us':>11} {'total us':>9}")
        for r in range(rounds):
            for g in groups:
                res = p1(g, f"p1-{r}", n)
                print(
                    f"{g.name:15} {res['msg/s']:>9,.0f} {res['wall']:>7.2f} {res['client_us']:>10.2f} "
                    f"{res['servers_us']:>11.2f} {res['client_us'] + res['servers_us']:>9.2f}", flush=True,
                )  # fmt: skip
    finally:
        for g in groups:
            g.close()


def run_failover(root: Path, kills: int, ttl: int) -> list[float]:
    """SIGKILL the leader ``kills`` times; each: seconds to the first acknowledged
    produce sent after the kill."""
    g = Group(f"ttl {ttl}", root / f"failover-{ttl}", 3, "--flush", "async", "--cluster-lease-ttl", str(ttl))
    times: list[float] = []
    try:
        with Client(g.admin_address()) as c:
            c.create_topic("fo", 4)
        with Producer(g.bootstrap, send_timeout=60.0) as p:
            i = 0
            for _ in range(kills):
                leader = g.wait_isr(3)
                for _ in range(50):  # a light load before the kill
                    p.send_async("fo", BODY, key=f"k{i}")
                    i += 1
                p.flush()
                killed_at = time.monotonic()
                g.brokers[leader].kill()
                handles = []
                first = None
                while first is None:
                    handles.append(p.send_async("fo", BODY, key=f"k{i}"))
                    i += 1
                    time.sleep(0.005)
                    for h in handles:
                        if h.done() and h.exception(0) is None:
                            first = time.monotonic() - killed_at
                            break
                    if time.monotonic() - killed_at > 120:
                        raise SystemExit("no produce acknowledged within 120 s of the kill")
                p.flush()
                times.append(first)
                print(f"  ttl {ttl}: kill {len(times)}: {first:.3f} s", flush=True)
                g.brokers[leader].start(timeout=60)
    finally:
        g.close()
    return times


def run_catchup(root: Path, n: int) -> None:
    g = Group("catch-up", root / "catchup", 3, "--flush", "async", "--cluster-lease-ttl", "2")
    try:
        with Client(g.admin_address()) as c:
            c.create_topic("cu", 4)
        leader = g.wait_isr(3)
        follower = (leader + 1) % 3
        g.brokers[follower].kill()
        t0 = time.perf_counter()
        with Producer(g.bootstrap, send_timeout=120.0) as p:
            for i in range(n):
                p.send_async("cu", BODY, key=f"k{i}")
            p.flush()
        produced = time.perf_counter() - t0
        lead = g.leader()
        assert lead is not None
        end, end_global = lead[1].position, lead[1].next_global
        b = g.brokers[follower]
        b.start(timeout=60)
        started = time.perf_counter()
        st0 = g.status(follower)
        behind = end_global - (st0.next_global if st0 is not None else 0)
        cpu0 = cpu_seconds(b.pid)
        wait(lambda: (st := g.status(follower)) is not None and st.position >= end, 600, "the follower caught up")
        caught = time.perf_counter() - started
        cpu = cpu_seconds(b.pid) - cpu0
        g.wait_isr(3)
        rejoined = time.perf_counter() - started
        print(
            f"catch-up: {n:,} messages produced in {produced:.1f} s with the follower down; "
            f"restarted {behind:,} messages / {end - (st0.position if st0 else 0):,} log entries behind: "
            f"caught up in {caught:.2f} s ({behind / caught:,.0f} msg/s, follower CPU {cpu:.1f} s), "
            f"back in the ISR after {rejoined:.2f} s", flush=True,
        )  # fmt: skip
    finally:
        g.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--ttl", default="3,2", help="lease TTLs to measure failover with (3: the default)")
    ap.add_argument("--catchup", type=int, default=1_000_000)
    ap.add_argument("--only", default="p1,failover,catchup")
    args = ap.parse_args()
    only = set(args.only.split(","))
    print(f"load average {os.getloadavg()[0]:.2f} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    with tempfile.TemporaryDirectory(prefix="equeue-bench-repl-") as tmp:
        root = Path(tmp)
        if "p1" in only:
            print(f"P1: {args.messages:,} x 100 B keyed, 4 queues, --flush async")
            run_p1(root, args.messages, args.rounds)
        if "failover" in only:
            for ttl in (int(x) for x in args.ttl.split(",")):
                t = run_failover(root, args.kills, ttl)
                print(
                    f"failover, --cluster-lease-ttl {ttl}: {len(t)} kills: p50 {pct(t, 0.5):.2f} s, "
                    f"p99 {pct(t, 0.99):.2f} s, max {max(t):.2f} s", flush=True,
                )  # fmt: skip
        if "catchup" in only:
            run_catchup(root, args.catchup)
    print(f"load average {os.getloadavg()[0]:.2f} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")


if __name__ == "__main__":
    main()
