"""The key index (``kindex``) in buckets of global offsets: lookups walk the
topic's buckets newest first, skip empty ones and resume where their budget ran
out; 16-bit hashes that collide are told apart by the key; retention takes a
batch's pairs with it (docs/storage.md, "The key index")."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue import Message, wire
from equeue.broker.storage import CreateTopicOp, ProduceOp, RetentionOp, ScanBudget, Store, layout
from equeue.control import TopicInfo

BUCKET = layout.KINDEX_BUCKET


def _topic(s: Store, name: str) -> TopicInfo:
    (info,) = s.write([CreateTopicOp(name, 2)]).settled()
    assert isinstance(info, TopicInfo)
    return info


def _put(s: Store, info: TopicInfo, n: int, key: str | None) -> list[int]:
    """``n`` messages with ``key`` on queue 0; their global offsets."""
    first = s.head.next_global
    entries = [wire.encode_entry(Message(b"m", key=key)) for _ in range(n)]
    for i in range(0, n, 500):
        s.write([ProduceOp(info, 0, entries[i : i + 500])]).settled()
    return list(range(first, first + n))


def _layout(tmp_path: Path, s: Store) -> tuple[TopicInfo, TopicInfo, list[int]]:
    """Topic ``a`` holds key "k" in buckets 0, 3 and 4 (1 and 2 hold only topic
    ``b``), with other keys between; returns the topics and the globals of "k"."""
    a, b = _topic(s, "a"), _topic(s, "b")
    hits = _put(s, a, 3, "k")
    _put(s, a, 5, "other")
    _put(s, b, 3 * BUCKET, "k")  # topic a's buckets 1 and 2 stay empty
    hits += _put(s, a, 2, "k")
    _put(s, a, BUCKET, None)
    hits += _put(s, a, 4, "k")
    assert len({g // BUCKET for g in hits}) == 3
    return a, b, hits


def _walk(s: Store, info: TopicInfo, key: str, limit: int, before: int = -1) -> tuple[list[int], int]:
    """Every hit by resuming until the walk is complete; how many calls it took."""
    got: list[int] = []
    calls = 0
    while True:
        calls += 1
        r = s.find_by_key(info, key, limit, before)
        got += [h.global_offset for h in r.hits]
        if not r.resume_before and len(r.hits) < limit:
            return got, calls
        nxt = r.resume_before or (got[-1] if got else 0)
        assert before < 0 or nxt < before, "a resumed walk must move down"
        before = nxt
        if before == 0:
            return got, calls


def test_a_lookup_walks_the_buckets_newest_first_and_honours_before(tmp_path: Path) -> None:
    s = Store(tmp_path, map_size=1 << 28, sync=False)
    try:
        a, b, hits = _layout(tmp_path, s)
        newest_first = sorted(hits, reverse=True)
        assert [h.global_offset for h in s.find_by_key(a, "k", 100).hits] == newest_first
        assert [h.global_offset for h in s.find_by_key(a, "k", 4).hits] == newest_first[:4]
        assert len(_walk(s, b, "k", 10_000)[0]) == 3 * BUCKET  # over the default budget: resumed
        assert s.find_by_key(a, "absent", 10).hits == []
        # before: mid-bucket, on a bucket's first offset, just past it, 0 and 1
        edges = {newest_first[1], (newest_first[-1] // BUCKET) * BUCKET + BUCKET}
        for g in hits:
            edges |= {g, g + 1, (g // BUCKET) * BUCKET, (g // BUCKET) * BUCKET + 1}
        for before in sorted(edges | {0, 1}):
            want = [g for g in newest_first if g < before]
            assert [h.global_offset for h in s.find_by_key(a, "k", 100, before).hits] == want, before
    finally:
        s.close()


def test_a_walk_over_many_buckets_stops_at_its_budget_and_resumes(tmp_path: Path) -> None:
    s = Store(tmp_path, map_size=1 << 28, sync=False)
    s.scan_budget = ScanBudget(records=2, seconds=60.0)
    try:
        a, _b, hits = _layout(tmp_path, s)
        first = s.find_by_key(a, "k", 100)
        assert first.resume_before and len(first.hits) == 2
        got, calls = _walk(s, a, "k", 100)
        assert got == sorted(hits, reverse=True) and calls > 3
    finally:
        s.close()


def _colliding_keys() -> tuple[str, str]:
    """Two keys with the same 16-bit index hash."""
    seen: dict[int, str] = {}
    i = 0
    while True:
        k = f"key-{i}"
        h = layout.kindex_hash(k.encode())
        if h in seen:
            return seen[h], k
        seen[h] = k
        i += 1


def test_keys_sharing_the_16_bit_hash_are_told_apart_by_the_key_itself(tmp_path: Path) -> None:
    s = Store(tmp_path, map_size=1 << 26, sync=False)
    try:
        a = _topic(s, "a")
        k1, k2 = _colliding_keys()
        g1 = _put(s, a, 3, k1)
        g2 = _put(s, a, 2, k2)
        assert [h.global_offset for h in s.find_by_key(a, k1, 100).hits] == sorted(g1, reverse=True)
        assert [h.global_offset for h in s.find_by_key(a, k2, 100).hits] == sorted(g2, reverse=True)
        assert all(h.message("a").key == k2 for h in s.find_by_key(a, k2, 100).hits)
    finally:
        s.close()


def test_the_key_index_costs_four_bytes_per_keyed_message_and_retention_takes_its_pairs(tmp_path: Path) -> None:
    now = [1_000]
    s = Store(tmp_path, map_size=1 << 26, sync=False, clock=lambda: now[0])
    try:
        a = _topic(s, "a")
        old = _put(s, a, 300, "k")
        _put(s, a, 10, None)
        now[0] = 100_000
        new = _put(s, a, 5, "k")
        with s.env.begin() as txn:
            (v,) = [bytes(v) for _k, v in txn.cursor(db=s.db[b"kindex"])]
        assert len(v) == 4 * (len(old) + len(new))  # one bucket: 4 bytes per keyed message
        s.write([RetentionOp(default_retention_ms=50_000, default_retention_bytes=None)]).settled()
        assert s.queue_state(a.topic_id, 0).min_offset == 310
        with s.env.begin() as txn:
            (v,) = [bytes(v) for _k, v in txn.cursor(db=s.db[b"kindex"])]
        assert len(v) == 4 * len(new)
        assert [h.global_offset for h in s.find_by_key(a, "k", 100).hits] == sorted(new, reverse=True)
    finally:
        s.close()


def test_a_replicated_format2_store_converted_on_open_empties_its_log(tmp_path: Path) -> None:
    """Its log's entries carry format-2 values: a follower that has not applied them
    must copy the store rather than apply them."""
    data = tmp_path / "data"
    data.mkdir()
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "store_format2" / "data.mdb.gz"
    with gzip.open(fixture, "rb") as src, open(data / "data.mdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    s = Store(data, map_size=1 << 28, sync=False, replicated=True)
    try:
        assert s.replication.log_start == s.replication.position
        s.replication.publish_all()
        info = s.topics["orders"]
        assert s.find_by_key(info, "cust-003", 100).hits
        hits = _put(s, info, 3, "fresh")
        s.replication.publish_all()
        assert [h.global_offset for h in s.find_by_key(info, "fresh", 100).hits] == sorted(hits, reverse=True)
    finally:
        s.close()


def test_a_store_of_an_unknown_format_is_still_refused(tmp_path: Path) -> None:
    Store(tmp_path, map_size=1 << 26, sync=False).close()
    env = lmdb.open(str(tmp_path), max_dbs=20, map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"format", layout.pack_u32(layout.FORMAT_VERSION + 1), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(Exception, match="has format"):
        Store(tmp_path, map_size=1 << 26, sync=False)


u16 = st.integers(0, (1 << 16) - 1)


@given(tid=st.integers(0, (1 << 32) - 1), bucket=st.integers(0, (1 << 32) - 1),
       pairs=st.lists(st.tuples(u16, st.integers(0, layout.KINDEX_BUCKET - 1)), max_size=50))  # fmt: skip
def test_key_index_values_decode_to_what_they_encode(tid: int, bucket: int, pairs: list[tuple[int, int]]) -> None:
    k = layout.kindex_key(tid, bucket)
    assert layout.kindex_bucket(k) == bucket and k.startswith(layout.topic_prefix(tid))
    hashes, offs = [h for h, _o in pairs], [o for _h, o in pairs]
    v = layout.pack_kindex_value(hashes, offs)
    assert v == b"".join(layout.KINDEX_PAIR.pack(h, o) for h, o in pairs)
    assert v == layout.kindex_pairs(hashes, [bucket * layout.KINDEX_BUCKET + o for o in offs])
    got_h, got_o = layout.unpack_kindex_value(v)
    assert (list(got_h), list(got_o)) == (hashes, offs)
