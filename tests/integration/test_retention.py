"""Retention: time, size and delete-consumed limits delete only what they should, whole
batches from the head of each queue, in bounded transactions; a pull below the retained range
answers OFFSET_TOO_SMALL with the valid range. Also producer-state expiry."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, PullStatus, wire
from equeue.broker import Broker, open_broker
from equeue.broker.storage import layout
from equeue.client import AsyncClient
from equeue.errors import MessageNotFound
from tests.conftest import make_config


def batch(prefix: str, n: int, size: int = 0) -> list[bytes]:
    return [wire.encode_entry(Message(f"{prefix}{i}".encode() + b"." * size, key=f"{prefix}{i}")) for i in range(n)]


async def produce(c: AsyncClient, topic: str, queue: int, entries: list[bytes], **kw: Any) -> wire.ProduceResponse:
    return await c.produce(wire.ProduceRequest(topic, queue, entries, **kw))


def step_clock(b: Broker) -> list[int]:
    """Give ``b``'s store a wall clock the test steps: ``wall[0] += ms``."""
    wall = [time.time_ns() // 1_000_000]
    b.store.clock = lambda: wall[0]
    return wall


async def test_time_retention_deletes_only_old_and_pull_below_range(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "data")) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            await c.create_topic("t", 2)
            await c.create_topic("keep", 1)
            for q in (0, 1):
                await produce(c, "t", q, batch(f"old{q}-", 30))
            await produce(c, "keep", 0, batch("k", 5))
            wall[0] += 1600
            for q in (0, 1):
                await produce(c, "t", q, batch(f"new{q}-", 20))
            before = await c.describe_topic("t")
            await c.alter_topic("t", retention_ms=800)  # "keep" stays on the 72 h default
            removed = await b.lifecycle.enforce_retention()
            assert removed == 60
            d = await c.describe_topic("t")
            for q in (0, 1):
                qs = d.queues[q]
                assert (qs.min_offset, qs.max_offset, qs.count) == (30, 50, 20)
                assert 0 < qs.bytes < before.queues[q].bytes
                r = await c.pull(wire.PullRequest("t", q, 0, 100))
                assert r.status is PullStatus.OFFSET_TOO_SMALL
                assert (r.min_offset, r.max_offset, r.next_offset) == (30, 50, 30)
                assert r.messages == []
                r = await c.pull(wire.PullRequest("t", q, 29, 100))
                assert r.status is PullStatus.OFFSET_TOO_SMALL
                r = await c.pull(wire.PullRequest("t", q, 30, 100))
                assert r.status is PullStatus.FOUND
                assert [m.text for m in r.messages] == [f"new{q}-{i}" for i in range(20)]
            # index entries went with the messages
            assert (await c.find_by_key("t", "old0-3")).messages == []
            assert [m.text for m in (await c.find_by_key("t", "new0-3")).messages] == ["new0-3"]
            with pytest.raises(MessageNotFound):
                await c.get_message("t", queue_id=0, queue_offset=29)
            with pytest.raises(MessageNotFound):
                await c.get_message("t", global_offset=0)
            assert (await c.describe_topic("keep")).queues[0].count == 5
            # nothing more to delete: a second pass is a no-op
            assert await b.lifecycle.enforce_retention() == 0


async def test_size_retention_oldest_first_across_queues(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "data")) as b, AsyncClient(b.address) as c:
            await c.create_topic("s", 3)
            await c.create_topic("other", 1)
            order: list[tuple[int, int]] = []  # (queue, queue offset) in global order
            for round_ in range(10):
                for q in (0, 1, 2):
                    ans = await produce(c, "s", q, batch(f"r{round_}q{q}-", 1, size=200))
                    order.append((q, ans.first_queue))
            await produce(c, "other", 0, batch("o", 10, size=200))
            d0 = await c.describe_topic("s")
            per_msg = d0.store_bytes // 30
            limit = per_msg * 12 + per_msg // 2  # room for 12 messages
            await c.alter_topic("s", retention_bytes=limit)
            removed = await b.lifecycle.enforce_retention()
            assert removed == 18
            d = await c.describe_topic("s")
            assert d.store_bytes <= limit
            kept = set(order[18:])
            for q in (0, 1, 2):
                qs = d.queues[q]
                # contiguous tail per queue: exactly the messages produced last
                assert {(q, o) for o in range(qs.min_offset, qs.max_offset)} == {k for k in kept if k[0] == q}
            assert (await c.describe_topic("other")).queues[0].count == 10
            # per-topic override back to the broker default (unlimited): nothing more goes
            assert (await c.alter_topic("s", reset=["retention_bytes"])).retention_bytes is None
            await produce(c, "s", 0, batch("x", 20, size=200))
            assert await b.lifecycle.enforce_retention() == 0


async def test_broker_wide_size_limit_applies_per_topic(tmp_path: Path) -> None:
    with trio.fail_after(20):
        cfg = make_config(tmp_path / "data", retention_bytes=20_000)
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            for t in ("a", "b"):
                await c.create_topic(t, 1)
                for i in range(10):  # retention deletes whole batches: ten of ~4.2 kB
                    await produce(c, t, 0, batch(f"{t}{i}-", 10, size=400))
            await c.create_topic("big", 1, retention_bytes=1 << 30)
            await produce(c, "big", 0, batch("big", 100, size=400))
            await b.lifecycle.enforce_retention()
            for t in ("a", "b"):
                d = await c.describe_topic(t)
                assert 20_000 - 4_500 < d.store_bytes <= 20_000
                assert d.queues[0].max_offset == 100
            assert (await c.describe_topic("big")).queues[0].count == 100


