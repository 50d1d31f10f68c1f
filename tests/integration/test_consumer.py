"""Consumer SDK against a real broker: run/iterator forms, offsets, retry and dead
letters, flow control, tags, start positions, broadcast mode, rebalance."""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.consumer.offsets import OffsetWindow
from equeue.models import PROP_ORIGIN_TOPIC
from equeue.names import dlq_topic
from tests.conftest import wait_until, wait_wall_clock_past

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0,
)  # fmt: skip


async def produce(c: AsyncClient, topic: str, queue: int, bodies: list[str], **kw: Any) -> None:
    await c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message(b, **kw)) for b in bodies]))


async def committed(c: AsyncClient, group: str, topic: str, queues: int) -> list[int]:
    return [await c.query_offset(group, topic, q) for q in range(queues)]


async def offset_at_least(c: AsyncClient, group: str, topic: str, queue: int, offset: int) -> bool:
    return await c.query_offset(group, topic, queue) >= offset


def test_offset_window() -> None:
    w = OffsetWindow(10)
    assert w.committable() == 10
    w.add([10, 11, 12, 15], 16)  # 13, 14 skipped by a tag filter
    assert (len(w), w.committable()) == (4, 10)
    w.done(11)
    w.done(15)
    assert (len(w), w.committable()) == (2, 10)
    w.done(10)
    assert w.committable() == 12
    w.done(12)
    assert (len(w), w.committable()) == (0, 16)
    w.advance(20)
    assert w.committable() == 20


