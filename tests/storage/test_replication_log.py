"""The replication log inside the store: recording, shipping, views, truncation,
snapshots, trimming, persistence. Two or three stores in temp dirs, no broker."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue import Message, wire
from equeue.broker.storage import (
    AlterTopicOp,
    CommitOffsetOp,
    CreateTopicOp,
    DeleteGroupOffsetsOp,
    DeleteTopicOp,
    ExpireProducersOp,
    MoveDueOp,
    ProduceOp,
    RetentionOp,
    SetPausedOp,
    Store,
    StoreView,
    WriteOp,
    layout,
)
from equeue.broker.storage import store as store_module
from equeue.broker.storage.deadletters import Letter, ResendOp
from equeue.broker.storage.recorder import RecordingCursor, RecordingTxn
from equeue.broker.storage.replication import UNREACHABLE
from equeue.broker.storage.skips import SkipRecordOp
from equeue.broker.storage.writes import WriteContext
from equeue.control import TopicInfo
from equeue.errors import CorruptRecord, LogTrimmed, StoreError, StoreFull
from equeue.wire.replog import DELETE, PUT, decode_entry

PID = b"p" * 16


class Clock:
    """A wall clock (ms) the test steps."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def stores(tmp_path: Path, clock: Clock) -> Iterator[Callable[[str], Store]]:
    """Factory of replicated stores in temp dirs, closed at the end."""
    opened: list[Store] = []

    def make(name: str, *, replicated: bool = True) -> Store:
        s = Store(tmp_path / name, map_size=1 << 28, sync=False, clock=clock, replicated=replicated)
        opened.append(s)
        return s

    yield make
    for s in opened:
        if s.env is not None:
            try:
                s.close()
            except Exception:
                pass


def entries(n: int, *, key: bool = False, deliver_at: int = 0, prefix: str = "m") -> list[bytes]:
    return [
        wire.encode_entry(
            Message(f"{prefix}{i}".encode(), key=f"k{i}" if key else None, tags="t", deliver_at=deliver_at)
        )
        for i in range(n)
    ]


def write(store: Store, *ops: WriteOp) -> list[Any]:
    return store.write(list(ops)).settled()


def topic(store: Store, name: str = "t", queues: int = 2) -> TopicInfo:
    (info,) = write(store, CreateTopicOp(name, queues))
    assert isinstance(info, TopicInfo)
    return info


def ship(leader: Store, follower: Store, max_bytes: int = 1 << 20) -> int:
    """Copy the leader's log to the follower, in fetch-sized pieces; returns the
    number of fetches."""
    n = 0
    while follower.replication.position < leader.replication.position:
        got = leader.replication.read_log(follower.replication.position, max_bytes)
        assert got, (follower.replication.position, leader.replication.position)
        follower.replication.apply_log(got)
        n += 1
    return n


def state_of(v: StoreView) -> tuple[Any, ...]:
    """What a view says about the data (not its counters since open)."""
    return (
        dict(v.topics), {t: dict(q) for t, q in v.queues.items()}, dict(v.offsets), dict(v.sched_pending),
        tuple(v.deleting), v.next_global, v.next_topic_id, v.paused_topics, v.paused_groups, dict(v.skipped),
    )  # fmt: skip


def log_size(store: Store) -> int:
    """The bytes of the log's entries, counted one by one."""
    return sum(len(e) for _, e in store.replication.read_log(store.replication.log_start, 1 << 40))


def assert_same(leader: Store, follower: Store) -> None:
    """Equal digests at equal positions, and equal views once both are reloaded
    (and each log's kept size is what its entries add up to)."""
    assert leader.replication.log_bytes(0) == log_size(leader)
    assert follower.replication.log_bytes(0) == log_size(follower)
    lp, ld = leader.replication.digests(4)
    fp, fd = follower.replication.digests(4)
    assert lp == fp == leader.replication.position == follower.replication.position
    assert fd == ld, {k for k in ld.keys() | fd.keys() if ld.get(k) != fd.get(k)}
    follower.replication.reload()
    # the leader's incremental head keeps skip markers of deleted topics and below
    # retention (harmless: never looked up); a view rebuilt from LMDB leaves them out
    assert state_of(follower.view)[:-1] == state_of(leader.head)[:-1]
    leader.replication.reload()
    assert state_of(leader.view) == state_of(follower.view)


# ------------------------------------------------------------------ recording and shipping
def test_standalone_store_has_no_log(stores: Callable[..., Store]) -> None:
    s = stores("a", replicated=False)
    info = topic(s)
    out = s.write([ProduceOp(info, 0, entries(3))])
    assert s.view is s.head
    assert out.position == 0 and s.replication is None
    with s.env.begin() as txn:  # no log databases were created
        assert txn.get(b"replog") is None


def log_state(s: Store) -> tuple[int, int, int, int, int]:
    """(position, log_start, epoch, last_epoch, consistent_at) of ``s``'s log."""
    r = s.replication
    assert r is not None
    return r.position, r.log_start, r.epoch, r.last_epoch, r.consistent_at


