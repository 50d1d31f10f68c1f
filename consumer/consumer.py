"""``Consumer``: the blocking front of :class:`equeue.consumer.async_consumer.AsyncConsumer`.

All logic lives in the async core, running on a private trio loop in a helper thread
(:class:`equeue.client.loop_thread.SyncFront`); this class only forwards. Sync handlers run
in worker threads of that loop, or inline on the loop thread once they prove fast
(``handler_threads``, see docs/consumer.md). The iterator form takes messages from
the loop a batch at a time (one hand-off per batch, sized to the loop body's speed).

Ctrl-C: the calling thread waits for the loop's work through :class:`_Pending`, whose
outcome outlives a KeyboardInterrupt raised while waiting. So Ctrl-C never abandons
work that is running on the loop: a join in progress finishes (then the member
leaves), and the final close (commit, leave) always runs to its end before the loop
is shut down. Shutting the loop down cancels everything on it, the connection's
reader included: a close still running then could neither commit nor leave.

Python raises KeyboardInterrupt between any two bytecodes, so a wait alone leaves
windows: just after the join ended, before its member was kept, a Ctrl-C tore the
loop down and the member stayed registered. The join and the close therefore run
with Ctrl-C *deferred* (:func:`_ctrl_c_deferred`: taken, remembered, raised once the
step is done) when SIGINT has Python's default handler, as in the CLI.
"""

from __future__ import annotations

import inspect
import queue
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, Generic, TypeVar

import trio

from equeue.client.loop_thread import LoopThread, SyncFront
from equeue.consumer.async_consumer import MAX_POLL, AsyncConsumer, ConsumerStatistics, queue_list
from equeue.consumer.dispatch import CHUNK_SECONDS, chunk_size
from equeue.errors import ClientClosed, ConfigError, EQueueError
from equeue.models import Message

__all__ = ["Consumer"]

#: the rebalance listeners (:class:`equeue.consumer.options.ConsumerOptions`): plain
#: functions here, run in a worker thread of the loop (:meth:`Consumer._listener`)
LISTENERS = ("on_assigned", "on_revoked", "on_lost")

T = TypeVar("T")

#: seconds between two looks at pending signals while a thread waits for the loop
SIGNAL_CHECK = 0.2


@contextmanager
def _ctrl_c_deferred() -> Iterator[list[bool]]:
    """Within the block a Ctrl-C is remembered instead of raised (the list it yields
    holds one flag: set it to raise one too); KeyboardInterrupt is raised once the
    block ends. Only in the main thread with Python's default SIGINT handler (the
    only case where Python raises KeyboardInterrupt on its own); otherwise the block
    runs as is, and a KeyboardInterrupt a custom handler raises goes through."""
    taken = [False]
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield taken
        if taken[0]:
            raise KeyboardInterrupt
        return

    def remember(signum: int, frame: FrameType | None) -> None:
        taken[0] = True

    signal.signal(signal.SIGINT, remember)
    try:
        yield taken
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if taken[0]:
        raise KeyboardInterrupt


class _Cancelled(Exception):
    """The outcome of a :class:`_Pending` call cancelled by :meth:`_Pending.cancel`."""


class _Pending(Generic[T]):
    """A call running on a consumer's loop, waited for by another thread.

    The loop stores the outcome *before* it wakes the waiter (a ``SimpleQueue``,
    whose ``get`` a signal interrupts without losing anything), so a KeyboardInterrupt
    raised in :meth:`wait` loses nothing: wait again for the same outcome."""

    def __init__(self) -> None:
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._scope: trio.CancelScope | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel = False

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        """Store the outcome, then wake the waiter (from the loop, or at once on failure)."""
        self._value, self._error, self._done = value, error, True
        self._wake.put(None)

    def _sleep(self) -> None:
        """Block until the outcome is in. In slices: a signal whose C handler ran in
        another thread (any thread may take a process's signal) does not interrupt this
        thread's wait, and Python runs its handler (KeyboardInterrupt) only once this
        thread runs bytecode again."""
        while not self._done:
            try:
                self._wake.get(timeout=SIGNAL_CHECK)
            except queue.Empty:
                pass

    def wait(self) -> T:
        """The call's result, or raises its error. A KeyboardInterrupt raised while
        waiting leaves the call running: wait again for its outcome."""
        self._sleep()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def wait_through_interrupts(self) -> bool:
        """Wait until the call ended (whatever its outcome), through Ctrl-C; whether a
        KeyboardInterrupt arrived meanwhile (the caller raises it once done)."""
        interrupted = False
        while True:
            try:
                self._sleep()
                return interrupted
            except KeyboardInterrupt:
                interrupted = True

    def took_messages(self) -> bool:
        """Whether the call ended (before a cancel landed) with a non-empty list (a
        batch the waiter never received when it was interrupted)."""
        return self._done and self._error is None and isinstance(self._value, list) and bool(self._value)

    def cancel(self) -> None:
        """Cancel the call (its outcome becomes :class:`_Cancelled` unless it ended first)."""
        self._cancel = True  # before reading the scope: a call starting now sees the flag
        token, scope = self._token, self._scope
        if token is not None and scope is not None:
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass


