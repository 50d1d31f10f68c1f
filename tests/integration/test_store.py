"""The LMDB store on its own: append/read (one stored batch per produce, read back
whole), atomicity, recovery, corruption, map full."""

from __future__ import annotations

from pathlib import Path

import pytest

from equeue import Message, wire
from equeue.broker.storage import (
    CommitOffsetOp,
    CreateTopicOp,
    ProduceOp,
    Store,
    layout,
    messages_of,
)
from equeue.control import TopicInfo
from equeue.errors import CorruptRecord, MessageTooLarge, QueueNotFound, StoreFull
from equeue.protocol import PullStatus
from equeue.wire import batches


def entries(n: int, prefix: str = "m", size: int = 0, key: bool = True) -> list[bytes]:
    pad = b"." * size
    return [
        wire.encode_entry(Message(f"{prefix}{i}".encode() + pad, key=f"k{i}" if key else None, tags="t"))
        for i in range(n)
    ]


def make_topic(store: Store, name: str = "t", queues: int = 4) -> TopicInfo:
    (info,) = store.write([CreateTopicOp(name, queues)]).settled()
    assert isinstance(info, TopicInfo)
    return info


def bodies(store: Store, info: TopicInfo, queue: int, offset: int = 0, n: int = 10_000) -> list[bytes]:
    msgs, _r = store.read_messages(info, queue, offset, n, 1 << 30)
    return [m.body for m in msgs[:n]]


def raw_counts(store: Store) -> tuple[int, int]:
    """(messages, queue-index entries) as LMDB holds them."""
    with store.env.begin() as txn:
        return (
            txn.stat(store.db[b"messages"])["entries"],
            txn.stat(store.db[b"qindex"])["entries"],
        )


def test_append_and_read(tmp_path: Path) -> None:
    store = Store(tmp_path)
    info = make_topic(store)
    out = store.write([ProduceOp(info, 1, entries(5)), ProduceOp(info, 2, entries(3, "x"))])
    a, b = out.settled()
    assert (a.first_global, a.first_queue, a.stored) == (0, 0, 5)
    assert (b.first_global, b.first_queue, b.stored) == (5, 0, 3)
    assert out.touched == {(info.topic_id, 1), (info.topic_id, 2)}
    r = store.read_queue(info, 1, 0, 100, 1 << 20)
    assert r.status is PullStatus.FOUND
    msgs = messages_of("t", r.batches)
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in msgs] == list(range(5))
    assert [m.global_offset for m in msgs] == list(range(5))
    assert [m.key for m in msgs] == [f"k{i}" for i in range(5)]
    assert (r.min_offset, r.max_offset, r.next_offset) == (0, 5, 5)
    # partial reads, by count and by bytes
    assert bodies(store, info, 1, 2, 2) == [b"m2", b"m3"]
    r = store.read_queue(info, 1, 0, 100, 1)
    assert len(r.batches) == 1 and r.next_offset == 5  # at least one batch even over max_bytes
    # statuses
    assert store.read_queue(info, 1, 5, 10, 1 << 20).status is PullStatus.NO_NEW_MESSAGE
    assert store.read_queue(info, 1, 6, 10, 1 << 20).status is PullStatus.OFFSET_OVERFLOW
    assert store.read_queue(info, 0, 0, 10, 1 << 20).status is PullStatus.NO_NEW_MESSAGE
    with pytest.raises(QueueNotFound):
        store.read_queue(info, 4, 0, 10, 1 << 20)
    # lookups
    hit = store.get_queue_offset(info, 2, 1)
    assert hit is not None and hit.global_offset == 6 and hit.message("t").body == b"x1"
    assert store.get_global(7) is not None and store.get_global(8) is None
    found = store.find_by_key(info, "k1", 10).hits
    assert sorted(h.global_offset for h in found) == [1, 6]
    store.close()


def test_tag_filter_skips_but_advances(tmp_path: Path) -> None:
    store = Store(tmp_path)
    info = make_topic(store, queues=1)
    es = [wire.encode_entry(Message(b"a", tags="a")), wire.encode_entry(Message(b"b", tags="b"))] * 3
    store.write([ProduceOp(info, 0, es)])
    r = store.read_queue(info, 0, 0, 10, 1 << 20, frozenset({b"b"}))
    assert [m.body for m in messages_of("t", r.batches)] == [b"b"] * 3
    assert r.next_offset == 6
    store.close()


