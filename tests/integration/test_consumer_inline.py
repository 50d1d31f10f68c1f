"""Sync handlers placed inline on the consumer's loop thread (``handler_threads="auto"``)
or in worker threads; the batched blocking iterator; the fast pull decoder.

Every consumer test runs against a real broker. A handler tells where it runs by its
thread: the AsyncConsumer's loop is the test's own thread, the blocking Consumer's
loop is the thread named ``equeue-consumer``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.consumer.offsets import OffsetWindow
from tests.conftest import wait_until_sync

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0,
)  # fmt: skip
LOOP_THREAD = "equeue-consumer"


async def produce(c: AsyncClient, topic: str, queue: int, n: int, start: int = 0) -> None:
    for lo in range(start, start + n, 500):
        bodies = [f"{queue}-{i}" for i in range(lo, min(lo + 500, start + n))]
        await c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message(b)) for b in bodies]))


def sync_produce(addr: str, topic: str, queues: int, n: int) -> None:
    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic(topic, queues)
            for q in range(queues):
                await produce(c, topic, q, n)

    trio.run(main)


# ---------------------------------------------------------------------------- offsets
@settings(max_examples=200)
@given(
    batches=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    gaps=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    chunk=st.integers(1, 50),
    order=st.randoms(use_true_random=False),
)
def test_offset_window_matches_a_model(batches: list[int], gaps: list[int], chunk: int, order: Any) -> None:
    """Chunks done in and out of pull order (done_many / done) against a plain model:
    committable = the lowest pulled offset not done, else the next pull position."""
    w = OffsetWindow(100)
    pulled: list[int] = []
    nxt = 100
    for size, gap in zip(batches, gaps, strict=False):
        offs = [nxt + gap + i for i in range(size)]  # a tag filter may skip some
        nxt = offs[-1] + 1
        w.add(offs, nxt)
        pulled += offs
    chunks = [pulled[i : i + chunk] for i in range(0, len(pulled), chunk)]
    if order.random() < 0.5:
        order.shuffle(chunks)
    done: set[int] = set()
    for c in chunks:
        if order.random() < 0.3:
            for o in c:
                w.done(o)
        else:
            w.done_many(c)
        done.update(c)
        left = [o for o in pulled if o not in done]
        assert len(w) == len(left)
        if order.random() < 0.5:
            assert w.committable() == (left[0] if left else nxt)
    assert w.committable() == nxt and len(w) == 0


def test_offset_window_long_runs_compact() -> None:
    w = OffsetWindow(0)
    w.add(list(range(10_000)), 10_000)
    w.done(5001)
    for lo in range(0, 5000, 500):
        w.done_many(list(range(lo, lo + 500)))  # in order: the head moves (and compacts)
    assert (len(w), w.committable()) == (4999, 5000)
    w.done(5000)
    assert (len(w), w.committable()) == (4998, 5002)
    w.done_many(list(range(5002, 10_000)))
    assert (len(w), w.committable()) == (0, 10_000)
    w.add([10_005], 10_010)
    assert (len(w), w.committable()) == (1, 10_005)


# ---------------------------------------------------------------------------- placement
async def test_fast_handler_runs_inline_slow_calls_go_back_to_threads(broker: Broker) -> None:
    """A fast handler moves onto the loop after the probe; a slow call sends it back to
    worker threads; the loop stays responsive throughout; every message once."""
    main = threading.current_thread()
    where: dict[int, bool] = {}  # offset -> ran on the loop thread
    with trio.fail_after(60):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("fast", 1)
            await produce(c, "fast", 0, 6000)
            gaps: list[float] = []

            async def watchdog() -> None:
                while True:
                    t0 = trio.current_time()
                    await trio.sleep(0.001)
                    gaps.append(trio.current_time() - t0)

            async with AsyncConsumer(broker.address, "gp", "fast", start_from="earliest", **FAST) as con:

                def handler(m: Message) -> None:
                    where[m.queue_offset] = threading.current_thread() is main
                    if 5000 <= m.queue_offset < 5030:
                        time.sleep(0.005)  # slow for a while
                    if len(where) == 6000:
                        con.stop()

                async with trio.open_nursery() as n:
                    n.start_soon(watchdog)
                    await con.run(handler)
                    n.cancel_scope.cancel()
                st = con.statistics()
    assert sorted(where) == list(range(6000)) and st.consumed == 6000 and st.failed == 0
    assert not where[0], "the first calls run in threads (the probe)"
    assert any(where[o] for o in range(5000)), "a fast handler goes inline"
    slow_inline = [o for o in range(5000, 5030) if where[o]]
    assert len(slow_inline) <= 1, f"only the first slow call may run inline: {slow_inline}"
    assert max(gaps) < 1.0, f"the loop stalled {max(gaps):.3f} s"


def test_handler_threads_always_never_inline(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    sync_produce(addr, "thr", 2, 1500)
    names: set[str] = set()
    n = 0
    with Consumer(addr, "gt", "thr", start_from="earliest", handler_threads="always", **FAST) as con:

        def handler(m: Message) -> None:
            nonlocal n
            names.add(threading.current_thread().name)
            n += 1
            if n == 3000:
                con.stop()

        con.run(handler)
        assert con.statistics().consumed == 3000
    assert LOOP_THREAD not in names and names


def test_invalid_handler_threads() -> None:
    from equeue.errors import ConfigError

    with pytest.raises(ConfigError):
        Consumer("127.0.0.1:1", "g", "t", handler_threads="never")


@pytest.mark.parametrize("call", ["client", "from_thread"])
def test_blocking_trio_call_inline_reruns_in_a_thread(embedded_broker: EmbeddedBroker, call: str) -> None:
    """A handler that starts making a blocking equeue call (or a trio.from_thread call
    back into the consumer's loop) once it runs on the loop: that call fails there
    (trio forbids it); the message is re-run in a worker thread (not sent to retry)
    and the handler stays in threads."""
    addr = embedded_broker.address
    sync_produce(addr, "blk", 1, 4000)
    calls: list[tuple[int, str, int]] = []
    seen: set[int] = set()
    went_inline = False
    with Client(addr) as cl, Consumer(addr, "gk", "blk", start_from="earliest", **FAST) as con:

        def handler(m: Message) -> None:
            nonlocal went_inline
            went_inline = went_inline or threading.current_thread().name == LOOP_THREAD
            if went_inline:  # from now on, every call makes the blocking call
                if call == "client":
                    res = cl.query_offset("gk", "blk", 0)
                else:  # works from a trio worker thread only
                    res = trio.from_thread.run_sync(lambda: 1)
                calls.append((m.queue_offset, threading.current_thread().name, res))
            seen.add(m.queue_offset)
            if len(seen) == 4000:
                con.stop()

        con.run(handler)
        st = con.statistics()
    assert went_inline
    assert seen == set(range(4000)) and st.failed == 0 and st.retried == 0
    # the call that hit trio's error on the loop ran again in a thread, and so did all later ones
    assert calls and all(name != LOOP_THREAD for _, name, _ in calls)
    assert len({o for o, _, _ in calls}) == len(calls)  # each message once


def test_stop_statistics_commit_close_from_an_inline_handler(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    sync_produce(addr, "ctl", 1, 3000)
    stopped_at = -1
    stats: list[int] = []
    con = Consumer(addr, "gc", "ctl", start_from="earliest", close_timeout=5, **FAST)
    try:

        def handler(m: Message) -> None:
            nonlocal stopped_at
            if stopped_at < 0 and threading.current_thread().name == LOOP_THREAD and m.queue_offset >= 1000:
                stats.append(con.statistics().consumed)
                con.commit()  # scheduled: runs once the handler returns
                con.close()  # stops; run() closes before returning
                stopped_at = m.queue_offset

        con.run(handler)
    finally:
        con.close()
    assert stopped_at >= 1000 and stats and 0 < stats[0] <= stopped_at
    with Client(addr) as c:
        assert c.query_offset("gc", "ctl", 0) == stopped_at + 1  # everything up to the closer
        assert c.describe_group("gc").members == []


async def test_orderly_inline_keeps_order_and_retries_in_place(broker: Broker) -> None:
    main = threading.current_thread()
    log: dict[int, list[int]] = defaultdict(list)
    inline = 0
    failed_once = False
    with trio.fail_after(60):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("ordi", 2)
            for q in range(2):
                await produce(c, "ordi", q, 2500)
            async with AsyncConsumer(broker.address, "go", "ordi", start_from="earliest", orderly=True,
                                     retry_delays=[0.05], **FAST) as con:  # fmt: skip

                def handler(m: Message) -> None:
                    nonlocal inline, failed_once
                    on_loop = threading.current_thread() is main
                    inline += on_loop
                    log[m.queue_id].append(m.queue_offset)
                    if on_loop and not failed_once and m.queue_id == 0:
                        failed_once = True
                        raise ValueError("fail once")
                    if sum(map(len, log.values())) == 5001:
                        con.stop()

                await con.run(handler)
                st = con.statistics()
    assert inline > 0 and failed_once
    assert log[1] == list(range(2500))
    # queue 0: in order, the failed message handled twice in a row
    dup = [o for i, o in enumerate(log[0][1:]) if o == log[0][i]]
    assert len(dup) == 1 and sorted(set(log[0])) == list(range(2500)) and log[0] == sorted(log[0])
    assert st.failed == 1 and st.retried == 0


# ---------------------------------------------------------------------------- iterator
def test_iterator_batches_break_resume_and_commit(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    sync_produce(addr, "itb", 1, 3000)
    got: list[int] = []
    with Consumer(addr, "gb", "itb", start_from="earliest", **FAST) as con:
        for msg in con:
            got.append(msg.queue_offset)
            if msg.queue_offset == 1700:
                break  # 1700 is not done
        con.commit()
        with Client(addr) as c:
            assert c.query_offset("gb", "itb", 0) == 1700
        for msg in con:
            got.append(msg.queue_offset)
            if msg.queue_offset == 2500:
                con.stop()  # the next request ends the loop; 2500 is done
        assert con.statistics().consumed == 2501
    assert got == list(range(1701)) + list(range(1700, 2501))
    with Client(addr) as c:
        assert c.query_offset("gb", "itb", 0) == 2501
    with Consumer(addr, "gb", "itb", **FAST) as con:  # a restart resumes at 2501
        it = iter(con)
        assert next(it).queue_offset == 2501
        it.close()


def test_rebalance_with_inline_handlers_no_overlap(embedded_broker: EmbeddedBroker) -> None:
    """Two blocking members with fast (inline) orderly handlers, the second joining
    late: a revoked queue is handed over only after its inline handlers finished and
    its offset was committed — each message once, in queue order, no queue handled by
    both members at the same time."""
    from tests.integration.test_consumer import check_no_overlap_and_order

    addr = embedded_broker.address
    per_queue = 10_000
    total = 4 * per_queue
    sync_produce(addr, "reb", 4, per_queue)
    log: list[tuple[str, int, int, float, float]] = []
    inline: dict[str, int] = defaultdict(int)
    lock = threading.Lock()
    members: dict[str, Consumer] = {}

    def member(name: str) -> None:
        con = members[name]

        def handler(m: Message) -> None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15e-6:  # fast, but the drain lasts past the join
                pass
            with lock:
                log.append((name, m.queue_id, m.queue_offset, t0, time.monotonic()))
                inline[name] += threading.current_thread().name == LOOP_THREAD

        con.run(handler)

    for name in ("m1", "m2"):
        members[name] = Consumer(addr, "gr", "reb", orderly=True, start_from="earliest", consumer_id=name,
                                 **FAST)  # fmt: skip
    threads = [threading.Thread(target=member, args=(n,), daemon=True) for n in ("m1", "m2")]

    def all_handled() -> bool:
        with lock:
            return len({(q, o) for _, q, o, _, _ in log}) >= total

    try:
        threads[0].start()
        wait_until_sync(lambda: len(log) >= 1000, timeout=60, what="1000 messages handled by m1")
        threads[1].start()
        wait_until_sync(all_handled, timeout=60, interval=0.05, what="every message handled")
    finally:
        for con in members.values():
            con.stop()
        for t in threads:
            if t.is_alive():  # m2 is not started if m1 never got going
                t.join(10)
        for con in members.values():
            con.close()
    assert inline["m1"] > 0 and {x[0] for x in log} == {"m1", "m2"}
    assert sorted((q, o) for _, q, o, _, _ in log) == [(q, i) for q in range(4) for i in range(per_queue)]
    check_no_overlap_and_order(log)


async def test_async_consumer_stop_from_a_handler_thread(broker: Broker) -> None:
    """A sync handler running in a worker thread may call ``stop()`` on the
    AsyncConsumer: the loop's part of stopping is scheduled on the loop (touching
    trio's parking lot from another thread corrupted it: TrioInternalError)."""

    class Lot:  # records which thread wakes the workers
        def __init__(self, lot: Any) -> None:
            self.lot, self.threads = lot, set()

        def __getattr__(self, name: str) -> Any:
            if name.startswith("unpark"):
                self.threads.add(threading.current_thread().name)
            return getattr(self.lot, name)

    with trio.fail_after(60):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("stopper", 2)
            await produce(c, "stopper", 0, 500)
            await produce(c, "stopper", 1, 500)
        for round_ in range(3):
            seen: list[str] = []
            async with AsyncConsumer(
                broker.address, f"gs{round_}", "stopper", start_from="earliest", handler_threads="always", **FAST
            ) as con:
                lot = con.dispatcher.lot = Lot(con.dispatcher.lot)  # type: ignore[assignment]

                def handler(m: Message, seen: list[str] = seen, at: int = 50 + 100 * round_) -> None:
                    seen.append(threading.current_thread().name)
                    if len(seen) == at:
                        con.stop()

                await con.run(handler)  # returns once stopped
            assert len(seen) >= 50 + 100 * round_
            assert threading.current_thread().name not in seen, "the handler ran in worker threads"
            assert lot.threads == {threading.current_thread().name}, lot.threads
