"""The asyncio front of the SDK: ``AsyncProducer``, ``AsyncConsumer`` and ``AsyncClient``
for asyncio code (``asyncio.run``, uvloop, Starlette/FastAPI, aiohttp).

The cores stay trio. Each front owns a private trio loop thread
(:class:`equeue.client.loop_thread.LoopThread`, the one the blocking SDK runs on) with the
trio core entered on it; every call is started on that loop without blocking
(:meth:`LoopThread.start_call`) and awaited on the caller's asyncio loop through an
asyncio future settled with ``loop.call_soon_threadsafe``. The logic exists once, in the
trio cores: idempotent sends, ordered lanes, leases, commit on close are theirs.

This is the one module of equeue that imports asyncio (import-linter keeps it so).

Cancellation follows asyncio's rules: cancelling a task awaiting a call raises
CancelledError in it once the call, cancelled on the trio loop, ended there; what was already handed
over stays done. A send whose message is already buffered is still sent (only the wait
is abandoned); a cancelled ``run`` stops handing out messages and the handlers
running are cancelled, the messages of their chunks left uncommitted (delivered again).

``run`` crosses threads once per chunk, not per message: the core hands a whole chunk to
the asyncio loop (:class:`equeue.consumer.invoke.ChunkHandler`), the handler is awaited
on each of its messages there, and the chunk's result crosses back. Iteration takes a
batch per crossing and yields from it. ``async with``
(or :meth:`aclose`) closes the core (flush; commit and leave) and ends the loop thread;
an object never closed ends its loop thread when collected or at exit, without flushing
or committing (see docs/asyncio.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import inspect
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Sequence,
)
from concurrent.futures import Future
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

import outcome
import trio

from equeue.client.async_client import AsyncClient as _TrioClient
from equeue.client.loop_thread import CallCancelled, LoopThread
from equeue.consumer.async_consumer import MAX_POLL, ConsumerStatistics, Iteration
from equeue.consumer.async_consumer import AsyncConsumer as _TrioConsumer
from equeue.consumer.dispatch import CHUNK_SECONDS, chunk_size
from equeue.consumer.invoke import ChunkHandler, Invoke, Stopping, deserializing, run_chunks
from equeue.consumer.options import ConsumerOptions
from equeue.errors import ClientClosed, ConfigError, EQueueError
from equeue.models import Message, SendResult
from equeue.producer._batch import DeliveryCallback, SendHandle, deliver_at_ms
from equeue.producer.async_producer import AsyncProducer as _TrioProducer
from equeue.producer.async_producer import Body, Delay
from equeue.producer.options import ProducerOptions
from equeue.producer.stats import SendStats

__all__ = ["AioSendHandle", "AsyncClient", "AsyncConsumer", "AsyncProducer"]

T = TypeVar("T")
C = TypeVar("C")
P = ParamSpec("P")

#: the rebalance listeners, called on the caller's asyncio loop (:func:`_to_asyncio`)
LISTENERS = ("on_assigned", "on_revoked", "on_lost")


class _Front(Generic[C]):
    """A trio core entered on a private loop thread, called from one asyncio loop."""

    def __init__(self) -> None:
        self._loop: LoopThread | None = None
        self._core: C | None = None
        #: set when a close starts (a second close returns at once); calls still go
        #: through meanwhile (a rebalance listener committing during the close)
        self._closing = False
        #: set once the close ended: calls raise ClientClosed
        self._closed = False

    def _make_core(self) -> C:  # pragma: no cover - interface
        raise NotImplementedError

    async def start(self) -> Self:
        """Start the loop thread and open the core on it (``async with`` does it)."""
        await self._open()
        return self

    async def aclose(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> C:
        """Start the loop thread and enter the core on it (once)."""
        if self._closed or self._closing:
            raise ClientClosed(f"{type(self).__name__} is closed")
        if self._core is not None:
            return self._core
        loop = self._loop = LoopThread(f"equeue-aio-{type(self).__name__.lower()}")
        try:
            core: C = await self._call(loop.start_entered, self._make_core)
            self._core = core
        except BaseException:
            self._loop = None
            loop.close()
            raise
        return core

    def _ready(self) -> tuple[LoopThread, C]:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed")
        if self._loop is None or self._core is None:
            raise ClientClosed(f"{type(self).__name__} is not open: use 'async with' (or 'await x.start()')")
        return self._loop, self._core

    async def _call(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await afn(*args)`` on the trio loop, awaited here. Cancelling the awaiting
        task cancels the call on the loop; CancelledError is raised here once it ended
        there (a cancelled ``run`` is over, its handlers cancelled, when it is raised)."""
        loop = self._loop
        if loop is None:
            raise ClientClosed(f"{type(self).__name__} is not open")
        aio = asyncio.get_running_loop()
        fut: asyncio.Future[T] = aio.create_future()

        def settle(result: outcome.Outcome[T]) -> None:
            if not fut.done():
                if isinstance(result, outcome.Error):
                    fut.set_exception(result.error)
                else:
                    fut.set_result(result.unwrap())

        def on_done(result: outcome.Outcome[T]) -> None:  # on the trio loop thread
            try:
                aio.call_soon_threadsafe(settle, result)
            except RuntimeError:  # the asyncio loop is closed: nobody waits
                pass

        cancel = loop.start_call(afn, *args, on_done=on_done)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # cancel the call on the loop and let it end there before CancelledError is
            # raised here (a cancelled run is over when its task sees the cancellation)
            cancel()
            try:
                await fut
            except (CallCancelled, Exception, asyncio.CancelledError):
                pass
            raise

    async def _close(self, fn: Callable[[C], Awaitable[Any]]) -> None:
        """Run ``fn(core)`` on the loop (shielded from the caller's cancellation: a close
        runs to its end), then end the loop thread. Idempotent. The front's calls go
        through until it ended (listeners may commit during the close), then raise
        ClientClosed."""
        if self._closed or self._closing:
            return
        self._closing = True
        loop, core = self._loop, self._core
        if loop is None:
            self._closed = True
            return
        try:
            if core is not None and loop.alive:
                closing = asyncio.ensure_future(self._call(fn, core))
                try:
                    await asyncio.shield(closing)
                except asyncio.CancelledError:
                    await closing  # the close goes on; the cancellation is raised after it
                    raise
        finally:
            self._closed = True
            self._core = None
            self._loop = None
            loop.close()

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and loop.alive:
            try:
                loop.close()
            except Exception:
                pass


