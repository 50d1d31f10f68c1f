"""Store format 3: a produce request is stored as one record batch, and
``StoreReader.read_queue`` answers with whole stored batches, each with a keep mask
(skips and tag filters), budgets at batch granularity (docs/storage.md)."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from equeue import Message, wire
from equeue.broker.storage import (
    CreateTopicOp,
    MoveDueOp,
    ProduceOp,
    ScanBudget,
    Store,
    layout,
    messages_of,
    reader,
)
from equeue.broker.storage.skips import SkipRecordOp
from equeue.control import TopicInfo
from equeue.errors import CorruptRecord, InvalidMessage
from equeue.protocol import PullStatus
from equeue.wire import batches
from equeue.wire.batches import stored_head


def _entries(n: int, start: int = 0, tags: str | None = None, key: bool = True) -> list[bytes]:
    return [
        wire.encode_entry(Message(f"m{i}".encode(), key=f"k{i}" if key else None, tags=tags,
                                  properties={"p": str(i)} if i % 3 == 0 else {}))
        for i in range(start, start + n)
    ]  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "s", map_size=64 << 20, clock=lambda: 1_000)
    yield s
    s.close()


def _topic(s: Store, name: str = "t", queues: int = 2) -> TopicInfo:
    (info,) = s.write([CreateTopicOp(name, queues)]).settled()
    assert isinstance(info, TopicInfo)
    return info


def test_a_produce_is_one_stored_batch_and_reads_back_message_for_message(store: Store) -> None:
    info = _topic(store)
    store.write([ProduceOp(info, 1, _entries(3, key=False))]).settled()  # globals 0..2 on queue 1
    (a,) = store.write([ProduceOp(info, 0, _entries(5))]).settled()
    (b,) = store.write([ProduceOp(info, 0, _entries(4, 5, tags="x"))]).settled()
    assert (a.first_global, a.first_queue, b.first_global, b.first_queue) == (3, 0, 8, 5)
    with store.env.begin() as txn:
        assert txn.stat(store.db[b"messages"])["entries"] == 3  # one value per batch
        assert txn.stat(store.db[b"qindex"])["entries"] == 3
        v = txn.get(layout.qindex_key(info.topic_id, 0, 5), db=store.db[b"qindex"])
        assert layout.unpack_qindex_value(v) == (8, 4)
    r = store.read_queue(info, 0, 0, 100, 1 << 20)
    assert (r.status, r.min_offset, r.max_offset, r.next_offset) == (PullStatus.FOUND, 0, 9, 9)
    assert [(g, m) for g, _v, m in r.batches] == [(3, b""), (8, b"")]
    msgs = messages_of(info.name, r.batches)
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(9)]
    assert [(m.queue_offset, m.global_offset) for m in msgs] == [(i, 3 + i) for i in range(9)]
    assert msgs[3].properties == {"p": "3"} and msgs[8].tags == "x" and msgs[2].key == "k2"
    assert all(m.timestamp == 1_000 for m in msgs)
    h = batches.stored_head(r.batches[1][1])
    assert (h.topic_id, h.queue_id, h.base_offset, h.first_ms, h.last_ms) == (info.topic_id, 0, 5, 1_000, 1_000)


def test_a_read_delivers_exactly_what_was_asked_counting_from_the_offset(store: Store) -> None:
    """Small batches go whole, and ``max_messages`` is exact: the answer ends inside
    the batch (first or later) that holds more than is left to deliver."""
    info = _topic(store)
    for i in range(3):
        store.write([ProduceOp(info, 0, _entries(10, 10 * i))]).settled()
    r = store.read_queue(info, 0, 7, 3, 1 << 20)  # 3 of batch 0 from offset 7
    assert [g for g, _v, _m in r.batches] == [0] and r.next_offset == 10
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 7)] == [7, 8, 9]
    r = store.read_queue(info, 0, 7, 13, 1 << 20)  # 3 + 10 fill it exactly
    assert [g for g, _v, _m in r.batches] == [0, 10] and r.next_offset == 20
    r = store.read_queue(info, 0, 7, 8, 1 << 20)  # 3 + 5: the answer ends inside the second batch
    assert [g for g, _v, _m in r.batches] == [0, 10] and r.next_offset == 15
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 7, r.next_offset)] == list(range(7, 15))
    r = store.read_queue(info, 0, 2, 5, 1 << 20)  # inside one batch: records 2..6 only
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 2, r.next_offset)] == [2, 3, 4, 5, 6]
    r = store.read_queue(info, 0, 0, 1, 1 << 20)  # at least one batch, the answer ending inside it
    assert len(r.batches) == 1 and r.next_offset == 1
    size = len(r.batches[0][1])
    r = store.read_queue(info, 0, 0, 100, size + 1)  # bytes: the second batch would pass them
    assert len(r.batches) == 1 and r.next_offset == 10
    assert store.read_queue(info, 0, 30, 10, 1 << 20).status is PullStatus.NO_NEW_MESSAGE
    assert store.read_queue(info, 0, 31, 10, 1 << 20).status is PullStatus.OFFSET_OVERFLOW


def test_a_small_pull_of_a_large_batch_carries_only_its_records(store: Store) -> None:
    """A batch whose left-out records weigh CUT_SAVES_BYTES or more is cut to the
    records delivered (sealed anew, its base moved); the middle of an answer is whole."""
    info = _topic(store)
    big = [wire.encode_entry(Message(bytes([i]) * 20_000)) for i in range(10)]  # ~200 kB batches
    for _ in range(3):
        store.write([ProduceOp(info, 0, big)]).settled()
    r = store.read_queue(info, 0, 7, 3, 1 << 30)  # 3 of 10: 140 kB left out, so cut
    assert [g for g, _v, _m in r.batches] == [7] and r.next_offset == 10
    assert stored_head(r.batches[0][1]).base_offset == 7
    assert [m.body[0] for m in messages_of(info.name, r.batches, 7)] == [7, 8, 9]
    assert len(r.batches[0][1]) < 70_000
    r = store.read_queue(info, 0, 8, 13, 1 << 30)  # 2 + 10 + 1: both ends cut, the middle whole
    assert [g for g, _v, _m in r.batches] == [8, 10, 20] and r.next_offset == 21
    assert [stored_head(v).base_offset for _g, v, _m in r.batches] == [8, 10, 20]
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 8, r.next_offset)] == list(range(8, 21))
    r = store.read_queue(info, 0, 1, 9, 1 << 30)  # 9 of 10: one record left out is not worth a cut
    assert [g for g, _v, _m in r.batches] == [0] and stored_head(r.batches[0][1]).base_offset == 0


def test_a_whole_batches_pull_ends_at_the_end_of_a_batch_that_goes_whole(store: Store) -> None:
    """With ``whole`` (the WHOLE_BATCHES pull flag) an answer does not end inside its
    last batch when that batch goes whole anyway: its next offset is the batch's end,
    past max_messages. A large batch is still cut, and a tag filter's answer still
    ends where its scan stopped."""
    info = _topic(store)
    store.write([ProduceOp(info, 0, _entries(10))]).settled()
    store.write([ProduceOp(info, 0, _entries(10, 10))]).settled()
    r = store.read_queue(info, 0, 2, 3, 1 << 20)
    assert r.next_offset == 5 and len(r.batches) == 1
    r = store.read_queue(info, 0, 2, 3, 1 << 20, whole=True)
    assert r.next_offset == 10 and len(r.batches) == 1 and r.batches[0][2] == b""
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 2, r.next_offset)] == list(range(2, 10))
    r = store.read_queue(info, 0, 2, 12, 1 << 20, whole=True)  # ends inside the second: its end
    assert r.next_offset == 20 and len(r.batches) == 2
    store.write([SkipRecordOp("t", 0, 7)]).settled()
    r = store.read_queue(info, 0, 2, 3, 1 << 20, whole=True)  # the mask covers the whole batch
    assert r.next_offset == 10
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 2, 10)] == [2, 3, 4, 5, 6, 8, 9]
    big = [wire.encode_entry(Message(bytes([i]) * 20_000)) for i in range(10)]  # ~200 kB: cut, not whole
    store.write([ProduceOp(info, 1, big)]).settled()
    r = store.read_queue(info, 1, 0, 3, 1 << 30, whole=True)
    assert r.next_offset == 3 and len(r.batches[0][1]) < 70_000
    store.write([ProduceOp(info, 1, _entries(10, tags="a"))]).settled()
    r = store.read_queue(info, 1, 10, 2, 1 << 20, frozenset({b"a"}), whole=True)
    assert r.next_offset == 20
    msgs = [Message(bytes([i]) * 20_000) for i in range(10)]
    for codec, goes_whole in ((batches.Codec.NONE, False), (batches.Codec.ZSTD, True), (batches.Codec.LZ4, True)):
        zipped = batches.encode_stored(1, 0, 0, 1, 1, None, 0, batches.encode_batch(msgs, codec))
        assert len(zipped) >= reader.CUT_SAVES_BYTES or codec is not batches.Codec.NONE
        assert reader._goes_whole(zipped) is goes_whole  # compressed: never cut, so whole


def test_skips_and_tag_filters_are_masks(store: Store) -> None:
    info = _topic(store)
    es = [wire.encode_entry(Message(f"m{i}".encode(), tags="a" if i % 2 else "b")) for i in range(10)]
    store.write([ProduceOp(info, 0, es)]).settled()
    store.write([SkipRecordOp("t", 0, 3)]).settled()
    r = store.read_queue(info, 0, 0, 100, 1 << 20)
    assert r.batches[0][2] == bytes([0b11110111, 0b11])
    assert [m.queue_offset for m in messages_of(info.name, r.batches)] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    r = store.read_queue(info, 0, 2, 100, 1 << 20, frozenset({b"a"}))
    assert r.next_offset == 10
    assert [m.queue_offset for m in messages_of(info.name, r.batches, 2)] == [5, 7, 9]  # 3: skipped
    assert r.batches[0][2] == bytes([0b10100000, 0b10])
    r = store.read_queue(info, 0, 0, 100, 1 << 20, frozenset({b"none"}))
    assert (r.status, r.batches, r.next_offset) == (PullStatus.NO_NEW_MESSAGE, [], 10)


def test_a_filtered_scan_stops_at_its_budget_inside_a_batch(store: Store) -> None:
    info = _topic(store)
    for _i in range(5):
        store.write([ProduceOp(info, 0, [wire.encode_entry(Message(b"x", tags="no")) for _ in range(10)])]).settled()
    store.scan_budget = ScanBudget(records=25, seconds=60.0)
    r = store.read_queue(info, 0, 0, 100, 1 << 20, frozenset({b"yes"}))
    assert (r.status, r.batches, r.next_offset) == (PullStatus.NO_MATCHED_MSG, [], 25)
    r = store.read_queue(info, 0, 25, 100, 1 << 20, frozenset({b"yes"}))  # resumes there
    assert (r.status, r.batches, r.next_offset) == (PullStatus.NO_MATCHED_MSG, [], 50)


def test_reopen_recovers_the_next_offsets_from_the_last_batches(tmp_path: Path) -> None:
    s = Store(tmp_path / "s", map_size=64 << 20)
    info = _topic(s)
    s.write([ProduceOp(info, 0, _entries(7))]).settled()
    s.write([ProduceOp(info, 1, _entries(5))]).settled()
    with s.env.begin(write=True) as txn:  # stale statistics: the index's last keys win
        txn.drop(s.db[b"qstats"], delete=False)
        txn.delete(b"next_global", db=s.db[b"meta"])
    s.close()
    s = Store(tmp_path / "s", map_size=64 << 20)
    try:
        assert (s.queue_state(info.topic_id, 0).next_offset, s.queue_state(info.topic_id, 1).next_offset) == (7, 5)
        assert s.next_global == 12
        (a,) = s.write([ProduceOp(info, 0, _entries(1))]).settled()
        assert (a.first_global, a.first_queue) == (12, 7)
    finally:
        s.close()


def test_a_corrupt_batch_is_corrupt_record_naming_the_way_past(store: Store) -> None:
    info = _topic(store)
    store.write([ProduceOp(info, 0, _entries(4))]).settled()
    store.write([ProduceOp(info, 0, _entries(4, 4))]).settled()
    with store.env.begin(write=True) as txn:
        v = bytearray(txn.get(layout.global_key(4), db=store.db[b"messages"]))
        v[-1] ^= 0xFF  # the second batch's last record
        txn.put(layout.global_key(4), bytes(v), db=store.db[b"messages"])
    r = store.read_queue(info, 0, 0, 100, 1 << 20)  # the good batch first, stops before the bad
    assert [g for g, _v, _m in r.batches] == [0] and r.next_offset == 4
    with pytest.raises(CorruptRecord, match=r"offset 4: batch checksum mismatch.*--offset 4.*4\.\.7"):
        store.read_queue(info, 0, 4, 100, 1 << 20)
    assert store.read_queue(info, 0, 4, 100, 1 << 20, verify=False).batches  # the client checks
    with pytest.raises(CorruptRecord):
        store.get_queue_offset(info, 0, 6)
    for o in range(4, 8):
        store.write([SkipRecordOp("t", 0, o)]).settled()
    assert store.read_queue(info, 0, 4, 100, 1 << 20).status is PullStatus.NO_NEW_MESSAGE


def test_lookups_by_position_and_key_and_time(tmp_path: Path) -> None:
    now = [1_000]
    s = Store(tmp_path / "s", map_size=64 << 20, clock=lambda: now[0])
    try:
        info = _topic(s)
        s.write([ProduceOp(info, 0, _entries(5))]).settled()  # k0..k4 at 1000
        now[0] = 2_000
        s.write([ProduceOp(info, 1, _entries(3))]).settled()  # k0..k2 at 2000, globals 5..7
        hit = s.get_queue_offset(info, 1, 2)
        assert hit is not None and hit.global_offset == 7 and hit.message("t").key == "k2"
        g = s.get_global(3)
        assert g is not None and (g.global_base, g.index) == (0, 3)
        assert s.get_global(8) is None
        found = s.find_by_key(info, "k1", 10)
        assert [h.global_offset for h in found.hits] == [6, 1] and found.resume_before == 0
        assert [h.global_offset for h in s.find_by_key(info, "k1", 10, before=6).hits] == [1]
        assert s.find_by_key(info, "nope", 10).hits == []
        assert s.offset_for_time(info, 0, 0) == 0
        assert s.offset_for_time(info, 1, 1_500) == 0
        assert s.offset_for_time(info, 1, 2_001) == 3
    finally:
        s.close()


def test_a_corrupt_value_never_crashes_a_raw_reader(store: Store) -> None:
    info = _topic(store)
    store.write([ProduceOp(info, 0, _entries(2))]).settled()
    with store.env.begin(write=True) as txn:
        txn.put(layout.global_key(0), b"\x00" * 10, db=store.db[b"messages"])
    with pytest.raises(CorruptRecord, match="truncated"):
        store.read_queue(info, 0, 0, 10, 1 << 20)
    assert store.find_by_key(info, "k0", 5).hits == []
    assert isinstance(store.env, lmdb.Environment)


def test_due_messages_move_as_one_batch_per_queue(tmp_path: Path) -> None:
    now = [1_000]
    s = Store(tmp_path / "s", map_size=64 << 20, clock=lambda: now[0])
    try:
        info = _topic(s)
        due = [wire.encode_entry(Message(f"d{i}".encode(), key=f"k{i}", deliver_at=5_000 + i)) for i in range(6)]
        (ans,) = s.write([ProduceOp(info, 0, [*due[:4], wire.encode_entry(Message(b"now"))])]).settled()
        assert (ans.stored, ans.scheduled) == (1, 4)  # the one not delayed: a batch of its own
        s.write([ProduceOp(info, 1, due[4:])]).settled()
        now[0] = 10_000
        assert s.write([MoveDueOp()]).settled() == [6]
        with s.env.begin() as txn:
            assert txn.stat(s.db[b"messages"])["entries"] == 3  # "now", then one batch per queue
        msgs, _r = s.read_messages(info, 0, 0, 100)
        assert [(m.text, m.queue_offset, m.deliver_at) for m in msgs] == [
            ("now", 0, 0), ("d0", 1, 0), ("d1", 2, 0), ("d2", 3, 0), ("d3", 4, 0)
        ]
        assert [h.global_offset for h in s.find_by_key(info, "k5", 5).hits] == [s.next_global - 1]
    finally:
        s.close()


def test_the_batch_header_keeps_an_idempotent_producers_id_and_sequence(store: Store) -> None:
    info = _topic(store)
    pid = b"p" * 16
    store.write([ProduceOp(info, 0, _entries(2), pid, 0), ProduceOp(info, 0, _entries(3), pid, 2)]).settled()
    store.write([ProduceOp(info, 1, _entries(1), None, -1)]).settled()  # no producer: any sequence
    (dup,) = store.write([ProduceOp(info, 0, _entries(3), pid, 2)]).settled()
    assert dup.duplicate and dup.first_queue == 2
    r = store.read_queue(info, 0, 0, 100, 1 << 20)
    heads = [batches.stored_head(v) for _g, v, _m in r.batches]
    assert [(h.producer_id, h.base_sequence, h.base_offset) for h in heads] == [(pid, 0, 0), (pid, 2, 2)]
    (_g, v, _m), = store.read_queue(info, 1, 0, 100, 1 << 20).batches
    assert (batches.stored_head(v).producer_id, batches.stored_head(v).base_sequence) == (None, 0)


def test_a_key_that_is_not_utf8_refuses_the_request_and_stores_nothing(store: Store) -> None:
    info = _topic(store)
    bad = wire.pack_entry(b"b", key=b"\xff\xfe")
    (err,) = store.write([ProduceOp(info, 0, [*_entries(2), bad])]).settled()
    assert isinstance(err, InvalidMessage) and "message 2" in str(err)
    assert store.queue_state(info.topic_id, 0).next_offset == 0 and store.next_global == 0


def test_max_messages_cuts_a_masked_first_batch_at_its_last_delivered_record(store: Store) -> None:
    info = _topic(store)
    es = [wire.encode_entry(Message(f"m{i}".encode(), tags="a" if i % 3 == 0 else "b")) for i in range(12)]
    store.write([ProduceOp(info, 0, es)]).settled()
    r = store.read_queue(info, 0, 1, 2, 1 << 20, frozenset({b"a"}))  # tag a: offsets 3, 6, 9
    assert r.next_offset == 7 and r.batches[0][2] == bytes([0b01001000, 0])
    assert [m.queue_offset for m in messages_of("t", r.batches, 1, r.next_offset)] == [3, 6]


def test_a_damaged_last_batch_never_stops_the_store_from_opening(tmp_path: Path) -> None:
    s = Store(tmp_path / "s", map_size=64 << 20)
    info = _topic(s)
    s.write([ProduceOp(info, 0, _entries(3))]).settled()
    s.write([ProduceOp(info, 0, _entries(4, 3))]).settled()
    with s.env.begin(write=True) as txn:
        txn.put(layout.global_key(3), b"\x00" * 3, db=s.db[b"messages"])  # the log's last value, cut
    s.close()
    s = Store(tmp_path / "s", map_size=64 << 20)
    try:
        assert s.next_global == 7 and s.queue_state(info.topic_id, 0).next_offset == 7
        with pytest.raises(CorruptRecord, match="offset 3"):
            s.read_queue(info, 0, 3, 10, 1 << 20)
        (a,) = s.write([ProduceOp(info, 0, _entries(1))]).settled()
        assert (a.first_global, a.first_queue) == (7, 7)
    finally:
        s.close()


def test_a_damaged_queue_index_entry_is_corrupt_record(store: Store) -> None:
    info = _topic(store)
    store.write([ProduceOp(info, 0, _entries(3))]).settled()
    with store.env.begin(write=True) as txn:
        txn.put(layout.qindex_key(info.topic_id, 0, 0), b"\x01\x02", db=store.db[b"qindex"])
    with pytest.raises(CorruptRecord, match="queue-index entry of 2 bytes"):
        store.read_queue(info, 0, 0, 10, 1 << 20)
    with pytest.raises(CorruptRecord):
        store.get_queue_offset(info, 0, 1)


def test_a_damaged_queue_index_entry_after_good_batches_ends_the_answer_there(store: Store) -> None:
    """The good batches before a damaged index entry are answered (next offset: the
    damaged entry's); only a read starting at it is CORRUPT_RECORD, naming where. A
    read that failed as a whole would send every good record before it to the DLQ."""
    info = _topic(store)
    for _ in range(3):
        store.write([ProduceOp(info, 0, _entries(3))]).settled()
    with store.env.begin(write=True) as txn:
        txn.put(layout.qindex_key(info.topic_id, 0, 3), b"\x01\x02", db=store.db[b"qindex"])
    r = store.read_queue(info, 0, 1, 100, 1 << 20)
    assert r.next_offset == 3 and len(r.batches) == 1
    with pytest.raises(CorruptRecord, match="offset 3"):
        store.read_queue(info, 0, 3, 100, 1 << 20)