def test_every_message_has_its_index_entry(tmp_path: Path) -> None:
    """Message and queue-index entry are written in one transaction: the two
    databases always agree, also when some ops of a group commit fail."""
    store = Store(tmp_path)
    info = make_topic(store)
    big = [wire.encode_entry(Message(b"z" * 2000))]
    out = store.write(
        [
            ProduceOp(info, 0, entries(10)),
            ProduceOp(info, 1, big, max_body=1000),  # fails its precondition: writes nothing
            ProduceOp(info, 9, entries(1)),  # no such queue
            ProduceOp(info, 1, entries(4)),
        ]
    )
    assert isinstance(out.settled()[1], MessageTooLarge)
    assert isinstance(out.settled()[2], QueueNotFound)
    assert out.settled()[3].first_global == 10
    assert raw_counts(store) == (2, 2)  # one batch per produce
    with store.env.begin() as txn:
        for k, v in txn.cursor(db=store.db[b"qindex"]):
            tid, q, off = layout.unpack_qindex_key(k)
            g, count = layout.unpack_qindex_value(v)
            value = txn.get(layout.global_key(g), db=store.db[b"messages"])
            assert value is not None
            h = batches.stored_head(value)
            assert (h.topic_id, h.queue_id, h.base_offset) == (tid, q, off)
            assert len(batches.decode_batch(batches.stored_batch(value), 1 << 20)) == count
    assert bodies(store, info, 1) == [f"m{i}".encode() for i in range(4)]
    store.close()


def test_reopen_recovers_offsets(tmp_path: Path) -> None:
    store = Store(tmp_path)
    info = make_topic(store, queues=3)
    for q in range(3):
        store.write([ProduceOp(info, q, entries(q + 2, f"q{q}-"))])
    store.write([CommitOffsetOp("g", "t", 1, 2)])
    store.close()

    store = Store(tmp_path)
    info2 = store.topic("t")
    assert info2 == info
    assert store.next_global == 2 + 3 + 4
    assert [store.queue_state(info.topic_id, q).next_offset for q in range(3)] == [2, 3, 4]
    assert store.committed("g", "t", 1) == 2
    (ans,) = store.write([ProduceOp(info2, 1, entries(2, "new"))]).settled()
    assert (ans.first_global, ans.first_queue) == (9, 3)
    assert bodies(store, info2, 1) == [b"q1-0", b"q1-1", b"q1-2", b"new0", b"new1"]
    store.close()


def test_recovery_uses_last_keys_when_stats_are_stale(tmp_path: Path) -> None:
    """Next offsets come from the last keys of the log and the index."""
    store = Store(tmp_path)
    info = make_topic(store, queues=1)
    store.write([ProduceOp(info, 0, entries(5))])
    with store.env.begin(write=True) as txn:  # simulate stale counters
        txn.delete(b"next_global", db=store.db[b"meta"])
        txn.delete(layout.queue_key(info.topic_id, 0), db=store.db[b"qstats"])
    store.close()
    store = Store(tmp_path)
    assert store.next_global == 5
    assert store.queue_state(info.topic_id, 0).next_offset == 5
    store.close()


def test_checksum_mismatch_is_detected(tmp_path: Path) -> None:
    store = Store(tmp_path)
    info = make_topic(store, queues=1)
    for e in entries(4, size=50):
        store.write([ProduceOp(info, 0, [e])])  # four batches of one
    # flip one byte of the body of the record at global offset 2, behind the store's back
    with store.env.begin(write=True) as txn:
        rec = bytearray(txn.get(layout.global_key(2), db=store.db[b"messages"]))
        rec[-5] ^= 0x40
        txn.put(layout.global_key(2), bytes(rec), db=store.db[b"messages"])
    # records before the bad one are returned; the read stops before it
    r = store.read_queue(info, 0, 0, 10, 1 << 20)
    assert [g for g, _v, _m in r.batches] == [0, 1] and r.next_offset == 2
    # reading the bad one itself raises, with the queue and offset in the message
    with pytest.raises(CorruptRecord, match="offset 2"):
        store.read_queue(info, 0, 2, 10, 1 << 20)
    hit = store.get_global(2)
    assert hit is not None
    with pytest.raises(CorruptRecord):
        hit.message("t")
    assert bodies(store, info, 0, 3) == [b"m3" + b"." * 50]
    store.close()