class AioSendHandle:
    """The pending result of one :meth:`AsyncProducer.send_async`: ``await handle``
    for its SendResult (raises what the send raised). Awaiting costs nothing until
    then: no hop to the asyncio loop is made for handles never awaited (a
    ``flush`` waits for them all). Cancelling the wait leaves the send going on."""

    __slots__ = ("_fut", "handle")

    def __init__(self, handle: SendHandle) -> None:
        #: the core's handle (``done()``, ``add_done_callback`` run on the trio loop thread)
        self.handle = handle
        #: set when the send finishes; made by the first wait (one callback per handle,
        #: however often a wait is cancelled and awaited again)
        self._fut: asyncio.Future[None] | None = None

    def done(self) -> bool:
        """Whether the send finished (stored, or failed)."""
        return self.handle.done()

    async def wait(self) -> SendResult:
        """Wait until the send finished; return where the message was stored."""
        h = self.handle
        if h.done():
            return h._batch.result(h._index)
        aio = asyncio.get_running_loop()
        fut = self._fut
        if fut is None or fut.get_loop() is not aio:
            fut = self._fut = aio.create_future()

            def wake(_: SendHandle) -> None:  # on the trio loop thread (or here, if done)
                try:
                    aio.call_soon_threadsafe(_set_none, fut)
                except RuntimeError:  # the asyncio loop is closed: nobody waits
                    pass

            h.add_done_callback(wake)
        await asyncio.shield(fut)  # a cancelled wait leaves the future for the next one
        return h._batch.result(h._index)

    def __await__(self) -> Generator[Any, None, SendResult]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        return f"<AioSendHandle {self.handle!r}>"


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AsyncProducer(_Front[_TrioProducer]):
    """The asyncio producer: same options and semantics as the trio
    :class:`equeue.producer.AsyncProducer`, which it runs on a private loop thread.

    ``async with AsyncProducer("host:port") as p: await p.send("t", b"x")``. Raises
    ConfigError for an invalid option (here, before anything starts).
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        options: ProducerOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self._trio = _TrioProducer(brokers, options=options, **kwargs)  # validates; no I/O
        self.brokers = brokers
        self.options = self._trio.options

    def _make_core(self) -> _TrioProducer:
        return self._trio

    @property
    def producer_id(self) -> bytes:
        return self._trio.producer_id

    async def send(
        self,
        topic: str,
        body: Body | Any,
        *,
        key: str | bytes | Any | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendResult:
        """Send one message and wait until it is stored (raises as the trio
        ``AsyncProducer.send``). The message is buffered from this thread (no hop to
        the loop unless the topic is new or the buffer is full); cancelling the wait
        leaves a buffered message to be sent."""
        due = deliver_at_ms(delay, deliver_at)
        _, core = self._ready()
        if core.serialize is not None:
            body, key = core.serialize(body, key)
        h = core.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, seal=True)
        if h is None:
            h = await self._call(
                lambda: core.submit(topic, body, key=key, tags=tags, properties=properties, due=due, seal=True)
            )
        return await AioSendHandle(h)

    async def send_async(
        self,
        topic: str,
        body: Body | Any,
        *,
        key: str | bytes | Any | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> AioSendHandle:
        """Buffer one message; return a handle to ``await`` for its SendResult.

        Waits only to learn a new topic's queue count or for buffer space (BufferFull
        with ``on_full="raise"``). ``on_delivery(result, error)`` runs on the
        producer's trio loop thread, as in the trio SDK: quick, non-blocking, and no
        asyncio calls there but ``loop.call_soon_threadsafe``."""
        due = 0 if delay is None and deliver_at is None else deliver_at_ms(delay, deliver_at)
        _, core = self._ready()
        if core.serialize is not None:
            body, key = core.serialize(body, key)
        h = core.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        if h is None:
            h = await self._call(
                lambda: core.submit(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
            )
        elif h._index == 0:
            await asyncio.sleep(0)  # once per new batch: lets other asyncio tasks run
        return AioSendHandle(h)

    async def send_batch(self, topic: str, messages: Iterable[Message | Body | Any]) -> list[SendResult]:
        """Send messages grouped per queue; wait for all (see the trio ``send_batch``)."""
        msgs = list(messages)
        _, core = self._ready()
        return await self._call(core.send_batch, topic, msgs)

    async def flush(self) -> int:
        """Wait until everything buffered so far is answered; return how many messages
        still wait (0 then). Bound it with ``asyncio.timeout``: the flush is cancelled,
        the messages stay buffered and are still sent."""
        _, core = self._ready()
        return await self._call(core.flush)

    def pending_messages(self) -> int:
        """Messages buffered or in flight, their outcome not known yet."""
        return self._trio.pending_messages()

    async def queue_count(self, topic: str) -> int:
        _, core = self._ready()
        return await self._call(core.queue_count, topic)

    def statistics(self) -> dict[str, int]:
        """Buffered bytes, lanes and message outcomes (see the trio ``statistics``)."""
        return self._trio.statistics()

    @property
    def send_stats(self) -> SendStats:
        return self._trio.send_stats

    async def aclose(self, flush: bool = True) -> None:
        """Flush (within ``send_timeout``; not with ``flush=False``), close, end the
        loop thread. Idempotent; a cancelled caller still lets the close finish."""
        await self._close(lambda core: core.aclose(flush))

    @property
    def closed(self) -> bool:
        """True once a close started."""
        return self._closed or self._closing


def _to_asyncio(fn: Callable[..., Any], aio: asyncio.AbstractEventLoop) -> Callable[..., Awaitable[Any]]:
    """``fn`` (a coroutine function, or a plain function) as a trio coroutine function:
    each call runs on the asyncio loop ``aio`` and is awaited on the trio side, its
    error raised there. Cancelled on the trio side (a close abandoning handlers, a
    cancelled ``run``): the asyncio task is cancelled too."""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004

    async def plain(*args: Any) -> Any:
        return fn(*args)

    target = fn if is_async else plain

    async def bridged(*args: Any) -> Any:
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_: Future[Any]) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        try:
            cf = asyncio.run_coroutine_threadsafe(target(*args), aio)
        except RuntimeError as exc:  # the asyncio loop is closed
            raise ClientClosed(f"the asyncio loop that runs the handler is closed ({exc})") from None
        cf.add_done_callback(wake)
        try:
            await done.wait()
        except trio.Cancelled:
            cf.cancel()
            raise
        try:
            return cf.result()
        except concurrent.futures.CancelledError:  # its asyncio task was cancelled (a loop shutting down)
            raise ClientClosed("the handler's asyncio task was cancelled") from None

    return bridged


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


def _forward(
    method: Callable[Concatenate[_TrioClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The asyncio method calling the trio client's ``method`` on the loop thread."""
    name = method.__name__

    async def forward(self: AsyncClient, *args: P.args, **kwargs: P.kwargs) -> T:
        _, core = self._ready()
        return await self._call(lambda: getattr(core, name)(*args, **kwargs))  # type: ignore[no-any-return]

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = method.__doc__
    forward.__wrapped__ = method  # type: ignore[attr-defined]  # inspect.signature: the trio one
    return forward


