"""``AsyncConsumer``: the consumer core (trio). :class:`consumer.Consumer` forwards to it.

Lifetime (``async with``): membership and rebalance (:mod:`consumer.rebalance`), one
pull loop per owned queue (:mod:`consumer.queues`), a periodic offset commit, and —
while :meth:`AsyncConsumer.run` runs — ``concurrency`` workers handing messages to the
handler. Messages flow::

    pull loop ──deliver──▶ ready deque ──take (chunks)──▶ worker ──▶ handler
        ▲                                                   │
        └── flow control (outstanding per queue) ◀── finish ┘──▶ sliding window ──▶ commit

A worker takes a *chunk* of a batch (sized to about ``CHUNK_SECONDS`` of handler
time, so thread hand-offs are amortised; one message for slow handlers), runs the
handler on each message and marks each one done. Async handlers run as tasks. Sync
handlers run in worker threads, or — ``handler_threads="auto"``, the default — inline
on the loop thread once they have proved fast (see :class:`_SyncPlacement`): for a
fast handler, the hand-off to a thread and passing the GIL between the loop and the
handler thread cost more than the handler. A handler that raises sends its message to
the retry topic (or, in orderly mode, retries it in place) and the message counts as
done, so it never blocks committing later offsets.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from client.connection import AsyncClient
from consumer.broadcast_store import BroadcastOffsetStore, default_state_dir
from consumer.options import ConsumerOptions
from consumer.queues import ProcessQueue, pull_loop
from consumer.rebalance import Coordinator
from consumer.retry import retry_delay, send_back_message
from equeue import wire
from equeue.errors import ClientClosed, ConfigError, EQueueError, NotQueueOwner
from equeue.models import Message
from equeue.names import validate_group, validate_topic
from equeue.protocol import PushCode

log = logging.getLogger("equeue.consumer")

__all__ = ["AsyncConsumer", "ConsumerStatistics"]

Handler = Callable[[Message], Any]
#: (processed count, [(index, exception), ...]) of one chunk
ChunkResult = tuple[int, list[tuple[int, BaseException]]]
MAX_CHUNK = 512
#: a chunk is sized to hold about this much handler time (amortises the thread hand-off
#: for fast handlers; slow handlers get one message per chunk, i.e. full parallelism)
CHUNK_SECONDS = 0.002
#: handler time per extra concurrent chunk: fast handlers are CPU-bound Python, which the
#: GIL serialises anyway, so they run one chunk at a time (threads would only contend)
PARALLEL_SECONDS = 0.00002
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
_Item = tuple[ProcessQueue, list[Message], list[int]]
Invoke = Callable[[ProcessQueue, list[Message], int, bool], Awaitable["ChunkResult"]]


@attrs.frozen
class ConsumerStatistics:
    """A snapshot of one consumer's counters."""

    consumer_id: str
    queues: list[str]
    consumed: int
    failed: int
    retried: int
    dead_lettered: int
    buffered: int
    peak_buffered: int
    paused: int
    rebalances: int


class _Iteration:
    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: _Item | None = None


def _on_loop(token: trio.lowlevel.TrioToken) -> bool:
    """True when called from the trio run that ``token`` belongs to."""
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:  # not in any trio run: another thread
        return False


class _SyncPlacement:
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


