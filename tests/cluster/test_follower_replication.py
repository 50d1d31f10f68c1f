"""The follower side of replication with real etcd and real broker processes
(docs/cluster.md, "Replicas, acks, failover"): a new replica catches up from empty, an old leader with
entries the new leader lacks truncates and converges, a replica behind the leader's
log copies the store, and garbled replication requests get coded errors."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import lmdb
import pytest
import trio
import trustme

from equeue import Message, control, wire
from equeue.acl import UsersFile
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.broker.storage import layout
from equeue.broker.storage.layout import FORMAT_VERSION
from equeue.client import AsyncClient
from equeue.errors import BadRequest, NotAReplica
from equeue.protocol import RequestCode
from equeue.security import ClientSecurity, Credentials, TlsSettings
from equeue.users import make_user, update_users_file
from equeue.wire.replica import (
    FetchRequest,
    KeysRequest,
    SnapshotRequest,
    encode_fetch_request,
    encode_keys_request,
    encode_snapshot_request,
)
from tests.conftest import wait_until

GROUP = "g"


def args(etcd: EtcdProcess, *extra: str) -> tuple[str, ...]:
    return ("--cluster", etcd.endpoint, "--broker-group", GROUP, "--cluster-lease-ttl", "2", *extra)


@contextmanager
def brokers() -> Iterator[list[BrokerProcess]]:
    """Broker processes started by the test, stopped (continued first) at the end."""
    started: list[BrokerProcess] = []
    try:
        yield started
    finally:
        with ExitStack() as stack:
            for b in started:
                if b.proc is not None and b.proc.poll() is None:
                    os.kill(b.pid, signal.SIGCONT)
                stack.callback(b.close)


def no_errors(started: list[BrokerProcess]) -> None:
    """Every broker still running logged no error (a peer's input never crashes one)."""
    for b in started:
        assert not b.error_lines, b.error_lines
    assert all(b.proc is not None and b.proc.poll() is None for b in started[-2:])


async def start(started: list[BrokerProcess], data_dir: Path, *a: str) -> BrokerProcess:
    b = BrokerProcess(data_dir, *a)
    started.append(b)
    return await trio.to_thread.run_sync(b.start)


#: how the test's clients connect (the secured test sets TLS and credentials)
SECURITY = ClientSecurity()


def client(address: str) -> AsyncClient:
    return AsyncClient(address, security=SECURITY)


async def status(address: str) -> control.ReplicationStatus:
    async with client(address) as c:
        return await c.call(control.ReplicationStatusRequest(), control.ReplicationStatus)


async def digest(address: str) -> control.ReplicaDigest:
    async with client(address) as c:
        return await c.call(control.ReplicaDigestRequest(), control.ReplicaDigest)


async def leading(address: str, above_epoch: int = 0) -> bool:
    try:
        st = await status(address)
    except Exception:
        return False
    return st.role == "leader" and st.epoch > above_epoch


async def converged(a: str, b: str, timeout: float = 40) -> control.ReplicaDigest:
    """Wait until both replicas report digests at one position; assert they agree."""
    seen: list[tuple[int, int]] = []

    async def same_position() -> bool:
        da, db = await digest(a), await digest(b)
        seen.append((da.position, db.position))
        if da.position != db.position:
            return False
        differ = sorted(k for k in da.digests.keys() | db.digests.keys() if da.digests.get(k) != db.digests.get(k))
        assert not differ, f"replicas at position {da.position} differ in {differ}"
        return True

    await wait_until(same_position, timeout=timeout, interval=0.2, what=f"equal positions (last seen {seen[-1:]})")
    return await digest(a)


def log_start(data_dir: Path) -> int:
    """The first position a running broker's log keeps (read from its LMDB, as any
    second reader may)."""
    env = lmdb.open(str(data_dir), readonly=True, max_dbs=32, lock=True)
    try:
        with env.begin() as txn:
            value = txn.get(layout.REPL_LOG_START, db=env.open_db(b"repl_state", txn=txn, create=False))
        return 0 if value is None else int.from_bytes(value)
    finally:
        env.close()


async def isr_size(address: str, n: int) -> bool:
    return len((await status(address)).isr) == n


async def messages(address: str, topic: str) -> int:
    async with client(address) as c:
        return sum(q.max_offset for q in (await c.describe_topic(topic)).queues)


async def produce(address: str, topic: str, n: int, size: int = 32, queues: int = 2, batch: int = 1) -> None:
    """``n`` messages of ``size`` bytes round-robin over the queues, ``batch`` per request."""
    async with client(address) as c:
        for i in range(0, n, batch):
            bodies = [f"{j:08d}".encode().ljust(size, b".") for j in range(i, min(n, i + batch))]
            entries = [wire.encode_entry(Message(b)) for b in bodies]
            await c.produce(wire.ProduceRequest(topic, (i // batch) % queues, entries))


async def create_topic(address: str, name: str, queues: int) -> None:
    async with client(address) as c:
        await c.create_topic(name, queues)


async def test_new_replica_catches_up_and_garbled_replica_requests_are_refused(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(120), brokers() as started:
        a = await start(started, tmp_path / "a", *args(etcd))
        await wait_until(lambda: leading(a.address), timeout=20, what="a leads")
        await create_topic(a.address, "t", 2)
        await produce(a.address, "t", 200, batch=10)
        b = await start(started, tmp_path / "b", *args(etcd))
        first = await converged(a.address, b.address)
        st = await status(b.address)
        assert st.role == "follower" and st.position >= first.position
        await produce(a.address, "t", 50)  # and it keeps following
        assert (await converged(a.address, b.address)).position > first.position

        epoch = (await status(a.address)).epoch
        async with AsyncClient(a.address) as c:
            for code, payload, match in [
                (RequestCode.REPLICA_FETCH, b"\x00\x05garbage", "truncated"),
                (RequestCode.REPLICA_FETCH, encode_fetch_request(FetchRequest("x", "h:1", epoch, 0, 0, 0, 0, FORMAT_VERSION)), "max_bytes"),
                # an older follower (its store format 1): refused by name, so it never applies our entries
                (RequestCode.REPLICA_FETCH, encode_fetch_request(FetchRequest("x", "h:1", epoch, 0, 0, 1 << 20, 0, FORMAT_VERSION))[:-9], "store format 1"),
                (RequestCode.REPLICA_SNAPSHOT, encode_snapshot_request(SnapshotRequest(epoch, "x", 1, None, 1 << 20, FORMAT_VERSION + 1)), f"store format {FORMAT_VERSION + 1}"),
                (RequestCode.REPLICA_KEYS, b"\x00\x00\x00\x01\xff\xff\xff\xff", "announces"),
                (RequestCode.REPLICA_KEYS, encode_keys_request(KeysRequest(epoch, [(250, b"k")])), "not a replicated"),
                (RequestCode.REPLICA_KEYS, encode_keys_request(KeysRequest(epoch, [(1, b"")])), "1..511"),
                (RequestCode.REPLICA_SNAPSHOT, encode_snapshot_request(SnapshotRequest(epoch, "x", 250, None, 1 << 20, FORMAT_VERSION)), "not a replicated"),
                (RequestCode.REPLICA_SNAPSHOT, encode_snapshot_request(SnapshotRequest(epoch, "x", 1, None, 0, FORMAT_VERSION)), "max_bytes"),
            ]:  # fmt: skip
                with pytest.raises(BadRequest, match=match):
                    await c.request(code, payload)
            # well-formed, but from no verified replica: a made-up id, and b's own id
            # without b's secret (a forged fetch at the leader's end would ack writes)
            b_id = (await status(b.address)).broker_id
            end = (await status(a.address)).position
            for who in ("x", b_id):
                forged = FetchRequest(who, "h:1", epoch, end, epoch, 1 << 20, 0, FORMAT_VERSION, b"guess")
                with pytest.raises(NotAReplica, match="not a replica"):
                    await c.request(RequestCode.REPLICA_FETCH, encode_fetch_request(forged))
                with pytest.raises(NotAReplica):
                    await c.request(RequestCode.REPLICA_KEYS, encode_keys_request(KeysRequest(epoch, [(1, b"k")], who)))
                with pytest.raises(NotAReplica):
                    await c.request(RequestCode.REPLICA_SNAPSHOT, encode_snapshot_request(
                        SnapshotRequest(epoch, who, 1, None, 1 << 20, FORMAT_VERSION)))  # fmt: skip
            assert [f.broker_id for f in (await status(a.address)).replicas] == [b_id]
            with pytest.raises(BadRequest, match="range_size"):
                await c.call(control.ReplicaDigestRequest(range_size=0), control.ReplicaDigest)
            assert (await c.stats()).topics >= 1  # the same connection still serves
        async with AsyncClient(b.address) as c:  # a follower serves no replication reads, nor to strangers
            fetch = FetchRequest("x", "h:1", epoch, 0, 0, 1 << 20, 0, FORMAT_VERSION)
            with pytest.raises(NotAReplica):
                await c.request(RequestCode.REPLICA_FETCH, encode_fetch_request(fetch))
            with pytest.raises(NotAReplica):
                await c.request(RequestCode.REPLICA_KEYS, encode_keys_request(KeysRequest(epoch, [(1, b"k")])))
        no_errors(started)


async def test_old_leader_with_entries_the_new_leader_lacks_truncates_and_converges(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """``--acks leader``: the follower is frozen while the leader commits (and
    acknowledges) writes, then the leader dies; the follower takes over and writes
    more; the old leader, restarted, finds it diverged, truncates and converges."""
    extra = args(etcd, "--acks", "leader", "--replica-lag-max", "60")
    with trio.fail_after(150), brokers() as started:
        a = await start(started, tmp_path / "a", *extra)
        await wait_until(lambda: leading(a.address), timeout=20, what="a leads")
        await create_topic(a.address, "t", 2)
        await produce(a.address, "t", 20)
        b = await start(started, tmp_path / "b", *extra)
        await converged(a.address, b.address)
        await wait_until(lambda: isr_size(a.address, 2), timeout=20, what="b joins the ISR")
        old_epoch = (await status(a.address)).epoch

        os.kill(b.pid, signal.SIGSTOP)
        await produce(a.address, "t", 30)  # acknowledged by a alone: b never fetches them
        a.kill()
        os.kill(b.pid, signal.SIGCONT)
        await wait_until(lambda: leading(b.address, old_epoch), timeout=30, what="b takes over")
        await produce(b.address, "t", 10, size=48)
        # acks leader: a's last writes are lost with it (b may have got the first ones:
        # the fetch it had sent before it froze was answered into its socket)
        kept = await messages(b.address, "t")
        assert 30 <= kept < 60, kept

        a = await start(started, tmp_path / "a", *extra)  # the old leader's store, restarted
        await converged(a.address, b.address)
        st = await status(a.address)
        assert st.role == "follower" and st.epoch > old_epoch
        assert any("diverged" in line for line in a.stderr_tail), "".join(a.stderr_tail)[-2000:]
        await produce(b.address, "t", 5)
        await converged(a.address, b.address)
        assert await messages(b.address, "t") == kept + 5
        no_errors(started)


async def test_replica_behind_the_leaders_log_copies_the_store(tmp_path: Path, etcd: EtcdProcess) -> None:
    """A follower frozen while the leader writes more than --replica-log-bytes: the
    leader trims past the follower's position; thawed, the follower is TOO_OLD,
    copies the store and converges."""
    extra = args(etcd, "--replica-log-bytes", "64KiB", "--acks", "leader")
    with trio.fail_after(150), brokers() as started:
        a = await start(started, tmp_path / "a", *extra)
        await wait_until(lambda: leading(a.address), timeout=20, what="a leads")
        await create_topic(a.address, "t", 3)
        await produce(a.address, "t", 30, queues=3)
        b = await start(started, tmp_path / "b", *extra)
        frozen_at = (await converged(a.address, b.address)).position
        os.kill(b.pid, signal.SIGSTOP)
        await produce(a.address, "t", 600, size=512, queues=3, batch=20)  # ~300 KiB of log
        await wait_until(lambda: log_start(a.data_dir) > frozen_at + 10, timeout=30, what="a trims past b")
        os.kill(b.pid, signal.SIGCONT)
        await converged(a.address, b.address, timeout=60)
        assert any("copying the store" in line for line in b.stderr_tail), "".join(b.stderr_tail)[-2000:]
        await produce(a.address, "t", 30, queues=3)
        await converged(a.address, b.address)
        no_errors(started)


async def test_replication_over_mutual_tls_with_authentication(
    tmp_path: Path, etcd: EtcdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --users-file a replica authenticates to its leader as EQUEUE_REPLICA_USER
    (without it, it cannot follow and says so, naming the variables), a user with the
    replica role: an admin user is refused (an operator's credentials must not
    acknowledge writes); with TLS and client certificates required it connects over
    TLS with its own certificate."""
    ca = trustme.CA()
    ca_file, cert = tmp_path / "ca.pem", tmp_path / "broker.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(cert))
    users = tmp_path / "users.json"

    def add(doc: UsersFile) -> UsersFile:
        return doc.with_user(make_user("root", "root-pw", admin=True)).with_user(make_user("repl", "repl-pw", replica=True))

    update_users_file(users, add)
    extra = args(etcd, "--users-file", str(users), "--tls-cert", str(cert), "--tls-ca", str(ca_file),
                 "--tls-client-auth", "required")  # fmt: skip
    secured = ClientSecurity(TlsSettings(ca_file=ca_file, cert_file=cert), Credentials("root", "root-pw"))
    monkeypatch.setattr(sys.modules[__name__], "SECURITY", secured)
    for name in ("EQUEUE_REPLICA_USER", "EQUEUE_REPLICA_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with trio.fail_after(120), brokers() as started:
        a = await start(started, tmp_path / "a", *extra)  # a lone replica leads without them
        await wait_until(lambda: leading(a.address), timeout=20, what="a leads")
        await create_topic(a.address, "t", 2)
        await produce(a.address, "t", 50)
        b = await start(started, tmp_path / "b", *extra)

        def cannot_follow() -> bool:
            return any("cannot follow" in line and "EQUEUE_REPLICA_USER" in line for line in b.stderr_tail)

        await wait_until(cannot_follow, timeout=20, what="b says it cannot follow")
        assert (await status(b.address)).position == 0
        await trio.to_thread.run_sync(b.stop)
        monkeypatch.setenv("EQUEUE_REPLICA_USER", "root")  # the admin role is not the replica role
        monkeypatch.setenv("EQUEUE_REPLICA_PASSWORD", "root-pw")
        b = await start(started, tmp_path / "b", *extra)

        def refused() -> bool:
            return any("needs the replica role" in line for line in b.stderr_tail)

        await wait_until(refused, timeout=20, what="b's admin credentials are refused")
        assert (await status(b.address)).position == 0
        await trio.to_thread.run_sync(b.stop)
        monkeypatch.setenv("EQUEUE_REPLICA_USER", "repl")
        monkeypatch.setenv("EQUEUE_REPLICA_PASSWORD", "repl-pw")
        b = await start(started, tmp_path / "b", *extra)
        await converged(a.address, b.address)
        no_errors(started[:1] + started[3:])  # (the two refused runs of b logged their refusal)