def test_each_commit_is_one_entry_in_order(stores: Callable[..., Store]) -> None:
    s = stores("a")
    assert log_state(s) == (0, 0, 0, 0, 0)
    info = topic(s)
    out = s.write([ProduceOp(info, 0, entries(3)), ProduceOp(info, 1, entries(2))])
    assert out.position == 2 == s.replication.position
    log = s.replication.read_log(0, 1 << 20)
    assert [p for p, _ in log] == [0, 1]
    header, runs = decode_entry(log[1][1])
    assert header.next_global == 5
    dbs = {name: i for i, name in enumerate(layout.DATABASES)}
    by_db: dict[int, list[bytes]] = {}
    for kind, db, keys, _values in runs:
        assert kind == PUT
        by_db.setdefault(db, []).extend(keys)
    assert by_db[dbs[b"messages"]] == [layout.global_key(0), layout.global_key(3)]  # one batch per produce
    assert len(by_db[dbs[b"qindex"]]) == 2
    assert dbs[b"qstats"] in by_db and dbs[b"meta"] in by_db
    # a transaction that wrote nothing is no entry
    out = s.write([CreateTopicOp("t", 2, exist_ok=True)])
    assert out.position == 2 == s.replication.position
    assert s.replication.read_log(2, 100) == []


def test_failed_op_records_nothing(stores: Callable[..., Store]) -> None:
    s = stores("a")
    info = topic(s)

    class Fails(WriteOp):
        def apply(self, w: WriteContext) -> None:
            w.wrote = True
            w.txn.put(b"junk", b"x", db=w.db[b"meta"])
            raise RuntimeError("boom")

    s.write([ProduceOp(info, 0, entries(1)), Fails(), ProduceOp(info, 1, entries(1))])
    for _, data in s.replication.read_log(0, 1 << 20):
        for _kind, _db, keys, _v in decode_entry(data)[1]:
            assert b"junk" not in keys
    with s.env.begin() as txn:
        assert txn.get(b"junk", db=s.db[b"meta"]) is None


def test_ops_cannot_write_around_the_recorder(stores: Callable[..., Store]) -> None:
    s = stores("a")
    topic(s)
    rlog = s.replication.log
    assert rlog is not None

    class Sneaky(WriteOp):
        def apply(self, w: WriteContext) -> Any:
            w.wrote = True
            w.txn.put(b"x", b"y", db=rlog.log)  # the log's own database: refused

    (err,) = write(s, Sneaky())
    assert isinstance(err, Exception)

    class Reach(WriteOp):
        def apply(self, w: WriteContext) -> Any:
            cur = w.cursor(b"meta")
            assert isinstance(w.txn, RecordingTxn) and isinstance(cur, RecordingCursor)
            assert isinstance(w.txn.cursor(db=w.db[b"schedule"]), RecordingCursor)
            return [name for name in ("commit", "abort", "drop", "putmulti", "env") if hasattr(w.txn, name)]

    (exposed,) = write(s, Reach())
    assert exposed == []  # nothing that writes around the recorder or ends the transaction


