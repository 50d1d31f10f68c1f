"""The optional partition test: the leader runs in its own network
namespace (``ip netns``), joined to the host by a veth pair; taking the host end of
the pair down cuts it from etcd, from its followers and from every client outside,
while a client INSIDE its namespace can still reach it.

The old leader must fence itself: after the new leader's election it answers that
client nothing but errors, and it acknowledges no write from the moment of the cut
(``--acks all``: its followers cannot have it). Healed, it truncates what it wrote
alone, rejoins as a follower, and the replicas' stores are equal.

Needs root (CAP_NET_ADMIN): skipped where ``ip netns add`` fails.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from tests.cluster.replication.conftest import LEASE_TTL, Load, ReplicaGroup, check_store
from tests.conftest import ROOT, wait_until_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@attrs.frozen
class Netns:
    name: str
    host_end: str
    host_ip: str
    ns_ip: str

    def cut(self) -> None:
        r = ip("link", "set", self.host_end, "down")
        assert r.returncode == 0, r.stderr

    def heal(self) -> None:
        r = ip("link", "set", self.host_end, "up")
        assert r.returncode == 0, r.stderr

    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)


@pytest.fixture
def netns() -> Iterator[Netns]:
    n = os.getpid() % 200 + 20
    ns = Netns(f"eq-part-{os.getpid()}", f"eqh{os.getpid()}", f"10.231.{n}.1", f"10.231.{n}.2")
    if ip("netns", "add", ns.name).returncode != 0:
        pytest.skip("ip netns add failed here (no CAP_NET_ADMIN)")
    try:
        peer = f"eqn{os.getpid()}"
        for cmd in (
            ("link", "add", ns.host_end, "type", "veth", "peer", "name", peer),
            ("link", "set", peer, "netns", ns.name),
            ("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_end),
            ("link", "set", ns.host_end, "up"),
            ("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.ns_ip}/30", "dev", peer),
            ("netns", "exec", ns.name, "ip", "link", "set", peer, "up"),
            ("netns", "exec", ns.name, "ip", "link", "set", "lo", "up"),
        ):
            r = ip(*cmd)
            if r.returncode != 0:
                pytest.skip(f"ip {' '.join(cmd)}: {r.stderr.strip()}")
        yield ns
    finally:
        ip("link", "del", ns.host_end)
        ip("netns", "del", ns.name)


class Proxy:
    """A TCP forwarder from ``listen_host:port`` to ``target``: etcd listens on
    127.0.0.1 only, which a namespace cannot reach."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server((listen_host, 0))
        self.port = self.sock.getsockname()[1]
        self._open: list[socket.socket] = [self.sock]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.sock.accept()
                b = socket.create_connection(self.target)
            except OSError:
                return
            self._open += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for s in self._open:
            s.close()


PINNED = r"""
import sys, time, trio
sys.path.insert(0, sys.argv[1])
from equeue.client.async_client import AsyncClient
from equeue import Message, wire
addr, topic, out = sys.argv[2], sys.argv[3], sys.argv[4]
f = open(out, "a", buffering=1)

async def one(kind, fn, body=""):
    sent = time.time_ns() // 1_000_000
    try:
        with trio.fail_after(10):
            res = await fn()
        ok, detail = 1, (f"{len(res.messages)}msgs" if kind == "pull" else "stored")
    except Exception as exc:
        ok, detail = 0, type(exc).__name__
    f.write(f"{kind} {sent} {time.time_ns() // 1_000_000} {ok} {body or '-'} {detail}\n")

async def main():
    n = 0
    async with AsyncClient(addr, connect_timeout=2.0) as c:
        while True:
            body = f"inside-{n}"
            n += 1
            req = wire.ProduceRequest(topic, 0, [wire.encode_entry(Message(body))])
            await one("produce", lambda: c.produce(req), body)
            await one("pull", lambda: c.pull(wire.PullRequest(topic, 0, 0, max_messages=10)))
            await trio.sleep(0.02)

trio.run(main)
"""


@attrs.frozen
class Answer:
    kind: str
    sent_ms: int
    answered_ms: int
    ok: bool
    body: str
    detail: str


def answers(path: Path) -> list[Answer]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            p = line.split()
            if len(p) == 6:
                out.append(Answer(p[0], int(p[1]), int(p[2]), p[3] == "1", p[4], p[5]))
    return out


