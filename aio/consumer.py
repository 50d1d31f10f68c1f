"""The asyncio consumer: :class:`AsyncConsumer` over the trio
:class:`equeue.consumer.AsyncConsumer` on a private loop thread (:mod:`equeue.aio.bridge`).

``run`` crosses threads once per chunk, not per message: the core hands a whole chunk to
the asyncio loop (:class:`equeue.consumer.invoke.ChunkHandler`), the handler is awaited
on each of its messages there, and the chunk's result crosses back. Iteration takes a
batch per crossing and yields from it; ``poll`` takes one batch (:class:`_PollTake` keeps
it when the caller is cancelled). A cancelled ``run`` stops handing out messages and the
handlers running are cancelled, the messages of their chunks left uncommitted (delivered
again). The rebalance listeners run on the caller's asyncio loop too.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Self

import outcome
import trio

from equeue.aio.bridge import _Front, _to_asyncio
from equeue.consumer.async_consumer import MAX_POLL, ConsumerStatistics, Iteration
from equeue.consumer.async_consumer import AsyncConsumer as _TrioConsumer
from equeue.consumer.dispatch import CHUNK_SECONDS, chunk_size
from equeue.consumer.invoke import ChunkHandler, Invoke, Stopping, deserializing, run_chunks
from equeue.consumer.options import ConsumerOptions
from equeue.errors import ClientClosed, ConfigError, EQueueError
from equeue.models import Message

__all__ = ["AsyncConsumer"]

#: the rebalance listeners, called on the caller's asyncio loop (:func:`_to_asyncio`)
LISTENERS = ("on_assigned", "on_revoked", "on_lost")


def _chunks_on_asyncio(handler: Callable[[Message], Awaitable[Any]], aio: asyncio.AbstractEventLoop) -> ChunkHandler:
    """The async ``handler`` as the core's :class:`ChunkHandler`: each chunk crosses to
    the asyncio loop ``aio`` once, runs there through the trio SDK's own chunk loop
    (:func:`run_chunks`: in turn, the stop and ``stop_on_failure`` rules, deserializers
    applied under the same ``try``), and its ChunkResult crosses back once."""

    def make(options: ConsumerOptions, state: Stopping) -> Invoke:
        return _to_asyncio(run_chunks(deserializing(handler, options, True), state), aio)

    return ChunkHandler(make)



class AsyncConsumer(_Front[_TrioConsumer]):
    """A member of a consumer group, for asyncio. Same arguments and semantics as the
    trio :class:`equeue.consumer.AsyncConsumer` (leases, retries, dead letters, commit
    on close), which it runs on a private loop thread.

    Handlers and the rebalance listeners (``on_assigned``, ``on_revoked``,
    ``on_lost``; coroutine functions or plain functions) run on the asyncio loop that
    entered the consumer; the trio core awaits each call, so offsets are committed
    only after the handler finished. Raises ConfigError for invalid arguments (here).
    """

    def __init__(
        self, brokers: str | Sequence[str], group: str | None, topics: str | Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__()
        probe = _TrioConsumer(brokers, group, topics, **kwargs)  # validates; no I/O
        kwargs["consumer_id"] = probe.consumer_id
        self.consumer_id = probe.consumer_id
        self.group = probe.group
        self.topics = probe.topics
        self._args = (brokers, group, topics)
        self._kwargs = kwargs
        self._aio: asyncio.AbstractEventLoop | None = None

    def _make_core(self) -> _TrioConsumer:
        assert self._aio is not None
        kwargs = dict(self._kwargs)
        for name in LISTENERS:
            if kwargs.get(name) is not None:
                kwargs[name] = _to_asyncio(kwargs[name], self._aio)
        return _TrioConsumer(*self._args, **kwargs)

    async def start(self) -> Self:
        """Join the group (``async with`` does it). Raises ConnectionBroken when no
        broker is reachable."""
        self._aio = asyncio.get_running_loop()
        await self._open()
        return self

    async def run(self, handler: Callable[[Message], Awaitable[Any]]) -> None:
        """Await ``handler(msg)`` (a coroutine function, run on this asyncio loop) for
        every message until :meth:`stop` or :meth:`aclose`; returning means done,
        raising means retry (as in the trio SDK). Up to ``concurrency`` handlers run
        at once (orderly: one per queue). Cancelling the task running it stops the
        run: the handlers running are cancelled and their messages are delivered
        again. Messages reach this loop a chunk at a time (one thread hop there and one
        back per chunk, not per message); a chunk's messages are handled in turn, as in
        the trio SDK. Raises TypeError for a handler that is not a coroutine function."""
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError("AsyncConsumer.run takes a coroutine function (async def handler(msg))")
        _, core = self._ready()
        await self._call(core.run, _chunks_on_asyncio(handler, asyncio.get_running_loop()))

    def __aiter__(self) -> AsyncIterator[Message]:
        """Iterate messages; one is done when the loop asks for the next. Breaking out
        (or an exception, or a cancellation) leaves the current one undone: it is
        delivered again. Messages come from the trio loop a batch of one queue at a
        time (sized to the loop body's speed, as in the blocking iterator)."""
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        loop, core = self._ready()
        it: Iteration = loop.run_sync(core.iteration)  # quick: marks the consumer busy
        per_msg = CHUNK_SECONDS
        clock = time.perf_counter
        done = 0
        try:
            while True:
                limit = chunk_size(per_msg)
                settled, done = done, 0
                try:
                    batch = await self._call(it.next_batch, settled, limit)
                except ClientClosed:
                    if self._closed or self._closing:
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
                try:  # not awaited (a finally of a cancelled generator): runs next on the loop
                    loop.start_call(_end_iteration, it, done, on_done=_ignore)
                except ClientClosed:
                    pass

    async def poll(self, timeout: float, max_messages: int = MAX_POLL) -> list[Message]:
        """Wait up to ``timeout`` seconds for messages; return a batch of up to
        ``max_messages`` (``[]`` when none came in time, or once stopped or closed), as
        the blocking ``Consumer.poll``. What the previous poll returned is done now
        (commit-on-poll: committed with the next commit, periodic, :meth:`commit`,
        :meth:`commit_async` or the close). ``timeout=0`` returns what is buffered
        already.

        Cancelling the task awaiting it (``asyncio.timeout``, ``task.cancel()``) takes
        nothing: a batch the trio loop had taken already when the cancellation landed
        goes back first in line, and the next poll returns it. Do not await two polls of
        one consumer at once.

        Raises TypeError/ConfigError for a bad ``timeout`` or ``max_messages``,
        RuntimeError when mixed with :meth:`run` or iteration (as the trio ``poll``)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be seconds (a number), got {timeout!r}")
        if not timeout >= 0:
            raise ConfigError(f"timeout must be >= 0 seconds, got {timeout!r}")
        if self._closed:
            return []
        loop, core = self._ready()
        take = _PollTake(core, timeout, max_messages)
        try:
            return await self._call(take.run)
        except asyncio.CancelledError:
            try:  # quick, on the loop: a batch taken for this poll goes back
                loop.run_sync(take.abandon)
            except (ClientClosed, trio.RunFinishedError):
                pass
            raise
        except ClientClosed:
            if self._closed or self._closing:
                return []
            raise

    def stop(self) -> None:
        """Stop handing out messages; :meth:`run` returns, iteration ends (never
        blocks; callable from a handler). Final."""
        if self._core is not None:
            self._core.stop()

    async def commit(self) -> None:
        """Commit offsets that moved, now (also done periodically and on close); what
        the last :meth:`poll` returned counts as done first."""
        _, core = self._ready()
        await self._call(core.commit)

    def commit_async(self, callback: Callable[[EQueueError | None], Any] | None = None) -> None:
        """Start a commit and return at once (the trio ``commit_async``): what the last
        :meth:`poll` returned is marked done now, the commit runs on the trio loop.
        ``callback(None)`` or ``callback(error)`` (an EQueueError; ClientClosed when the
        consumer closed before the commit ended) is then called on the asyncio loop that
        entered this consumer (a plain function: schedule a coroutine from it with
        ``asyncio.ensure_future``; what it raises goes to that loop's exception
        handler); without a callback a failure is logged. Raises ClientClosed when the
        consumer is closed or not entered."""
        _, core = self._ready()
        if callback is None:
            core.commit_async(None)
            return
        aio = self._aio
        assert aio is not None  # set by start()

        def on_trio_loop(error: EQueueError | None) -> None:
            try:
                aio.call_soon_threadsafe(callback, error)
            except RuntimeError:  # the asyncio loop is closed: nobody to tell
                pass

        core.commit_async(on_trio_loop)

    def assignment(self) -> set[tuple[str, int]]:
        """The queues this member consumes now (``(topic, queue_id)`` tuples)."""
        return self._ready()[1].assignment()

    def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """Stop fetching from ``queues`` until :meth:`resume` (raises as the trio ``pause``)."""
        self._ready()[1].pause(queues)

    def resume(self, queues: Iterable[tuple[str, int]]) -> None:
        """Fetch from ``queues`` again."""
        self._ready()[1].resume(queues)

    def paused(self) -> set[tuple[str, int]]:
        return self._ready()[1].paused()

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Fetch that queue from ``offset`` next (raises as the trio ``seek``)."""
        self._ready()[1].seek(topic, queue_id, offset)

    def assign(self, queues: Iterable[tuple[str, int]]) -> None:
        """Consume exactly ``queues`` (a consumer made without topics; raises as the
        trio ``assign``)."""
        self._ready()[1].assign(queues)

    def statistics(self) -> ConsumerStatistics:
        loop, core = self._ready()
        return loop.run_sync(core.statistics)

    async def aclose(self) -> None:
        """Stop, wait for running handlers (``close_timeout``), commit, leave the group,
        end the loop thread. Idempotent; a cancelled caller still lets it finish."""
        if self._core is not None:
            self._core.stop()
        await self._close(lambda core: core.aclose())


async def _end_iteration(it: Iteration, done: int) -> None:
    it.end(done)


class _PollTake:
    """One :meth:`AsyncConsumer.poll` on the trio loop. Its batch must not be lost when
    the asyncio caller is cancelled after the loop took it: :meth:`abandon` (the
    cancelled caller's, on the loop) puts back a batch taken, and a batch taken after
    it (the cancellation not yet landed on the loop) is put back by :meth:`run`
    itself. Both run on the trio loop, so one of them always sees the other's mark."""

    __slots__ = ("abandoned", "core", "max_messages", "taken", "timeout")

    def __init__(self, core: _TrioConsumer, timeout: float, max_messages: int) -> None:
        self.core = core
        self.timeout = timeout
        self.max_messages = max_messages
        self.abandoned = False
        self.taken = False

    async def run(self) -> list[Message]:
        msgs: list[Message] = []
        with trio.move_on_after(self.timeout):
            msgs = await self.core.poll(self.max_messages)
        if msgs and self.abandoned:
            self.core.undo_poll()
            return []
        self.taken = bool(msgs)
        return msgs

    def abandon(self) -> None:
        self.abandoned = True
        if self.taken:
            self.taken = False
            self.core.undo_poll()


def _ignore(_: outcome.Outcome[None]) -> None:
    pass