@pytest.mark.parametrize("case", [
    "keyed", "keyless", "delayed", "idempotent", "duplicate", "alter", "delete_purge", "commit", "reset_offset",
    "schedule_move", "retention_time", "retention_size", "retention_consumed", "producer_expiry", "skip",
    "dlq_resend", "delete_group", "pause",
])  # fmt: skip
def test_every_write_op_replicates(case: str, stores: Callable[..., Store], clock: Clock) -> None:
    leader, follower = stores("leader"), stores("follower")
    info = topic(leader, "t", 3)
    write(leader, CommitOffsetOp("g", "t", 0, 0))
    ship(leader, follower)
    if case == "keyed":
        write(leader, ProduceOp(info, 0, entries(20, key=True)), ProduceOp(info, 2, entries(5, key=True)))
    elif case == "keyless":
        write(leader, ProduceOp(info, 1, entries(30)))
    elif case == "delayed":
        write(leader, ProduceOp(info, 1, entries(4, deliver_at=clock.now + 60_000) + entries(2, prefix="now")))
    elif case == "idempotent":
        write(leader, ProduceOp(info, 0, entries(3), producer_id=PID, base_sequence=0))
        write(leader, ProduceOp(info, 0, entries(3), producer_id=PID, base_sequence=3))
    elif case == "duplicate":
        write(leader, ProduceOp(info, 0, entries(3), producer_id=PID, base_sequence=0))
        ship(leader, follower)
        (dup,) = write(leader, ProduceOp(info, 0, entries(3), producer_id=PID, base_sequence=0))
        assert dup.duplicate
    elif case == "alter":
        write(leader, AlterTopicOp("t", queues=5, retention_ms=1000))
    elif case == "delete_purge":
        write(leader, ProduceOp(info, 0, entries(10, key=True)), ProduceOp(info, 1, entries(10)))
        ship(leader, follower)
        write(leader, DeleteTopicOp("t"))
        ship(leader, follower)
        while write(leader, RetentionOp(None, None, limit=7))[0]:
            ship(leader, follower)  # bounded purge steps, each shipped
        assert leader.head.deleting == ()
        topic(leader, "t", 2)  # created again: a new topic id
    elif case == "commit":
        write(leader, CommitOffsetOp("g", "t", 1, 7), CommitOffsetOp("h", "t", 2, 3))
    elif case == "reset_offset":
        write(leader, CommitOffsetOp("g", "t", 0, 9))
        ship(leader, follower)
        write(leader, CommitOffsetOp("g", "t", 0, 2))
    elif case == "schedule_move":
        write(leader, ProduceOp(info, 2, entries(5, deliver_at=clock.now + 1000)))
        ship(leader, follower)
        clock.now += 2000
        (moved,) = write(leader, MoveDueOp(limit=3))
        assert moved == 3
        ship(leader, follower)
        write(leader, MoveDueOp())
    elif case == "retention_time":
        write(leader, ProduceOp(info, 0, entries(5, key=True)))
        clock.now += 10_000
        write(leader, ProduceOp(info, 0, entries(3)))
        ship(leader, follower)
        (n,) = write(leader, RetentionOp(5_000, None))
        assert n == 5
    elif case == "retention_size":
        write(leader, *[ProduceOp(info, i % 2, entries(5)) for i in range(8)])
        ship(leader, follower)
        (n,) = write(leader, RetentionOp(None, 200))
        assert n > 0
    elif case == "retention_consumed":
        write(leader, ProduceOp(info, 0, entries(6)), ProduceOp(info, 0, entries(4)), CommitOffsetOp("g", "t", 0, 6))
        ship(leader, follower)
        (n,) = write(leader, RetentionOp(None, None, delete_consumed=True))
        assert n == 6
    elif case == "producer_expiry":
        write(leader, ProduceOp(info, 0, entries(1), producer_id=PID))
        write(leader, ProduceOp(info, 1, entries(1), producer_id=b"q" * 16))
        ship(leader, follower)
        clock.now += 100_000
        write(leader, ProduceOp(info, 1, entries(1), producer_id=b"q" * 16, base_sequence=1))
        (res,) = write(leader, ExpireProducersOp(50_000))
        assert res[0] == 1
    elif case == "skip":
        write(leader, ProduceOp(info, 0, entries(3)))
        ship(leader, follower)
        (ans,) = write(leader, SkipRecordOp("t", 0, 1))
        assert not ans.already_skipped
    elif case == "delete_group":
        write(leader, CommitOffsetOp("g", "t", 1, 4), CommitOffsetOp("h", "t", 2, 3))
        ship(leader, follower)
        # a delete, a commit of the deleted group after it and a delete of a commit staged
        # in the same transaction
        assert write(leader, DeleteGroupOffsetsOp("g"), CommitOffsetOp("g", "t", 2, 1), CommitOffsetOp("k", "t", 0, 1),
                     DeleteGroupOffsetsOp("k")) == [2, None, None, 1]  # fmt: skip
        assert dict(leader.head.offsets) == {("g", "t", 2): 1, ("h", "t", 2): 3}
        assert write(leader, DeleteGroupOffsetsOp("nobody")) == [0]
    elif case == "dlq_resend":
        write(leader, ProduceOp(info, 0, entries(3)))
        letters = [Letter(i, "t", i, e) for i, e in enumerate(entries(3, prefix="dead"))]
        (res,) = write(leader, ResendOp("g", letters))
        assert res[0] == [0, 1, 2]
        ship(leader, follower)
        (res,) = write(leader, ResendOp("g", letters, prune_below=2))
        assert res[1] == [0, 1, 2] or res[1] == [2]
    elif case == "pause":
        assert write(leader, SetPausedOp("topic", "t", True), SetPausedOp("group", "g", True),
                     SetPausedOp("group", "h", True), SetPausedOp("topic", "t", True)) == [True, True, True, False]  # fmt: skip
        ship(leader, follower)
        assert write(leader, SetPausedOp("group", "h", False), SetPausedOp("group", "nobody", False)) == [True, False]
        assert (leader.head.paused_topics, leader.head.paused_groups) == ({"t"}, {"g"})
    ship(leader, follower)
    assert_same(leader, follower)
    if case == "pause":  # the follower's rebuilt view has them (it leads with them after a failover)
        assert (follower.view.paused_topics, follower.view.paused_groups) == ({"t"}, {"g"})


def test_follower_fetching_in_small_pieces(stores: Callable[..., Store]) -> None:
    leader, follower = stores("leader"), stores("follower")
    info = topic(leader)
    for i in range(10):
        write(leader, ProduceOp(info, i % 2, entries(50, key=True)))
    assert ship(leader, follower, max_bytes=1) == leader.replication.position  # one whole entry per fetch
    assert_same(leader, follower)


# ------------------------------------------------------------------ views
def test_view_advances_only_on_publish(stores: Callable[..., Store]) -> None:
    s = stores("a")
    v0 = s.view
    info = topic(s)
    assert s.view is v0 and s.head is not v0
    o1 = s.write([ProduceOp(info, 0, entries(2))])
    o2 = s.write([ProduceOp(info, 1, entries(2), producer_id=PID)])
    o3 = s.write([ProduceOp(info, 1, entries(1, deliver_at=s.clock() + 10_000))])
    assert (o1.position, o2.position, o3.position) == (2, 3, 4)
    assert s.view is v0
    assert s.read_queue(info, 0, 0, 10, 1 << 20).batches == []  # readers see the published view
    got = s.replication.publish_upto(2)
    assert [o.position for o in got] == [1, 2]
    assert got[1].touched == {(info.topic_id, 0)}
    assert s.read_queue(info, 0, 0, 10, 1 << 20).next_offset == 2
    assert s.view.queue(info.topic_id, 1).next_offset == 0
    assert s.replication.publish_upto(2) == []
    got = s.replication.publish_all()
    assert [o.position for o in got] == [3, 4] and got[1].scheduled
    assert s.view is s.head