class AsyncClient(_Front[_TrioClient]):
    """The admin client for asyncio: the admin methods of the trio
    :class:`equeue.client.AsyncClient`, same arguments and errors, awaited here.
    ``async with AsyncClient("host:port") as c: await c.create_topic("t", 4)``."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs
        _TrioClient(brokers, **kwargs)  # validates; no I/O

    def _make_core(self) -> _TrioClient:
        return _TrioClient(self.brokers, **self._kwargs)

    async def aclose(self) -> None:
        """Close the connections and end the loop thread. Idempotent."""
        await self._close(lambda core: core.aclose())

    create_topic = _forward(_TrioClient.create_topic)
    alter_topic = _forward(_TrioClient.alter_topic)
    delete_topic = _forward(_TrioClient.delete_topic)
    list_topics = _forward(_TrioClient.list_topics)
    describe_topic = _forward(_TrioClient.describe_topic)
    get_route = _forward(_TrioClient.get_route)
    get_routes = _forward(_TrioClient.get_routes)
    queue_offsets = _forward(_TrioClient.queue_offsets)
    offset_for_time = _forward(_TrioClient.offset_for_time)
    commit_offset = _forward(_TrioClient.commit_offset)
    query_offset = _forward(_TrioClient.query_offset)
    reset_offsets = _forward(_TrioClient.reset_offsets)
    list_groups = _forward(_TrioClient.list_groups)
    describe_group = _forward(_TrioClient.describe_group)
    stats = _forward(_TrioClient.stats)
    pause_topic = _forward(_TrioClient.pause_topic)
    resume_topic = _forward(_TrioClient.resume_topic)
    pause_group = _forward(_TrioClient.pause_group)
    resume_group = _forward(_TrioClient.resume_group)
    cluster_status = _forward(_TrioClient.cluster_status)
    replication_status = _forward(_TrioClient.replication_status)
    get_message = _forward(_TrioClient.get_message)
    find_by_key = _forward(_TrioClient.find_by_key)
    pull = _forward(_TrioClient.pull)
    dlq_list = _forward(_TrioClient.dlq_list)
    dlq_resend = _forward(_TrioClient.dlq_resend)
    skip_message = _forward(_TrioClient.skip_message)
    list_skipped = _forward(_TrioClient.list_skipped)
    request = _forward(_TrioClient.request)
    call = _forward(_TrioClient.call)
    produce = _forward(_TrioClient.produce)
    heartbeat = _forward(_TrioClient.heartbeat)
    leave_group = _forward(_TrioClient.leave_group)
    release_queues = _forward(_TrioClient.release_queues)
    replica_digest = _forward(_TrioClient.replica_digest)
    send_back = _forward(_TrioClient.send_back)