def leader_since_ms(endpoint: str, group: str) -> tuple[str, int]:
    """(broker id, since_ms) of etcd's leader record of ``group``."""
    key = base64.b64encode(f"/equeue/leaders/{group}".encode()).decode()
    req = urllib.request.Request(endpoint + "/v3/kv/range", data=json.dumps({"key": key}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        kvs = json.loads(resp.read()).get("kvs", [])
    assert kvs, f"no leader record for {group}"
    rec = json.loads(base64.b64decode(kvs[0]["value"]))
    return rec["broker_id"], int(rec["since_ms"])


def test_leader_partitioned_from_etcd_and_followers(etcd: EtcdProcess, netns: Netns, tmp_path: Path) -> None:
    proxy = Proxy(netns.host_ip, ("127.0.0.1", etcd.client_port))
    rs = ReplicaGroup(tmp_path, etcd.endpoint, "p", 3)
    common = ("--broker-group", "p", "--cluster-lease-ttl", str(LEASE_TTL))
    rs.brokers[0] = BrokerProcess(
        tmp_path / "p-0", "--cluster", f"http://{netns.host_ip}:{proxy.port}", *common, "--host", netns.ns_ip,
        wrapper=netns.wrapper(),
    )  # fmt: skip
    for i in (1, 2):
        rs.brokers[i] = BrokerProcess(tmp_path / f"p-{i}", "--cluster", etcd.endpoint, *common, "--host", netns.host_ip)
    pinned: subprocess.Popen[bytes] | None = None
    try:
        rs.start(0)
        assert rs.leader() == 0, "the first replica bootstraps the group"
        rs.client(0).create_topic("tp", 2)
        rs.start(1, 2)
        rs.wait_isr(3)
        log = tmp_path / "inside.log"
        pinned = subprocess.Popen(
            [*netns.wrapper(), sys.executable, "-c", PINNED, str(ROOT), rs.address(0), "tp", str(log)], cwd=ROOT
        )
        with Load(rs.bootstrap, "tp", producers=2) as load:
            wait_until_sync(lambda: sum(a.ok for a in answers(log)) >= 20, timeout=30, interval=0.05,
                            what="the client inside the namespace served")  # fmt: skip
            load.wait_more(200)
            netns.cut()
            cut_ms = time.time_ns() // 1_000_000  # a write sent from now on cannot reach a follower
            new = rs.leader(timeout=30)
            assert new in (1, 2)
            leader_id, since_ms = leader_since_ms(etcd.endpoint, "p")
            assert leader_id == rs.broker_id(new)
            load.wait_more(300)
            wait_until_sync(
                lambda: sum(a.sent_ms > since_ms for a in answers(log)) >= 10, timeout=60, interval=0.05,
                what="the inside client's requests after the election answered",
            )  # fmt: skip
            netns.heal()
            healed = time.monotonic()
            wait_until_sync(
                lambda: (st := rs.status(0)) is not None and st.role == "follower", timeout=60, interval=0.05,
                what="the old leader turned follower",
            )  # fmt: skip
            rs.wait_isr(3, timeout=60)
            rejoined_in = time.monotonic() - healed
            load.wait_more(200)
        pinned.kill()
        pinned.wait(10)
        got = answers(log)
        late = [a for a in got if a.ok and a.answered_ms >= since_ms]
        assert not late, f"the partitioned leader served {len(late)} requests after the election, e.g. {late[:3]}"
        alone = [a for a in got if a.ok and a.kind == "produce" and a.sent_ms >= cut_ms]
        assert not alone, f"the partitioned leader acknowledged {len(alone)} writes sent after the cut: {alone[:3]}"
        refused = [a for a in got if a.sent_ms > since_ms and a.detail == "NotLeader"]
        assert refused, f"no NOT_LEADER after the election: {[a for a in got if a.sent_ms > since_ms][:3]}"
        fenced_after = min((a.answered_ms for a in got if a.answered_ms > cut_ms and a.detail == "NotLeader"),
                           default=0) - cut_ms  # fmt: skip
        print(f"old leader fenced {fenced_after} ms after the cut; new leader elected {since_ms - cut_ms} ms after it; "
              f"healed, back in the ISR in {rejoined_in:.2f} s")
        assert not load.errors and not load.failed, (load.errors[:1], list(load.failed.items())[:3])
        acked = dict(load.acked)
        acked.update({a.body: (0, -1, 0.0, 0.0) for a in got if a.ok and a.kind == "produce"})
        sent = load.sent | {a.body for a in got if a.kind == "produce"}
        check_store(rs, "tp", 2, acked, sent)
        rs.check_verify()
    finally:
        if pinned is not None and pinned.poll() is None:
            pinned.kill()
        rs.close()
        proxy.close()
