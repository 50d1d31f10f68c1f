"""The appender's replication hooks: ``call`` (a store function run in the writer
thread, in order with queued ops) and ``hold`` (committed ops handed over instead of
answered)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from equeue import Message, control, wire
from equeue.broker import storage as st
from equeue.broker.appender import Appender
from equeue.errors import BrokerShuttingDown, NotLeader


def _produce_op(info: control.TopicInfo, q: int, body: bytes) -> st.ProduceOp:
    return st.ProduceOp(info, q, [wire.encode_entry(Message(body))], None, -1, 4 << 20, 86_400_000)


async def test_call_runs_in_the_writer_thread_in_order_with_ops(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store)
        seen: list[tuple[str, int]] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                info = await app.submit(st.CreateTopicOp("t", 1))
                first = [app.enqueue(_produce_op(info, 0, b"a%d" % i)) for i in range(5)]

                def probe() -> int:  # sees the ops queued before it, none after
                    seen.append((threading.current_thread().name, store.view.queue(info.topic_id, 0).next_offset))
                    return 42

                async def late() -> None:
                    await trio.sleep(0)
                    for _ in range(5):
                        app.enqueue(_produce_op(info, 0, b"b"))

                n.start_soon(late)
                assert await app.call(probe) == 42
                for p in first:
                    await app.wait(p)

                def boom() -> None:
                    raise ValueError("from the writer")

                with pytest.raises(ValueError, match="from the writer"):
                    await app.call(boom)
                assert await app.call(lambda: 7) == 7  # the writer lives on
                app.close()
        assert seen == [("equeue-appender", 5)]
        assert store.view.queue(info.topic_id, 0).next_offset == 10
        with pytest.raises(BrokerShuttingDown):
            await app.call(lambda: 1)
    finally:
        store.close()


async def test_hold_receives_committed_ops_and_release_answers_them(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    held: list[tuple[list[Any], st.WriteOutcome]] = []
    try:
        app = Appender(store, hold=lambda batch, committed: held.append((batch, committed)))
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                create = app.enqueue(st.CreateTopicOp("t", 1))
                await trio.testing.wait_all_tasks_blocked()
                while not held:
                    await trio.sleep(0.01)
                assert not create.done.is_set()  # committed, held: not answered
                batch, committed = held.pop()
                app.release(batch, committed.results)
                info = await app.wait(create)
                assert info.name == "t"
                p = app.enqueue(_produce_op(info, 0, b"x"))
                while not held:
                    await trio.sleep(0.01)
                batch, _ = held.pop()
                app.fail(batch, NotLeader("stepped down"))
                with pytest.raises(NotLeader):
                    await app.wait(p)
                app.close()
    finally:
        store.close()




async def test_refuse_answers_queued_ops_unwritten_while_calls_still_run(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store)
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                info = await app.submit(st.CreateTopicOp("t", 1))
                app.refuse(NotLeader("stepped down"))
                with pytest.raises(NotLeader):
                    await app.submit(_produce_op(info, 0, b"refused"))
                assert await app.call(lambda: store.view.queue(info.topic_id, 0).next_offset) == 0
                app.refuse(None)
                assert (await app.submit(_produce_op(info, 0, b"written"))).stored == 1
                app.close()
    finally:
        store.close()
