"""Kafka-style consuming calls against a real broker (docs/consumer.md, "Polling",
"Commits", "Seeking", "Manual assignment"): ``poll`` on both fronts, commit-on-poll,
``commit_async``, ``seek`` back and forward, ``assign`` without a group, and the error
for mixing ``poll`` with ``run`` or iteration."""

from __future__ import annotations

import threading
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import EmbeddedBroker, open_broker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.errors import ConfigError, EQueueError
from tests.conftest import make_config, wait_until, wait_until_sync

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=0.5,
)  # fmt: skip


def entries(prefix: str, n: int, start: int = 0) -> list[bytes]:
    return [wire.encode_entry(Message(f"{prefix}{i}")) for i in range(start, start + n)]


async def produce(c: AsyncClient, topic: str, queue: int, prefix: str, n: int, start: int = 0) -> None:
    await c.produce(wire.ProduceRequest(topic, queue, entries(prefix, n, start)))


def poll_until(con: Consumer, n: int, max_messages: int = 500) -> list[Message]:
    """Poll until ``n`` messages came (AssertionError after 10 s)."""
    out: list[Message] = []
    deadline = time.monotonic() + 10
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} messages"
        out += con.poll(1.0, max_messages=min(max_messages, n - len(out)))
    return out


# ---------------------------------------------------------------------- poll
def test_sync_poll_returns_a_batch_and_empty_after_the_timeout(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("pe", 1)
        c.create_topic("pf", 1)
        c.produce(wire.ProduceRequest("pf", 0, entries("m", 10)))
    with Consumer(addr, "gpe", "pe", start_from="earliest", **FAST) as con:
        con.start()
        t0 = time.monotonic()
        assert con.poll(0.3) == []  # an empty topic: [] once the timeout passed
        assert time.monotonic() - t0 >= 0.29
        with pytest.raises(ConfigError):
            con.poll(-1)
        with pytest.raises(ConfigError):
            con.poll(1, max_messages=0)
    with Consumer(addr, "gpf", "pf", start_from="earliest", **FAST) as con:
        got = poll_until(con, 10, max_messages=4)
        assert [m.text for m in got] == [f"m{i}" for i in range(10)]
        assert con.poll(0) == []
    assert con.poll(1) == []  # closed: nothing


async def test_async_poll_batch_and_cancel_scope(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("ap", 1)
                async with AsyncConsumer(b.address, "gap", "ap", start_from="earliest", **FAST) as con:
                    with trio.move_on_after(0.3) as scope:
                        await con.poll()
                    assert scope.cancelled_caught  # nothing came: the caller's scope ends the wait
                    await produce(c, "ap", 0, "a", 6)
                    got: list[Message] = []
                    while len(got) < 6:
                        batch = await con.poll(max_messages=4)
                        assert 1 <= len(batch) <= 4
                        got += batch
                    assert [m.text for m in got] == [f"a{i}" for i in range(6)]
                    con.stop()
                    assert await con.poll() == []  # stopped: [] at once


# ---------------------------------------------------------------------- commits
async def test_commit_on_poll_and_commit_async(tmp_path: Path) -> None:
    """What a poll returned is done at the next poll (not before); commit_async commits
    it without waiting; a second member starts after what the first had polled."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(40):
            async with AsyncClient(b.address) as c:
                await c.create_topic("cp", 1)
                await produce(c, "cp", 0, "m", 10)
                slow = dict(FAST, commit_interval=3600.0)  # only explicit commits (and the close)
                async with AsyncConsumer(b.address, "gcp", "cp", start_from="earliest", **slow) as con:
                    await wait_until(lambda: con.statistics().buffered == 10, what="all pulled")
                    first = await con.poll(max_messages=3)
                    assert [m.text for m in first] == ["m0", "m1", "m2"]
                    second = await con.poll(max_messages=3)
                    assert [m.text for m in second] == ["m3", "m4", "m5"]
                    # the first batch is done now, the second only at the next poll/commit
                    assert con.statistics().buffered == 7
                    outcome: list[EQueueError | None] = []
                    done = trio.Event()

                    def callback(error: EQueueError | None) -> None:
                        outcome.append(error)
                        done.set()

                    # commit_async counts the second batch done at once, commits in a task
                    con.commit_async(callback)
                    assert con.statistics().buffered == 4
                    await done.wait()
                    assert outcome == [None]
                    assert await c.query_offset("gcp", "cp", 0) == 6
                    third = await con.poll(max_messages=2)
                    assert [m.text for m in third] == ["m6", "m7"]
                    await con.commit()  # commit() covers what the last poll returned
                    assert await c.query_offset("gcp", "cp", 0) == 8
                    fourth = await con.poll(max_messages=1)
                    assert [m.text for m in fourth] == ["m8"]
                # the close counted m8 done and committed it
                assert await c.query_offset("gcp", "cp", 0) == 9
                async with AsyncConsumer(b.address, "gcp", "cp", start_from="earliest", **FAST) as con2:
                    assert [m.text for m in await con2.poll()] == ["m9"]


def test_sync_commit_and_commit_async(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("sc", 1)
        c.produce(wire.ProduceRequest("sc", 0, entries("m", 6)))
        slow = dict(FAST, commit_interval=3600.0)
        with Consumer(addr, "gsc", "sc", start_from="earliest", **slow) as con:
            assert [m.text for m in poll_until(con, 2, max_messages=2)] == ["m0", "m1"]
            con.commit()
            assert c.query_offset("gsc", "sc", 0) == 2
            assert [m.text for m in poll_until(con, 2, max_messages=2)] == ["m2", "m3"]
            outcome: list[EQueueError | None] = []
            called = threading.Event()

            def callback(error: EQueueError | None) -> None:
                outcome.append(error)
                called.set()

            con.commit_async(callback)  # returns at once; the commit runs on the loop
            assert called.wait(10)
            assert outcome == [None]
            assert c.query_offset("gsc", "sc", 0) == 4
        # the close committed nothing more (m4, m5 were never polled): a second member
        # of the group starts after what the first had polled
        assert c.query_offset("gsc", "sc", 0) == 4
        with Consumer(addr, "gsc", "sc", start_from="earliest", **FAST) as con2:
            assert [m.text for m in poll_until(con2, 2)] == ["m4", "m5"]


# ---------------------------------------------------------------------- seek
def test_sync_seek_forward_and_back(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("sk", 1)
        c.produce(wire.ProduceRequest("sk", 0, entries("m", 20)))
    with Consumer(addr, "gsk", "sk", start_from="earliest", **FAST) as con:
        wait_until_sync(lambda: con.statistics().buffered == 20, what="all pulled")
        assert [m.text for m in poll_until(con, 3, max_messages=3)] == ["m0", "m1", "m2"]
        con.seek("sk", 0, 15)  # forward: what was buffered past it is dropped
        assert [m.queue_offset for m in poll_until(con, 5)] == [15, 16, 17, 18, 19]
        con.seek("sk", 0, 2)  # back: read again from 2
        again = poll_until(con, 18)
        assert [m.queue_offset for m in again] == list(range(2, 20))
        with pytest.raises(ConfigError, match="not assigned"):
            con.seek("sk", 3, 0)
        with pytest.raises(ConfigError):
            con.seek("sk", 0, -1)
        with pytest.raises(TypeError):
            con.seek("sk", 0, "5")  # type: ignore[arg-type]
        con.commit()
    with Client(addr) as c:
        assert c.query_offset("gsk", "sk", 0) == 20


async def test_async_seek_discards_a_pull_in_flight(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("as", 1)
                await produce(c, "as", 0, "m", 4)
                opts = dict(FAST, pull_hold=10.0)
                async with AsyncConsumer(b.address, "gas", "as", start_from="earliest", **opts) as con:
                    got: list[Message] = []
                    while len(got) < 4:
                        got += await con.poll()
                    # the next pull now waits at the broker (10 s hold); seek back cancels it
                    con.seek("as", 0, 1)
                    with trio.fail_after(5):
                        again = await con.poll()
                    assert again[0].queue_offset == 1


# ---------------------------------------------------------------------- manual assignment
def test_sync_assign_and_seek_without_a_group(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("ma", 2)
        c.produce(wire.ProduceRequest("ma", 0, entries("zero", 5)))
        c.produce(wire.ProduceRequest("ma", 1, entries("one", 5)))
        with pytest.raises(ConfigError, match="assign"):
            Consumer(addr, None, "ma")
        with pytest.raises(ConfigError):
            Consumer(addr, None, on_assigned=lambda qs: None)
        with Consumer(addr, "gma", "ma", **FAST) as member, pytest.raises(ConfigError, match="group"):
            member.assign([("ma", 0)])
        with Consumer(addr, None, start_from="earliest", **FAST) as con:
            con.assign([("ma", 1)])
            assert con.assignment() == {("ma", 1)}
            assert [m.text for m in poll_until(con, 5)] == [f"one{i}" for i in range(5)]
            con.seek("ma", 1, 3)
            assert [m.text for m in poll_until(con, 2)] == ["one3", "one4"]
            con.assign([("ma", 0), ("ma", 1)])  # queue 1 goes on where it stood
            con.seek("ma", 0, 4)
            assert [m.text for m in poll_until(con, 1)] == ["zero4"]
            c.produce(wire.ProduceRequest("ma", 1, entries("one", 1, 5)))
            assert [m.text for m in poll_until(con, 1)] == ["one5"]
            con.assign([("ma", 0)])
            assert con.assignment() == {("ma", 0)}
            con.commit()  # nothing to commit to: no error
            # no group, no member registered at the broker (gma, left above, may linger empty)
            assert [g for g in c.list_groups() if g.members or g.group != "gma"] == []


async def test_async_assign_without_a_group(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("aa", 3)
                await produce(c, "aa", 2, "m", 3)
                async with AsyncConsumer(b.address, None, start_from="latest", **FAST) as con:
                    assert con.assignment() == set()
                    con.assign([("aa", 2)])
                    con.seek("aa", 2, 0)  # latest would start at 3: seek puts it at 0
                    got: list[Message] = []
                    while len(got) < 3:
                        got += await con.poll()
                    assert [(m.queue_id, m.text) for m in got] == [(2, "m0"), (2, "m1"), (2, "m2")]
                    assert (await c.list_groups()) == []


# ---------------------------------------------------------------------- mixing
async def test_poll_cannot_be_mixed_with_run_or_iteration(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("mx", 1)
                await produce(c, "mx", 0, "m", 2)
                async with AsyncConsumer(b.address, "gmx", "mx", start_from="earliest", **FAST) as con:
                    async with aclosing(con.__aiter__()) as it:  # type: ignore[type-var]
                        async for _ in it:
                            with pytest.raises(RuntimeError, match="poll"):
                                await con.poll()
                            break
                    # the iteration ended (closed): poll may take over
                    assert await con.poll()
                    with pytest.raises(RuntimeError, match="poll"):
                        await con.run(lambda m: None)
                    with pytest.raises(RuntimeError, match="poll"):
                        async for _ in con:
                            pass


def test_sync_poll_then_run_raises(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("sx", 1)
        c.produce(wire.ProduceRequest("sx", 0, entries("m", 1)))
    with Consumer(addr, "gsx", "sx", start_from="earliest", **FAST) as con:
        assert poll_until(con, 1)
        with pytest.raises(RuntimeError, match="poll"):
            con.run(lambda m: None)
        with pytest.raises(RuntimeError, match="poll"):
            next(iter(con))


async def test_manual_run_retries_in_place_then_drops_and_stops_at_end(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("mr", 2)
                await produce(c, "mr", 1, "m", 3)
                calls: list[str] = []

                def handler(m: Message) -> None:
                    calls.append(m.text)
                    if m.text == "m1":
                        raise ValueError("boom")

                async with AsyncConsumer(b.address, None, start_from="earliest", stop_at_end=True,
                                         max_reconsume_times=1, retry_delays=[0], **FAST) as con:  # fmt: skip
                    con.assign([("mr", 1)])
                    await con.run(handler)  # returns once the assigned queue is read and handled
                    assert sorted(calls) == ["m0", "m1", "m1", "m2"]  # m1: tried, retried once, dropped
                    assert con.statistics().dropped == 1


def test_a_batch_whose_poll_was_interrupted_is_delivered_again(embedded_broker: EmbeddedBroker) -> None:
    """A Ctrl-C that lands after the loop's poll returned a batch, and before the
    waiting thread received it: the batch is put back first in line, not counted done
    (so not committed), and the next poll returns it, in order."""
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("pi", 1)
        c.produce(wire.ProduceRequest("pi", 0, entries("m", 6)))
    with Consumer(addr, "gpi", "pi", start_from="earliest", commit_interval=60.0, **{
        k: v for k, v in FAST.items() if k != "commit_interval"}) as con:  # fmt: skip
        first = poll_until(con, 3, max_messages=3)
        assert [m.text for m in first] == ["m0", "m1", "m2"]
        loop, core = con._ensure()
        taken = loop.run(lambda: core.poll(3))  # the loop's poll returned this batch...
        assert [m.text for m in taken] == ["m3", "m4", "m5"]
        loop.run_sync(core.undo_poll)  # ...and the interrupted front put it back
        con.commit()  # what was polled before is done; the batch put back is not
        with Client(addr) as c:
            assert c.query_offset("gpi", "pi", 0) == 3
        assert [m.text for m in poll_until(con, 3, max_messages=3)] == ["m3", "m4", "m5"]
