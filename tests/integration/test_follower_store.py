"""The follower (broker/replication/follower.py) and the replica handlers
(broker/handlers/replica.py) over real replicated stores in temp dirs, in one trio
loop: catching up, truncation after a divergence (several rounds, keys paged),
copying the store when behind the leader's log (and again after an interrupted
copy). The leader's side here is a minimal log service over a real store (the
fetch rules of docs/cluster.md); the real LeaderLog runs in tests/cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio

from equeue import Message, control, wire
from equeue.broker.handlers import replica as replica_handlers
from equeue.broker.handlers.replica import ReplicaHandlers
from equeue.broker.replication import follower as follower_module
from equeue.broker.replication.follower import Follower, replica_security
from equeue.broker.storage import CommitOffsetOp, CreateTopicOp, ProduceOp, Store, WriteOp, layout
from equeue.broker.storage.replication import UNREACHABLE
from equeue.errors import (
    BadRequest,
    ConfigError,
    ConnectionBroken,
    NotAReplica,
    NotLeader,
    StaleEpoch,
)
from equeue.protocol import RequestCode
from equeue.wire.replica import (
    FetchAnswer,
    FetchRequest,
    FetchStatus,
    KeysRequest,
    SnapshotRequest,
    decode_fetch_answer,
    encode_fetch_request,
    encode_keys_request,
    encode_snapshot_request,
)
from tests.conftest import make_config, wait_until

T = TypeVar("T")
#: the follower "F"'s replica secret in these tests
FOLLOWER_PROOF = b"secret of F"


class LogService:
    """The leader's fetch rules over a real store (epoch check, TOO_OLD, DIVERGED by
    the epoch's end, entries from the position); no ISR, no waiting."""

    def __init__(self, store: Store, epoch: int) -> None:
        self.store = store
        self.epoch = epoch
        self.pins: dict[str, int] = {}
        #: the status of every answer
        self.answered: list[FetchStatus] = []

    async def fetch(self, req: FetchRequest) -> FetchAnswer:
        s = self.store
        if req.epoch != self.epoch:
            raise StaleEpoch(f"epoch {req.epoch}")
        status, diverge_at, entries = FetchStatus.OK, 0, []
        if req.position < s.replication.log_start:
            status = FetchStatus.TOO_OLD
        elif req.position and (
            s.replication.end_of_epoch(req.last_epoch) < req.position or req.last_epoch not in dict(s.replication.epochs())
        ):  # KIP-101, and KIP-279: an epoch the leader never had diverges too
            status, diverge_at = FetchStatus.DIVERGED, min(s.replication.end_of_epoch(req.last_epoch), req.position)
        else:
            entries = s.replication.read_log(req.position, req.max_bytes)
        await trio.lowlevel.checkpoint()
        self.answered.append(status)
        r = s.replication
        return FetchAnswer(status, self.epoch, r.position, r.position, diverge_at, r.log_start, entries)

    def pin(self, broker_id: str, position: int) -> None:
        self.pins[broker_id] = min(position, self.pins.get(broker_id, position))