class _Loop(LoopThread):
    """The consumer's loop thread: :meth:`submit` starts a call whose outcome a
    thread waits for through Ctrl-C (:class:`_Pending`)."""

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None
        return self._nursery

    def submit(self, afn: Callable[..., Awaitable[T]], *args: Any) -> _Pending[T]:
        """Start ``await afn(*args)`` on the loop (a system task: the loop's shutdown cancels
        it last) and return its pending outcome. A closed loop: the outcome is
        ClientClosed."""
        pending: _Pending[T] = _Pending()
        token = self._token

        async def task() -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                with trio.CancelScope() as scope:
                    pending._scope, pending._token = scope, token
                    if pending._cancel:
                        scope.cancel()
                    value = await afn(*args)
                if scope.cancelled_caught:
                    error = _Cancelled()
            except trio.Cancelled:
                pending.settle(error=ClientClosed("the consumer's event loop closed"))
                raise
            except BaseException as exc:  # handed to the waiting thread, raised there
                error = exc
            pending.settle(value, error)

        def spawn() -> None:
            try:
                trio.lowlevel.spawn_system_task(task, name=getattr(afn, "__qualname__", "consumer call"))
            except RuntimeError:  # the system nursery is closed: the loop is ending
                pending.settle(error=ClientClosed("the consumer's event loop is not running"))

        if not self.alive or token is None:
            raise ClientClosed("the consumer's event loop is not running (closed or forked)")
        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            pending.settle(error=ClientClosed("the consumer's event loop is not running"))
        return pending


