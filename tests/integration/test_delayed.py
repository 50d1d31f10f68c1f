"""Delayed delivery, broker side: scheduled in the ack's transaction, moved into the
queue at its due time (never early), in order of due time, exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import trio

from equeue import Message, PullStatus, wire
from equeue.broker import Broker, open_broker
from equeue.broker import server as server_mod
from equeue.broker.lifecycle import Lifecycle
from equeue.broker.longpoll import ParkedPulls
from equeue.client import AsyncClient
from equeue.errors import DelayTooLong
from tests.conftest import make_config


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delayed(body: str, due_ms: int, key: str | None = None) -> bytes:
    return wire.encode_entry(Message(body, key=key, deliver_at=due_ms))


async def pull_all(c: AsyncClient, topic: str, queue: int, want: int, hold_ms: int = 2000) -> list[Message]:
    """Long-poll ``queue`` from offset 0 until ``want`` messages arrived."""
    got: list[Message] = []
    offset = 0
    while len(got) < want:
        r = await c.pull(wire.PullRequest(topic, queue, offset, 1000, max_wait_ms=hold_ms))
        assert r.status in (PullStatus.FOUND, PullStatus.NO_NEW_MESSAGE)
        got += r.messages
        offset = r.next_offset
    return got


async def test_delayed_delivered_at_due_time(broker: Broker) -> None:
    with trio.fail_after(15):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("d", 1)
            due = now_ms() + 800
            ans = await c.produce(wire.ProduceRequest("d", 0, [delayed("later", due)]))
            assert (ans.stored, ans.scheduled, ans.first_global, ans.first_queue) == (0, 1, -1, -1)
            desc = await c.describe_topic("d")
            assert desc.pending_delayed == 1
            assert desc.queues[0].max_offset == 0  # not in the queue yet
            r = await c.pull(wire.PullRequest("d", 0, 0, 10, max_wait_ms=0))
            assert r.status is PullStatus.NO_NEW_MESSAGE
            [m] = await pull_all(c, "d", 0, 1, hold_ms=3000)
            arrived = now_ms()
            assert m.text == "later"
            assert m.timestamp >= due  # never early
            # generous bound (the 100 ms figure is measured by bench/bench_delayed.py)
            assert m.timestamp - due < 1000 and arrived - due < 1500
            assert (await c.describe_topic("d")).pending_delayed == 0
            assert broker.lifecycle.moved == 1


async def test_move_is_counted_before_the_moved_message_is_visible(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread answers a parked pull right after the move's commit,
    before the loop hears of the commit. ``lifecycle.moved`` must already count the
    move then. The writer thread is held just after it answered, so the check runs
    while the loop has not yet received the move's outcome."""
    holding = threading.Event()  # the writer thread answers the parked pull ...
    release = threading.Event()  # ... then waits for this before posting the outcome
    answer = server_mod.answer_parked_pulls

    def answer_then_hold(parked: ParkedPulls, queues: Iterable[tuple[int, int]]) -> None:
        hold = bool(queues) and not release.is_set()
        if hold:
            holding.set()
        answer(parked, queues)
        if hold:
            release.wait(10)

    monkeypatch.setattr(server_mod, "answer_parked_pulls", answer_then_hold)
    try:
        with trio.fail_after(15):
            async with AsyncClient(broker.address) as c:
                await c.create_topic("d", 1)
                await c.produce(wire.ProduceRequest("d", 0, [delayed("later", now_ms() + 300)]))
                [m] = await pull_all(c, "d", 0, 1, hold_ms=3000)
                assert holding.is_set() and not release.is_set()  # the outcome is still held
                assert m.text == "later"
                assert broker.lifecycle.moved == 1
                assert broker.lifecycle.move_transactions == 1
    finally:
        release.set()


async def test_order_of_due_time_and_mixed_batch(broker: Broker) -> None:
    with trio.fail_after(15):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("d", 1)
            base = now_ms() + 600
            # produced in reverse due order, mixed with immediate messages in one batch
            entries = [delayed(f"d{i}", base + 40 * i) for i in reversed(range(10))]
            entries.insert(3, wire.encode_entry(Message("now-a")))
            entries.append(wire.encode_entry(Message("now-b")))
            ans = await c.produce(wire.ProduceRequest("d", 0, entries))
            assert (ans.stored, ans.scheduled, ans.first_queue) == (2, 10, 0)
            got = await pull_all(c, "d", 0, 12)
            assert [m.text for m in got] == ["now-a", "now-b"] + [f"d{i}" for i in range(10)]
            stamps = [m.timestamp for m in got[2:]]
            assert stamps == sorted(stamps)
            for i, m in enumerate(got[2:]):
                assert m.timestamp >= base + 40 * i


async def test_same_due_time_keeps_produce_order(broker: Broker) -> None:
    with trio.fail_after(15):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("d", 2)
            due = now_ms() + 500
            for q in (0, 1):
                for chunk in range(3):
                    batch = [delayed(f"q{q}-{chunk * 100 + i}", due) for i in range(100)]
                    await c.produce(wire.ProduceRequest("d", q, batch))
            for q in (0, 1):
                got = await pull_all(c, "d", q, 300)
                assert [m.text for m in got] == [f"q{q}-{i}" for i in range(300)]