def test_failed_ops_outcome_position(stores: Callable[..., Store]) -> None:
    s = stores("a")
    info = topic(s)
    out = s.write([ProduceOp(info, 9, entries(1))])  # QueueNotFound: nothing written
    assert out.position == 1
    out = s.write([ProduceOp(info, 9, entries(1)), ProduceOp(info, 0, entries(1))])
    assert out.position == 2


# ------------------------------------------------------------------ epochs and divergence
def test_epochs(stores: Callable[..., Store]) -> None:
    s = stores("a")
    assert s.replication.begin_epoch(1) == 0
    info = topic(s)
    write(s, ProduceOp(info, 0, entries(1)))
    assert s.replication.begin_epoch(3) == 3
    write(s, ProduceOp(info, 0, entries(1)))
    assert s.replication.epochs() == [(1, 0), (3, 3)]
    assert (s.replication.epoch, s.replication.last_epoch, s.replication.position) == (3, 3, 5)
    assert s.replication.end_of_epoch(0) == 0 and s.replication.end_of_epoch(1) == 3 and s.replication.end_of_epoch(2) == 3
    assert s.replication.end_of_epoch(3) == 5 == s.replication.end_of_epoch(9)
    info0 = s.replication.entry_info(3)
    assert info0 is not None and info0.epoch == 3
    assert s.replication.entry_info(99) is None
    with pytest.raises(ValueError):
        s.replication.begin_epoch(3)
    assert [o.position for o in s.replication.publish_all()] == [1, 2, 3, 4, 5]


def test_entries_before_any_epoch_are_epoch_zero(stores: Callable[..., Store]) -> None:
    leader, follower = stores("leader"), stores("follower")
    topic(leader)
    leader.replication.begin_epoch(2)
    ship(leader, follower)
    assert leader.replication.epochs() == follower.replication.epochs() == [(0, 0), (2, 1)]
    assert follower.replication.last_epoch == 2 == follower.replication.epoch


def diverge(stores: Callable[..., Store], clock: Clock) -> tuple[Store, Store, TopicInfo]:
    """A leader (epoch 1 then 2) and an old leader of epoch 1 with extra entries."""
    old, new = stores("old"), stores("new")
    old.replication.begin_epoch(1)
    info = topic(old, "t", 3)
    write(old, ProduceOp(info, 0, entries(5, key=True)), CommitOffsetOp("g", "t", 0, 2))
    write(old, ProduceOp(info, 1, entries(3), producer_id=PID))
    ship(old, new)
    # the old leader goes on alone in epoch 1 (writes no one acknowledged)
    write(old, ProduceOp(info, 0, entries(4, key=True, prefix="lost")), CommitOffsetOp("g", "t", 0, 4))
    write(old, ProduceOp(info, 1, entries(2, prefix="lost"), producer_id=PID, base_sequence=3))
    write(old, CreateTopicOp("only-old", 1), ProduceOp(info, 2, entries(2, deliver_at=clock.now + 5000)))
    write(old, RetentionOp(None, None, delete_consumed=True))
    # the new leader takes over in epoch 2 and writes other things
    new.replication.reload()
    new.replication.begin_epoch(2)
    write(new, ProduceOp(info, 0, entries(2, key=True, prefix="new")), CommitOffsetOp("g", "t", 0, 1))
    write(new, ProduceOp(info, 1, entries(1, prefix="new"), producer_id=PID, base_sequence=3))
    write(new, CreateTopicOp("only-new", 2))
    return new, old, info


def truncate_to_leader(leader: Store, follower: Store) -> None:
    """The documented algorithm, as rfollow runs it over REPLICA_FETCH / REPLICA_KEYS."""
    start = leader.replication.end_of_epoch(follower.replication.last_epoch)
    assert start < follower.replication.position
    keys = follower.replication.divergent_keys(start)
    q, values = leader.replication.read_keys(keys)
    follower.replication.truncate(start, [(db, k, v) for (db, k), v in zip(keys, values, strict=True)], q)
    assert follower.replication.position == start and follower.replication.consistent_at == q
    ship(leader, follower)
    assert follower.replication.position >= follower.replication.consistent_at


def test_truncation_converges(stores: Callable[..., Store], clock: Clock) -> None:
    leader, old, _info = diverge(stores, clock)
    assert old.replication.last_epoch == 1 and leader.replication.end_of_epoch(1) == 4 < old.replication.position
    truncate_to_leader(leader, old)
    assert old.replication.epochs() == leader.replication.epochs() == [(1, 0), (2, 4)]
    assert_same(leader, old)
    # and it keeps following
    write(leader, CommitOffsetOp("g", "t", 2, 5))
    ship(leader, old)
    assert_same(leader, old)


def test_truncation_while_leader_keeps_writing(stores: Callable[..., Store], clock: Clock) -> None:
    """The leader writes between REPLICA_KEYS and the fetches that follow: Q is older
    than the leader's end, the entries in [start, Q) and after set the keys again."""
    leader, old, info = diverge(stores, clock)
    start = leader.replication.end_of_epoch(old.replication.last_epoch)
    keys = old.replication.divergent_keys(start)
    q, values = leader.replication.read_keys(keys)
    write(leader, ProduceOp(info, 0, entries(3, key=True, prefix="later")), CommitOffsetOp("g", "t", 0, 3))
    write(leader, DeleteTopicOp("only-new"))
    old.replication.truncate(start, [(db, k, v) for (db, k), v in zip(keys, values, strict=True)], q)
    ship(leader, old)
    assert_same(leader, old)