class Consumer(SyncFront[AsyncConsumer]):
    """A member of a consumer group (blocking). Same arguments as
    :class:`~equeue.consumer.async_consumer.AsyncConsumer`; joins the group on the first
    :meth:`run` or iteration. The rebalance listeners (``on_assigned``, ``on_revoked``,
    ``on_lost``) are plain functions, each call run in a worker thread of the loop
    (docs/consumer.md, "Rebalance listeners"). No topics: manual assignment with
    :meth:`assign` (with a group: its committed offsets, commits to it; ``None``: no
    commit). Raises ConfigError for invalid arguments, TypeError
    for an async listener."""

    def __init__(
        self, brokers: str | Sequence[str], group: str | None, topics: str | Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__()
        for name in LISTENERS:
            fn = kwargs.get(name)
            if inspect.iscoroutinefunction(fn):
                raise TypeError(f"{name}: the blocking Consumer calls plain functions (async ones are for AsyncConsumer)")
        probe = AsyncConsumer(brokers, group, topics, **kwargs)  # validates; no I/O
        kwargs["consumer_id"] = probe.consumer_id
        self.consumer_id = probe.consumer_id
        self.group = probe.group
        self.topics = probe.topics
        self.manual = probe.manual
        self._args = (brokers, group, topics)
        self._kwargs = kwargs
        self._token: trio.lowlevel.TrioToken | None = None
        self._close_pending = False
        #: the join in progress (or done): close() waits for it before leaving
        self._joining: _Pending[AsyncConsumer] | None = None
        #: stop() before the core existed: applied once joined
        self._stop_requested = False
        #: ``core``: set in a listener's thread while it runs (:meth:`_listener`)
        self._local = threading.local()

    def _make_core(self) -> AsyncConsumer:
        self._token = trio.lowlevel.current_trio_token()  # runs on the loop
        cell: list[AsyncConsumer] = []
        kwargs = dict(self._kwargs)
        for name in LISTENERS:
            if kwargs.get(name) is not None:
                kwargs[name] = self._listener(kwargs[name], cell)
        core = AsyncConsumer(*self._args, **kwargs)
        cell.append(core)
        return core

    def _listener(self, fn: Callable[[set[tuple[str, int]]], Any], cell: list[AsyncConsumer]
                  ) -> Callable[[set[tuple[str, int]]], Awaitable[None]]:  # fmt: skip
        """``fn`` as the core's (async) listener: called in a worker thread of the loop,
        awaited by the core's task, so it may block and call this consumer's methods
        (:meth:`commit` too, during the close as well: see :meth:`_core_here`)."""

        def call(queues: set[tuple[str, int]]) -> None:
            self._local.core = cell[0] if cell else None
            try:
                fn(queues)
            finally:
                self._local.core = None

        async def listener(queues: set[tuple[str, int]]) -> None:
            await trio.to_thread.run_sync(call, queues)

        return listener

    def _core_here(self) -> AsyncConsumer:
        """The core to call: in a rebalance listener's thread, the core that called it
        (even while closing: its ``on_revoked`` may still commit), else the joined core
        (joining first if needed)."""
        core: AsyncConsumer | None = getattr(self._local, "core", None)
        return core if core is not None else self._ensure()[1]

    async def _keep_open(self, task_status: trio.TaskStatus[AsyncConsumer] = trio.TASK_STATUS_IGNORED) -> None:
        """Build the core and keep it entered (joined) until the loop closes."""
        core = self._make_core()
        async with core:
            task_status.started(core)
            await trio.sleep_forever()

    def _ensure(self) -> tuple[LoopThread, AsyncConsumer]:
        """The loop and the joined core, joining now if needed. Ctrl-C during the join
        lets the join finish (a member half-registered and then cut off would stay
        in the group until the broker expires it) and is raised after it; the caller's
        close then leaves. Raises the join's error (ConnectionBroken...)."""
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed")
        loop, core = self._loop, self._core
        if loop is not None and loop.alive and core is not None:
            return loop, core
        with self._lock:
            if self._closed:
                raise ClientClosed(f"{type(self).__name__} is closed")
            if self._loop is None or not self._loop.alive or self._core is None:
                with _ctrl_c_deferred() as interrupted:
                    new = _Loop(f"equeue-{type(self).__name__.lower()}")
                    # the join is published before the loop, so a close() that sees the loop
                    # sees the join too, and lets it finish rather than cancel it mid-flight
                    joining = self._joining = new.submit(new.nursery.start, self._keep_open)
                    self._loop = new
                    if joining.wait_through_interrupts():
                        interrupted[0] = True
                    try:
                        self._core = joining.wait()
                    except BaseException:
                        self._loop = None
                        self._joining = None
                        new.close()
                        raise
                    if self._stop_requested:
                        self._core.stop()
            return self._loop, self._core

    def _on_loop(self) -> bool:
        """Called by a handler running inline on this consumer's loop thread?"""
        if self._token is None or not trio.lowlevel.in_trio_run():
            return False
        return trio.lowlevel.current_trio_token() is self._token

    def start(self) -> None:
        """Join the group now (otherwise the first run/iteration does)."""
        self._ensure()

    def run(self, handler: Callable[[Message], Any]) -> None:
        """Call ``handler(msg)`` for every message until :meth:`stop` or :meth:`close`
        (from another thread, a signal handler or the handler). Ctrl-C closes cleanly
        (a join in progress finishes, then commit, leave: see :meth:`close`) and
        re-raises KeyboardInterrupt."""
        try:
            loop, core = self._ensure()
            if not isinstance(loop, _Loop):  # pragma: no cover - _ensure makes one
                raise ClientClosed("the consumer's event loop is not running")
            loop.submit(core.run, handler).wait()
        except KeyboardInterrupt:
            self.close()
            raise
        except (trio.Cancelled, trio.RunFinishedError, ClientClosed):
            if not self._closed:
                raise
        if self._close_pending:
            self.close()

    def __iter__(self) -> Iterator[Message]:
        """Iterate messages; one is done when the loop asks for the next. Breaking out
        (or an exception) leaves the current one undone: it is delivered again.

        Messages come from the consumer's loop in batches of one queue (one hand-off
        per batch; one message per batch while the loop body is slow, up to 512 while
        it is fast); the messages before the current one are marked done on the loop
        at the next hand-off. Stop, or losing the queue, ends the batch early. Ctrl-C
        while waiting for a batch cancels that wait (what it took goes back first in
        line) before KeyboardInterrupt is raised."""
        loop, core = self._ensure()
        assert isinstance(loop, _Loop)
        it = loop.run_sync(core.iteration)
        per_msg = CHUNK_SECONDS  # moving average of the loop body, seconds per message
        clock = time.perf_counter
        done = 0
        try:
            while True:
                limit = chunk_size(per_msg)
                # once handed over, the loop owns the count (an interrupted hand-off may
                # or may not have settled it: then those messages are redelivered)
                settled, done = done, 0
                pending = loop.submit(it.next_batch, settled, limit)
                try:
                    batch = pending.wait()
                except KeyboardInterrupt:
                    pending.cancel()  # a batch it took anyway is settled (undone) below
                    pending.wait_through_interrupts()
                    raise
                except (_Cancelled, trio.Cancelled, trio.RunFinishedError, ClientClosed):
                    if self._closed:
                        return
                    raise
                if batch is None:
                    return
                t0 = clock()
                for msg in batch:
                    if not it.live:  # stopped, or the batch's queue was lost
                        break
                    yield msg
                    done += 1
                if done:
                    per_msg = 0.8 * per_msg + 0.2 * (clock() - t0) / done
        finally:
            if loop.alive:
                try:
                    loop.run_sync(it.end, done)
                except (trio.RunFinishedError, ClientClosed):
                    pass

    def poll(self, timeout: float, max_messages: int = MAX_POLL) -> list[Message]:
        """Wait up to ``timeout`` seconds for messages; return a batch of up to
        ``max_messages`` (``[]`` when none came in time, or once stopped or closed).
        What the previous poll returned is done now (commit-on-poll, as
        :meth:`AsyncConsumer.poll`: committed with the next commit, periodic,
        :meth:`commit`, :meth:`commit_async` or :meth:`close`). ``timeout=0`` returns
        what is buffered already. Joins the group first if needed (not counted in the
        timeout). Ctrl-C while waiting cancels the wait (nothing is taken) before
        KeyboardInterrupt is raised.

        Raises ConfigError for a negative or NaN ``timeout`` (and as
        :meth:`AsyncConsumer.poll`: RuntimeError when mixed with :meth:`run` or iteration)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be seconds (a number), got {timeout!r}")
        if not timeout >= 0:
            raise ConfigError(f"timeout must be >= 0 seconds, got {timeout!r}")
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise TypeError(f"max_messages must be an int, got {max_messages!r}")
        if max_messages < 1:
            raise ConfigError(f"max_messages must be >= 1, got {max_messages}")
        if self._closed:
            return []
        if self._on_loop() or getattr(self._local, "core", None) is not None:
            raise RuntimeError("poll() cannot be called from a handler or a rebalance listener of this consumer")
        loop, core = self._ensure()
        assert isinstance(loop, _Loop)

        async def poll() -> list[Message]:
            with trio.move_on_after(timeout):
                return await core.poll(max_messages)
            return []

        pending = loop.submit(poll)
        try:
            return pending.wait()
        except KeyboardInterrupt:
            pending.cancel()  # a wait cancelled takes nothing
            pending.wait_through_interrupts()
            if pending.took_messages():  # it had returned a batch before the cancel landed
                loop.run_sync(core.undo_poll)  # not handed out: back first in line
            raise
        except (_Cancelled, trio.Cancelled, trio.RunFinishedError, ClientClosed):
            if self._closed:
                return []
            raise

    def stop(self) -> None:
        """Stop handing out messages; :meth:`run` returns (safe from a handler, another
        thread or a signal handler: it never blocks). Before the group is joined, it
        takes effect once joined."""
        self._stop_requested = True
        core = self._core
        if core is not None:
            core.stop()  # thread-safe: from another thread its loop part is scheduled on the loop

    def commit(self) -> None:
        """Commit offsets that moved, now. From a handler running inline (on the
        consumer's loop) the commit is scheduled: it runs once the handler returns."""
        if self._on_loop():
            core = self._core
            assert core is not None
            core.commit_async()  # runs once the handler returns; a failure is logged
            return
        listening: AsyncConsumer | None = getattr(self._local, "core", None)
        if listening is not None:  # in a rebalance listener (a worker thread of the loop)
            trio.from_thread.run(listening.commit, trio_token=self._token)
            return
        self._call(lambda core: core.commit())

    def commit_async(self, callback: Callable[[EQueueError | None], Any] | None = None) -> None:
        """Start a commit and return at once (:meth:`AsyncConsumer.commit_async`): what
        the last :meth:`poll` returned is marked done now, the commit runs on the
        consumer's loop. ``callback(None)`` or ``callback(error)`` is called on the
        loop thread once it is over (keep it quick: the loop waits meanwhile); without
        a callback a failure is logged. Joins the group first if needed."""
        self._core_here().commit_async(callback)

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Fetch that queue from ``offset`` next (:meth:`AsyncConsumer.seek`, which
        raises the same errors); joins the group first if needed."""
        self._core_here().seek(topic, queue_id, offset)

    def assign(self, queues: Iterable[tuple[str, int]]) -> None:
        """Consume exactly ``queues`` (a consumer made without topics:
        :meth:`AsyncConsumer.assign`, which raises the same errors); starts the
        consumer's loop first if needed."""
        leases = queue_list(queues)
        self._core_here().assign(leases)

    def assignment(self) -> set[tuple[str, int]]:
        """The queues this member consumes now (:meth:`AsyncConsumer.assignment`);
        joins the group first if needed."""
        return self._core_here().assignment()

    def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """Stop fetching from ``queues`` until :meth:`resume`; buffered messages are
        still handled (:meth:`AsyncConsumer.pause`, which raises the same errors).
        Callable from a handler or any thread; joins the group first if needed (a bad
        ``queues`` raises TypeError before)."""
        leases = queue_list(queues)
        self._core_here().pause(leases)

    def resume(self, queues: Iterable[tuple[str, int]]) -> None:
        """Fetch from ``queues`` again (:meth:`AsyncConsumer.resume`)."""
        leases = queue_list(queues)
        self._core_here().resume(leases)

    def paused(self) -> set[tuple[str, int]]:
        """The assigned queues whose fetching is paused (:meth:`AsyncConsumer.paused`)."""
        return self._core_here().paused()

    def statistics(self) -> ConsumerStatistics:
        if self._on_loop():
            assert self._core is not None
            return self._core.statistics()
        listening: AsyncConsumer | None = getattr(self._local, "core", None)
        if listening is not None:
            return trio.from_thread.run_sync(listening.statistics, trio_token=self._token)
        loop, core = self._ensure()
        return loop.run_sync(core.statistics)

    def close(self) -> None:
        """Stop, wait for running handlers (bounded), commit, leave the group, then
        end the loop. From a handler running inline (on the consumer's loop) it stops,
        and :meth:`run` closes before it returns.

        Ctrl-C does not cut it short: a join still in progress (from another thread)
        is waited for, and the close runs to its end (it is bounded: ``close_timeout``
        for the handlers, then ``on_revoked`` if set, then the commit and the leave
        within ``connect_timeout`` + 5 s each) before a KeyboardInterrupt that arrived meanwhile is raised."""
        if self._on_loop():
            self._close_pending = True
            self.stop()
            return
        if self._closed:
            return
        with _ctrl_c_deferred() as interrupted:
            self._closed = True
            self._stop_requested = True
            loop, core, joining = self._loop, self._core, self._joining
            if loop is None or not loop.alive:
                return
            try:
                if core is None and joining is not None:  # joining in another thread: let it finish
                    if joining.wait_through_interrupts():
                        interrupted[0] = True
                    try:
                        core = joining.wait()
                    except BaseException:
                        core = None  # the join failed: nothing to leave
                if core is not None and isinstance(loop, _Loop):
                    core.stop()
                    closing = loop.submit(core.aclose)
                    if closing.wait_through_interrupts():
                        interrupted[0] = True
                    try:
                        closing.wait()
                    except ClientClosed:
                        pass
            finally:
                loop.close()
                self._loop = None
                self._core = None
