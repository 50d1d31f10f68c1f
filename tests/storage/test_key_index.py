"""The key index (``kindex``) in buckets of global offsets: lookups walk the
topic's buckets newest first, skip empty ones and resume where their budget ran
out; a store of format 1 (no buckets) is converted when opened, also when an
earlier conversion was cut short (docs/storage.md, "The key index")."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue import Message, wire
from equeue.broker.storage import CreateTopicOp, ProduceOp, ScanBudget, Store, layout
from equeue.broker.storage import store as store_module
from equeue.control import TopicInfo
from equeue.routing import key_hash

BUCKET = 1 << layout.KINDEX_BUCKET_BITS
_V1 = struct.Struct(">IIQ")


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
    assert len({g >> layout.KINDEX_BUCKET_BITS for g in hits}) == 3
    return a, b, hits


def _walk(s: Store, info: TopicInfo, key: str, limit: int, before: int = -1) -> tuple[list[int], int]:
    """Every hit by resuming until the walk is complete; how many calls it took."""
    got: list[int] = []
    calls = 0
    while True:
        calls += 1
        r = s.find_by_key(info, key, limit, before)
        got += [g for g, _ in r.hits]
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
        assert [g for g, _ in s.find_by_key(a, "k", 100).hits] == newest_first
        assert [g for g, _ in s.find_by_key(a, "k", 4).hits] == newest_first[:4]
        assert len(_walk(s, b, "k", 10_000)[0]) == 3 * BUCKET  # over the default budget: resumed
        assert s.find_by_key(a, "absent", 10).hits == []
        # before: mid-bucket, on a bucket's first offset, just past it, 0 and 1
        edges = {newest_first[1], (newest_first[-1] >> layout.KINDEX_BUCKET_BITS) * BUCKET + BUCKET}
        for g in hits:
            edges |= {g, g + 1, (g >> layout.KINDEX_BUCKET_BITS) * BUCKET, (g >> layout.KINDEX_BUCKET_BITS) * BUCKET + 1}
        for before in sorted(edges | {0, 1}):
            want = [g for g in newest_first if g < before]
            assert [g for g, _ in s.find_by_key(a, "k", 100, before).hits] == want, before
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


def test_a_key_index_without_buckets_is_converted_when_the_store_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Written by this code, then rewritten by hand to format 1 (its key index as
    that format stored it: topic | crc32 | global); the first half only, so part of
    the index is already converted, as after a conversion cut short."""
    s = Store(tmp_path, map_size=1 << 28, sync=False)
    a, b, hits = _layout(tmp_path, s)
    before = {(t.name, k): _walk(s, t, k, 10_000)[0] for t in (a, b) for k in ("k", "other")}
    keys = s.head.next_global
    s.close()

    env = lmdb.open(str(tmp_path), max_dbs=20, map_size=1 << 28)
    with env.begin(write=True) as txn:
        kdb, meta = env.open_db(b"kindex", txn=txn), env.open_db(b"meta", txn=txn)
        new = [bytes(k) for k in txn.cursor(db=kdb).iternext(values=False)]
        assert all(len(k) == 20 for k in new) and len(new) > 3 * BUCKET
        for k in new[: len(new) // 2]:
            tid, _bucket, h, g = struct.unpack(">IIIQ", k)
            txn.delete(k, db=kdb)
            txn.put(_V1.pack(tid, h, g), b"", db=kdb)
        txn.put(b"format", layout.pack_u32(layout.FORMAT_UNBUCKETED), db=meta)
    env.close()

    monkeypatch.setattr(store_module, "_CONVERT_CHUNK", 700)  # several transactions
    monkeypatch.setattr(store_module, "_CONVERT_PROGRESS_EVERY", 0.0)  # a progress line after each
    with caplog.at_level(logging.WARNING, logger="equeue.store"):
        s = Store(tmp_path, map_size=1 << 28, sync=False)
    said = [r.getMessage() for r in caplog.records]
    assert f"up to {len(new)} keys" in said[0] and "converting" in said[0]
    assert any(" of up to " in m for m in said[1:-1]) and "was converted" in said[-1]
    try:
        with s.env.begin() as txn:
            assert layout.unpack_u32(txn.get(b"format", db=s.db[b"meta"])) == layout.FORMAT_VERSION
            assert sorted(bytes(k) for k in txn.cursor(db=s.db[b"kindex"]).iternext(values=False)) == sorted(new)
        after = {(t.name, k): _walk(s, t, k, 10_000)[0] for t in (a, b) for k in ("k", "other")}
        assert after == before and after[("a", "k")] == sorted(hits, reverse=True)
        assert key_hash(b"k") != key_hash(b"other")
        [g] = _put(s, a, 1, "k")  # and it goes on being indexed
        assert g >= keys and s.find_by_key(a, "k", 1).hits[0][0] == g
    finally:
        s.close()


def test_a_replicated_store_converted_on_open_empties_its_log(tmp_path: Path) -> None:
    """Its log entries name key-index keys of format 1: a follower that has not
    applied them must copy the store rather than apply them."""
    s = Store(tmp_path, map_size=1 << 28, sync=False, replicated=True)
    info = _topic(s, "a")
    hits = _put(s, info, 10, "k")
    s.replication.publish_all()
    assert s.replication.log_start < s.replication.position
    s.close()
    env = lmdb.open(str(tmp_path), max_dbs=20, map_size=1 << 28)
    with env.begin(write=True) as txn:
        kdb, meta = env.open_db(b"kindex", txn=txn), env.open_db(b"meta", txn=txn)
        for k in [bytes(k) for k in txn.cursor(db=kdb).iternext(values=False)]:
            tid, _bucket, h, g = struct.unpack(">IIIQ", k)
            txn.delete(k, db=kdb)
            txn.put(_V1.pack(tid, h, g), b"", db=kdb)
        txn.put(b"format", layout.pack_u32(layout.FORMAT_UNBUCKETED), db=meta)
    env.close()

    s = Store(tmp_path, map_size=1 << 28, sync=False, replicated=True)
    try:
        assert s.replication.log_start == s.replication.position  # emptied: readers of the old entries copy the store
        s.replication.publish_all()
        assert [g for g, _ in s.find_by_key(info, "k", 100).hits] == sorted(hits, reverse=True)
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


u32 = st.integers(0, (1 << 32) - 1)


@given(tid=u32, h=u32, g=st.integers(0, (1 << 42) - 1 - 4 * 700), hashes=st.lists(u32, min_size=1, max_size=5))
def test_key_index_keys_decode_to_what_they_encode_and_sort_by_bucket(tid: int, h: int, g: int, hashes: list[int]) -> None:
    k = layout.kindex_key(tid, h, g)
    assert layout.kindex_global(k) == g and layout.kindex_bucket(k) == g >> layout.KINDEX_BUCKET_BITS
    assert k.startswith(layout.kindex_prefix(tid, g >> layout.KINDEX_BUCKET_BITS, h))
    assert k.startswith(layout.kindex_bucket_start(tid, g >> layout.KINDEX_BUCKET_BITS))
    assert layout.kindex_from_v1(_V1.pack(tid, h, g)) == k
    gs = [g + i * 700 for i in range(len(hashes))]
    assert list(layout.kindex_keys(tid, hashes, gs)) == [layout.kindex_key(tid, x, y) for x, y in zip(hashes, gs, strict=True)]
    # an older bucket sorts first whatever the hash: the walk goes bucket by bucket
    if g >= 1 << layout.KINDEX_BUCKET_BITS:
        older = layout.kindex_key(tid, (1 << 32) - 1, g - (1 << layout.KINDEX_BUCKET_BITS))
        assert older < layout.kindex_key(tid, 0, g)