class AsyncConsumer:
    """A member of a consumer group (trio). See docs/consumer.md.

    ``async with AsyncConsumer(brokers, group, topics, ...) as c: await c.run(handler)``
    or ``async for msg in c: ...``. Raises ConfigError for invalid arguments; entering
    raises ConnectionBroken when no broker is reachable.
    """

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str,
        topics: str | Sequence[str],
        *,
        mode: str = "clustering",
        start_from: str | dt.datetime = "latest",
        tags: str | None = None,
        orderly: bool = False,
        concurrency: int = 16,
        allocation: Any = "average",
        **options: Any,
    ) -> None:
        self.group = validate_group(group)
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise ConfigError("subscribe to at least one topic")
        self.topics = [validate_topic(t, allow_internal=True) for t in dict.fromkeys(names)]
        self.options = o = ConsumerOptions.build(
            mode=mode, start_from=start_from, tags=tags, orderly=orderly,
            concurrency=concurrency, allocation=allocation, **options,
        )  # fmt: skip
        self.consumer_id = o.consumer_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.client = AsyncClient(brokers, connect_timeout=o.connect_timeout, on_push=self._on_push)
        self.queues: dict[str, ProcessQueue] = {}
        self.revoking: set[str] = set()
        self.closing = False
        self._closed = trio.Event()
        self._stopping = False
        self._stop_evt = trio.Event()
        self._consuming = False
        self._ready: deque[list[Any]] = deque()  # [queue, messages, offsets, next index]
        self._ready_count = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._workers = o.concurrency
        #: moving average of one handler call, seconds
        self._handler_time = CHUNK_SECONDS
        self._active = 0
        #: sync handlers of the current run(): threads or inline (None: async handler)
        self._placement: _SyncPlacement | None = None
        self._run_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._routes: dict[str, int] = {}
        #: the loop this consumer runs on (set on entry): stop() from another thread goes through it
        self._token: trio.lowlevel.TrioToken | None = None
        self._store = (
            BroadcastOffsetStore(o.state_dir or default_state_dir(), self.group)
            if o.mode == "broadcast" else None
        )  # fmt: skip
        self.coordinator = Coordinator(self)
        self.consumed = self.failed = self.retried = self.dead_lettered = 0
        self.stats_paused = 0

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> AsyncConsumer:
        self._token = trio.lowlevel.current_trio_token()
        await self.client.__aenter__()
        try:
            self._nursery_cm = trio.open_nursery()
            self._nursery = await self._nursery_cm.__aenter__()
        except BaseException:
            await self.client.__aexit__(None, None, None)
            raise
        try:
            if self._store is not None:
                await trio.to_thread.run_sync(self._store.load)
            await self.coordinator.rebalance()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._nursery.start_soon(self.coordinator.run)
        self._nursery.start_soon(self._commit_loop)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.aclose()
        finally:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
            cm, self._nursery_cm = self._nursery_cm, None
            try:
                if cm is not None:
                    await cm.__aexit__(None, None, None)
            finally:
                await self.client.__aexit__(None, None, None)

    def stop(self) -> None:
        """Stop handing out messages (final). Running handlers finish; :meth:`run`
        returns and iteration ends. Safe to call from a handler, including a sync
        handler running in a worker thread (the loop's part is then scheduled on the
        loop: trio objects are touched from the loop thread only); :meth:`aclose`
        then commits and leaves."""
        self._stopping = True  # a plain flag: handlers see it at once, from any thread
        token = self._token
        if token is not None and not _on_loop(token):
            try:
                token.run_sync_soon(self._wake_stopped)
            except trio.RunFinishedError:
                pass
            return
        self._wake_stopped()

    def _wake_stopped(self) -> None:
        self._stop_evt.set()
        self._lot.unpark_all()

    async def aclose(self) -> None:
        """Stop pulling, wait for running handlers (up to ``close_timeout``), commit,
        leave the group. Idempotent; never raises for broker trouble (it logs)."""
        if self.closing:
            await self._closed.wait()
            return
        self.closing = True
        self.stop()
        try:
            for q in list(self.queues.values()):
                q.stop()
            with trio.move_on_after(self.options.close_timeout):
                while any(q.inflight for q in self.queues.values()):
                    await trio.sleep(0.01)
            if any(q.inflight for q in self.queues.values()):
                log.warning("close: handlers still running after %.1f s; abandoning them "
                            "(their messages will be redelivered)", self.options.close_timeout)  # fmt: skip
            if self._run_scope is not None:
                self._run_scope.cancel()
            if self.client.connected or self.queues:
                with trio.move_on_after(self.options.connect_timeout + 5):
                    await self.commit()
                    await self.client.leave_group(self.group, self.consumer_id)
        except EQueueError as exc:
            log.warning("close: could not commit/leave cleanly: %s", exc)
        finally:
            self._closed.set()
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ consuming
    async def run(self, handler: Handler) -> None:
        """Hand every message to ``handler`` until :meth:`stop` or :meth:`aclose`.

        ``handler(msg)`` returning means done; raising means retry (see docs). Async
        handlers run as tasks, sync ones in worker threads, up to ``concurrency`` at
        once (orderly: one per queue) — or, with ``handler_threads="auto"``, inline on
        this loop, one at a time, once they prove fast (docs/consumer.md, "Where
        handlers run"). Raises RuntimeError if already consuming.
        """
        if self._consuming:
            raise RuntimeError("this consumer is already consuming (run or iteration)")
        if self._stopping:
            return
        self._consuming = True
        invoke = self._invoker(handler)
        try:
            async with trio.open_nursery() as n:
                self._run_scope = n.cancel_scope
                for _ in range(self._workers):
                    n.start_soon(self._worker, invoke)
        finally:
            self._run_scope = None
            self._consuming = False

    def _invoker(self, handler: Handler) -> Invoke:
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            self._placement = None

            async def invoke_async(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
                fails: list[tuple[int, BaseException]] = []
                for i, m in enumerate(msgs):
                    if (self._stopping or q.stopped) and q.taken_top <= top:
                        return i, fails
                    try:
                        await handler(m)
                    except Exception as exc:
                        fails.append((i, exc))
                        if stop_on_failure:
                            return i + 1, fails
                return len(msgs), fails

            return invoke_async

        place = self._placement = _SyncPlacement(self.options.handler_threads == "auto")
        clock = time.perf_counter

        def run_chunk(
            q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool
        ) -> tuple[int, list[tuple[int, BaseException]], float, bool]:
            """In a worker thread: (processed, failures, seconds, a call was slow)."""
            fails: list[tuple[int, BaseException]] = []
            t0 = t = clock()
            slow = False
            for i, m in enumerate(msgs):
                if (self._stopping or q.stopped) and q.taken_top <= top:
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

        limiter = trio.CapacityLimiter(self.options.concurrency)
        to_thread = trio.to_thread.run_sync

        async def in_threads(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
            processed, fails, elapsed, slow = await to_thread(
                run_chunk, q, msgs, top, stop_on_failure, limiter=limiter, abandon_on_cancel=True
            )
            place.observed(processed, elapsed, slow)
            return processed, fails

        checkpoint = trio.lowlevel.checkpoint

        async def inline(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
            """On the loop thread, in slices of INLINE_SLICE with a checkpoint between."""
            fails: list[tuple[int, BaseException]] = []
            n = len(msgs)
            i = first = 0
            t = start = clock()
            while i < n:
                if (self._stopping or q.stopped) and q.taken_top <= top:
                    return i, fails
                try:
                    handler(msgs[i])
                except Exception as exc:
                    if isinstance(exc, RuntimeError) and any(e in str(exc) for e in _LOOP_THREAD_ERRORS):
                        place.leave(f"made a blocking trio call ({exc})", forever=True)
                        return await self._rest_in_threads(q, i, msgs, top, fails, stop_on_failure, in_threads)
                    fails.append((i, exc))
                    if stop_on_failure:
                        return i + 1, fails
                i += 1
                t1 = clock()
                if t1 - t > SLOW_CALL:
                    place.leave(f"call took {1000 * (t1 - t):.1f} ms")
                    return await self._rest_in_threads(q, i, msgs, top, fails, stop_on_failure, in_threads)
                t = t1
                if t1 - start >= INLINE_SLICE:
                    if t1 - start > INLINE_LEAVE * (i - first):
                        place.leave(f"calls average {1e6 * (t1 - start) / (i - first):.0f} us")
                        return await self._rest_in_threads(q, i, msgs, top, fails, stop_on_failure, in_threads)
                    await checkpoint()
                    t = start = clock()
                    first = i
            return n, fails

        async def invoke_sync(q: ProcessQueue, msgs: list[Message], top: int, stop_on_failure: bool) -> ChunkResult:
            if place.inline:
                return await inline(q, msgs, top, stop_on_failure)
            return await in_threads(q, msgs, top, stop_on_failure)

        return invoke_sync

    @staticmethod
    async def _rest_in_threads(
        q: ProcessQueue, i: int, msgs: list[Message], top: int, fails: list[tuple[int, BaseException]],
        stop_on_failure: bool, in_threads: Invoke,
    ) -> ChunkResult:  # fmt: skip
        """Run ``msgs[i:]`` in threads after ``msgs[:i]`` ran inline (with ``fails``)."""
        if i >= len(msgs):
            return i, fails
        processed, more = await in_threads(q, msgs[i:], top, stop_on_failure)
        return i + processed, fails + [(i + j, exc) for j, exc in more]

    def _chunk(self) -> int:
        return max(1, min(MAX_CHUNK, int(CHUNK_SECONDS / max(self._handler_time, 1e-7))))

    async def _worker(self, invoke: Invoke) -> None:
        orderly = self.options.orderly
        clock = time.perf_counter
        place = self._placement
        while not self._stopping:
            if place is not None and place.inline:
                allowed = 1  # inline calls share the loop thread: one chunk at a time
            else:
                allowed = max(1, min(self._workers, int(self._handler_time / PARALLEL_SECONDS)))
            item = self._take(self._chunk()) if self._active < allowed else None
            if item is None:
                await self._lot.park()
                continue
            q, msgs, offs = item
            t0 = clock()
            self._active += 1
            try:
                if orderly:
                    await self._process_orderly(q, msgs, offs, invoke)
                else:
                    await self._process(q, msgs, offs, invoke)
            finally:
                self._active -= 1
                self._release(q, len(msgs))
            self._handler_time = 0.8 * self._handler_time + 0.2 * (clock() - t0) / len(msgs)

    def _release(self, q: ProcessQueue, n: int) -> None:
        q.inflight -= n
        if q.busy:
            q.busy = False
            self._lot.unpark()

    async def _process(
        self, q: ProcessQueue, msgs: list[Message], offs: list[int],
        invoke: Invoke,
    ) -> None:  # fmt: skip
        processed, fails = await invoke(q, msgs, offs[-1], False)
        o = self.options
        mm, mb = o.max_buffered_messages, o.max_buffered_bytes
        if not fails:
            if processed == len(msgs):
                q.finish_many(offs, sum([len(m.body) for m in msgs]), mm, mb)
            else:
                q.finish_many(offs[:processed], sum([len(m.body) for m in msgs[:processed]]), mm, mb)
            self.consumed += processed
            return
        failed = {i for i, _ in fails}
        for i, exc in fails:
            self.failed += 1
            m = msgs[i]
            log.info("handler failed on %s/%d@%d (attempt %d): %r",
                     m.topic, m.queue_id, m.queue_offset, m.reconsume_times + 1, exc)  # fmt: skip
            if self._store is not None:  # broadcast: retry locally
                assert self._nursery is not None
                self._nursery.start_soon(self._local_retry, q, m, offs[i])
            elif await self._send_back(m):
                q.finish(offs[i], len(m.body), mm, mb)
        for i in range(processed):
            if i not in failed:
                q.finish(offs[i], len(msgs[i].body), mm, mb)
        self.consumed += processed - len(fails)

    async def _process_orderly(
        self, q: ProcessQueue, msgs: list[Message], offs: list[int],
        invoke: Invoke,
    ) -> None:  # fmt: skip
        o = self.options
        mm, mb = o.max_buffered_messages, o.max_buffered_bytes
        i = 0
        while i < len(msgs) and not q.stopped:
            rest = msgs[i:]
            processed, fails = await invoke(q, rest, offs[-1], True)
            ok = processed - len(fails)
            for j in range(i, i + ok):
                q.finish(offs[j], len(msgs[j].body), mm, mb)
            self.consumed += ok
            if not fails:
                if processed < len(rest):
                    return  # stopping: the rest stays undone
                i += processed
                continue
            k = i + ok
            m = msgs[k]
            self.failed += 1
            log.info("orderly handler failed on %s/%d@%d (attempt %d): %r",
                     m.topic, m.queue_id, m.queue_offset, m.reconsume_times + 1, fails[0][1])  # fmt: skip
            if m.reconsume_times >= o.max_reconsume_times:
                if not await self._send_back(m):
                    return
                q.finish(offs[k], len(m.body), mm, mb)
                i = k + 1
                continue
            with trio.move_on_after(retry_delay(o.retry_delays, m.reconsume_times)):
                await self._stop_evt.wait()
            if self._stopping:
                return
            m.reconsume_times += 1
            i = k

    async def _local_retry(self, q: ProcessQueue, m: Message, off: int) -> None:
        o = self.options
        if m.reconsume_times >= o.max_reconsume_times:
            if await self._send_back(m):
                q.finish(off, len(m.body), o.max_buffered_messages, o.max_buffered_bytes)
            return
        with trio.move_on_after(retry_delay(o.retry_delays, m.reconsume_times)):
            await self._stop_evt.wait()
        if self._stopping or q.stopped:
            return
        m.reconsume_times += 1
        self._ready.appendleft([q, [m], [off], 0])
        self._ready_count += 1
        self._lot.unpark()

    async def _send_back(self, m: Message) -> bool:
        """Produce a failed message to the retry (or dead-letter) topic; retried until
        it succeeds or the consumer stops. Returns whether it was sent."""
        o = self.options
        topic, out = send_back_message(m, self.group, o.retry_delays, o.max_reconsume_times)
        entry = wire.encode_entry(out)
        backoff = 0.05
        while True:
            try:
                n = self._routes.get(topic)
                if n is None:
                    n = self._routes[topic] = (await self.client.get_route(topic)).queues
                qid = m.queue_id % n if m.queue_id >= 0 else 0
                await self.client.produce(wire.ProduceRequest(topic, qid, [entry]))
                break
            except EQueueError as exc:
                if self._stopping or isinstance(exc, ClientClosed):
                    log.warning("could not send %s back to %s: %s (it will be redelivered)", m.key, topic, exc)
                    return False
                log.warning("sending a failed message to %s failed: %s; retrying", topic, exc)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        if topic == self.coordinator.retry_topic:
            self.retried += 1
            if not any(q.retry for q in self.queues.values()):
                self.coordinator.trigger()  # the retry topic may have just been created
        else:
            self.dead_lettered += 1
            log.warning("message %s/%d@%d moved to %s after %d attempts",
                        m.topic, m.queue_id, m.queue_offset, topic, m.reconsume_times + 1)  # fmt: skip
        return True

    # ------------------------------------------------------------------ dispatch
    def _deliver(self, q: ProcessQueue, msgs: list[Message], nxt: int) -> None:
        offs = [m.queue_offset for m in msgs]
        if q.retry:
            from consumer.retry import as_origin

            for m in msgs:
                as_origin(m)
        q.window.add(offs, nxt)
        q.buffered_bytes += sum([len(m.body) for m in msgs])
        n = len(q.window)
        if n > q.peak_buffered:
            q.peak_buffered = n
        self._ready.append([q, msgs, offs, 0])
        self._ready_count += len(msgs)
        self._lot.unpark(count=-(-len(msgs) // self._chunk()))

    def _take(self, limit: int) -> _Item | None:
        ready = self._ready
        if not ready:
            return None
        if self.options.orderly:
            for item in ready:
                if not item[0].busy and not item[0].stopped:
                    break
            else:
                return None
        else:
            item = ready[0]
        q, msgs, offs, pos = item
        end = pos + limit
        if end >= len(msgs):
            if item is ready[0]:
                ready.popleft()
            else:
                ready.remove(item)
            if pos:
                msgs, offs = msgs[pos:], offs[pos:]
        else:
            item[3] = end
            msgs, offs = msgs[pos:end], offs[pos:end]
        n = len(msgs)
        self._ready_count -= n
        q.inflight += n
        if offs[-1] > q.taken_top:
            q.taken_top = offs[-1]
        if self.options.orderly:
            q.busy = True
        return q, msgs, offs

    def _drop_ready(self, q: ProcessQueue) -> None:
        if any(item[0] is q for item in self._ready):
            self._ready = deque(item for item in self._ready if item[0] is not q)
            self._ready_count = sum(len(item[1]) - item[3] for item in self._ready)

    # ------------------------------------------------------------------ iterator
    def __aiter__(self) -> AsyncIterator[Message]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Message]:
        it = self._iter_begin()
        try:
            while True:
                msg = await self._iter_next(it)
                if msg is None:
                    return
                yield msg
        finally:
            self._iter_end(it)

    def _iter_begin(self) -> _Iteration:
        if self._consuming:
            raise RuntimeError("this consumer is already consuming (run or iteration)")
        self._consuming = True
        return _Iteration()

    async def _iter_next(self, it: _Iteration) -> Message | None:
        """Mark the previous message done; wait for the next (None once stopped)."""
        msgs = await self._iter_next_batch(it, 1, 1)
        return None if msgs is None else msgs[0]

    async def _iter_next_batch(self, it: _Iteration, done: int, limit: int) -> list[Message] | None:
        """The first ``done`` messages of the batch handed out last are done, the rest
        go back first in line; wait for the next batch of up to ``limit`` messages of
        one queue (None once stopped). One loop hand-off per batch for the blocking
        iterator."""
        self._iter_settle(it, done)
        while not self._stopping:
            item = self._take(limit)
            if item is not None:
                it.current = item
                return item[1]
            await self._lot.park()
        return None

    def _iter_settle(self, it: _Iteration, done: int) -> None:
        cur, it.current = it.current, None
        if cur is None:
            return
        q, msgs, offs = cur
        o = self.options
        mm, mb = o.max_buffered_messages, o.max_buffered_bytes
        if done:
            q.finish_many(offs[:done], sum([len(m.body) for m in msgs[:done]]), mm, mb)
            self.consumed += done
        self._release(q, len(msgs))
        if done < len(msgs) and not q.stopped:
            self._ready.appendleft([q, msgs[done:], offs[done:], 0])
            self._ready_count += len(msgs) - done
            self._lot.unpark()

    def _iter_end(self, it: _Iteration, done: int = 0) -> None:
        """The loop ended without asking for the next message: its message (and the
        rest of its batch) is not done; put it back first in line (a later iteration,
        or a restart, redelivers it). The ``done`` before it are done."""
        self._iter_settle(it, done)
        self._consuming = False

    # ------------------------------------------------------------------ queues
    def start_queue(self, topic: str, queue_id: int, *, retry: bool) -> None:
        """Begin consuming a queue (its lease is held, or broadcast mode)."""
        assert self._nursery is not None
        q = ProcessQueue(topic, queue_id, retry=retry, batch=self.options.pull_batch)
        self.queues[q.key] = q
        log.info("consumer %s: consuming %s", self.consumer_id, q.key)
        self._nursery.start_soon(pull_loop, self, q, self._initial_offset, self._deliver)

    def revoke(self, q: ProcessQueue) -> None:
        """Hand a queue back: stop pulling, wait for its handlers, commit, release."""
        if q.key in self.revoking or self.closing:
            return
        self.revoking.add(q.key)
        q.stop()
        self._drop_ready(q)
        assert self._nursery is not None
        self._nursery.start_soon(self._revoke_task, q)

    async def _revoke_task(self, q: ProcessQueue) -> None:
        try:
            with trio.move_on_after(self.options.revoke_timeout):
                while q.inflight:
                    await trio.sleep(0.005)
            if q.inflight:
                log.warning("revoke %s: %d handlers still running after %.1f s; releasing anyway",
                            q.key, q.inflight, self.options.revoke_timeout)  # fmt: skip
            try:
                await self._commit_queue(q)
                await self.client.release_queues(self.group, self.consumer_id, [q.key])
            except EQueueError as exc:
                log.warning("revoke %s: %s (the lease expires with the member)", q.key, exc)
            log.info("consumer %s: released %s", self.consumer_id, q.key)
        finally:
            self.revoking.discard(q.key)
            if self.queues.get(q.key) is q:
                del self.queues[q.key]

    def lease_lost(self, q: ProcessQueue) -> None:
        """The broker says we no longer hold the queue: stop at once, commit nothing."""
        if self.queues.get(q.key) is q:
            del self.queues[q.key]
        self.revoking.discard(q.key)
        if not q.stopped and not self.closing:
            log.warning("consumer %s: lost the lease of %s; stopping it", self.consumer_id, q.key)
        q.stop()
        self._drop_ready(q)
        self.coordinator.trigger()

    def release_later(self, keys: list[str]) -> None:
        async def release() -> None:
            try:
                await self.client.release_queues(self.group, self.consumer_id, keys)
            except EQueueError as exc:
                log.warning("releasing %s failed: %s", keys, exc)

        assert self._nursery is not None
        self._nursery.start_soon(release)

    async def _initial_offset(self, q: ProcessQueue) -> int:
        if self._store is not None:
            off = self._store.get(q.topic, q.queue_id)
        else:
            off = await self.client.query_offset(self.group, q.topic, q.queue_id)
        if off >= 0:
            q.last_committed = off
            return off
        start = self.options.start_from
        if q.retry or start == "earliest":
            off = (await self.client.queue_offsets(q.topic, q.queue_id)).min_offset
        elif start == "latest":
            off = (await self.client.queue_offsets(q.topic, q.queue_id)).max_offset
        else:
            assert isinstance(start, dt.datetime)
            ms = int(start.timestamp() * 1000)
            off = await self.client.offset_for_time(q.topic, q.queue_id, ms)
        q.last_committed = -1  # commit the resolved start at the next commit
        return off

    # ------------------------------------------------------------------ offsets
    async def _commit_loop(self) -> None:
        while True:
            await trio.sleep(self.options.commit_interval)
            try:
                await self.commit()
            except EQueueError as exc:
                log.warning("offset commit failed: %s", exc)

    async def commit(self) -> None:
        """Commit every queue whose committable offset moved (also done periodically,
        on revoke and on close)."""
        if self._store is not None:
            updates = {}
            for q in list(self.queues.values()):
                if q.started:
                    off = q.window.committable()
                    if off != q.last_committed:
                        updates[(q.topic, q.queue_id)] = off
                        q.last_committed = off
            if updates:
                await trio.to_thread.run_sync(self._store.save, updates)
            return
        for q in list(self.queues.values()):
            await self._commit_queue(q)

    async def _commit_queue(self, q: ProcessQueue) -> None:
        if not q.started or self._store is not None:
            return
        # one commit of a queue at a time: the broker handles requests concurrently, so
        # a periodic commit still on its way could land after (and undo) the final one
        async with q.commit_lock:
            off = q.window.committable()
            if off == q.last_committed:
                return
            try:
                await self.client.commit_offset(self.group, q.topic, q.queue_id, off, self.consumer_id)
            except NotQueueOwner:
                self.lease_lost(q)
                return
            q.last_committed = off

    # ------------------------------------------------------------------ misc
    def _on_push(self, code: int, payload: bytes) -> None:
        if code == PushCode.GROUP_CHANGED:
            self.coordinator.trigger()

    def statistics(self) -> ConsumerStatistics:
        qs = list(self.queues.values())
        return ConsumerStatistics(
            self.consumer_id, sorted(q.key for q in qs), self.consumed, self.failed, self.retried,
            self.dead_lettered, sum(len(q.window) for q in qs),
            max((q.peak_buffered for q in qs), default=0), self.stats_paused,
            self.coordinator.rebalances,
        )  # fmt: skip


def now_ms() -> int:
    return time.time_ns() // 1_000_000
