"""Producer SDK against a real broker: routing, batching, buffered mode, errors."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from equeue import (
    BufferFull,
    ClientClosed,
    ConfigError,
    InvalidName,
    Message,
    MessageTooLarge,
    PullStatus,
    ReservedTopic,
    TopicNotFound,
    wire,
)
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.models import SendResult
from equeue.producer import AsyncProducer, Producer
from equeue.producer._batch import deliver_at_ms
from equeue.routing import queue_for_key
from tests.conftest import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


async def read_queue(c: AsyncClient, topic: str, queue_id: int) -> list[Message]:
    out: list[Message] = []
    offset = 0
    while True:
        r = await c.pull(wire.PullRequest(topic, queue_id, offset, 1000))
        if r.status is not PullStatus.FOUND:
            return out
        out += r.messages
        offset = r.next_offset


def test_deliver_at_conversion() -> None:
    assert deliver_at_ms(None, None) == 0
    assert deliver_at_ms(-5, None) == 0
    now_ms = dt.datetime.now(dt.UTC).timestamp() * 1000
    assert abs(deliver_at_ms(10, None) - (now_ms + 10_000)) < 1000
    assert abs(deliver_at_ms(dt.timedelta(minutes=1), None) - (now_ms + 60_000)) < 1000
    naive = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=30)
    assert abs(deliver_at_ms(None, naive) - (now_ms + 30_000)) < 1000
    with pytest.raises(ConfigError):
        deliver_at_ms(1, naive)


async def test_send_routes_keys_stably(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address) as p:
            await c.create_topic("orders", 4)
            results: dict[str, list[SendResult]] = {}
            for i in range(60):
                key = f"user-{i % 12}"
                results.setdefault(key, []).append(await p.send("orders", f"m{i}", key=key))
            for key, rs in results.items():
                assert {r.queue_id for r in rs} == {queue_for_key(key, 4)}
                offsets = [r.queue_offset for r in rs]
                assert offsets == sorted(offsets)
            assert len({r.queue_id for rs in results.values() for r in rs}) == 4
            stored = await read_queue(c, "orders", queue_for_key("user-3", 4))
            assert [m.text for m in stored if m.key == "user-3"] == [f"m{i}" for i in range(3, 60, 12)]


async def test_round_robin_spreads_evenly(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address) as p:
            await c.create_topic("rr", 4)
            rs = [await p.send("rr", b"x") for _ in range(40)]
            counts = [sum(1 for r in rs if r.queue_id == q) for q in range(4)]
            assert counts == [10, 10, 10, 10]


async def test_queue_selector_and_properties(broker: Broker) -> None:
    seen: list[tuple[int, str | None]] = []

    def selector(count: int, msg: Message) -> int:
        seen.append((count, msg.key))
        return count - 1

    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address, queue_selector=selector) as p:
            await c.create_topic("sel", 3)
            r = await p.send("sel", b"body", key="k", tags="paid", properties={"n": "1"})
            assert r.queue_id == 2 and seen == [(3, "k")]
            (m,) = await read_queue(c, "sel", 2)
            assert (m.body, m.key, m.tags, m.properties) == (b"body", "k", "paid", {"n": "1"})


async def test_send_batch_groups_per_queue_in_input_order(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address) as p:
            await c.create_topic("b", 4)
            msgs = [Message(f"m{i}", key=f"k{i % 8}") for i in range(100)]
            rs = await p.send_batch("b", msgs)
            assert [r.queue_id for r in rs] == [queue_for_key(f"k{i % 8}", 4) for i in range(100)]
            # one request per queue: offsets within a queue are consecutive in input order
            for q in range(4):
                offs = [r.queue_offset for r in rs if r.queue_id == q]
                assert offs == list(range(len(offs)))
            globals_ = sorted(r.global_offset for r in rs)
            assert globals_ == list(range(100))
            stats = await c.stats()
            assert stats.transactions <= 3  # topic creation + the batch (one group commit, or two)


async def test_send_batch_refuses_a_bad_message_before_buffering_any(broker: Broker) -> None:
    """The batch path encodes every message first: one too large raises, and none
    of the batch is buffered or sent (one by one, the messages before it were)."""
    with trio.fail_after(20):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(broker.address, max_message_bytes=1000) as p,
        ):
            await c.create_topic("bad", 2)
            await p.queue_count("bad")  # the route is known: the batch path
            msgs = [Message(b"x" * 10, key=f"k{i}") for i in range(50)] + [Message(b"x" * 2000)]
            with pytest.raises(MessageTooLarge):
                await p.send_batch("bad", msgs)
            assert p.statistics()["buffered_bytes"] == 0
            await p.flush()
            assert await read_queue(c, "bad", 0) == [] and await read_queue(c, "bad", 1) == []
            # the producer goes on: the next batch is stored whole
            rs = await p.send_batch("bad", msgs[:50])
            assert sorted(r.global_offset for r in rs) == list(range(50))


async def test_send_batch_larger_than_the_buffer_goes_one_by_one(broker: Broker) -> None:
    """A batch the buffer cannot hold whole is submitted message by message, waiting
    for space as send_async does; every message is stored, results in input order."""
    with trio.fail_after(30):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(broker.address, max_buffered_bytes=4096, max_batch_bytes=1024) as p,
        ):
            await c.create_topic("big", 4)
            msgs = [Message(b"y" * 100, key=f"k{i}") for i in range(300)]
            rs = await p.send_batch("big", msgs)
            assert [r.queue_id for r in rs] == [queue_for_key(f"k{i}", 4) for i in range(300)]
            for q in range(4):
                offs = [r.queue_offset for r in rs if r.queue_id == q]
                assert offs == list(range(len(offs)))
                assert [m.key for m in await read_queue(c, "big", q)] == [
                    m.key for m, r in zip(msgs, rs, strict=True) if r.queue_id == q
                ]
            assert p.statistics()["buffered_bytes"] == 0


async def test_send_batch_with_on_full_raise_sends_none_of_a_batch_that_does_not_fit(broker: Broker) -> None:
    """With ``on_full="raise"`` a batch the buffer cannot hold whole raises BufferFull
    and none of it is sent (it used to send the part that fitted, which a retry of the
    batch then stored twice). A topic whose route is not known yet is looked up first,
    so a bad message at the end of a batch keeps all of it unsent as well."""
    with trio.fail_after(30):
        async with (
            AsyncClient(broker.address) as c,
            AsyncProducer(broker.address, max_buffered_bytes=4096, max_batch_bytes=1024, on_full="raise") as p,
        ):
            await c.create_topic("full", 4)
            msgs = [Message(b"y" * 100, key=f"k{i}") for i in range(100)]
            with pytest.raises(BufferFull, match="nothing of it was sent"):
                await p.send_batch("full", msgs)
            bad = [Message(b"z", key=f"k{i}") for i in range(5)] + [Message(b"z" * (p.options.max_message_bytes + 1))]
            with pytest.raises(MessageTooLarge):
                await p.send_batch("full", bad)
            await p.flush()
            assert p.statistics()["buffered_bytes"] == 0
            assert [len(await read_queue(c, "full", q)) for q in range(4)] == [0, 0, 0, 0]
            rs = await p.send_batch("full", msgs[:20])  # a batch that fits goes whole
            assert sorted(r.queue_offset for r in rs if r.queue_id == rs[0].queue_id)[0] == 0


class _SpyLock:
    """A lock that says when a thread starts waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting = threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.waiting.set()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


