"""Delivery callbacks (``send_async(on_delivery=...)``, ``SendHandle.add_done_callback``)
and ``flush``'s count of messages still unanswered, on both producer fronts."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading

import pytest
import trio

from equeue import ClientClosed, DelayTooLong
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.models import SendResult
from equeue.producer import AsyncProducer, DeliveryCallback, Producer, SendHandle

#: a delay beyond the broker's default ``max_delay`` (40 days): refused by the broker,
#: so the send fails in its handle (not before sending)
TOO_LONG = dt.timedelta(days=400)

Outcome = tuple[SendResult | None, BaseException | None]


class Recorder:
    """Collects ``on_delivery`` calls per message and the thread each ran on."""

    def __init__(self) -> None:
        self.calls: dict[int, list[Outcome]] = {}
        self.threads: set[str] = set()

    def for_message(self, i: int) -> DeliveryCallback:
        def on_delivery(result: SendResult | None, error: BaseException | None) -> None:
            self.calls.setdefault(i, []).append((result, error))
            self.threads.add(threading.current_thread().name)

        return on_delivery


async def test_on_delivery_is_called_once_per_message_with_its_result(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("cb-ok", 2)
        rec = Recorder()
        async with AsyncProducer(broker.address) as p:
            handles = [await p.send_async("cb-ok", f"m{i}", key=str(i), on_delivery=rec.for_message(i)) for i in range(50)]
            assert await p.flush() == 0
            # the callbacks of the flushed messages have run when flush returns
            assert sorted(rec.calls) == list(range(50))
            for i, h in enumerate(handles):
                [(result, error)] = rec.calls[i]
                assert error is None and result == await h
                assert result is not None and result.queue_offset >= 0 and result.global_offset >= 0
        # on this test's trio loop: the producer's own thread
        assert rec.threads == {threading.current_thread().name}


async def test_on_delivery_gets_the_error_of_a_failed_send_and_of_a_close(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("cb-fail", 1)
        rec = Recorder()
        async with AsyncProducer(broker.address, linger=math.inf) as p:
            h = await p.send_async("cb-fail", b"late", delay=TOO_LONG, on_delivery=rec.for_message(0))
            assert await p.flush() == 0
            [(result, error)] = rec.calls[0]
            assert result is None and isinstance(error, DelayTooLong)
            with pytest.raises(DelayTooLong):
                await h
            await p.send_async("cb-fail", b"never", on_delivery=rec.for_message(1))  # waits: linger is infinite
            assert p.pending_messages() == 1
            await p.aclose(flush=False)
            [(result, error)] = rec.calls[1]
            assert result is None and isinstance(error, ClientClosed)
        assert len(rec.calls[0]) == 1 and len(rec.calls[1]) == 1


async def test_on_delivery_must_be_callable(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncProducer(broker.address) as p:
            await p.send("cb-type", b"route")
            with pytest.raises(TypeError):
                await p.send_async("cb-type", b"x", on_delivery="not a function")  # type: ignore[arg-type]
            assert p.pending_messages() == 0


async def test_add_done_callback_before_and_after_completion(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncProducer(broker.address, linger=math.inf) as p:
            order: list[tuple[str, SendHandle]] = []
            h = await p.send_async("cb-done", b"x", on_delivery=lambda r, e: order.append(("delivery", h)))
            h.add_done_callback(lambda hh: order.append(("first", hh)))
            h.add_done_callback(lambda hh: order.append(("second", hh)))
            assert order == [] and not h.done()
            await p.flush()
            assert [name for name, _ in order] == ["delivery", "first", "second"]
            assert all(hh is h for _, hh in order)
            # already done: called at once, on the calling thread
            h.add_done_callback(lambda hh: order.append(("late", hh)))
            assert [name for name, _ in order] == ["delivery", "first", "second", "late"]
            assert (await h).queue_offset == 0
            with pytest.raises(TypeError):
                h.add_done_callback(None)  # type: ignore[arg-type]


async def test_a_raising_callback_is_logged_and_does_not_break_later_sends(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(result: SendResult | None, error: BaseException | None) -> None:
        raise RuntimeError("callback bug")

    with trio.fail_after(20), caplog.at_level(logging.ERROR, logger="equeue.producer"):
        rec = Recorder()
        async with AsyncProducer(broker.address, linger=math.inf) as p:
            h1 = await p.send_async("cb-raise", b"a", key="k", on_delivery=boom)
            h2 = await p.send_async("cb-raise", b"b", key="k", on_delivery=boom)
            h2.add_done_callback(lambda h: rec.for_message(2)(h.result(), None))
            await p.flush()
            assert (await h1).queue_offset == 0 and (await h2).queue_offset == 1
            assert [r.queue_offset for r, _ in rec.calls[2] if r is not None] == [1]  # the callback after them ran
            for i in range(3, 6):
                await p.send_async("cb-raise", f"m{i}", key="k", on_delivery=rec.for_message(i))
            assert await p.flush() == 0
            assert [rec.calls[i][0][0].queue_offset for i in range(3, 6)] == [2, 3, 4]  # type: ignore[union-attr]
            assert (await p.send("cb-raise", b"after", key="k")).queue_offset == 5
    lines = [r for r in caplog.records if "callback" in r.getMessage() and "cb-raise" in r.getMessage()]
    assert len(lines) == 1  # rate-limited: the second failure of the same topic is only counted
    assert lines[0].exc_info is not None and isinstance(lines[0].exc_info[1], RuntimeError)


async def test_async_flush_bounded_by_a_cancel_scope_leaves_the_count(embedded_broker: EmbeddedBroker) -> None:
    with trio.fail_after(30):
        rec = Recorder()
        async with AsyncProducer(embedded_broker.address, retries=1000, send_timeout=60) as p:
            await p.send("cb-down", b"route known")
            await trio.to_thread.run_sync(embedded_broker.stop)
            for i in range(5):
                await p.send_async("cb-down", f"m{i}", on_delivery=rec.for_message(i))
            with trio.move_on_after(0.3) as cs:
                await p.flush()
            assert cs.cancelled_caught
            assert p.pending_messages() == 5 and rec.calls == {}
            await p.aclose(flush=False)
        assert sorted(rec.calls) == list(range(5))
        assert all(len(v) == 1 and isinstance(v[0][1], ClientClosed) for v in rec.calls.values())


# ------------------------------------------------------------------ the blocking front


def test_sync_on_delivery_runs_on_the_loop_thread_and_flush_returns_zero(embedded_broker: EmbeddedBroker) -> None:
    with Client(embedded_broker.address) as c:
        c.create_topic("cbs-ok", 3)
    rec = Recorder()
    with Producer(embedded_broker.address) as p:
        handles = [p.send_async("cbs-ok", f"m{i}", key=str(i), on_delivery=rec.for_message(i)) for i in range(200)]
        bad = p.send_async("cbs-ok", b"late", delay=TOO_LONG, on_delivery=rec.for_message(200))
        assert p.flush(timeout=20) == 0
        assert sorted(rec.calls) == list(range(201))
        for i, h in enumerate(handles):
            [(result, error)] = rec.calls[i]
            assert error is None and result == h.result(0)
            assert result is not None and result.queue_offset >= 0 and result.global_offset >= 0
        [(result, error)] = rec.calls[200]
        assert result is None and isinstance(error, DelayTooLong) and bad.exception(0) is error
        assert p.flush() == 0
    assert rec.threads == {"equeue-producer"}


def test_sync_add_done_callback_before_and_after_completion(embedded_broker: EmbeddedBroker) -> None:
    seen: list[tuple[str, str]] = []
    with Producer(embedded_broker.address, linger=math.inf) as p:
        h = p.send_async("cbs-done", b"x")
        for name in ("first", "second"):
            h.add_done_callback(lambda hh, name=name: seen.append((name, threading.current_thread().name)))
        assert seen == []
        assert p.flush(20) == 0
        assert seen == [("first", "equeue-producer"), ("second", "equeue-producer")]
        h.add_done_callback(lambda hh: seen.append(("late", threading.current_thread().name)))
        assert seen[2:] == [("late", threading.current_thread().name)]
        assert h.result(0).queue_offset == 0


def test_sync_raising_callback_does_not_break_later_sends(embedded_broker: EmbeddedBroker) -> None:
    def boom(result: SendResult | None, error: BaseException | None) -> None:
        raise ValueError("callback bug")

    rec = Recorder()
    with Producer(embedded_broker.address) as p:
        for i in range(3):
            p.send_async("cbs-raise", f"bad{i}", key="k", on_delivery=boom)
        assert p.flush(20) == 0
        for i in range(3):
            p.send_async("cbs-raise", f"m{i}", key="k", on_delivery=rec.for_message(i))
        assert p.flush(20) == 0
        assert [rec.calls[i][0][0].queue_offset for i in range(3)] == [3, 4, 5]  # type: ignore[union-attr]
        assert p.send("cbs-raise", b"after", key="k").queue_offset == 6


def test_sync_flush_timeout_returns_what_is_still_unanswered(embedded_broker: EmbeddedBroker) -> None:
    rec = Recorder()
    with Producer(embedded_broker.address, retries=1000, send_timeout=60) as p:
        p.send("cbs-down", b"route known")
        embedded_broker.stop()
        for i in range(5):
            p.send_async("cbs-down", f"m{i}", on_delivery=rec.for_message(i))
        assert p.flush(timeout=0.3) == 5
        assert p.pending_messages() == 5 and rec.calls == {}
        p.close(flush=False)
    assert sorted(rec.calls) == list(range(5))
    assert all(len(v) == 1 and isinstance(v[0][1], ClientClosed) for v in rec.calls.values())