class Link:
    """A follower's connection that calls the leader's handlers directly; it can
    be made to break (once) after ``fail_after`` requests."""

    def __init__(self, handlers: ReplicaHandlers) -> None:
        self.handlers = handlers
        self.codes: list[int] = []
        self.fail_after: int | None = None

    async def request(self, code: int, payload: bytes) -> bytes:
        self.codes.append(code)
        if self.fail_after is not None and len(self.codes) > self.fail_after:
            self.fail_after = None  # once
            raise ConnectionBroken("cut by the test")
        fn = {RequestCode.REPLICA_FETCH: self.handlers.fetch, RequestCode.REPLICA_KEYS: self.handlers.keys,
              RequestCode.REPLICA_SNAPSHOT: self.handlers.snapshot}[RequestCode(code)]  # fmt: skip
        return b"".join(await fn(payload))


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.leader = self.open("leader")
        self.service: LogService | None = None
        self.link = Link(ReplicaHandlers(
            log=self.leader.replication, leader_log=lambda: self.service, status=self.status, identify=self.identify,
        ))  # fmt: skip

    @staticmethod
    def identify(broker_id: str, proof: bytes, peer: str = "?") -> None:
        """The follower "F" proves itself with its secret (as a real leader checks it
        against the registration's digest)."""
        if (broker_id, proof) != ("F", FOLLOWER_PROOF):
            raise NotAReplica(f"{broker_id!r} with a wrong proof")

    def open(self, name: str) -> Store:
        return Store(self.tmp / name, map_size=1 << 28, sync=False, replicated=True)

    def lead(self, epoch: int) -> None:
        self.leader.replication.reload()
        self.leader.replication.begin_epoch(epoch)
        self.service = LogService(self.leader, epoch)

    def status(self) -> control.ReplicationStatus:
        epoch = self.service.epoch if self.service else 0
        role = "leader" if self.service else "follower"
        return control.ReplicationStatus(role, "g", "L", epoch, "L", self.leader.replication.position, 0, 0, [], "all", 1)

    def follower(self, store: Store) -> Follower:
        @asynccontextmanager
        async def connect(address: str) -> AsyncIterator[Link]:
            async with trio.open_nursery():  # as AsyncClient's: errors come out in a group
                yield self.link

        async def call(fn: Callable[[], T]) -> T:
            return await trio.to_thread.run_sync(fn)

        cfg = make_config(self.tmp / "cfg", replica_fetch_bytes=4096)
        return Follower(
            replication=store.replication, call=call, connect=connect, broker_id="F", address="f:1", config=cfg,
            proof=FOLLOWER_PROOF,
        )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    yield p
    p.leader.close()


def write(store: Store, *ops: WriteOp) -> None:
    for r in store.write(list(ops)).settled():
        assert not isinstance(r, Exception), r


def produce(store: Store, n: int, tag: str = "m", size: int = 100) -> None:
    info = store.head.topics["t"]
    for i in range(n):
        body = f"{tag}{i}".encode().ljust(size, b".")
        write(store, ProduceOp(info, i % 2, [wire.encode_entry(Message(body, key=f"k{i}"))]))


async def follow_until(f: Follower, pair: Pair, cond: Callable[[], bool]) -> None:
    """Run ``f.follow`` until ``cond()`` holds."""
    assert pair.service is not None
    async with trio.open_nursery() as n:
        n.start_soon(f.follow, "leader:1", pair.service.epoch)
        await wait_until(cond, timeout=30, interval=0.01)
        n.cancel_scope.cancel()


def same(a: Store, b: Store) -> None:
    pa, da = a.replication.digests(1024)
    pb, db = b.replication.digests(1024)
    assert pa == pb
    assert da == db, sorted(k for k in da.keys() | db.keys() if da.get(k) != db.get(k))


async def test_catches_up_from_empty_and_keeps_following(pair: Pair) -> None:
    pair.lead(1)
    write(pair.leader, CreateTopicOp("t", 2))
    produce(pair.leader, 300)
    fs = pair.open("f")
    f = pair.follower(fs)
    pair.link.fail_after = 3  # a broken connection on the way: reconnected, not raised
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    same(pair.leader, fs)
    assert f.position == fs.replication.position and f.high_watermark > 0 and f.last_ok > 0
    assert pair.link.codes.count(RequestCode.REPLICA_FETCH) > 5  # fetches of 4 KiB
    produce(pair.leader, 10, "n")
    write(pair.leader, CommitOffsetOp("grp", "t", 0, 3))
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    same(pair.leader, fs)
    fs.close()