def test_map_full_fails_cleanly_and_reads_keep_working(tmp_path: Path) -> None:
    store = Store(tmp_path, map_size=1 << 20)  # 1 MiB
    info = make_topic(store, queues=2)
    store.write([ProduceOp(info, 0, entries(20, size=100))])
    before = raw_counts(store)
    nxt = store.next_global
    with pytest.raises(StoreFull, match="map-size"):
        # ~2 MiB in one transaction: cannot fit
        store.write([ProduceOp(info, 1, entries(40, size=50_000, key=False))])
    # nothing half-written: counts, offsets and in-memory state unchanged
    assert raw_counts(store) == before
    assert store.next_global == nxt
    assert store.queue_state(info.topic_id, 1).next_offset == 0
    assert bodies(store, info, 0)[:2] == [b"m0" + b"." * 100, b"m1" + b"." * 100]
    assert store.read_queue(info, 1, 0, 10, 1 << 20).status is PullStatus.NO_NEW_MESSAGE
    # the store stays usable: a write that fits succeeds at the next dense offsets
    (ans,) = store.write([ProduceOp(info, 1, entries(2))]).settled()
    assert (ans.first_global, ans.first_queue) == (nxt, 0)
    store.close()
    # and the file is intact after reopening
    store = Store(tmp_path, map_size=1 << 20)
    assert store.next_global == nxt + 2
    store.close()


def test_raw_lmdb_is_consistent_after_many_group_commits(tmp_path: Path) -> None:
    store = Store(tmp_path)
    info = make_topic(store, queues=4)
    for i in range(20):
        store.write([ProduceOp(info, (i + j) % 4, entries(7)) for j in range(3)])
    assert raw_counts(store) == (60, 60)
    for q in range(4):
        r = store.read_queue(info, q, 0, 1000, 1 << 30)
        assert [m.queue_offset for m in messages_of("t", r.batches)] == list(range(105))
    store.close()