async def test_run_handles_everything_and_close_commits(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("orders", 4)
            for q in range(4):
                await produce(c, "orders", q, [f"{q}-{i}" for i in range(50)])
            seen: list[tuple[int, int]] = []
            # commit_interval is long: only close() can have committed
            async with AsyncConsumer(broker.address, "g", "orders", start_from="earliest",
                                     **{**FAST, "commit_interval": 60}) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    seen.append((m.queue_id, m.queue_offset))
                    if len(seen) == 200:
                        con.stop()

                await con.run(handler)
                assert await committed(c, "g", "orders", 4) == [-1] * 4  # not yet
            assert sorted(seen) == [(q, i) for q in range(4) for i in range(50)]
            assert await committed(c, "g", "orders", 4) == [50] * 4
            d = await c.describe_group("g")
            assert d.members == [] and all(q.lag == 0 for q in d.queues)


async def test_the_async_with_body_s_error_passes_unchanged_and_close_leaves(broker: Broker) -> None:
    """An exception of the ``async with`` body comes out as itself (not wrapped in an
    ExceptionGroup by the consumer's nursery), after the consumer closed and left; a
    consumer closing itself (its own cancellation of the body) ends the block quietly."""
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("orders", 2)
            with pytest.raises(KeyError, match="boom"):
                async with AsyncConsumer(broker.address, "g", "orders", **FAST) as con:
                    await wait_until(lambda: len(con.assignment()) == 2)
                    raise KeyError("boom")
            assert (await c.describe_group("g")).members == []
            reached = False
            async with AsyncConsumer(broker.address, "g", "orders", **FAST) as con:
                await con.aclose()  # cancels the rest of the body, as a nursery would
                await trio.sleep_forever()
                reached = True
            assert not reached and (await c.describe_group("g")).members == []


def test_sync_run_and_iterator_form(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("it", 1)
        c.produce(wire.ProduceRequest("it", 0, [wire.encode_entry(Message(f"m{i}")) for i in range(10)]))
    got: list[str] = []
    with Consumer(addr, "gi", "it", start_from="earliest", **FAST) as con:
        for msg in con:
            got.append(msg.text)
            if msg.text == "m2":
                break  # m2 is not done: it is delivered again
        for msg in con:
            got.append(msg.text)
            if msg.text == "m4":
                con.stop()  # the next request for a message ends the loop; m4 is done
    assert got == ["m0", "m1", "m2", "m2", "m3", "m4"]
    with Client(addr) as c:
        assert c.query_offset("gi", "it", 0) == 5
    # a sync handler in worker threads, stopped from a handler
    seen: list[int] = []
    with Consumer(addr, "gi", "it", **FAST) as con:

        def handler(m: Message) -> None:
            seen.append(m.queue_offset)
            if len(seen) == 5:
                con.stop()

        con.run(handler)
    assert sorted(seen) == [5, 6, 7, 8, 9]


async def test_retry_then_success_and_later_offsets_commit(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("pay", 1)
            await produce(c, "pay", 0, ["bad"] + [f"ok{i}" for i in range(9)])
            attempts: list[tuple[str, str, int, int]] = []
            done = trio.Event()
            async with AsyncConsumer(broker.address, "gr", "pay", start_from="earliest",
                                     retry_delays=[0.3, 0.3], **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    if m.text == "bad":
                        attempts.append((m.topic, m.origin_topic, m.queue_offset, m.reconsume_times))
                        if m.reconsume_times < 2:
                            raise RuntimeError("not yet")
                        done.set()

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    # the failing message does not hold back the later ones
                    await wait_until(lambda: offset_at_least(c, "gr", "pay", 0, 10), what="offset 10 committed")
                    assert not done.is_set()
                    await done.wait()
                    con.stop()
                st = con.statistics()
            assert [a[3] for a in attempts] == [0, 1, 2]
            assert all(a[:3] == ("pay", "pay", 0) for a in attempts)
            assert (st.failed, st.retried, st.dead_lettered) == (2, 2, 0)


async def test_dead_letter_after_limit(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("jobs", 1)
            await produce(c, "jobs", 0, ["poison"], key="k1")
            calls: list[int] = []
            async with AsyncConsumer(broker.address, "gd", "jobs", start_from="earliest",
                                     retry_delays=[0.1], max_reconsume_times=2, **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    calls.append(m.reconsume_times)
                    raise ValueError("always")

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_until(lambda: con.statistics().dead_lettered, what="a dead letter")
                    con.stop()
            assert calls == [0, 1, 2]
            res = await c.pull(wire.PullRequest(dlq_topic("gd"), 0, 0, 10))
            assert [(m.text, m.key, m.reconsume_times) for m in res.messages] == [("poison", "k1", 2)]
            assert res.messages[0].properties[PROP_ORIGIN_TOPIC] == "jobs"
            assert await c.query_offset("gd", "jobs", 0) == 1


async def test_flow_control_bounds_buffered_messages(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("slow", 1)
            await produce(c, "slow", 0, [f"m{i}" for i in range(400)])
            n = 0
            async with AsyncConsumer(broker.address, "gf", "slow", start_from="earliest",
                                     max_buffered_messages=40, pull_batch=16, max_pull_batch=64,
                                     concurrency=2, **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    nonlocal n
                    await trio.sleep(0.002)
                    n += 1
                    if n == 400:
                        con.stop()

                await con.run(handler)
                st = con.statistics()
            assert st.consumed == 400
            assert st.peak_buffered <= 40
            assert st.paused > 0


async def test_the_rest_of_a_whole_batch_serves_the_next_pulls_without_a_request(broker: Broker) -> None:
    """A pull for 10 of a stored batch of 200 brings the whole batch (the WHOLE_BATCHES
    flag): the consumer hands out 10 and serves the next 19 pulls from the rest, in
    order, with no request."""
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("kept", 1)
            await produce(c, "kept", 0, [f"m{i}" for i in range(200)])  # one stored batch
            got: list[str] = []
            async with AsyncConsumer(broker.address, "gk", "kept", start_from="earliest",
                                     pull_batch=10, max_pull_batch=10, **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    got.append(m.text)
                    if len(got) == 200:
                        con.stop()

                await con.run(handler)
                st = con.statistics()
            assert got == [f"m{i}" for i in range(200)]
            assert st.kept_pulls == 19
            assert 1 <= st.pulls <= 3  # the one that brought the batch, then long-polls at the end


async def test_a_large_rest_is_not_kept_and_a_broker_without_whole_batches_is_still_read(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rest of an answer is kept only up to MAX_KEPT_BYTES: past it (a large
    compressed batch) each pull fetches the batch again. A broker that refuses the
    WHOLE_BATCHES flag (one from before it: this broker, made to know only the flags
    it knew then) is read as before, with the flag dropped."""
    from equeue.consumer.pull import MAX_KEPT_BYTES
    from equeue.producer import AsyncProducer
    from equeue.wire import pull as wire_pull

    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("big", 1)
            body = b"x" * 20_000  # 100 of them: 2 MB of records, a few kB compressed
            async with AsyncProducer(broker.address, compression="zstd", max_batch_bytes=4 << 20, linger=1.0) as p:
                await p.send_batch("big", [Message(body) for _ in range(100)])
            assert 100 * len(body) > MAX_KEPT_BYTES

            async def consume(group: str) -> Any:
                got: list[int] = []
                async with AsyncConsumer(broker.address, group, "big", start_from="earliest",
                                         pull_batch=10, max_pull_batch=10, **FAST) as con:  # fmt: skip

                    async def handler(m: Message) -> None:
                        assert m.body == body
                        got.append(m.queue_offset)
                        if len(got) == 100:
                            con.stop()

                    await con.run(handler)
                    st = con.statistics()
                assert got == list(range(100))
                return st

            st = await consume("g-big")
            assert st.kept_pulls == 0 and st.pulls >= 10  # the rest was too large to keep
            monkeypatch.setattr(wire_pull, "_PULL_FLAGS_KNOWN", wire.PULL_BATCHES | wire.PULL_CLIENT_VERIFIES)
            st = await consume("g-old")
            assert st.kept_pulls == 0 and st.pulls >= 11  # one refused, then 10 without the flag


async def test_tag_filter(broker: Broker) -> None:
    with trio.fail_after(15):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("tagged", 1)
            for i, tag in enumerate(["a", "b", "c", "a", "c", "c"]):
                await produce(c, "tagged", 0, [f"{tag}{i}"], tags=tag)
            got: list[str] = []
            async with AsyncConsumer(broker.address, "gt", "tagged", start_from="earliest",
                                     tags="a || b", **FAST) as con:  # fmt: skip
                async with trio.open_nursery() as n:

                    async def handler(m: Message) -> None:
                        got.append(m.text)

                    n.start_soon(con.run, handler)
                    # filtered-out messages still advance the committed offset
                    await wait_until(lambda: offset_at_least(c, "gt", "tagged", 0, 6), what="offset 6 committed")
                    con.stop()
            assert got == ["a0", "b1", "a3"]


async def test_start_from_earliest_latest_and_time(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("sf", 1)
            await produce(c, "sf", 0, ["old0", "old1"])
            # a mark just after the old messages' stamps (wall clock, ms); the new one
            # is stored once the clock has passed it
            old = await c.pull(wire.PullRequest("sf", 0, 0, 10))
            mark_ms = old.messages[-1].timestamp + 1
            await wait_wall_clock_past(mark_ms)
            mark = dt.datetime.fromtimestamp(mark_ms / 1000, dt.UTC)
            await produce(c, "sf", 0, ["new2"])

            async def first(group: str, start: Any, expect: int) -> list[str]:
                got: list[str] = []
                async with AsyncConsumer(broker.address, group, "sf", start_from=start, **FAST) as con:

                    async def handler(m: Message) -> None:
                        got.append(m.text)
                        if len(got) == expect:
                            con.stop()

                    async with trio.open_nursery() as n:
                        n.start_soon(con.run, handler)
                        # the start position is committed
                        await wait_until(lambda: offset_at_least(c, group, "sf", 0, 0), what="a start position")
                        if expect == 0:
                            await produce(c, "sf", 0, [f"late-{group}"])
                            await wait_until(lambda: got, what="the late message")
                            con.stop()
                return got

            assert await first("e", "earliest", 3) == ["old0", "old1", "new2"]
            assert await first("t", mark, 1) == ["new2"]
            assert await first("l", "latest", 0) == ["late-l"]


async def test_broadcast_every_member_and_restart_resumes(broker: Broker, tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("bc", 2)
            for q in range(2):
                await produce(c, "bc", q, [f"{q}-{i}" for i in range(5)])
            seen: dict[str, list[str]] = defaultdict(list)

            async def member(name: str, expect: int) -> None:
                async with AsyncConsumer(broker.address, "gb", "bc", mode="broadcast",
                                         start_from="earliest", state_dir=tmp_path / name,
                                         **FAST) as con:  # fmt: skip

                    async def handler(m: Message) -> None:
                        seen[name].append(m.text)
                        if len(seen[name]) == expect:
                            con.stop()

                    await con.run(handler)

            async with trio.open_nursery() as n:
                n.start_soon(member, "a", 10)
                n.start_soon(member, "b", 10)
            assert sorted(seen["a"]) == sorted(seen["b"]) and len(seen["a"]) == 10
            assert (tmp_path / "a" / "gb.offsets.json").exists()
            for q in range(2):
                await produce(c, "bc", q, [f"{q}-late"])
            await member("a", 12)  # restart: only the two new ones
            assert sorted(seen["a"][10:]) == ["0-late", "1-late"]
            assert await c.query_offset("gb", "bc", 0) == -1  # nothing on the broker


async def test_rebalance_orderly_no_overlap(broker: Broker) -> None:
    """Two in-process members, the second joining late: each message handled once,
    in queue order, and no queue is ever handled by two members at the same time."""
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("ord", 4)
            for q in range(4):
                await produce(c, "ord", q, [f"{q}-{i}" for i in range(300)])
            log: list[tuple[str, int, int, float, float]] = []
            total = 1200

            async def member(name: str, stop: trio.Event) -> None:
                async with AsyncConsumer(broker.address, "go", "ord", start_from="earliest",
                                         orderly=True, consumer_id=name, **FAST) as con:  # fmt: skip

                    async def handler(m: Message) -> None:
                        t0 = time.monotonic()
                        await trio.sleep(0.001)
                        log.append((name, m.queue_id, m.queue_offset, t0, time.monotonic()))

                    async with trio.open_nursery() as n:
                        n.start_soon(con.run, handler)
                        await stop.wait()
                        con.stop()

            stop = trio.Event()
            async with trio.open_nursery() as n:
                n.start_soon(member, "m1", stop)
                await wait_until(lambda: len(log) >= 200, what="200 messages handled by m1")
                n.start_soon(member, "m2", stop)
                await wait_until(lambda: len({(q, o) for _, q, o, _, _ in log}) == total, timeout=30, what="all handled")
                stop.set()
    assert {x[0] for x in log} == {"m1", "m2"}
    assert sorted((q, o) for _, q, o, _, _ in log) == [(q, i) for q in range(4) for i in range(300)]
    check_no_overlap_and_order(log)


def check_no_overlap_and_order(log: list[tuple[str, int, int, float, float]]) -> None:
    by_queue: dict[int, list[tuple[float, float, str, int]]] = defaultdict(list)
    per_member: dict[tuple[str, int], list[int]] = defaultdict(list)
    for name, q, off, t0, t1 in sorted(log, key=lambda x: x[3]):
        by_queue[q].append((t0, t1, name, off))
        per_member[(name, q)].append(off)
    for q, runs in by_queue.items():
        last_end: dict[str, float] = {}  # member -> end of its latest handling of q
        for start, end, name, _off in runs:
            for other, other_end in last_end.items():
                assert other == name or start >= other_end, f"queue {q}: {other} and {name} overlapped"
            last_end[name] = max(end, last_end.get(name, end))
    for key, offs in per_member.items():
        assert offs == sorted(offs) and len(set(offs)) == len(offs), f"{key} out of order"


@pytest.mark.parametrize("bad", [dict(mode="x"), dict(start_from="yesterday"), dict(allocation="nope"),
                                 dict(concurrency=0), dict(bogus=1)])  # fmt: skip
def test_invalid_options(bad: dict[str, Any]) -> None:
    from equeue.errors import ConfigError

    with pytest.raises(ConfigError):
        AsyncConsumer("127.0.0.1:1", "g", "t", **bad)


async def test_an_error_in_the_body_of_async_with_a_consumer_is_raised(broker: Broker) -> None:
    """The consumer's nursery wraps the ``async with`` body; its exit absorbed every
    exception of the body (a nursery's exit answers True when it has nothing to raise),
    so an assertion failing in there passed silently. Only the body's Cancelled that
    the consumer's own close caused is absorbed."""
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
        with pytest.raises(ValueError, match="boom"):
            async with AsyncConsumer(broker.address, "g", "t"):
                raise ValueError("boom")
        with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="boom")):
            async with AsyncConsumer(broker.address, "g", "t") as con, trio.open_nursery() as n:
                n.start_soon(con.run, lambda m: None)
                raise ValueError("boom")
        async with AsyncConsumer(broker.address, "g", "t") as con:
            await con.aclose()  # cancels the body: absorbed, the block ends quietly
            await trio.sleep_forever()