def test_truncation_bounds(stores: Callable[..., Store]) -> None:
    s = stores("a")
    topic(s)
    with pytest.raises(ValueError):
        s.replication.truncate(5, [], 0)
    s.write([CommitOffsetOp("g", "t", 0, 1)])
    s.replication.trim_log(1)
    with pytest.raises(ValueError):
        s.replication.truncate(0, [], 0)


def test_apply_log_refuses_a_gap_or_garbage(stores: Callable[..., Store]) -> None:
    leader, follower = stores("leader"), stores("follower")
    topic(leader)
    write(leader, CommitOffsetOp("g", "t", 0, 1))
    log = leader.replication.read_log(0, 1 << 20)
    with pytest.raises(ValueError):
        follower.replication.apply_log(log[1:])
    with pytest.raises(CorruptRecord):
        follower.replication.apply_log([(0, log[0][1][:-1])])
    with pytest.raises(CorruptRecord):
        follower.replication.apply_log([(0, log[0][1]), (1, b"\0" * 20 + bytes([PUT, 200, 0, 0, 0, 0]))])
    assert follower.replication.position == 0 and follower.replication.read_log(0, 100) == []  # nothing applied
    assert follower.replication.apply_log([]) == 0
    assert follower.replication.apply_log(log) == 2


def test_follower_must_reload_before_writing(stores: Callable[..., Store]) -> None:
    leader, follower = stores("leader"), stores("follower")
    topic(leader)
    ship(leader, follower)
    with pytest.raises(StoreError):
        follower.write([CommitOffsetOp("g", "t", 0, 1)])
    follower.replication.reload()
    assert "t" in follower.view.topics
    follower.replication.begin_epoch(1)
    follower.write([CommitOffsetOp("g", "t", 0, 1)])
    assert follower.replication.position == 3


# ------------------------------------------------------------------ snapshot, trim
def test_snapshot_from_a_leader_that_keeps_writing(stores: Callable[..., Store], clock: Clock) -> None:
    leader, follower = stores("leader"), stores("follower")
    leader.replication.begin_epoch(4)
    info = topic(leader, "t", 3)
    for i in range(6):
        write(leader, ProduceOp(info, i % 3, entries(20, key=True)), CommitOffsetOp("g", "t", i % 3, i))
    write(leader, ProduceOp(info, 1, entries(5, deliver_at=clock.now + 1000), producer_id=PID))
    leader.replication.trim_log(leader.replication.position)
    # the follower has stale data of its own
    topic(follower, "stale", 1)
    follower.replication.reset_for_snapshot()
    assert follower.replication.consistent_at == UNREACHABLE and follower.replication.position == 0
    first_position = None
    last_position = 0
    step = 0
    for db in layout.REPLICATED_DATABASES:
        after = None
        while True:
            position, items, after = leader.replication.snapshot_chunk(db, after, 300)
            first_position = position if first_position is None else first_position
            last_position = position
            follower.replication.apply_snapshot_chunk(db, items)
            # the leader keeps writing between chunks (produce, retention, moves, offsets)
            step += 1
            if step % 3 == 0:
                write(leader, ProduceOp(info, step % 3, entries(4, key=True)), CommitOffsetOp("g", "t", 0, step))
            if step % 5 == 0:
                clock.now += 700
                write(leader, MoveDueOp(), RetentionOp(None, 4000))
            if after is None:
                break
    assert first_position is not None and last_position > first_position
    follower.replication.finish_snapshot(first_position, last_position, leader.replication.epoch)
    fr = follower.replication
    assert (fr.position, fr.log_start, fr.consistent_at) == (first_position, first_position, last_position)
    assert follower.replication.last_epoch == 4 == follower.replication.epoch
    assert leader.replication.end_of_epoch(fr.last_epoch) >= fr.position  # no divergence found
    ship(leader, follower)
    assert_same(leader, follower)


def test_trim_and_log_trimmed(stores: Callable[..., Store]) -> None:
    s = stores("a")
    topic(s)
    for i in range(5):
        write(s, CommitOffsetOp("g", "t", 0, i))
    total = s.replication.log_bytes(0)
    assert total == sum(len(e) for _, e in s.replication.read_log(0, 1 << 20))
    assert s.replication.trim_log(3) == 3 == s.replication.log_start
    assert s.replication.log_bytes(0) == s.replication.log_bytes(3) == log_size(s) < total
    assert s.replication.log_bytes(4) == log_size(s) - len(s.replication.read_log(3, 1)[0][1])
    with pytest.raises(LogTrimmed):
        s.replication.read_log(2, 100)
    with pytest.raises(LogTrimmed):
        s.replication.divergent_keys(2)
    assert s.replication.divergent_keys(5) == [(layout.DATABASES.index(b"offsets"), layout.offset_key("g", "t", 0))]
    assert [p for p, _ in s.replication.read_log(3, 1 << 20)] == [3, 4, 5]
    assert s.replication.entry_info(2) is None
    assert s.replication.trim_log(100) == 6 == s.replication.position  # never past the end
    assert s.replication.read_log(6, 100) == []
    with pytest.raises(ValueError):
        s.replication.read_log(7, 100)
    write(s, CommitOffsetOp("g", "t", 0, 9))
    assert [p for p, _ in s.replication.read_log(6, 100)] == [6]


