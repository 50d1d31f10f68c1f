"""The replication safety holes a review found with real etcd and real brokers,
each reproduced here as it was found (every test failed before its fix):

1. a forged follower: a client with no credentials sends REPLICA_FETCH under the
   frozen follower's broker id at the leader's end; the leader must neither move
   its high watermark nor acknowledge, and the acknowledged write must survive the
   leader's death;
2. a clean stop of a follower must not stall acks until ``--replica-lag-max``:
   its registration is gone, so the leader drops it from the in-sync set at once;
3. a second broker with the same broker id (a copied data directory) is refused
   at registration instead of answering for the live replica;
4. etcd losing its data under a live group: no replica elects itself from the empty
   etcd; the operator's ``equeue cluster recover`` does, at a new epoch;
5. etcd restored from a backup taken before a failover (the fault campaign's
   finding): the replica the backup's record still trusts, whose store never saw
   the later epoch, must not take over at that epoch again; nor may a leader frozen
   across the failover and the restore lead again under the backup's leader key.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from equeue import Message, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.process import BrokerProcess
from equeue.broker.storage.layout import FORMAT_VERSION
from equeue.client import Client
from equeue.client.async_client import AsyncClient
from equeue.errors import EQueueError, NotAReplica
from equeue.protocol import RequestCode
from equeue.wire.replica import FetchRequest, encode_fetch_request
from tests.cluster.replication.conftest import ReplicaGroup
from tests.conftest import wait_until_sync

pytestmark = [pytest.mark.timeout(180)]

Replicas = Callable[..., ReplicaGroup]


def _produce_in_thread(address: str, topic: str, body: bytes) -> tuple[threading.Thread, list[object]]:
    """One produce (acks as the broker runs) in a thread; ``result`` gets the answer
    or the error."""
    result: list[object] = []

    def run() -> None:
        async def go() -> None:
            with trio.fail_after(90):
                async with AsyncClient(address) as c:
                    result.append(await c.produce(wire.ProduceRequest(topic, 0, [wire.encode_entry(Message(body))])))

        try:
            trio.run(go)
        except BaseException as exc:  # reported by the test
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


async def _forge(address: str, req: FetchRequest, *, strip_proof: bool) -> BaseException | None:
    """Send one REPLICA_FETCH as a plain client (no credentials): the error it got,
    or None when the leader took it."""
    payload = encode_fetch_request(req)
    if strip_proof:  # the layout before replica proofs (what the review's client sent)
        payload = payload[:-5]  # (an empty proof is its u32 length alone; then the consistent flag)
    async with AsyncClient(address) as c:
        try:
            await c.request(RequestCode.REPLICA_FETCH, payload)
        except EQueueError as exc:
            return exc
    return None


def test_a_forged_follower_fetch_neither_acknowledges_nor_loses_a_write(replicas: Replicas) -> None:
    rs = replicas("forge", 2, "--acks", "all", "--replica-lag-max", "60")
    leader = rs.leader()
    follower = 1 - leader
    rs.client(leader).create_topic("t", 1)
    rs.wait_isr(2)
    rs.freeze(follower)
    thread, result = _produce_in_thread(rs.address(leader), "t", b"precious")

    def held() -> bool:
        st = rs.status(leader)
        return st is not None and st.position > st.high_watermark

    wait_until_sync(held, timeout=30, what="the produce is committed on the leader and held")
    st = rs.status(leader)
    assert st is not None
    for proof, strip in ((b"", True), (b"a guess", False)):
        for who in (rs.broker_id(follower), "made-up-broker"):
            forged = FetchRequest(who, rs.address(follower), st.epoch, st.position, st.epoch, 1 << 20, 0,
                                  FORMAT_VERSION, proof)  # fmt: skip
            err = trio.run(lambda f=forged, s=strip: _forge(rs.address(leader), f, strip_proof=s))
            assert isinstance(err, NotAReplica), err
    after = rs.status(leader)
    assert after is not None and after.high_watermark == st.high_watermark < after.position
    assert not result, f"acknowledged while the only other in-sync replica was frozen: {result}"
    assert set(after.isr) == {rs.broker_id(leader), rs.broker_id(follower)}  # no made-up member
    rs.thaw(follower)
    thread.join(60)
    assert result and not isinstance(result[0], BaseException), result
    rs.kill(leader)
    new = rs.leader()
    assert new == follower
    assert [m.body for m in rs.read_queue("t", 0)] == [b"precious"]
    assert not rs.errors()


def test_a_follower_stopped_cleanly_leaves_the_isr_without_stalling_acks(replicas: Replicas) -> None:
    """``--replica-lag-max 60``: were the leader to wait for the lag bound, the
    produce after the stop would wait a minute; the follower's revoked registration
    makes the leader drop it at once."""
    rs = replicas("stop", 2, "--acks", "all", "--replica-lag-max", "60")
    leader = rs.leader()
    follower = 1 - leader
    c = rs.client(leader)
    c.create_topic("t", 1)
    rs.wait_isr(2)
    rs.brokers[follower].stop()
    thread, result = _produce_in_thread(rs.address(leader), "t", b"after the stop")
    thread.join(30)
    assert result and not isinstance(result[0], BaseException), result
    assert rs.isr() == [leader]
    assert not rs.errors()


def test_a_second_broker_with_the_same_broker_id_is_refused(replicas: Replicas, tmp_path: Path) -> None:
    """A copied data directory carries the broker id: the copy must fail loudly at
    registration (after waiting one lease TTL for a crashed owner), not answer for
    the live replica."""
    rs = replicas("dup", 1)
    rs.leader()
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(rs.brokers[0].data_dir / "broker.id", copy / "broker.id")
    twin = BrokerProcess(copy, *rs.brokers[0].args)
    try:
        with pytest.raises(EQueueError, match="registered by a live broker"):
            twin.start(timeout=60)
    finally:
        twin.close()
    assert rs.current_leader() == 0  # the original is untouched


def test_after_etcd_lost_its_data_no_replica_elects_itself_until_the_operator_recovers(
    tmp_path: Path, own_etcd: EtcdProcess
) -> None:
    """etcd restarts empty under a live group of 2 replicas that acknowledged writes:
    no replica bootstraps the group again on its own (a stale one could reuse an
    epoch, or lose acknowledged writes); both say why, naming the recovery command.
    `equeue cluster recover --group G --yes` then makes the most advanced replica
    lead at an epoch above every one used, with every acknowledged message."""
    rs = ReplicaGroup(tmp_path, own_etcd.endpoint, "w", 2, "--acks", "all")
    try:
        rs.start()
        leader = rs.leader()
        c = rs.client(leader)
        c.create_topic("t", 1)
        rs.wait_isr(2)
        for i in range(20):
            c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"m%d" % i))]))
        old = rs.status(leader)
        assert old is not None
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        own_etcd.start()

        def both_refuse() -> bool:
            return all(any("Recover with: equeue cluster recover --group w" in line for line in b.stderr_tail)
                       for b in rs.brokers)  # fmt: skip

        wait_until_sync(both_refuse, timeout=60, what="both replicas refuse to elect from the empty etcd")
        assert all((st := rs.status(i)) is not None and st.role != "leader" for i in (0, 1))
        cli = [sys.executable, "-m", "equeue", "cluster", "recover", "--group", "w", "--broker", rs.bootstrap]
        plan = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert plan.returncode == 0 and "Add --yes" in plan.stdout, plan.stdout + plan.stderr
        done = subprocess.run([*cli, "--yes"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        new = rs.leader()
        st = rs.status(new)
        assert st is not None and st.epoch > old.epoch
        rs.client(new).create_topic("t", 1)  # the new etcd lacks it: serve the kept data again
        assert [m.body for m in rs.read_queue("t", 0)] == [b"m%d" % i for i in range(20)]
        rs.wait_isr(2)
        rs.check_verify()
    finally:
        rs.close()


def _isr_record(endpoint: str, group: str) -> dict[str, object] | None:
    body = json.dumps({"key": base64.b64encode(f"/equeue/isr/{group}".encode()).decode()}).encode()
    with urllib.request.urlopen(urllib.request.Request(endpoint + "/v3/kv/range", data=body), timeout=10) as resp:
        kvs = json.loads(resp.read()).get("kvs", [])
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def _produce(c: Client, first: int, count: int) -> None:
    for i in range(first, first + count):
        c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"m%d" % i))]))


def _backup_then(rs: ReplicaGroup, own_etcd: EtcdProcess, backup: Path) -> tuple[int, int]:
    """A group of replicas A, B leading A at epoch 1 with m0..m9 acknowledged, and a
    backup of etcd (its data directory, copied while it was stopped) taken then;
    returns (A, B) once A leads again."""
    rs.start()
    a = rs.leader()
    c = rs.client(a)
    c.create_topic("t", 1)
    rs.wait_isr(2)
    _produce(c, 0, 10)
    own_etcd.stop()
    shutil.copytree(own_etcd.data_dir, backup)
    own_etcd.start()
    wait_until_sync(lambda: rs.current_leader() == a, timeout=60, what="A leads again after the backup")
    return a, 1 - a


def _restore(own_etcd: EtcdProcess, backup: Path) -> None:
    own_etcd.stop()
    shutil.rmtree(own_etcd.data_dir)
    shutil.copytree(backup, own_etcd.data_dir)
    own_etcd.start()


def _recovered_by_b(rs: ReplicaGroup, own_etcd: EtcdProcess, b: int) -> None:
    """The record marked restored and nobody leading; then ``equeue cluster recover``
    makes B lead at epoch 3 with m0..m19, and the replicas are equal."""

    def marked_and_leaderless() -> bool:
        marked = (_isr_record(own_etcd.endpoint, "w") or {}).get("restored") is True
        return marked and all((st := rs.status(i)) is not None and st.role != "leader" for i in (0, 1))

    wait_until_sync(marked_and_leaderless, timeout=30, what="the record marked restored, and no replica leading")
    cli = [sys.executable, "-m", "equeue", "cluster", "recover", "--group", "w", "--broker", rs.bootstrap, "--yes"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rs.leader() == b
    st = rs.status(b)
    assert st is not None and st.epoch == 3
    assert [m.body for m in rs.read_queue("t", 0)] == [b"m%d" % i for i in range(20)]
    rs.wait_isr(2)
    rs.check_verify()


def test_after_etcd_is_restored_from_a_backup_a_stale_replica_does_not_reuse_an_epoch(
    tmp_path: Path, own_etcd: EtcdProcess
) -> None:
    """A backup of etcd is taken while A leads at epoch 1 (ISR A, B). A stops
    cleanly, so B takes over at epoch 2 and acknowledges writes alone. etcd is then
    restored from the backup: its record says epoch 1, ISR A, B, and A's store
    (epoch 1) is no further than that, so A could take over at epoch 2 again and B's
    acknowledged writes would pass the truncation check and be lost. B finds etcd
    gone back and marks the record restored; A, started again, does not take over;
    ``equeue cluster recover`` makes B lead at epoch 3 with every message."""
    rs = ReplicaGroup(tmp_path, own_etcd.endpoint, "w", 2, "--acks", "all")
    try:
        a, b = _backup_then(rs, own_etcd, tmp_path / "etcd-backup")
        rs.brokers[a].stop()  # a clean stop hands the group over to B
        assert rs.leader() == b
        st = rs.status(b)
        assert st is not None and st.epoch == 2
        _produce(rs.client(b), 10, 10)
        _restore(own_etcd, tmp_path / "etcd-backup")
        rs.restart(a)

        def a_refuses_or_leads() -> bool:
            refused = any("Recover with: equeue cluster recover --group w" in line for line in rs.brokers[a].stderr_tail)
            return refused or rs.current_leader() == a

        wait_until_sync(a_refuses_or_leads, timeout=60, what="A refuses to take over, or leads")
        st = rs.status(a)
        assert st is not None and st.role != "leader", f"A took over from the restored record at epoch {st.epoch}"
        _recovered_by_b(rs, own_etcd, b)
    finally:
        rs.close()


def test_after_etcd_is_restored_from_a_backup_a_leader_frozen_across_it_does_not_lead_again(
    tmp_path: Path, own_etcd: EtcdProcess
) -> None:
    """A backup is taken while A leads at epoch 1; A is frozen, B takes over at epoch 2
    and acknowledges writes. etcd is restored from the backup while A is still frozen:
    A's leader key and its lease come back, so A, thawed, renews that lease and would
    lead at epoch 1 again. B finds etcd gone back and deletes the backup's leader key:
    nobody leads until the operator's recovery makes B lead at epoch 3, with every
    message. (A lease TTL of 10 s keeps A's restored lease alive until A is thawed.)"""
    rs = ReplicaGroup(tmp_path, own_etcd.endpoint, "w", 2, "--acks", "all", "--cluster-lease-ttl", "10")
    try:
        a, b = _backup_then(rs, own_etcd, tmp_path / "etcd-backup")
        rs.freeze(a)
        wait_until_sync(lambda: rs.current_leader() == b, timeout=60, what="B takes over")
        st = rs.status(b)
        assert st is not None and st.epoch == 2
        _produce(rs.client(b), 10, 10)
        _restore(own_etcd, tmp_path / "etcd-backup")
        rs.thaw(a)
        _recovered_by_b(rs, own_etcd, b)
    finally:
        rs.close()


def test_two_stores_converted_apart_are_reconciled_not_mixed(tmp_path: Path, etcd: EtcdProcess) -> None:
    """Two standalone stores with different data become replicas of one group. Both
    called their data epoch 0, so the follower passed every fetch check and applied
    the leader's log on top of its own data: the replicas differed for ever. Each
    converted store now counts its data in an epoch of its own: the follower's is one
    the leader never had, so it copies the leader's store (and says so), and the
    replicas are equal."""
    for i in range(2):
        alone = BrokerProcess(tmp_path / f"conv-{i}")
        try:
            alone.start(timeout=60)
            c = Client(alone.address)
            try:
                c.create_topic("t", 1)
                c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"store %d: %d" % (i, j)))
                                                       for j in range(5 + i)]))  # fmt: skip
            finally:
                c.close()
        finally:
            alone.close()
    rs = ReplicaGroup(tmp_path, etcd.endpoint, "conv", 2, "--acks", "all")
    try:
        rs.start(0)
        rs.client(rs.leader()).create_topic("t", 1)  # placed in etcd: the leader serves its local data
        rs.start(1)
        rs.wait_isr(2)
        rs.check_verify()
        assert any("replaced by a copy of the leader's store" in line for line in rs.brokers[1].stderr_tail)
        assert [m.body for m in rs.read_queue("t", 0)] == [b"store 0: %d" % j for j in range(5)]
    finally:
        rs.close()