async def test_delay_limit_and_keys_of_delayed(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data", max_delay=60.0)
    with trio.fail_after(15):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("d", 1)
            with pytest.raises(DelayTooLong):
                await c.produce(wire.ProduceRequest("d", 0, [delayed("x", now_ms() + 120_000)]))
            assert (await c.describe_topic("d")).pending_delayed == 0
            # a delayed message is indexed by key once it is delivered
            await c.produce(wire.ProduceRequest("d", 0, [delayed("k", now_ms() + 300, key="K1")]))
            assert (await c.find_by_key("d", "K1")).messages == []
            await pull_all(c, "d", 0, 1)
            assert [m.text for m in (await c.find_by_key("d", "K1")).messages] == ["k"]


async def test_burst_moves_in_bounded_batches_without_stalling_produce(tmp_path: Path) -> None:
    """20,000 due at the same ms are moved in transactions of at most move_batch;
    an ordinary produce issued during the burst is answered long before it ends."""
    n, batch = 20_000, 500
    with trio.fail_after(60):
        async with open_broker(make_config(tmp_path / "data")) as b, AsyncClient(b.address) as c:
            b.lifecycle.move_batch = batch
            await c.create_topic("burst", 1)
            await c.create_topic("live", 1)
            due = now_ms() + 1500
            for start in range(0, n, 2000):
                await c.produce(
                    wire.ProduceRequest("burst", 0, [delayed(str(i), due) for i in range(start, start + 2000)])
                )
            assert (await c.describe_topic("burst")).pending_delayed == n
            await trio.sleep(max(0.0, (due - now_ms()) / 1000) + 0.005)
            # produce while the burst is being moved
            t0 = trio.current_time()
            await c.produce(wire.ProduceRequest("live", 0, [wire.encode_entry(Message("hi"))]))
            produce_latency = trio.current_time() - t0
            got = await pull_all(c, "burst", 0, n)
            assert [int(m.text) for m in got] == list(range(n))
            assert b.lifecycle.moved == n  # counted in the commit that made them visible
            assert b.lifecycle.move_transactions >= n // batch
            assert (await c.describe_topic("burst")).pending_delayed == 0
            assert produce_latency < 5.0  # generous: it rides in the next move's transaction


async def test_lifecycle_move_due_is_noop_when_nothing_due(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("d", 1)
            await c.produce(wire.ProduceRequest("d", 0, [delayed("x", now_ms() + 60_000)]))
            lc: Lifecycle = broker.lifecycle
            tx = broker.store.transactions
            assert await lc.move_due() == 0
            assert broker.store.transactions == tx  # read-only: no empty commit
            assert (await c.describe_topic("d")).pending_delayed == 1


def test_move_drops_malformed_and_deleted_topic_entries(tmp_path: Path) -> None:
    """Store level: one bad schedule entry never blocks the others (and never half-commits)."""
    from equeue.broker.storage import (
        CreateTopicOp,
        DeleteTopicOp,
        MoveDueOp,
        ProduceOp,
        Store,
        layout,
        messages_of,
    )

    wall = [now_ms()]
    store = Store(tmp_path / "s", map_size=1 << 28, clock=lambda: wall[0])
    try:
        keep, gone = store.write([CreateTopicOp("keep", 1), CreateTopicOp("gone", 1)]).settled()
        due = now_ms() + 200
        store.write([
            ProduceOp(keep, 0, [delayed("a", due), delayed("b", due + 1)]),
            ProduceOp(gone, 0, [delayed("x", due)]),
        ])  # fmt: skip
        with store.env.begin(write=True) as txn:  # a truncated entry, due first
            txn.put(layout.schedule_key(due - 1, 1), layout.schedule_target(keep.topic_id, 0) + b"\x00\x00\x00\x30junk", db=store.db[b"schedule"])
            # a key that is not UTF-8 (an earlier version scheduled it unchecked): moving it
            # would fail the whole move, and every due message after it, for ever
            bad_key = wire.pack_entry(b"k", key=b"\xff\xfe", deliver_at=due)
            txn.put(layout.schedule_key(due - 1, 2), layout.schedule_target(keep.topic_id, 0) + bad_key, db=store.db[b"schedule"])
        store.write([DeleteTopicOp("gone")])
        assert store.write([MoveDueOp()]).settled() == [0]  # not due yet
        wall[0] += 250
        assert store.write([MoveDueOp(limit=3)]).settled() == [3]  # junk, the bad key (dropped) + "a"
        assert store.write([MoveDueOp()]).settled() == [2]  # "x" (dropped) + "b"
        assert store.next_due() is None
        r = store.read_queue(keep, 0, 0, 10, 1 << 20)
        assert [m.text for m in messages_of("keep", r.batches)] == ["a", "b"]
        assert store.pending_delayed(keep.topic_id) == 0
    finally:
        store.close()


def test_due_messages_move_in_batches_a_pull_can_carry(tmp_path: Path) -> None:
    """Many large delayed messages of one queue come due together: they are stored as
    several batches of at most about 1 MiB, never as one batch above what a pull
    answer can carry (the frame cap)."""
    from equeue.broker.storage import CreateTopicOp, MoveDueOp, ProduceOp, Store

    wall = [now_ms()]
    store = Store(tmp_path / "s", map_size=1 << 28, clock=lambda: wall[0])
    try:
        (t,) = store.write([CreateTopicOp("big", 1)]).settled()
        due = now_ms() + 100
        body = "x" * (600 << 10)
        store.write([ProduceOp(t, 0, [delayed(body, due) for _ in range(5)])])
        wall[0] += 200
        assert store.write([MoveDueOp()]).settled() == [5]
        r = store.read_queue(t, 0, 0, 10, 1 << 30)
        sizes = [len(value) for _g, value, _mask in r.batches]
        assert len(sizes) == 5 and max(sizes) < 1 << 20  # 600 KiB each: one per batch
    finally:
        store.close()