# ------------------------------------------------------------------ persistence
def test_log_state_survives_reopen(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "a"
    s = Store(path, clock=clock, replicated=True, sync=False)
    s.replication.begin_epoch(2)
    info = topic(s)
    write(s, ProduceOp(info, 0, entries(3)))
    s.replication.begin_epoch(5)
    write(s, CommitOffsetOp("g", "t", 0, 1))
    s.replication.trim_log(2)
    s.replication.truncate(5, [(layout.DATABASES.index(b"offsets"), layout.offset_key("g", "t", 0), None)], 7)
    r = s.replication
    before = (*log_state(s), r.epochs(), r.digests(8), r.log_bytes(0))
    assert before[:5] == (5, 2, 5, 5, 7)
    assert before[-1] == log_size(s) > 0
    s.close()
    s = Store(path, clock=clock, replicated=True, sync=False)
    r = s.replication
    assert (*log_state(s), r.epochs(), r.digests(8), r.log_bytes(0)) == before
    assert s.view is s.head
    s.close()
    # a snapshot interrupted by a crash stays ineligible; a finished one persists
    s = Store(path, clock=clock, replicated=True, sync=False)
    s.replication.reset_for_snapshot()
    s.close()
    s = Store(path, clock=clock, replicated=True, sync=False)
    assert s.replication.consistent_at == UNREACHABLE
    s.replication.finish_snapshot(40, 44, 6)
    s.close()
    s = Store(path, clock=clock, replicated=True, sync=False)
    assert (log_state(s), s.replication.epochs()) == ((40, 40, 6, 6, 44), [(6, 40)])
    s.close()


def test_digests_name_the_parts(stores: Callable[..., Store]) -> None:
    s = stores("a")
    info = topic(s)
    write(s, *[ProduceOp(info, 0, entries(1)) for _ in range(10)])  # ten batches, globals 0..9
    position, d = s.replication.digests(4)
    assert position == 2
    assert {k for k in d if k.startswith("messages/")} == {"messages/0", "messages/4", "messages/8"}
    assert {name.decode() for name in layout.DATABASES} - {"messages"} <= d.keys()
    with pytest.raises(ValueError):
        s.replication.digests(0)
    json.dumps(d)


def test_read_keys_and_snapshot_chunk_edges(stores: Callable[..., Store]) -> None:
    s = stores("a")
    topic(s)
    topics_db = layout.DATABASES.index(b"topics")
    pos, vals = s.replication.read_keys([(topics_db, b"t"), (topics_db, b"nope")])
    assert pos == 1 and vals[0] is not None and vals[1] is None
    with pytest.raises(ValueError):
        s.replication.read_keys([(99, b"x")])
    assert s.replication.snapshot_chunk(layout.DATABASES.index(b"messages"), None, 100) == (1, [], None)
    _, items, last = s.replication.snapshot_chunk(topics_db, None, 1)
    assert [k for k, _ in items] == [b"t"] and last is None
    with pytest.raises(ValueError):
        s.replication.snapshot_chunk(len(layout.DATABASES), None, 100)
    assert DELETE == 2  # the kinds are part of the wire layout


# ------------------------------------------------------------------ random histories
OP_KINDS = ("create", "produce", "keyed", "delayed", "idem", "commit", "delete", "retention", "move", "expire", "skip", "alter")
op_strategy = st.tuples(st.sampled_from(OP_KINDS), st.sampled_from(("a", "b")), st.integers(0, 3), st.integers(1, 6))


def run_op(store: Store, clock: Clock, op: tuple[str, str, int, int], seqs: dict[tuple[str, int], int]) -> None:
    """One random write on ``store`` (as its leader would run it)."""
    kind, name, q, n = op
    info = store.head.topics.get(name)
    clock.now += 50
    if kind == "create":
        write(store, CreateTopicOp(name, 3, exist_ok=True))
    elif kind == "alter" and info is not None:
        write(store, AlterTopicOp(name, queues=info.queues + 1))
    elif kind == "delete" and info is not None:
        write(store, DeleteTopicOp(name))
    elif kind == "commit":
        write(store, CommitOffsetOp("g", name, q, n))
    elif kind == "retention":
        write(store, RetentionOp(None, 60 * n, delete_consumed=n % 2 == 0, limit=2 * n))
    elif kind == "move":
        clock.now += 1000 * n
        write(store, MoveDueOp(limit=n))
    elif kind == "expire":
        write(store, ExpireProducersOp(100 * n, limit=n))
    elif info is not None and q < info.queues:
        if kind == "produce":
            write(store, ProduceOp(info, q, entries(n)))
        elif kind == "keyed":
            write(store, ProduceOp(info, q, entries(n, key=True)))
        elif kind == "delayed":
            write(store, ProduceOp(info, q, entries(n, deliver_at=clock.now + 500 * n) + entries(1)))
        elif kind == "idem":
            seq = seqs.get((name, q), 0)
            (res,) = write(store, ProduceOp(info, q, entries(n), producer_id=PID, base_sequence=seq))
            if not isinstance(res, Exception):
                seqs[(name, q)] = seq + n
        elif kind == "skip":
            st_q = store.head.queue(info.topic_id, q)
            if st_q.min_offset < st_q.next_offset:
                write(store, SkipRecordOp(name, q, st_q.min_offset))


@settings(max_examples=60)
@given(
    shared=st.lists(op_strategy, max_size=16),
    old_only=st.lists(op_strategy, max_size=8),
    new_only=st.lists(op_strategy, max_size=8),
    behind=st.integers(0, 3),
    snapshot=st.booleans(),
    during=st.lists(op_strategy, max_size=6),
)
def test_random_histories_converge(
    shared: list[tuple[str, str, int, int]], old_only: list[tuple[str, str, int, int]],
    new_only: list[tuple[str, str, int, int]], behind: int, snapshot: bool,
    during: list[tuple[str, str, int, int]],
) -> None:
    """Random writes, a leader change with divergence (the old leader wrote on alone,
    the new one may have missed some of the shared entries: it was `behind`), then
    truncation (or a snapshot, the leader writing `during` it, between chunks): the
    replicas end equal."""
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="equeue-repl-") as d:
        old = Store(Path(d) / "old", map_size=1 << 28, sync=False, clock=clock, replicated=True)
        new = Store(Path(d) / "new", map_size=1 << 28, sync=False, clock=clock, replicated=True)
        try:
            seqs: dict[tuple[str, int], int] = {}
            old.replication.begin_epoch(1)
            write(old, CreateTopicOp("a", 2))
            for op in shared:
                run_op(old, clock, op, seqs)
            upto = max(0, old.replication.position - behind)
            while new.replication.position < upto:
                at = new.replication.position
                new.replication.apply_log(old.replication.read_log(at, 1 << 20)[: upto - at])
            for op in old_only:
                run_op(old, clock, op, dict(seqs))
            new.replication.begin_epoch(2)  # reloads its views first
            seqs_new = dict(seqs)
            for op in new_only:
                run_op(new, clock, op, seqs_new)
            if snapshot:
                old.replication.reset_for_snapshot()
                first = None
                for db in layout.REPLICATED_DATABASES:
                    after = None
                    while True:
                        position, items, after = new.replication.snapshot_chunk(db, after, 200)
                        first = position if first is None else first
                        last = position
                        old.replication.apply_snapshot_chunk(db, items)
                        if during:
                            run_op(new, clock, during.pop(), seqs_new)
                        if after is None:
                            break
                assert first is not None
                old.replication.finish_snapshot(first, last, new.replication.epoch)
                ship(new, old)
            elif new.replication.end_of_epoch(old.replication.last_epoch) < old.replication.position:
                truncate_to_leader(new, old)
            else:
                ship(new, old)
            assert_same(new, old)
        finally:
            old.close()
            new.close()