def test_unknown_producer_must_start_at_sequence_zero(tmp_path: Path) -> None:
    """A later batch of a new producer arriving first must not make the earlier one
    look like a duplicate: the broker refuses it (transient) until sequence 0 is in."""
    from equeue import Message, OutOfOrderSequence, wire

    s = Store(tmp_path / "d", map_size=1 << 26)
    try:
        info = s.write([CreateTopicOp("t", 1)]).settled()[0]
        pid = b"p" * 16
        e = [wire.encode_entry(Message(b"x"))]
        out = s.write([ProduceOp(info, 0, e * 2, pid, 2), ProduceOp(info, 0, e * 2, pid, 0)])
        assert isinstance(out.settled()[0], OutOfOrderSequence)
        assert out.settled()[1].stored == 2
        again = s.write([ProduceOp(info, 0, e * 2, pid, 2)]).settled()[0]
        assert (again.first_queue, again.stored, again.duplicate) == (2, 2, False)
        dup = s.write([ProduceOp(info, 0, e * 2, pid, 0)]).settled()[0]
        assert dup.duplicate and dup.first_queue == 0
    finally:
        s.close()


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("shape", ["long runs", "short runs", "mixed"])
def test_dense_reads_match_what_was_written(tmp_path: Path, shape: str, verify: bool) -> None:
    """Every way the fast read walks the log (one run, several runs found by probing the
    index, many short runs fetched by getmulti) returns exactly the queue's records."""
    import random

    rnd = random.Random(f"{shape}{verify}")
    store = Store(tmp_path)
    info = make_topic(store, queues=3)
    expect: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(3)}
    for b in range(60):
        size = {"long runs": 400, "short runs": 3, "mixed": rnd.choice([1, 2, 70, 700])}[shape]
        q = rnd.randrange(3)
        batch = [wire.encode_entry(Message(f"{q}.{b}.{i}".encode() * rnd.randint(1, 4))) for i in range(size)]
        if b % 7 == 0:  # several batches in one transaction
            ops = [ProduceOp(info, q, batch[: size // 2]), ProduceOp(info, (q + 1) % 3, batch[size // 2 :])]
        else:
            ops = [ProduceOp(info, q, batch)]
        for op, res in zip(ops, store.write(ops).settled(), strict=True):
            expect[op.queue_id] += [(res.first_global + i, e) for i, e in enumerate(op.entries)]
    for q in range(3):
        want = expect[q]
        for _ in range(30):
            off = rnd.randrange(len(want)) if want else 0
            n = rnd.choice([1, 5, 100, 1000, 10_000])
            r = store.read_queue(info, q, off, n, 1 << 30, verify=verify)
            msgs = messages_of("t", r.batches, off, r.next_offset)
            got = [(m.global_offset, wire.encode_entry(m)) for m in msgs]
            assert got == want[off : off + len(got)] and (got or off >= len(want)) and len(got) <= n
            assert [m.queue_offset for m in msgs] == list(range(off, off + len(got)))
            assert r.next_offset == off + len(got)
        # a byte limit cuts a read after whole batches (at least one)
        r = store.read_queue(info, q, 0, 10_000, 1, verify=verify)
        assert len(r.batches) == (1 if want else 0)
    store.close()


def test_view_is_an_immutable_snapshot_swapped_after_commit(tmp_path: Path) -> None:
    """Readers hold a view that never changes; a commit publishes a new one, a
    transaction that wrote nothing or failed publishes none."""
    store = Store(tmp_path, map_size=1 << 20)
    info = make_topic(store, queues=2)
    v0 = store.view
    store.write([ProduceOp(info, 0, entries(3))])
    v1 = store.view
    assert v1 is not v0
    assert (v0.queue(info.topic_id, 0).next_offset, v1.queue(info.topic_id, 0).next_offset) == (0, 3)
    assert (v0.next_global, v1.next_global, v1.transactions - v0.transactions) == (0, 3, 1)
    with pytest.raises(TypeError):
        v1.queues[info.topic_id] = v0.queues[info.topic_id]  # type: ignore[index]
    out = store.write([ProduceOp(info, 7, entries(1))])  # fails its precondition: no write
    assert isinstance(out.settled()[0], QueueNotFound)
    assert store.view is v1
    with pytest.raises(StoreFull):
        store.write([ProduceOp(info, 1, entries(40, size=50_000, key=False))])
    assert store.view is v1
    store.close()


def test_a_reader_thread_only_ever_sees_committed_state(tmp_path: Path) -> None:
    """While the writer commits (topics, then one message per transaction), every
    view a reader takes is committed: each topic it lists has its queues, and each
    queue's last offset is readable."""
    import threading

    store = Store(tmp_path, sync=False)
    stop = threading.Event()
    seen: list[int] = []
    problems: list[str] = []
    passes = threading.Semaphore(0)  # one release per pass of the reader over a view

    def reader() -> None:
        while not stop.is_set():
            v = store.view
            for info in v.topics.values():
                if info.queues - 1 not in v.queues.get(info.topic_id, {}):
                    problems.append(f"topic {info.name} without its queues")
                st = v.queue(info.topic_id, 0)
                if st.next_offset and store.get_queue_offset(info, 0, st.next_offset - 1) is None:
                    problems.append(f"{info.name}: offset {st.next_offset - 1} published, not readable")
                seen.append(st.next_offset)
            passes.release()

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(20):
            info = make_topic(store, f"t{n}", 3)
            for _ in range(10):
                store.write([ProduceOp(info, 0, entries(1))])
            # the reader reads while the writer writes: wait for one of its passes over
            # this topic's views (the GIL may otherwise let the writer finish first)
            while passes.acquire(blocking=False):
                pass  # passes over earlier views
            assert passes.acquire(timeout=30), "the reader made no pass"
    finally:
        stop.set()
        t.join()
    store.close()
    assert problems == []
    assert seen


def test_a_produce_built_before_a_delete_and_recreate_is_refused(tmp_path: Path) -> None:
    """A produce checked against topic ``t`` must not land in a new topic of the same
    name created meanwhile (the records would carry the old id: acknowledged, then lost)."""
    from equeue.broker.storage import DeleteTopicOp
    from equeue.errors import TopicNotFound

    store = Store(tmp_path)
    try:
        old = make_topic(store, "t", 1)
        store.write([DeleteTopicOp("t")])
        new = make_topic(store, "t", 1)
        assert new.topic_id != old.topic_id
        (result,) = store.write([ProduceOp(old, 0, entries(3))]).settled()
        assert isinstance(result, TopicNotFound)
        assert store.queue_state(new.topic_id, 0).next_offset == 0
    finally:
        store.close()