async def test_send_async_racing_close_from_another_thread_raises_client_closed(broker: Broker) -> None:
    """A thread's send_async that passed the closed check just before ``aclose`` and
    takes the buffer lock after it raises ClientClosed. It used to open a batch in a lane
    that ``aclose`` had already failed, and its handle never finished."""
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("race", 1)
        p = AsyncProducer(broker.address)
        async with p:
            await p.send("race", b"first")  # the route and the lane exist
            spy = p._buffer.lock = _SpyLock()  # type: ignore[assignment]
            outcome: list[BaseException | object] = []

            def sender() -> None:
                try:
                    outcome.append(p.submit_nowait("race", b"late"))
                except BaseException as exc:  # recorded for the assertion
                    outcome.append(exc)

            # hold the lock (blocking the loop: nothing of it may run while the lock is
            # held): the sender passes the unlocked check and waits for the lock
            with spy:
                t = threading.Thread(target=sender)
                t.start()
                assert spy.waiting.wait(10)
                p._closed = True  # what aclose does under the lock, before failing the lanes
            await trio.to_thread.run_sync(t.join, 10)
            assert len(outcome) == 1 and isinstance(outcome[0], ClientClosed), outcome
            p._closed = False
            await p.aclose(flush=False)


async def test_buffered_send_async_and_flush(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncProducer(broker.address, linger=0.05) as p:
            await c.create_topic("buf", 2)
            handles = [await p.send_async("buf", f"m{i}", key=str(i)) for i in range(500)]
            assert not all(h.done() for h in handles)
            await p.flush()
            assert all(h.done() for h in handles)
            rs = [await h for h in handles]
            assert len({(r.queue_id, r.queue_offset) for r in rs}) == 500
            total = [len(await read_queue(c, "buf", q)) for q in range(2)]
            assert sum(total) == 500


async def test_backpressure_blocks_then_completes(broker: Broker) -> None:
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c, AsyncProducer(
            broker.address, max_buffered_bytes=32 * 1024, max_batch_bytes=8 * 1024, max_in_flight=2
        ) as p:
            await c.create_topic("bp", 2)
            peak = 0
            handles = []
            for i in range(400):
                handles.append(await p.send_async("bp", b"x" * 1000, key=str(i)))
                peak = max(peak, p.statistics()["buffered_bytes"])
            await p.flush()
            assert peak <= 32 * 1024
            rs = [await h for h in handles]
            assert len({(r.queue_id, r.queue_offset) for r in rs}) == 400


async def test_buffer_full_raises_when_asked(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncProducer(
            broker.address, max_buffered_bytes=16 * 1024, max_batch_bytes=16 * 1024, linger=60, on_full="raise"
        ) as p:
            await p.send("full", b"warm-up")
            with pytest.raises(BufferFull):
                for _ in range(100):
                    await p.send_async("full", b"x" * 1000)
            await p.flush()
            assert p.statistics()["buffered_bytes"] == 0
            await p.send_async("full", b"fits again")


async def test_errors_before_sending(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncProducer(broker.address, max_message_bytes=1000, auto_create=False) as p:
            with pytest.raises(InvalidName):
                await p.send("bad name", b"x")
            with pytest.raises(ReservedTopic):
                await p.send("%DLQ%g", b"x")
            with pytest.raises(TopicNotFound):
                await p.send("missing", b"x")
            async with AsyncClient(broker.address) as c:
                await c.create_topic("t", 1)
            with pytest.raises(MessageTooLarge):
                await p.send("t", b"x" * 1001)
            # the limit counts the whole content, as the broker does: properties too
            with pytest.raises(MessageTooLarge, match="key \\+ tags \\+ properties \\+ body"):
                await p.send("t", b"x" * 10, properties={"p": "v" * 1000})
            with pytest.raises(ConfigError):
                await p.send("t", b"x", key=b"k" * 70_000)
            assert (await p.send("t", b"x" * 1000)).queue_offset == 0
        with pytest.raises(ClientClosed):
            await p.send("t", b"x")


async def test_statistics_count_outcomes_and_close_without_flush_sends_nothing(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("st", 2)
            async with AsyncProducer(broker.address, linger=math.inf) as p:
                await p.send_batch("st", [Message(b"a"), Message(b"b"), Message(b"c", deliver_at=int(time.time() * 1000) + 60_000)])
                st = p.statistics()
                assert (st["stored"], st["scheduled"], st["duplicates"], st["failed"]) == (2, 1, 0, 0)
                h = await p.send_async("st", b"never")  # waits in an open batch (linger is infinite)
                await p.aclose(flush=False)
                with pytest.raises(ClientClosed):
                    await h
                assert p.send_stats.failed == 1 and isinstance(p.send_stats.first_error, ClientClosed)
            assert [len(await read_queue(c, "st", q)) for q in range(2)] == [1, 1]


async def test_delayed_send_is_scheduled(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncProducer(broker.address) as p:
            r = await p.send("later", b"x", delay=30)
            assert r.scheduled and r.queue_offset == -1
            r2 = await p.send("later", b"y", deliver_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
            assert r2.scheduled
            r3 = await p.send("later", b"z")
            assert not r3.scheduled and r3.queue_offset >= 0


# ---------------------------------------------------------------------- sync front
def test_blocking_producer_from_8_threads(embedded_broker: EmbeddedBroker) -> None:
    results: list[tuple[int, SendResult]] = []
    errors: list[BaseException] = []
    with Producer(embedded_broker.address) as p:

        def worker(t: int) -> None:
            try:
                for i in range(40):
                    if i % 2:
                        results.append((t, p.send("threads", f"{t}-{i}", key=f"k{t}")))
                    else:
                        results.append((t, p.send_async("threads", f"{t}-{i}", key=f"k{t}").result(10)))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert not errors
        assert len(results) == 320
        assert len({r.global_offset for _, r in results}) == 320
        assert all(r.queue_id == queue_for_key(f"k{t}", 4) for t, r in results)
        for t in range(8):  # one thread's messages keep their order within the queue
            offs = [r.queue_offset for tt, r in results if tt == t]
            assert offs == sorted(offs)


def test_send_handle_wait_done_and_first_in_batch(embedded_broker: EmbeddedBroker) -> None:
    """A handle says whether its message opened its batch, and ``wait_done`` waits in
    slices without raising: False while the batch waits (linger is infinite), True once
    flushed; the results then come at once."""
    with Client(embedded_broker.address) as c:
        c.create_topic("wd", 1)
    with Producer(embedded_broker.address, linger=math.inf) as p:
        h1 = p.send_async("wd", b"a")
        h2 = p.send_async("wd", b"b")
        assert h1.first_in_batch and not h2.first_in_batch
        assert not h1.wait_done(0.01) and not h2.done()
        assert p.flush(10) == 0
        assert h2.wait_done(0) and h1.wait_done()
        assert [h1.result().queue_offset, h2.result().queue_offset] == [0, 1]
        h3 = p.send_async("wd", b"c")  # the next batch
        assert h3.first_in_batch
    with pytest.raises(ClientClosed):
        p.send("threads", b"x")


_KEYS_SCRIPT = """
import json, sys
from equeue.producer import Producer
with Producer(sys.argv[1]) as p:
    print(json.dumps({k: p.send("hashed", k, key=k).queue_id for k in sys.argv[2:]}))
"""


def test_same_key_same_queue_across_processes(embedded_broker: EmbeddedBroker) -> None:
    keys = [f"customer-{i}" for i in range(20)]
    out = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", _KEYS_SCRIPT, embedded_broker.address, *keys],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout))
    assert out[0] == out[1] == {k: queue_for_key(k, 4) for k in keys}


def test_producer_survives_fork(embedded_broker: EmbeddedBroker) -> None:
    with Producer(embedded_broker.address) as p:
        before = p.send("forked", b"parent-1")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: reuse the producer object created before the fork
            code = 1
            try:
                res = [p.send("forked", f"child-{i}".encode()) for i in range(3)]
                h = p.send_async("forked", b"child-async")
                res.append(h.result(10))
                os.write(w, json.dumps([x.global_offset for x in res]).encode())
                p.close()
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        data = os.read(r, 4096)
        os.close(r)
        assert os.waitstatus_to_exitcode(status) == 0
        child_offsets = json.loads(data)
        assert len(child_offsets) == 4
        after = p.send("forked", b"parent-2")
        assert after.global_offset > max(child_offsets) > before.global_offset
    with Client(embedded_broker.address) as c:
        bodies = []
        for q in range(4):
            res = c.pull(wire.PullRequest("forked", q, 0, 100))
            bodies += [m.text for m in res.messages]
        assert sorted(bodies) == sorted(["parent-1", "parent-2", "child-0", "child-1", "child-2", "child-async"])


def test_a_forked_child_does_not_reuse_a_given_producer_id() -> None:
    fixed = bytes(range(16))
    with Producer("127.0.0.1:1", producer_id=fixed) as p:
        assert p.producer_id == fixed
        p._pid = -1  # as seen from a forked child
        child_core = p._make_core()
        assert child_core.producer_id != fixed
        assert child_core.options.producer_id is None and child_core.options.retries == p.options.retries


def test_cli_produce_from_file(embedded_broker: EmbeddedBroker, tmp_path: Path) -> None:
    from equeue.cli import app

    lines = [json.dumps({"user": f"u{i % 3}", "n": i}) for i in range(30)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n\n")
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["produce", "cli", "--file", str(src), "--key-field", "user", "--tags", "t1",
         "--property", "src=file", "--property", "v=2", "--json", "-b", embedded_broker.address],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    results = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 30
    assert {r["queue_id"] for r in results} == {queue_for_key(f"u{i}", 4) for i in range(3)}
    with Client(embedded_broker.address) as c:
        stored = []
        for q in range(4):
            stored += c.pull(wire.PullRequest("cli", q, 0, 100)).messages
    assert sorted(m.text for m in stored) == sorted(lines)
    m = stored[0]
    assert m.tags == "t1" and m.properties == {"src": "file", "v": "2"}
    assert m.key == json.loads(m.text)["user"]
    res = runner.invoke(app, ["produce", "cli", "--file", str(src), "-b", embedded_broker.address])
    assert res.exit_code == 0 and "sent 30 messages" in res.output
    res = runner.invoke(app, ["produce", "cli", "--file", str(tmp_path / "nope"), "-b", embedded_broker.address])
    assert res.exit_code != 0


def test_mixed_delayed_and_immediate_buffered_sends_store_each_once(
    embedded_broker: EmbeddedBroker,
) -> None:
    """Regression: delayed and immediate messages go in separate pipelined batches of
    one lane; every one must be stored exactly once (none answered as a duplicate)."""
    addr = embedded_broker.address
    with Client(addr) as c, Producer(addr) as p:
        c.create_topic("mixed", 4)
        handles = [
            p.send_async("mixed", f"m{i}", key=f"c{i % 50}", delay=0.5 if i % 25 == 0 else None)
            for i in range(2000)
        ]
        p.flush()
        results = [h.result(10) for h in handles]
        assert not any(r.duplicate for r in results)
        assert sum(r.scheduled for r in results) == 80
        wait_until_sync(
            lambda: sum(q.count for q in c.describe_topic("mixed").queues) == 2000,
            interval=0.05, what="the delayed messages are delivered",
        )  # fmt: skip
        desc = c.describe_topic("mixed")
        assert sum(q.count for q in desc.queues) == 2000
        assert desc.pending_delayed == 0
