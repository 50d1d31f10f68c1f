"""Inline commits (``--flush async``): a batch of produce / offset-commit ops queued
with ``Appender.enqueue(defer=True)`` is committed by ``Appender.kick`` on the loop
when the writer thread is idle, nothing else is queued and the batch is at most
``inline_bytes``; otherwise the writer thread is woken as before.

The appender tests run a real Store and swap the appender's condition for
:class:`SpyCondition`, which counts wake-ups and can hold them back: a held
notification is exactly a writer thread that was notified but has not run yet (it
is still parked, ``_writer_waiting`` still true), so the "something else is queued"
cases are deterministic. ``store.write`` is wrapped to record which thread wrote.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, PullStatus, control, wire
from equeue.broker import Broker, open_broker
from equeue.broker import storage as st
from equeue.broker.appender import Appender
from equeue.broker.http import render_broker
from equeue.client import AsyncClient
from equeue.errors import (
    BrokerShuttingDown,
    EQueueError,
    InternalBrokerError,
    NotLeader,
    StoreFull,
    TopicNotFound,
)
from equeue.models import SendResult
from equeue.producer import AsyncProducer
from tests.conftest import make_config, wait_until, wait_until_sync
from tests.integration.test_crash import QUEUES, produce_until_killed, read_all

WRITER = "equeue-appender"


def _produce_op(info: control.TopicInfo, q: int, body: bytes) -> st.ProduceOp:
    return st.ProduceOp(info, q, [wire.encode_entry(Message(body))], None, -1, 4 << 20, 86_400_000)


class SpyCondition(threading.Condition):
    """The appender's condition, counting ``notify`` calls; while ``held`` they are
    recorded but not delivered (the writer stays parked as if not scheduled yet)."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.notified = 0
        self.held = False

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        if not self.held:
            super().notify(n)

    def deliver(self) -> None:
        """Stop holding wake-ups and deliver one now."""
        with self:
            self.held = False
            super().notify()


class Harness:
    def __init__(self, app: Appender, store: st.Store, cond: SpyCondition, threads: list[str]) -> None:
        self.app = app
        self.store = store
        self.cond = cond
        #: the thread of every store.write (in order)
        self.threads = threads
        self.loop_thread = threading.current_thread().name
        #: set: the writer thread's next store.write waits for it (before writing)
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    async def idle(self) -> None:
        """Wait until the writer thread is parked on its condition with nothing queued."""
        app = self.app
        await wait_until(lambda: app._writer_waiting and not app._pending, what="the writer thread parked")

    async def topic(self, queues: int = 1) -> control.TopicInfo:
        """Create topic ``t`` with ``queues`` queues, then wait until the writer thread
        parked (every test's starting point)."""
        info: control.TopicInfo = await self.app.submit(st.CreateTopicOp("t", queues))
        await self.idle()
        return info

    def next_offset(self, info: control.TopicInfo, q: int = 0) -> int:
        return self.store.view.queue(info.topic_id, q).next_offset


@asynccontextmanager
async def appender(tmp_path: Path, **kw: Any) -> AsyncIterator[Harness]:
    """A running Appender on a real Store (sync=False), its condition a SpyCondition."""
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store, **kw)
        cond = SpyCondition()
        app._cond = cond  # before run(): the writer thread takes it at its start
        h = Harness(app, store, cond, [])
        write = store.write

        def recording(ops: Sequence[st.WriteOp]) -> st.WriteOutcome:
            h.threads.append(threading.current_thread().name)
            if h.gate is not None and threading.current_thread().name == WRITER:
                h.entered.set()
                h.gate.wait(10)
            return write(ops)

        store.write = recording  # type: ignore[method-assign]
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                yield h
                cond.held = False
                app.close()
    finally:
        store.close()


# ---------------------------------------------------------------------- 1. inline


