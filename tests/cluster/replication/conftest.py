"""The replication harness: one broker group of R replicas, each a real ``equeue broker
start --cluster URL --broker-group G --data-dir D --port 0 --cluster-lease-ttl 2``
process, on the session etcd of ``tests/cluster/conftest.py`` (wiped per test).

:class:`ReplicaGroup` starts the replicas (in parallel: process start-up is what
costs time), finds the group's leader (REPLICATION_STATUS of every replica, checked
against etcd's leader record in CLUSTER_STATUS), waits for the in-sync set to hold
N members, SIGKILLs / SIGSTOPs / SIGCONTs / restarts a replica with its data
directory and port, reads a queue whole from the leader, and runs ``equeue cluster
verify``. Every wait is on a condition (``wait_until_sync``), with generous bounds
that name what they waited for.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.client import Client
from equeue.control import (
    ClusterStatus,
    ClusterStatusRequest,
    ReplicationStatus,
    ReplicationStatusRequest,
)
from equeue.errors import EQueueError
from tests.conftest import ROOT, in_threads, wait_until_sync

#: the lease TTL every replica runs with (failover within a few seconds)
LEASE_TTL = 2
#: a request to one replica gives up after this long (a frozen one answers nothing)
ASK_TIMEOUT = 2.0


class ReplicaGroup:
    """``R`` replicas of broker group ``group``, replica ``i`` in ``root/<group>-<i>``.

    ``args`` go to every ``broker start`` (``--acks``, ``--min-insync``,
    ``--replica-lag-max``...). Replicas are named by their index; their broker ids
    (``<data-dir>/broker.id``) map back with :meth:`index_of`."""

    def __init__(self, root: Path, etcd: str, group: str = "r", replicas: int = 3, *args: str) -> None:
        self.etcd = etcd
        self.group = group
        common = ("--cluster", etcd, "--broker-group", group, "--cluster-lease-ttl", str(LEASE_TTL), *args)
        self.brokers = [BrokerProcess(root / f"{group}-{i}", *common) for i in range(replicas)]
        self.frozen: set[int] = set()
        self._clients: dict[str, Client] = {}
        self._ids: dict[str, int] = {}

    # ------------------------------------------------------------------ processes
    def start(self, *indexes: int) -> ReplicaGroup:
        """Start these replicas (default: every one) at once; raise the first failure."""
        chosen = [self.brokers[i] for i in indexes] if indexes else self.brokers
        in_threads(chosen, lambda b: b.start(timeout=60))
        for i, b in enumerate(self.brokers):
            if b in chosen:
                self._ids[(b.data_dir / "broker.id").read_text().strip()] = i
        return self

    def running(self, i: int) -> bool:
        return self.brokers[i].running

    def live(self) -> list[int]:
        """Replicas running and not frozen."""
        return [i for i in range(len(self.brokers)) if self.running(i) and i not in self.frozen]

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i`` (a crash: no shutdown code runs)."""
        self.thaw(i)
        self.brokers[i].kill()

    def freeze(self, i: int) -> None:
        """SIGSTOP replica ``i``."""
        self.brokers[i].freeze()
        self.frozen.add(i)

    def thaw(self, i: int) -> None:
        """SIGCONT replica ``i``."""
        self.brokers[i].thaw()
        self.frozen.discard(i)

    def restart(self, i: int) -> None:
        """Start replica ``i`` again (after a kill or stop): same data dir, same port."""
        self.brokers[i].start(timeout=60)

    def address(self, i: int) -> str:
        return self.brokers[i].address

    @property
    def bootstrap(self) -> str:
        """Every replica's address (what a client bootstraps from; dead ones included:
        the clients try the next)."""
        return ",".join(b.address for b in self.brokers)

    def broker_id(self, i: int) -> str:
        return next(bid for bid, j in self._ids.items() if j == i)

    def index_of(self, broker_id: str) -> int:
        return self._ids[broker_id]

    # ------------------------------------------------------------------ requests
    def client(self, i: int) -> Client:
        """A blocking client pinned to replica ``i`` (kept open; it reconnects)."""
        addr = self.address(i)
        c = self._clients.get(addr)
        if c is None:
            c = self._clients[addr] = Client(addr, connect_timeout=ASK_TIMEOUT)
        return c

    def ask(self, i: int, fn: Callable[[Any], Any], timeout: float = ASK_TIMEOUT) -> Any:
        """``fn(async_client)`` at replica ``i``, bounded by ``timeout`` seconds
        (trio.TooSlowError past it: a frozen replica)."""

        async def run(core: Any) -> Any:
            with trio.fail_after(timeout):
                return await fn(core)

        return self.client(i)._call(run)

    def status(self, i: int) -> ReplicationStatus | None:
        """Replica ``i``'s REPLICATION_STATUS; None when it answers nothing in time."""
        if i not in self.live():
            return None
        try:
            st: ReplicationStatus = self.ask(i, lambda c: c.call(ReplicationStatusRequest(), ReplicationStatus))
        except (EQueueError, trio.TooSlowError, OSError):
            return None
        return st

    def cluster_status(self, i: int) -> ClusterStatus | None:
        try:
            st: ClusterStatus = self.ask(i, lambda c: c.call(ClusterStatusRequest(), ClusterStatus))
        except (EQueueError, trio.TooSlowError, OSError):
            return None
        return st

    def current_leader(self) -> int | None:
        """The replica that says it leads and that etcd's leader record (as a live
        replica's CLUSTER_STATUS shows it) names; None while there is none, or while
        they disagree."""
        leading = [i for i in self.live() if (st := self.status(i)) is not None and st.role == "leader"]
        if len(leading) != 1:
            return None
        cs = self.cluster_status(leading[0])
        if cs is None:
            return None
        rec = next((g for g in cs.groups if g.name == self.group), None)
        if rec is None or rec.leader != self.broker_id(leading[0]):
            return None
        return leading[0]

    def leader(self, timeout: float = 60) -> int:
        """Wait for the group's leader (see :meth:`current_leader`); its index."""
        found: list[int] = []

        def check() -> bool:
            i = self.current_leader()
            if i is not None:
                found.append(i)
            return i is not None

        wait_until_sync(check, timeout=timeout, interval=0.05, what=f"group {self.group} has one leader")
        return found[-1]

    def isr(self) -> list[int]:
        """The in-sync set as the leader reports it (replica indexes; [] without a leader)."""
        i = self.current_leader()
        st = self.status(i) if i is not None else None
        return sorted(self.index_of(b) for b in st.isr) if st is not None else []

    def wait_isr(self, members: int | set[int], timeout: float = 60) -> int:
        """Wait until the leader's in-sync set holds ``members`` (a count, or exactly
        these replicas); return the leader's index."""
        seen: list[list[int]] = []

        def check() -> bool:
            isr = self.isr()
            seen.append(isr)
            return len(isr) == members if isinstance(members, int) else set(isr) == members

        wait_until_sync(check, timeout=timeout, interval=0.05, what=f"in-sync set {members} (last seen {seen[-1:]})")
        return self.leader()

    def read_queue(self, topic: str, queue_id: int, timeout: float = 30) -> list[Message]:
        """Every message of one queue, read at the leader from its first offset to
        its end; AssertionError when the offsets read are not dense (a gap)."""
        leader = self.leader(timeout)
        out: list[Message] = []
        offset = 0
        while True:
            req = wire.PullRequest(topic, queue_id, offset, max_messages=1000)
            res = self.ask(leader, lambda c, r=req: c.pull(r), timeout=timeout)
            if not out:
                offset = res.min_offset if res.min_offset > offset else offset
            for m in res.messages:
                assert m.queue_offset == offset, f"{topic}/{queue_id}: offset {m.queue_offset} read where {offset} was due"
                out.append(m)
                offset += 1
            if offset >= res.max_offset or not res.messages:
                assert offset == res.max_offset, f"{topic}/{queue_id}: read up to {offset}, end {res.max_offset}"
                return out

    def verify(self, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``equeue cluster verify`` against every replica (exit 0: equal)."""
        return subprocess.run(
            [sys.executable, "-m", "equeue", "cluster", "verify", "--broker", self.bootstrap,
             "--timeout", str(timeout)],
            capture_output=True, text=True, timeout=timeout + 60, cwd=ROOT,
        )  # fmt: skip

    def check_verify(self, timeout: float = 30) -> None:
        r = self.verify(timeout)
        assert r.returncode == 0, f"cluster verify exit {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}"

    def errors(self) -> list[str]:
        """ERROR lines any replica logged (tests assert there are none)."""
        return [line for b in self.brokers for line in b.error_lines]

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        for i in range(len(self.brokers)):
            self.thaw(i)
        for b in self.brokers:
            b.close()


@pytest.fixture
def replicas(etcd: EtcdProcess, tmp_path: Path) -> Iterator[Callable[..., ReplicaGroup]]:
    """``replicas(group, n, *args)``: a started :class:`ReplicaGroup` (closed after the test)."""
    made: list[ReplicaGroup] = []

    def make(group: str = "r", n: int = 3, *args: str) -> ReplicaGroup:
        g = ReplicaGroup(tmp_path, etcd.endpoint, group, n, *args)
        made.append(g)
        return g.start()

    try:
        yield make
    finally:
        for g in made:
            g.close()


class Load:
    """``producers`` threads, each with its own ``Producer``, sending keyed messages
    ``"<producer>-<n>"`` in batches of ``batch`` (``send_async`` + ``flush``) until
    :meth:`stop`. Records what each message's answer was: ``acked[body] = (queue,
    offset, sent_at, acked_at)`` (monotonic times), and the bodies whose send failed."""

    def __init__(self, bootstrap: str, topic: str, producers: int = 4, batch: int = 20, **options: Any) -> None:
        self.bootstrap, self.topic, self.batch = bootstrap, topic, batch
        self.options = dict(send_timeout=60.0, **options)
        self.acked: dict[str, tuple[int, int, float, float]] = {}
        self.failed: dict[str, str] = {}
        self.sent: set[str] = set()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(p,), daemon=True) for p in range(producers)]

    def _run(self, p: int) -> None:
        from equeue.producer import Producer

        try:
            with Producer(self.bootstrap, **self.options) as prod:
                n = 0
                while not self._stop.is_set():
                    sent_at = time.monotonic()
                    handles = []
                    for _ in range(self.batch):
                        body = f"{p}-{n}"
                        with self._lock:
                            self.sent.add(body)
                        handles.append((body, prod.send_async(self.topic, body, key=f"k{n % 16}")))
                        n += 1
                    try:
                        prod.flush()
                    except EQueueError:
                        pass  # each handle says what became of its message
                    for body, h in handles:
                        try:
                            r = h.result(60)
                        except EQueueError as exc:
                            self.failed[body] = repr(exc)
                            continue
                        with self._lock:
                            self.acked[body] = (r.queue_id, r.queue_offset, sent_at, time.monotonic())
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def count(self) -> int:
        return len(self.acked)

    def first_ack_sent_after(self, t: float) -> float | None:
        """The earliest acknowledgement of a batch sent after monotonic time ``t``."""
        with self._lock:
            times = [acked for _, _, sent, acked in self.acked.values() if sent > t]
        return min(times) if times else None

    def wait_more(self, n: int, timeout: float = 60) -> None:
        """Wait until ``n`` more messages than now are acknowledged."""
        target = self.count() + n
        wait_until_sync(
            lambda: self.count() >= target or bool(self.errors), timeout=timeout, interval=0.02,
            what=f"{n} more acknowledged (at {self.count()})",
        )  # fmt: skip
        assert not self.errors, f"a producer failed: {self.errors[0]!r}"

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)
        assert not any(t.is_alive() for t in self._threads), "a producer thread did not stop"

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_store(group: ReplicaGroup, topic: str, queues: int, acked: dict[str, tuple[int, int, float, float]],
                sent: set[str]) -> dict[tuple[int, int], str]:  # fmt: skip
    """Every queue read whole at the leader: dense offsets (``read_queue``), no body
    stored twice, nothing stored that was never sent, and every acknowledged message
    where its acknowledgement said. Returns ``(queue, offset) -> body``."""
    stored: dict[tuple[int, int], str] = {}
    seen: dict[str, tuple[int, int]] = {}
    for q in range(queues):
        for m in group.read_queue(topic, q):
            body = m.text
            assert body not in seen, f"{body!r} stored twice: at {seen[body]} and {(q, m.queue_offset)}"
            assert body in sent, f"{(q, m.queue_offset)} holds {body!r}, never sent"
            seen[body] = (q, m.queue_offset)
            stored[(q, m.queue_offset)] = body
    lost = [b for b in acked if b not in seen]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost, e.g. {lost[:5]}"
    moved = [(b, acked[b][:2], seen[b]) for b in acked if acked[b][1] >= 0 and acked[b][:2] != seen[b]]
    assert not moved, f"{len(moved)} acknowledged messages not where acknowledged, e.g. {moved[:5]}"
    return stored
