"""The appender's commit hooks (``CommitHooks``): one object, one method per moment of a
transaction, on a real Store; ``enqueue`` returns the public ``PendingOp``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, control, wire
from equeue.broker import storage as st
from equeue.broker.appender import NO_HOOKS, Appender, CommitHooks, NoHooks, PendingOp
from tests.conftest import wait_until

WRITER = "equeue-appender"


def _produce_op(info: control.TopicInfo, body: bytes) -> st.ProduceOp:
    return st.ProduceOp(info, 0, [wire.encode_entry(Message(body))], None, -1, 4 << 20, 86_400_000)


class Recorder(NoHooks):
    """Records each hook call as (moment, thread name); holds when ``holding``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.holding = False
        self.held: list[tuple[list[PendingOp], st.WriteOutcome]] = []

    def _record(self, moment: str) -> None:
        self.calls.append((moment, threading.current_thread().name))

    def written(self, committed: st.WriteOutcome) -> None:
        self._record("written")

    def hold(self, batch: list[PendingOp], committed: st.WriteOutcome) -> bool:
        self._record("hold")
        if self.holding:
            self.held.append((batch, committed))
        return self.holding

    def committed(self, committed: st.WriteOutcome) -> None:
        self._record("committed")

    def answered(self) -> None:
        self._record("answered")


@asynccontextmanager
async def running(tmp_path: Path, hooks: CommitHooks, **kw: Any) -> AsyncIterator[Appender]:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store, hooks, **kw)
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                yield app
                app.close()
    finally:
        store.close()


async def test_hooks_run_once_per_transaction_in_order_and_in_their_threads(tmp_path: Path) -> None:
    hooks = Recorder()
    async with running(tmp_path, hooks) as app:
        info = await app.submit(st.CreateTopicOp("t", 1))
        loop = threading.current_thread().name
        assert hooks.calls == [("written", WRITER), ("hold", loop), ("committed", loop), ("answered", loop)]
        hooks.calls.clear()
        got: list[PendingOp] = []
        p = app.enqueue(_produce_op(info, b"x"), got.append)
        assert isinstance(p, PendingOp)
        await wait_until(lambda: bool(got), what="the op answered")
        assert got == [p] and p.done.is_set() and p.result.first_queue == 0
        assert [m for m, _ in hooks.calls] == ["written", "hold", "committed", "answered"]


async def test_an_inline_commit_runs_the_written_hook_on_the_loop(tmp_path: Path) -> None:
    hooks = Recorder()
    async with running(tmp_path, hooks, inline_bytes=64 << 10) as app:
        info = await app.submit(st.CreateTopicOp("t", 1))
        await wait_until(lambda: app._writer_waiting and not app._pending, what="the writer thread parked")
        hooks.calls.clear()
        p = app.enqueue(_produce_op(info, b"x"), defer=True)
        app.kick()  # inline: answered before kick returns
        loop = threading.current_thread().name
        assert p.result.first_queue == 0
        assert hooks.calls == [("written", loop), ("hold", loop), ("committed", loop), ("answered", loop)]


async def test_hooks_that_hold_get_the_ops_and_release_answers_them(tmp_path: Path) -> None:
    hooks = Recorder()
    async with running(tmp_path, hooks) as app:
        info = await app.submit(st.CreateTopicOp("t", 1))
        hooks.holding = True
        p = app.enqueue(_produce_op(info, b"x"))
        await wait_until(lambda: bool(hooks.held), what="the transaction held")
        assert not p.done.is_set()  # committed, held: not answered
        hooks.calls.clear()
        batch, committed = hooks.held.pop()
        assert batch == [p]
        app.release(batch, committed.results)
        assert p.result.first_queue == 0
        assert [m for m, _ in hooks.calls] == ["answered"]


async def test_a_failing_hook_is_logged_and_the_ops_are_still_answered(tmp_path: Path) -> None:
    class Broken(NoHooks):
        def written(self, committed: st.WriteOutcome) -> None:
            raise RuntimeError("a bug in written")

        def committed(self, committed: st.WriteOutcome) -> None:
            raise RuntimeError("a bug in committed")

    async with running(tmp_path, Broken()) as app:
        info = await app.submit(st.CreateTopicOp("t", 1))
        assert (await app.wait(app.enqueue(_produce_op(info, b"x")))).first_queue == 0


def test_hold_and_hooks_are_one_or_the_other(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        with pytest.raises(TypeError, match="hooks or hold"):
            Appender(store, Recorder(), hold=lambda batch, committed: None)
        app = Appender(store, Recorder())
        with pytest.raises(TypeError, match="has hooks"):
            app.hold = lambda batch, committed: None
        bare = Appender(store)
        assert bare.hooks is NO_HOOKS and bare.hold is None
        bare.hold = fn = lambda batch, committed: None
        assert bare.hold is fn
        bare.hold = None
        assert bare.hooks is NO_HOOKS
    finally:
        store.close()