def follow(leader: Store, follower: Store, *, naive: bool = False) -> int:
    """The fetch protocol's divergence check, then the fetches; returns the number of
    truncations. Not ``naive``: a last epoch the leader never had is divergence too
    (KIP-279), placed at the follower's own start of that epoch when the leader
    cannot place it."""
    truncations = 0
    while True:
        e, pos = follower.replication.last_epoch, follower.replication.position
        end = leader.replication.end_of_epoch(e)
        unknown = not naive and pos > 0 and e not in dict(leader.replication.epochs())
        if end < pos or unknown:
            at = min(end, pos)
            start = at if at < pos else dict(follower.replication.epochs())[e]
            keys = follower.replication.divergent_keys(start)
            q, values = leader.replication.read_keys(keys)
            follower.replication.truncate(start, [(db, k, v) for (db, k), v in zip(keys, values, strict=True)], q)
            truncations += 1
            continue
        ship(leader, follower)
        return truncations


@pytest.mark.parametrize("naive", [True, False])
def test_unknown_epoch_divergence(naive: bool, stores: Callable[..., Store]) -> None:
    """Three replicas, two quick failovers: the new leader G never had F's epoch 3,
    and F's epoch-3 entry 5 sits where G has the epoch-2 entry 5 of the first leader."""
    l2, f, g = stores("l2"), stores("f"), stores("g")
    l2.replication.begin_epoch(1)
    info = topic(l2, "t", 2)
    write(l2, ProduceOp(info, 0, entries(3, key=True)), CommitOffsetOp("g", "t", 0, 1))
    write(l2, ProduceOp(info, 1, entries(2)))
    write(l2, CommitOffsetOp("g", "t", 1, 1))
    ship(l2, f)
    l2.replication.begin_epoch(2)
    write(l2, ProduceOp(info, 0, entries(4, prefix="e2")), CommitOffsetOp("g", "t", 0, 2))  # entry 6
    ship(l2, g)  # G has entry 6 (epoch 2); F does not
    f.replication.begin_epoch(3)  # F takes over: marker at 5, then writes alone
    write(f, ProduceOp(info, 1, entries(2, prefix="e3")), CommitOffsetOp("g", "t", 1, 2))
    g.replication.begin_epoch(4)  # F dies before G fetched; G takes over
    write(g, ProduceOp(info, 1, entries(1, prefix="e4")))
    assert g.replication.epochs() == [(1, 0), (2, 5), (4, 7)] and f.replication.epochs() == [(1, 0), (3, 5)]
    follow(g, f, naive=naive)
    same = f.replication.digests(8) == g.replication.digests(8)
    assert same is not naive  # the naive check keeps F's epoch-3 entry 5: it diverges silently
    if not naive:
        assert_same(g, f)