async def test_truncates_entries_the_leader_lacks_in_rounds_and_converges(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After epoch 1 the follower led epochs 2 and 4 with entries nobody else has;
    the leader led epochs 3 and 5 from the same position: two DIVERGED rounds (the
    end of epoch 4 at the leader, then of epoch 2), keys asked in pages of 7 and
    answered in pages of ~1 KiB."""
    monkeypatch.setattr(follower_module, "KEYS_PER_REQUEST", 7)
    monkeypatch.setattr(replica_handlers, "KEYS_ANSWER_BYTES", 1000)
    pair.lead(1)
    write(pair.leader, CreateTopicOp("t", 2))
    produce(pair.leader, 20)
    fs = pair.open("f")
    f = pair.follower(fs)
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    fs.replication.reload()
    fs.replication.begin_epoch(2)
    produce(fs, 15, "old")
    fs.replication.begin_epoch(4)
    produce(fs, 10, "older")
    write(fs, CommitOffsetOp("grp", "t", 1, 4))
    pair.lead(3)
    produce(pair.leader, 12, "new", size=300)
    pair.lead(5)
    produce(pair.leader, 3, "newer")
    assert fs.replication.position > pair.leader.replication.position
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    same(pair.leader, fs)
    assert fs.replication.consistent_at <= fs.replication.position
    assert pair.service is not None and pair.service.answered.count(FetchStatus.DIVERGED) == 2
    assert pair.link.codes.count(RequestCode.REPLICA_KEYS) > 5
    fs.replication.reload()
    assert fs.view.offsets == pair.leader.head.offsets
    fs.close()


async def test_copies_the_store_when_behind_the_log_and_again_after_an_interrupted_copy(pair: Pair) -> None:
    pair.lead(1)
    write(pair.leader, CreateTopicOp("t", 2))
    produce(pair.leader, 200)
    pair.leader.replication.trim_log(pair.leader.replication.position - 5)
    fs = pair.open("f")
    f = pair.follower(fs)
    pair.link.fail_after = 4  # fetch (TOO_OLD), then cut during the copy
    assert pair.service is not None
    with pytest.raises(ConnectionBroken):
        await f._session(pair.link, pair.service.epoch)
    assert fs.replication.consistent_at == UNREACHABLE and fs.replication.position == 0
    produce(pair.leader, 5, "during")
    pair.link.codes.clear()
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    # started over with the copy (not a fetch from 0 over the partial copy)
    assert pair.link.codes[0] == RequestCode.REPLICA_SNAPSHOT
    assert FetchStatus.TOO_OLD not in pair.service.answered[1:]
    assert pair.service.pins["F"] <= fs.replication.log_start
    same(pair.leader, fs)
    assert fs.replication.consistent_at <= fs.replication.position
    fs.close()


async def test_a_repair_of_an_earlier_leader_not_reached_yet_is_copied_over(pair: Pair) -> None:
    """A replica repaired by one leader (truncate's consistent_at above its position)
    that then follows another must not fetch over those repaired values: they may be
    the earlier leader's unreplicated writes. It copies the new leader's store."""
    pair.lead(1)
    write(pair.leader, CreateTopicOp("t", 2))
    produce(pair.leader, 20)
    fs = pair.open("f")
    f = pair.follower(fs)
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    r = fs.replication
    r.truncate(r.position - 3, [], consistent_at=r.position + 50)  # an earlier leader's repair
    pair.lead(2)
    produce(pair.leader, 4, "new")
    pair.link.codes.clear()
    await follow_until(f, pair, lambda: r.position == pair.leader.replication.position and r.consistent_at <= r.position)
    assert pair.link.codes[0] == RequestCode.REPLICA_SNAPSHOT
    same(pair.leader, fs)
    fs.close()


async def test_not_leader_and_stale_epoch_end_the_follow(pair: Pair) -> None:
    pair.lead(2)
    fs = pair.open("f")
    f = pair.follower(fs)
    with pytest.raises(StaleEpoch):
        await f.follow("leader:1", 1)
    pair.service = None
    with pytest.raises(NotLeader):
        await f.follow("leader:1", 2)
    fs.close()


def test_replica_security_needs_the_replica_user_with_a_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    cfg = make_config(tmp_path, users_file=users)
    with pytest.raises(ConfigError, match="EQUEUE_REPLICA_USER"):
        replica_security(cfg, {})
    sec = replica_security(cfg, {"EQUEUE_REPLICA_USER": "rep", "EQUEUE_REPLICA_PASSWORD": "pw"})
    assert sec.credentials is not None and sec.credentials.username == "rep" and sec.tls is None
    assert replica_security(make_config(tmp_path), {}).credentials is None



async def test_a_standalone_broker_refuses_replication_requests(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", map_size=1 << 26, sync=False)
    st = control.ReplicationStatus("standalone", "", "b", 0, "", 0, 0, 0, [], "all", 1)
    h = ReplicaHandlers(log=store.replication, leader_log=lambda: None, status=lambda: st)
    fetch = encode_fetch_request(FetchRequest("F", "f:1", 1, 0, 0, 1 << 20, 0, layout.FORMAT_VERSION))
    for call in (
        h.fetch(fetch), h.keys(encode_keys_request(KeysRequest(1, [(1, b"k")]))),
        h.digest(control.ReplicaDigestRequest()),
    ):  # fmt: skip
        with pytest.raises(BadRequest, match="standalone"):
            await call
    assert await h.replication_status(control.ReplicationStatusRequest()) is st
    store.close()


async def test_a_silent_leader_is_given_up_as_a_broken_connection(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follower_module, "REQUEST_TIMEOUT", 0.05)
    monkeypatch.setattr(follower_module, "FETCH_WAIT_MS", 0)

    class Silent:
        async def request(self, code: int, payload: bytes) -> bytes:
            await trio.sleep_forever()
            raise AssertionError

    fs = pair.open("f")
    with pytest.raises(ConnectionBroken, match="no answer to request REPLICA_FETCH"):
        await pair.follower(fs)._session(Silent(), 1)
    fs.close()


async def test_an_epoch_the_leader_never_had_is_cut_whole(pair: Pair) -> None:
    """KIP-279: the follower led epoch 3 (entries at P..P+2) that the leader never
    had; the leader wrote epoch 2 at P and leads epoch 4 from P+2: the first answer
    cuts at P+2, the next (the leader cannot place epoch 3) cuts the whole epoch 3."""
    pair.lead(1)
    write(pair.leader, CreateTopicOp("t", 2))
    produce(pair.leader, 3)
    fs = pair.open("f")
    f = pair.follower(fs)
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    p = fs.replication.position
    pair.lead(2)
    produce(pair.leader, 1, "e2")
    fs.replication.reload()
    fs.replication.begin_epoch(3)
    produce(fs, 2, "e3")
    pair.lead(4)
    produce(pair.leader, 2, "e4")
    assert pair.leader.replication.epochs()[1:] == [(2, p), (4, p + 2)] and fs.replication.epochs()[1:] == [(3, p)]
    await follow_until(f, pair, lambda: fs.replication.position == pair.leader.replication.position)
    same(pair.leader, fs)
    assert pair.service is not None and pair.service.answered.count(FetchStatus.DIVERGED) == 2


async def test_the_leader_counts_no_replication_request_it_cannot_verify(pair: Pair) -> None:
    """A fetch is an acknowledgement: one under the follower's id without its proof
    (or with another's) is refused before the leader records any position, and so
    are keys and snapshot requests."""
    pair.lead(1)
    fetch = FetchRequest("F", "f:1", 1, 0, 0, 1 << 20, 0, layout.FORMAT_VERSION)
    h = pair.link.handlers
    for forged in (fetch, attrs.evolve(fetch, proof=b"guess"), attrs.evolve(fetch, broker_id="made-up", proof=b"x")):
        with pytest.raises(NotAReplica):
            await h.fetch(encode_fetch_request(forged))
    with pytest.raises(NotAReplica):
        await h.keys(encode_keys_request(KeysRequest(1, [(1, b"k")], "F", b"guess")))
    with pytest.raises(NotAReplica):
        await h.snapshot(encode_snapshot_request(SnapshotRequest(1, "F", 1, None, 1 << 20, layout.FORMAT_VERSION)))
    assert pair.service is not None and pair.service.answered == []  # nothing reached the leader's log
    ans = decode_fetch_answer(b"".join(await h.fetch(encode_fetch_request(attrs.evolve(fetch, proof=FOLLOWER_PROOF)))))
    assert ans.status is FetchStatus.OK
    with pytest.raises(StaleEpoch):  # verified, but of another epoch
        await h.keys(encode_keys_request(KeysRequest(8, [(1, b"k")], "F", FOLLOWER_PROOF)))


async def test_a_format3_leader_refuses_a_format2_follower(pair: Pair) -> None:
    """Log entries carry stored batches and batch-index keys: a follower whose store
    still holds one record per message (format 2) must not apply them."""
    assert layout.FORMAT_VERSION == 3
    pair.lead(1)
    h = pair.link.handlers
    old = FetchRequest("F", "f:1", 1, 0, 0, 1 << 20, 0, 2, FOLLOWER_PROOF)
    with pytest.raises(BadRequest, match="follower 'F' has store format 2, this leader 3"):
        await h.fetch(encode_fetch_request(old))
    with pytest.raises(BadRequest, match="store format 2"):
        await h.snapshot(encode_snapshot_request(SnapshotRequest(1, "F", 1, None, 1 << 20, 2, FOLLOWER_PROOF)))
    assert pair.service is not None and pair.service.answered == []