async def test_kick_commits_a_small_deferred_batch_on_the_loop_in_one_transaction(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic(2)
        tx, notified, writes = app.transactions, h.cond.notified, len(h.threads)
        answered: list[object] = []
        ops: list[st.WriteOp] = [
            _produce_op(info, 0, b"a0"), st.CommitOffsetOp("g", "t", 0, 5), _produce_op(info, 1, b"b0"),
            _produce_op(info, 0, b"a1"),
        ]  # fmt: skip
        ps = [app.enqueue(op, answered.append, defer=True) for op in ops]
        assert h.cond.notified == notified  # deferred: the writer is not woken
        assert not any(p.done.is_set() for p in ps)
        app.kick()
        # answered before kick returned, in one transaction written by the loop thread
        assert all(p.done.is_set() for p in ps)
        assert answered == ps
        assert (app.inline_transactions, app.transactions) == (1, tx + 1)
        assert h.threads[writes:] == [h.loop_thread]
        assert h.cond.notified == notified
        assert app.inline_max_seconds > 0
        assert [ps[0].result.first_queue, ps[2].result.first_queue, ps[3].result.first_queue] == [0, 0, 1]
        assert ps[1].result is None  # an offset commit answers None
        assert (h.next_offset(info, 0), h.next_offset(info, 1)) == (2, 1)
        assert h.store.view.offsets[("g", "t", 0)] == 5
        # the writer thread still works after an inline commit
        assert (await app.submit(_produce_op(info, 0, b"a2"))).first_queue == 2
        assert h.threads[-1] == WRITER


async def test_kicks_keep_the_order_of_the_ops(tmp_path: Path) -> None:
    rnd = random.Random(7)
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        ps = []
        for _ in range(30):
            now = [
                app.enqueue(_produce_op(info, 0, b"body-%05d" % (len(ps) + i)), defer=True)
                for i in range(rnd.randint(1, 6))
            ]
            app.kick()
            assert all(p.done.is_set() for p in now)
            ps += now
        assert app.inline_transactions == 30
        assert [p.result.first_queue for p in ps] == list(range(len(ps)))
        got, _r = h.store.read_messages(info, 0, 0, 1000, 1 << 20)
        assert [m.body for m in got] == [b"body-%05d" % i for i in range(len(ps))]  # stored in order
        assert h.next_offset(info) == len(ps)


async def test_a_deferred_op_waits_for_a_kick_or_a_wake_up(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        notified = h.cond.notified
        p = app.enqueue(_produce_op(info, 0, b"deferred"), defer=True)
        await trio.lowlevel.checkpoint()
        # not woken, not written: it waits for the kick (the connection kicks before
        # every await of its read loop)
        assert h.cond.notified == notified
        assert app._pending[-1] is p and not p.done.is_set()
        assert h.next_offset(info) == 0
        app.kick()
        assert p.done.is_set() and p.result.first_queue == 0
        # a deferred op followed by a plain enqueue: the wake-up writes both, in one
        # transaction of the writer thread
        await h.idle()
        tx, writes = app.transactions, len(h.threads)
        p1 = app.enqueue(_produce_op(info, 0, b"deferred too"), defer=True)
        p2 = app.enqueue(_produce_op(info, 0, b"plain"))
        assert h.cond.notified == notified + 1
        assert (await app.wait(p2)).first_queue == 2
        assert p1.done.is_set() and p1.result.first_queue == 1
        assert (app.transactions, app.inline_transactions) == (tx + 1, 1)
        assert h.threads[writes:] == [WRITER]


async def test_inline_answers_never_overtake_a_writer_transaction(tmp_path: Path) -> None:
    """The writer thread committed a transaction and posted its answers, which the
    loop has not run yet, and is parked again: a kick then must not commit (and
    answer) the next batch inline before them. Answers (the ops' callbacks, and
    ``hold`` in a replicated broker, whose held acks are released in position
    order) come in commit order."""
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        answered: list[object] = []
        first = app.enqueue(_produce_op(info, 0, b"first"), answered.append)
        # no checkpoint from here: the writer's posted answers cannot run
        wait_until_sync(
            lambda: h.next_offset(info) == 1 and app._writer_waiting and not app._pending,
            what="the writer committed and parked again",
        )
        assert not first.done.is_set()
        second = app.enqueue(_produce_op(info, 0, b"second"), answered.append, defer=True)
        app.kick()
        assert app.inline_transactions == 0 and not second.done.is_set()
        assert (await app.wait(second)).first_queue == 1
        assert answered == [first, second]
        # once they ran, the next kick commits inline again
        await h.idle()
        third = app.enqueue(_produce_op(info, 0, b"third"), answered.append, defer=True)
        app.kick()
        assert third.done.is_set() and app.inline_transactions == 1


# ---------------------------------------------------------------------- 2. not inline


async def _committed_by_the_writer(h: Harness, ps: list[Any]) -> None:
    """``ps`` were kicked: the writer thread (not the loop) commits them."""
    assert not any(p.done.is_set() for p in ps)  # answers of the writer thread come later
    for p in ps:
        await h.app.wait(p)
    assert h.app.inline_transactions == 0
    assert h.threads[-1] == WRITER


async def test_not_inline_while_the_writer_thread_is_writing(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        h.gate = threading.Event()
        first = app.enqueue(_produce_op(info, 0, b"first"))
        await trio.to_thread.run_sync(h.entered.wait, 10)  # the writer is in store.write
        assert not app._writer_waiting
        p = app.enqueue(_produce_op(info, 0, b"second"), defer=True)
        app.kick()
        assert not p.done.is_set() and app.inline_transactions == 0
        h.gate.set()
        assert (await app.wait(first)).first_queue == 0
        assert (await app.wait(p)).first_queue == 1  # after the writer's transaction
        assert app.inline_transactions == 0 and h.threads[-2:] == [WRITER, WRITER]


async def test_not_inline_when_inline_bytes_is_0(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=0) as h:
        info = await h.topic()
        notified = h.cond.notified
        ps = [h.app.enqueue(_produce_op(info, 0, b"x"), defer=True) for _ in range(3)]
        h.app.kick()
        assert h.cond.notified == notified + 1  # the kick woke the writer
        await _committed_by_the_writer(h, ps)
        assert [p.result.first_queue for p in ps] == [0, 1, 2]


async def test_not_inline_when_the_batch_is_larger_than_inline_bytes(tmp_path: Path) -> None:
    entry = len(wire.encode_entry(Message(b"y" * 50)))
    async with appender(tmp_path, inline_bytes=2 * entry) as h:
        info = await h.topic()
        # exactly inline_bytes: inline
        ps = [h.app.enqueue(_produce_op(info, 0, b"y" * 50), defer=True) for _ in range(2)]
        h.app.kick()
        assert all(p.done.is_set() for p in ps) and h.app.inline_transactions == 1
        # one byte more: the writer thread
        h.app.inline_transactions = 0
        ps = [
            h.app.enqueue(_produce_op(info, 0, b"y" * 50), defer=True),
            h.app.enqueue(_produce_op(info, 0, b"y" * 51), defer=True),
        ]
        h.app.kick()
        await _committed_by_the_writer(h, ps)
        assert [p.result.first_queue for p in ps] == [2, 3]


async def test_not_inline_when_an_op_has_no_inline_size(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        info = await h.topic()
        assert st.CreateTopicOp("u", 1).inline_size() is None
        ps = [
            h.app.enqueue(_produce_op(info, 0, b"x"), defer=True),
            h.app.enqueue(st.CreateTopicOp("u", 1), defer=True),
            h.app.enqueue(_produce_op(info, 0, b"z"), defer=True),
        ]
        h.app.kick()
        await _committed_by_the_writer(h, ps)
        assert ps[1].result.name == "u"
        assert [ps[0].result.first_queue, ps[2].result.first_queue] == [0, 1]


async def test_not_inline_while_a_call_is_queued(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        seen: list[tuple[str, int]] = []

        def probe() -> int:
            seen.append((threading.current_thread().name, h.next_offset(info)))
            return 1

        results: list[int] = []

        async def call() -> None:
            results.append(await app.call(probe))

        h.cond.held = True  # the call's wake-up is on its way, the writer still parked
        async with trio.open_nursery() as n:
            n.start_soon(call)
            await wait_until(lambda: app._calls == 1, what="the call queued")
            assert app._writer_waiting
            p = app.enqueue(_produce_op(info, 0, b"after the call"), defer=True)
            app.kick()
            assert not p.done.is_set() and app.inline_transactions == 0
            h.cond.deliver()
            await _committed_by_the_writer(h, [p])
        # in order: the call ran first (in the writer thread), then the produce
        assert results == [1] and seen == [(WRITER, 0)]
        assert p.result.first_queue == 0


async def test_not_inline_while_refusing_and_the_writer_fails_the_ops(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        writes = len(h.threads)
        app.refuse(NotLeader("stepped down"))
        ps = [app.enqueue(_produce_op(info, 0, b"refused"), defer=True) for _ in range(2)]
        app.kick()
        assert not any(p.done.is_set() for p in ps)
        for p in ps:
            with pytest.raises(NotLeader, match="stepped down"):
                await app.wait(p)
        assert app.inline_transactions == 0
        assert len(h.threads) == writes and h.next_offset(info) == 0  # nothing written
        app.refuse(None)
        await h.idle()
        p = app.enqueue(_produce_op(info, 0, b"written"), defer=True)
        app.kick()
        assert p.done.is_set() and p.result.first_queue == 0 and app.inline_transactions == 1


# ---------------------------------------------------------------------- 3. errors inline


async def test_an_op_failing_inline_fails_alone(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await app.submit(st.CreateTopicOp("t", 1))
        gone = await app.submit(st.CreateTopicOp("gone", 1))
        await app.submit(st.DeleteTopicOp("gone"))
        await h.idle()
        ps = [
            app.enqueue(_produce_op(info, 0, b"a"), defer=True),
            app.enqueue(_produce_op(gone, 0, b"to a deleted topic"), defer=True),
            app.enqueue(_produce_op(info, 0, b"b"), defer=True),
        ]
        app.kick()
        assert all(p.done.is_set() for p in ps) and app.inline_transactions == 1
        assert isinstance(ps[1].result, TopicNotFound)
        assert [ps[0].result.first_queue, ps[2].result.first_queue] == [0, 1]
        p = app.enqueue(_produce_op(info, 0, b"c"), defer=True)
        app.kick()
        assert p.result.first_queue == 2 and app.inline_transactions == 2


async def test_a_transaction_failing_inline_answers_its_ops_and_the_appender_lives_on(tmp_path: Path) -> None:
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        recording = h.store.write
        failures: list[BaseException] = [StoreFull("the map is full"), RuntimeError("a bug")]
        try:
            for exc in failures:

                def fail(ops: Sequence[st.WriteOp], exc: BaseException = exc) -> st.WriteOutcome:
                    raise exc

                h.store.write = fail  # type: ignore[method-assign]
                ps = [app.enqueue(_produce_op(info, 0, b"lost"), defer=True) for _ in range(2)]
                app.kick()  # never raises
                assert all(p.done.is_set() for p in ps)
                for p in ps:
                    if isinstance(exc, EQueueError):
                        assert p.result is exc
                    else:  # anything else is the broker's bug: INTERNAL_ERROR
                        assert isinstance(p.result, InternalBrokerError)
                        assert "a bug" in str(p.result)
                    with pytest.raises(type(p.result)):
                        await app.wait(p)
        finally:
            h.store.write = recording  # type: ignore[method-assign]
        assert app.inline_transactions == 2 and h.next_offset(info) == 0
        # both paths keep working
        p = app.enqueue(_produce_op(info, 0, b"inline"), defer=True)
        app.kick()
        assert p.result.first_queue == 0 and app.inline_transactions == 3
        assert (await app.submit(_produce_op(info, 0, b"thread"))).first_queue == 1
        assert h.threads[-1] == WRITER


async def test_a_keyboard_interrupt_in_an_inline_commit_answers_the_ops_and_goes_on_up(tmp_path: Path) -> None:
    """Ctrl-C landing in the loop thread during an inline commit (an embedded broker) is
    not turned into an error answer and swallowed: the ops are answered (resend: whether
    the transaction committed is unknown), then the KeyboardInterrupt propagates."""
    async with appender(tmp_path, inline_bytes=64 << 10) as h:
        app = h.app
        info = await h.topic()
        recording = h.store.write

        def interrupted(ops: Sequence[st.WriteOp]) -> st.WriteOutcome:
            raise KeyboardInterrupt

        h.store.write = interrupted  # type: ignore[method-assign]
        try:
            ps = [app.enqueue(_produce_op(info, 0, b"%d" % i), defer=True) for i in range(2)]
            with pytest.raises(KeyboardInterrupt):
                app.kick()
        finally:
            h.store.write = recording  # type: ignore[method-assign]
        assert all(isinstance(p.result, BrokerShuttingDown) for p in ps)
        p = app.enqueue(_produce_op(info, 0, b"after"), defer=True)  # the appender lives on
        app.kick()
        assert p.result.first_queue == 0


async def test_a_holder_failing_after_it_answered_some_ops_never_answers_them_twice(tmp_path: Path) -> None:
    """A ``hold`` (a replicated leader's) that releases the produces and then fails: the
    released ops keep their answer and get no second one (the client would get two
    responses to one request), the others are failed; on both paths."""
    holder: dict[str, Any] = {}

    def hold(batch: Sequence[Any], committed: st.WriteOutcome) -> None:
        app: Appender = holder["app"]
        app.release(batch[:1], committed.results[:1])  # the first is answered ...
        raise RuntimeError("a bug after releasing")  # ... then the holder fails

    async with appender(tmp_path, inline_bytes=64 << 10, hold=hold) as h:
        app = holder["app"] = h.app
        h.app.hold = None  # the topic is created without the holder
        info = await h.topic()
        app.hold = hold
        for inline in (True, False):
            answers: list[Any] = []
            record = answers.append
            ps = [
                app.enqueue(_produce_op(info, 0, b"%d" % i), lambda p, rec=record: rec(p.result), defer=inline)
                for i in range(2)
            ]
            if inline:
                app.kick()
            await wait_until(lambda n=answers: len(n) >= 2, what="both answered")
            await h.idle()
            assert len(answers) == 2, answers  # once each
            assert isinstance(ps[0].result, wire.ProduceResponse)
            assert isinstance(ps[1].result, InternalBrokerError) and "a bug after releasing" in str(ps[1].result)
            assert answers[0] is ps[0].result


# ---------------------------------------------------------------------- 4. a broker


async def _read_queue(c: AsyncClient, topic: str, q: int) -> list[Message]:
    out: list[Message] = []
    off = 0
    while True:
        r = await c.pull(wire.PullRequest(topic, q, off, 10_000, 16 << 20))
        if r.status is not PullStatus.FOUND:
            assert r.status is PullStatus.NO_NEW_MESSAGE, r.status
            return out
        out += r.messages
        off = r.next_offset


async def _writer_parked(broker: Broker) -> None:
    app = broker.appender
    await wait_until(lambda: app._writer_waiting and not app._pending, what="the writer thread parked")


@pytest.mark.parametrize("inline_commit_bytes", [256 << 10, 0])
async def test_a_flush_async_broker_commits_inline(tmp_path: Path, inline_commit_bytes: int) -> None:
    cfg = make_config(tmp_path / "data", flush="async", inline_commit_bytes=inline_commit_bytes)
    with trio.fail_after(30):
        async with open_broker(cfg) as broker, AsyncClient(broker.address) as c, AsyncProducer(broker.address) as p:
            await c.create_topic("inl", 4)
            await _writer_parked(broker)
            sent: list[tuple[SendResult, bytes, str]] = []
            for i in range(60):
                body, key = b"s%d" % i, f"k{i % 6}"
                sent.append((await p.send("inl", body, key=key), body, key))
            batch = [Message(b"b%d" % i, key=f"k{i % 6}") for i in range(240)]
            for r, m in zip(await p.send_batch("inl", batch), batch, strict=True):
                sent.append((r, m.body, m.key or ""))

            # a long-polling pull parked before the produce is answered by it
            q = sent[0][0].queue_id
            tail = (await c.pull(wire.PullRequest("inl", q, 0, 1))).max_offset
            polled: list[Any] = []

            async def poll() -> None:
                polled.append(await c.pull(wire.PullRequest("inl", q, tail, 10, 1 << 20, max_wait_ms=20_000)))

            async with trio.open_nursery() as n:
                n.start_soon(poll)
                await wait_until(lambda: broker.parked.parked == 1, what="the pull parked")
                await _writer_parked(broker)
                before = broker.appender.inline_transactions
                a = await c.produce(wire.ProduceRequest("inl", q, [wire.encode_entry(Message(b"woken"))]))
            assert a.first_queue == tail
            assert polled[0].status is PullStatus.FOUND and [m.body for m in polled[0].messages] == [b"woken"]
            assert broker.appender.inline_transactions == before + bool(inline_commit_bytes)

            # offset commits
            await c.commit_offset("grp", "inl", q, tail)
            assert await c.query_offset("grp", "inl", q) == tail

            # everything back, exactly once, in order per queue and per key
            where = {(r.queue_id, r.queue_offset): (body, key) for r, body, key in sent}
            assert len(where) == len(sent)
            got: dict[tuple[int, int], tuple[bytes, str]] = {}
            for qid in range(4):
                msgs = await _read_queue(c, "inl", qid)
                assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
                for m in msgs:
                    got[(qid, m.queue_offset)] = (m.body, m.key or "")
            assert got.pop((q, tail)) == (b"woken", "")
            assert got == where
            for key in {k for _, _, k in sent}:
                mine = [(r.queue_id, r.queue_offset) for r, _, k in sent if k == key]
                assert mine == sorted(mine) and len({qid for qid, _ in mine}) == 1

            stats = await c.stats()
            assert stats.transactions >= stats.inline_transactions
            text = render_broker(stats)
            assert f"equeue_write_transactions_inline_total {float(stats.inline_transactions)}\n" in text
            assert "equeue_write_inline_max_seconds " in text
            if inline_commit_bytes:  # nearly every produce (each sent with the writer idle)
                assert stats.inline_transactions >= 60
                assert 0 < stats.inline_max_seconds < 5
            else:
                assert (stats.inline_transactions, stats.inline_max_seconds) == (0, 0.0)


# ---------------------------------------------------------------------- 5. crash


async def test_sigkill_after_inline_commits_loses_nothing_acknowledged(broker_process: Any) -> None:
    """Like tests/integration/test_crash.py (flush async), shorter, and with the
    inline commits checked to have happened: fsync never runs (--flush-interval 1 h)
    so only what the commits wrote to the map survives the kill."""
    proc = broker_process("--flush", "async", "--flush-interval", "3600")
    acked: dict[tuple[int, int], bytes] = {}
    with trio.fail_after(60):
        async with AsyncClient(proc.address) as admin:
            await admin.create_topic("crash", QUEUES)

            async def inlined() -> bool:
                return (await admin.stats()).inline_transactions > 0

            async with trio.open_nursery() as n:
                for pid in range(2):
                    n.start_soon(produce_until_killed, proc.address, acked, pid)
                await wait_until(lambda: len(acked) >= 400, timeout=30, what="400 messages acked")
                await wait_until(inlined, what="inline commits")
                proc.kill()  # SIGKILL mid-stream
                assert proc.proc is not None and proc.proc.returncode == -signal.SIGKILL
        proc.start()  # same data directory
        stored = await read_all(proc.address)
    for q in range(QUEUES):
        assert [m.queue_offset for m in stored[q]] == list(range(len(stored[q]))), f"queue {q} has gaps"
    for (q, off), body in acked.items():
        assert off < len(stored[q]), f"acknowledged message {q}/{off} lost"
        assert stored[q][off].body == body, f"message {q}/{off} has a different body"
