"""Running handlers: async handlers as tasks, sync handlers in worker threads or —
``handler_threads="auto"``, the default — inline on the loop thread once they have
proved fast (:class:`SyncPlacement`): for a fast handler, the hand-off to a thread and
passing the GIL between the loop and the handler thread cost more than the handler.

:func:`make_invoker` returns the one call the workers use, ``invoke(q, msgs, top,
stop_on_failure)``: run the handler on each message of a chunk (``top``: the chunk's
highest offset) and report ``(processed, [(index, exception), ...])``. A chunk ends
early on stop or revoke only when it holds the queue's highest handed-out offset
(:attr:`equeue.consumer.process_queue.ProcessQueue.taken_top`); ``stop_on_failure`` (orderly mode)
ends it at the first failure.

A front that runs handlers elsewhere (the asyncio front, on the asyncio loop) hands
:meth:`equeue.consumer.AsyncConsumer.run` a :class:`ChunkHandler` instead of a handler:
its own invoke call, given whole chunks, so it crosses to its loop once per chunk rather
than once per message; :func:`run_chunks` is the chunk loop it runs there (the one async
handlers run through here).

Deserializers (``value_deserializer`` / ``key_deserializer``): :func:`deserializing`
wraps the handler so each message is deserialized (:func:`equeue.serde.deserialize_into`)
just before its handler call, in the same place (thread or loop) and under the same
``try``: a deserializer that raises is a failure of that message's handler call (retry,
then dead letter), and the handler never sees it. Without deserializers the handler runs
unwrapped, and the record decoder never pays for them.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from equeue.consumer.options import ConsumerOptions, HandlerThreads
from equeue.consumer.process_queue import ProcessQueue
from equeue.models import Message
from equeue.serde import deserialize_into

log = logging.getLogger("equeue.consumer")

__all__ = [
    "ChunkHandler",
    "ChunkResult",
    "Handler",
    "Invoke",
    "SyncPlacement",
    "deserializing",
    "make_invoker",
    "run_chunks",
]

Handler = Callable[[Message], Any]
#: (processed count, [(index, exception), ...]) of one chunk
ChunkResult = tuple[int, list[tuple[int, BaseException]]]
Invoke = Callable[[ProcessQueue, list[Message], int, bool], Awaitable[ChunkResult]]
#: sync handlers go inline once PROBE_CALLS calls in a row, run in worker threads,
#: averaged less than this (seconds per call) with no call longer than SLOW_CALL
INLINE_CALL = 50e-6
#: inline handlers go back to threads when one call takes longer than this, or when the
#: calls of one inline slice average more than INLINE_LEAVE
SLOW_CALL = 0.002
INLINE_LEAVE = 2 * INLINE_CALL
#: inline handler time between two checkpoints: the most the loop (heartbeats, lease
#: renewals, pulls, commits) waits for inline handlers, plus one call
INLINE_SLICE = 0.005
#: fast thread calls in a row needed to go inline; doubled after every fall-back
PROBE_CALLS = 32
MAX_PROBE_CALLS = 1 << 20
#: trio's errors for a trio call that only works off the loop thread, made by a handler
#: running inline: a blocking equeue client or trio.from_thread.* with a token ("call it
#: from a thread"), trio.from_thread.* without one ("wasn't created by Trio": it works
#: in a trio worker thread), a nested trio.run. Such a handler needs a thread.
_LOOP_THREAD_ERRORS = ("call it from a thread", "wasn't created by Trio", "from inside a run()")


class Stopping(Protocol):
    """Whatever tells handlers the consumer is stopping (read from any thread)."""

    stopping: bool


class SyncPlacement:
    """Where sync handler calls run: worker threads, or inline on the loop thread.

    Starts in threads. Calls run in threads are timed there; after ``probe`` calls in a
    row averaging under INLINE_CALL per chunk with none over SLOW_CALL, calls go inline
    (``handler_threads="auto"`` only). Inline calls run in slices of at most
    INLINE_SLICE with a checkpoint between slices; one call over SLOW_CALL, a slice
    averaging over INLINE_LEAVE, or trio's "call it from a thread" error sends the
    handler back to threads (the rest of the chunk included), and ``probe`` doubles,
    so a handler that keeps changing its mind settles in threads.
    """

    __slots__ = ("allowed", "fallbacks", "inline", "probe", "streak")

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self.inline = False
        self.streak = 0
        self.probe = PROBE_CALLS
        self.fallbacks = 0

    def observed(self, calls: int, elapsed: float, slow: bool) -> None:
        """A chunk of ``calls`` ran in a thread in ``elapsed`` seconds."""
        if not self.allowed or not calls:
            return
        if slow or elapsed > INLINE_CALL * calls:
            self.streak = 0
            return
        self.streak += calls
        if self.streak >= self.probe:
            self.inline = True
            log.debug("sync handler is fast (%.1f us/call): running it inline", 1e6 * elapsed / calls)

    def leave(self, why: str, forever: bool = False) -> None:
        """Back to threads (``forever``: this handler cannot run on the loop thread)."""
        self.inline = False
        self.streak = 0
        self.fallbacks += 1
        self.probe = min(self.probe * 2, MAX_PROBE_CALLS)
        if forever:
            self.allowed = False
        log.info("sync handler %s: running it in worker threads%s", why, "" if forever else " again")


def deserializing(handler: Handler, options: ConsumerOptions, is_async: bool) -> Handler:
    """``handler`` itself without deserializers; else a handler of the same kind (async
    or sync, by ``is_async``) that deserializes the message first (raising
    SerializationError, which the invokers count as the handler's failure)."""
    kd, vd = options.key_deserializer, options.value_deserializer
    if kd is None and vd is None:
        return handler
    if is_async:

        async def deserialize_then_await(m: Message) -> Any:
            deserialize_into(m, kd, vd)
            return await handler(m)

        return deserialize_then_await

    def deserialize_then_call(m: Message) -> Any:
        deserialize_into(m, kd, vd)
        return handler(m)

    return deserialize_then_call


class ChunkHandler:
    """A handler given as its own invoke call, for a front that runs handlers on
    another event loop: ``make(options, state)`` returns the :data:`Invoke` call the
    workers await once per chunk (it must apply the stop and ``stop_on_failure`` rules
    of :func:`run_chunks`, and the deserializers: :func:`deserializing`)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[ConsumerOptions, Stopping], Invoke]) -> None:
        self.make = make


def run_chunks(handler: Handler, state: Stopping) -> Invoke:
    """The invoke call awaiting the async ``handler`` on each message of a chunk in
    turn. It awaits nothing but the handler, so it runs under any event loop (trio
    here; asyncio for the asyncio front's :class:`ChunkHandler`). A handler's Exception
    is that message's failure; BaseException (a cancellation) propagates."""

    async def invoke_async(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
        fails: list[tuple[int, BaseException]] = []
        for i, m in enumerate(msgs):
            if (state.stopping or q.stopped) and q.taken_top <= top:
                return i, fails
            try:
                await handler(m)
            except Exception as exc:
                fails.append((i, exc))
                if stop_on_failure:
                    return i + 1, fails
        return len(msgs), fails

    return invoke_async


def make_invoker(
    handler: Handler | ChunkHandler, options: ConsumerOptions, state: Stopping
) -> tuple[Invoke, SyncPlacement | None]:
    """The invoke call for ``handler`` (wrapped by :func:`deserializing` when the
    options name deserializers) and, for a sync handler, its placement; a
    :class:`ChunkHandler`'s own call as it is."""
    if isinstance(handler, ChunkHandler):
        return handler.make(options, state), None
    call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
    handler = deserializing(handler, options, is_async)
    if is_async:
        return run_chunks(handler, state), None

    place = SyncPlacement(options.handler_threads == HandlerThreads.AUTO)
    clock = time.perf_counter

    def run_chunk(
        q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool
    ) -> tuple[int, list[tuple[int, BaseException]], float, bool]:
        """In a worker thread: (processed, failures, seconds, a call was slow)."""
        fails: list[tuple[int, BaseException]] = []
        t0 = t = clock()
        slow = False
        for i, m in enumerate(msgs):
            if (state.stopping or q.stopped) and q.taken_top <= top:
                return i, fails, t - t0, slow
            try:
                handler(m)
            except Exception as exc:
                fails.append((i, exc))
                if stop_on_failure:
                    return i + 1, fails, clock() - t0, slow
            t1 = clock()
            if t1 - t > SLOW_CALL:
                slow = True
            t = t1
        return len(msgs), fails, t - t0, slow

    limiter = trio.CapacityLimiter(options.concurrency)
    to_thread = trio.to_thread.run_sync

    async def in_threads(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
        processed, fails, elapsed, slow = await to_thread(
            run_chunk, q, msgs, top, stop_on_failure, limiter=limiter, abandon_on_cancel=True
        )
        place.observed(processed, elapsed, slow)
        return processed, fails

    async def rest_in_threads(
        q: ProcessQueue, i: int, msgs: list[Message], top: int, fails: list[tuple[int, BaseException]],
        stop_on_failure: bool,
    ) -> ChunkResult:  # fmt: skip
        """Run ``msgs[i:]`` in threads after ``msgs[:i]`` ran inline (with ``fails``)."""
        if i >= len(msgs):
            return i, fails
        processed, more = await in_threads(q, msgs[i:], top, stop_on_failure)
        return i + processed, fails + [(i + j, exc) for j, exc in more]

    checkpoint = trio.lowlevel.checkpoint

    async def inline(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
        """On the loop thread, in slices of INLINE_SLICE with a checkpoint between."""
        fails: list[tuple[int, BaseException]] = []
        n = len(msgs)
        i = first = 0
        t = start = clock()
        while i < n:
            if (state.stopping or q.stopped) and q.taken_top <= top:
                return i, fails
            try:
                handler(msgs[i])
            except Exception as exc:
                if isinstance(exc, RuntimeError) and any(e in str(exc) for e in _LOOP_THREAD_ERRORS):
                    place.leave(f"made a blocking trio call ({exc})", forever=True)
                    return await rest_in_threads(q, i, msgs, top, fails, stop_on_failure)
                fails.append((i, exc))
                if stop_on_failure:
                    return i + 1, fails
            i += 1
            t1 = clock()
            if t1 - t > SLOW_CALL:
                place.leave(f"call took {1000 * (t1 - t):.1f} ms")
                return await rest_in_threads(q, i, msgs, top, fails, stop_on_failure)
            t = t1
            if t1 - start >= INLINE_SLICE:
                if t1 - start > INLINE_LEAVE * (i - first):
                    place.leave(f"calls average {1e6 * (t1 - start) / (i - first):.0f} us")
                    return await rest_in_threads(q, i, msgs, top, fails, stop_on_failure)
                await checkpoint()
                t = start = clock()
                first = i
        return n, fails

    async def invoke_sync(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
        if place.inline:
            return await inline(q, msgs, top, stop_on_failure)
        return await in_threads(q, msgs, top, stop_on_failure)

    return invoke_sync, place