async def test_retention_runs_in_bounded_transactions(tmp_path: Path) -> None:
    with trio.fail_after(30):
        cfg = make_config(tmp_path / "data", retention_batch=100)
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            await c.create_topic("t", 1, retention_ms=1)
            for _ in range(25):  # batches of 50: two per transaction
                await produce(c, "t", 0, batch("m", 50))
            wall[0] += 50
            tx = b.store.transactions
            assert await b.lifecycle.enforce_retention() == 1250
            assert b.store.transactions - tx >= 13  # ceil(1250 / 100), never one big txn
            d = await c.describe_topic("t")
            assert (d.queues[0].min_offset, d.queues[0].max_offset, d.queues[0].bytes) == (1250, 1250, 0)
            # the queue keeps counting from where it was
            ans = await produce(c, "t", 0, batch("n", 1))
            assert ans.first_queue == 1250


async def test_retention_state_survives_restart(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data")
    with trio.fail_after(20):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("t", 1)
            await c.create_topic("empty", 1, retention_bytes=1)
            for i in range(10):  # retention deletes whole batches
                await produce(c, "t", 0, batch(f"m{i}-", 5, size=100))
            await produce(c, "empty", 0, batch("e", 5))
            per_msg = (await c.describe_topic("t")).store_bytes // 50
            await c.alter_topic("t", retention_bytes=per_msg * 20 + per_msg // 2)
            assert await b.lifecycle.enforce_retention() == 30 + 5
            d = await c.describe_topic("t")
            assert (d.queues[0].min_offset, d.queues[0].max_offset) == (30, 50)
            kept_bytes = d.store_bytes
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            d = await c.describe_topic("t")
            assert (d.queues[0].min_offset, d.queues[0].max_offset, d.store_bytes) == (30, 50, kept_bytes)
            r = await c.pull(wire.PullRequest("t", 0, 10, 10))
            assert (r.status, r.min_offset, r.max_offset) == (PullStatus.OFFSET_TOO_SMALL, 30, 50)
            e = (await c.describe_topic("empty")).queues[0]
            assert (e.min_offset, e.max_offset, e.bytes) == (5, 5, 0)  # emptied, offsets kept
            assert (await produce(c, "empty", 0, batch("e", 1))).first_queue == 5


async def test_delete_consumed(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data", delete_consumed=True)
    with trio.fail_after(20):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("t", 3)
            for q in (0, 1, 2):
                for i in range(10):  # batches of one: consumed record by record
                    await produce(c, "t", q, batch(f"q{q}-{i}-", 1))
            assert await b.lifecycle.enforce_retention() == 0  # no group: nothing consumed
            await c.commit_offset("g1", "t", 0, 7)
            await c.commit_offset("g2", "t", 0, 4)
            await c.commit_offset("g1", "t", 1, 9)  # g2 has no offset on queue 1: protects it
            await c.commit_offset("g1", "t", 2, 10)
            await c.commit_offset("g2", "t", 2, 10)
            assert await b.lifecycle.enforce_retention() == 14
            d = await c.describe_topic("t")
            assert [(q.min_offset, q.max_offset) for q in d.queues] == [(4, 10), (0, 10), (10, 10)]


async def test_delete_consumed_off_by_default(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            await produce(c, "t", 0, batch("m", 10))
            await c.commit_offset("g", "t", 0, 10)
            assert await broker.lifecycle.enforce_retention() == 0
            assert (await c.describe_topic("t")).queues[0].count == 10


async def test_deleted_topic_data_is_purged(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data", retention_batch=40)
    with trio.fail_after(20):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("gone", 2)
            await c.create_topic("stay", 1)
            for q in (0, 1):
                await produce(c, "gone", q, batch("g", 50))
            await produce(c, "stay", 0, batch("s", 5))
            await c.delete_topic("gone")
            assert b.store.deleting
            with pytest.raises(MessageNotFound):  # still on disk, but its topic is gone
                await c.get_message("gone", global_offset=0)
            await b.lifecycle.enforce_retention()
            assert b.store.deleting == ()
            with b.store.env.begin() as txn:
                assert txn.stat(b.store.db[b"messages"])["entries"] == 1  # stay's one batch
                assert txn.stat(b.store.db[b"kindex"])["entries"] == 1  # and its one key-index bucket
            assert (await c.describe_topic("stay")).queues[0].count == 5


async def test_producer_state_expiry(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    import equeue.broker.lifecycle as lifecycle_mod

    wall = step_clock(broker)
    with trio.fail_after(15):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            pids = [os.urandom(16) for _ in range(25)]
            for pid in pids:
                await produce(c, "t", 0, batch("m", 1), producer_id=pid, base_sequence=0)
            db = broker.store.db[b"producers"]
            with broker.store.env.begin() as txn:
                assert txn.stat(db)["entries"] == 25
            lc = broker.lifecycle
            assert await lc.expire_producers() == 0  # all fresh (default TTL 7 days)
            monkeypatch.setattr(lifecycle_mod, "PRODUCER_EXPIRY_BATCH", 4)  # several transactions
            wall[0] += 60_000
            # a producer seen just now is kept
            await produce(c, "t", 0, batch("m", 1), producer_id=pids[0], base_sequence=1)
            assert await lc.expire_producers(ttl=30) == 24
            with broker.store.env.begin() as txn:
                keys = [bytes(k) for k, _ in txn.cursor(db=db)]
            assert keys == [layout.producer_key(pids[0], broker.store.topic("t").topic_id, 0)]
            # an expired producer starts over: its sequence 0 is new again, not a duplicate
            ans = await produce(c, "t", 0, batch("again", 1), producer_id=pids[1], base_sequence=0)
            assert (ans.stored, ans.duplicate) == (1, False)