def test_a_big_batch_is_several_entries(stores: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """A replicated store bounds each entry (a follower fetches it whole): past
    MAX_ENTRY_RECORDS of records it commits and runs the other ops in the next one."""
    monkeypatch.setattr(store_module, "MAX_ENTRY_RECORDS", 500)
    leader, follower = stores("leader"), stores("follower")
    info = topic(leader)
    out = leader.write([ProduceOp(info, i % 2, entries(20, prefix=f"b{i}-")) for i in range(5)] + [ProduceOp(info, 9, [])])
    sizes = [len(e) for _, e in leader.replication.read_log(1, 1 << 30)]
    assert len(sizes) > 1 and out.position == leader.replication.position == 1 + len(sizes)
    assert [type(r).__name__ for r in out.settled()][-1] == "QueueNotFound"
    assert sum(r.stored for r in out.settled()[:5]) == 100
    assert [o.position for o in leader.replication.publish_all()] == list(range(1, leader.replication.position + 1))
    ship(leader, follower)
    assert_same(leader, follower)


def test_a_later_transaction_failing_keeps_the_committed_results(
    stores: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_ENTRY_RECORDS", 100)
    s = stores("a")
    info = topic(s)
    real = Store._transaction
    calls = 0

    def flaky(self: Store, ops: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StoreFull("map full")
        return real(self, ops)

    monkeypatch.setattr(Store, "_transaction", flaky)
    out = s.write([ProduceOp(info, 0, entries(5)), ProduceOp(info, 1, entries(5)), ProduceOp(info, 0, entries(1))])
    first, second, third = out.settled()
    assert first.stored == 5 and isinstance(second, StoreFull) and isinstance(third, StoreFull)
    assert out.position == s.replication.position == 2
    calls = 1  # the first transaction failing raises: nothing was written
    with pytest.raises(StoreFull):
        s.write([ProduceOp(info, 0, entries(1))])


def test_data_written_without_a_log(tmp_path: Path, clock: Clock) -> None:
    """A store with data and no log (standalone, or opened standalone after it was
    replicated) starts its log at 1: a follower at 0 must copy it first."""
    path = tmp_path / "a"
    s = Store(path, clock=clock, sync=False)
    info = topic(s)
    write(s, ProduceOp(info, 0, entries(3)), CommitOffsetOp("g", "t", 0, 1))
    s.close()
    s = Store(path, clock=clock, sync=False, replicated=True)
    base = s.replication.converted_epoch  # a random epoch of its own (two converted stores differ)
    assert 1 <= base <= 1 << 30 and s.replication.led_epoch == 0
    r = s.replication
    assert (r.position, r.log_start, r.last_epoch, r.epochs(), r.end_of_epoch(base)) == (1, 1, base, [(base, 0)], 1)
    with pytest.raises(LogTrimmed):
        s.replication.read_log(0, 100)
    s.replication.begin_epoch(base + 1)
    assert s.replication.led_epoch == base + 1
    write(s, ProduceOp(info, 1, entries(2)))
    follower = Store(tmp_path / "f", clock=clock, sync=False, replicated=True)
    try:
        follower.replication.reset_for_snapshot()
        first = last = None
        for db in layout.REPLICATED_DATABASES:
            after = None
            while True:
                position, items, after = s.replication.snapshot_chunk(db, after, 1 << 20)
                first = position if first is None else first
                last = position
                follower.replication.apply_snapshot_chunk(db, items)
                if after is None:
                    break
        assert first is not None and last is not None
        follower.replication.finish_snapshot(first, last, s.replication.epoch)
        ship(s, follower)
        assert_same(s, follower)
    finally:
        follower.close()
    s.close()
    # opened standalone: the log is dropped (it would miss these writes) ...
    s = Store(path, clock=clock, sync=False)
    with s.env.begin() as txn:
        assert txn.get(b"replog") is None and txn.get(b"repl_state") is None
    write(s, CommitOffsetOp("g", "t", 0, 2))
    s.close()
    # ... and replicated again, it starts a new log after its data
    s = Store(path, clock=clock, sync=False, replicated=True)
    again = s.replication.converted_epoch
    assert (s.replication.position, s.replication.log_start, s.replication.epochs()) == (1, 1, [(again, 0)]) and again >= 1
    s.close()
    empty = Store(tmp_path / "e", clock=clock, sync=False, replicated=True)
    assert empty.replication.position == 0
    empty.close()


def test_publishing_while_the_writer_commits(stores: Callable[..., Store]) -> None:
    """publish_upto (the loop) runs against the writer appending: every transaction's
    outcome comes out once, in order, and the view ends at the head."""
    s = stores("a")
    info = topic(s)
    s.replication.publish_all()
    n = 300

    def writer() -> None:
        for i in range(n):
            s.write([ProduceOp(info, i % 2, entries(1)), CommitOffsetOp("g", "t", i % 2, i)])

    seen: list[int] = []
    t = threading.Thread(target=writer)
    t.start()
    while t.is_alive() or s.view is not s.head:
        hw = s.replication.position
        seen.extend(o.position for o in s.replication.publish_upto(hw))
        v = s.view
        assert v.queue(info.topic_id, 0).next_offset + v.queue(info.topic_id, 1).next_offset <= hw
    t.join()
    assert seen == list(range(2, n + 2))
    assert s.view is s.head and s.view.queue(info.topic_id, 0).next_offset == n // 2
