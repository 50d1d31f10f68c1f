"""The producer SDK: :class:`AsyncProducer` (trio) holds all the logic;
:class:`Producer` (blocking) forwards to one running in a helper thread.

Routing: a keyed message goes to ``crc32(key) mod queue_count``
(:func:`equeue.routing.queue_for_key`), others round-robin, or wherever
``queue_selector(queue_count, message)`` says. Queue counts are cached per topic,
fetched on first use, refreshed every ``route_refresh`` seconds and at once when
the broker answers QueueNotFound.

Batching: messages accumulate per queue for ``linger`` seconds or up to
``max_batch_bytes``, then go out as one idempotent produce request; up to
``max_in_flight`` requests per queue are in flight at once. ``send`` seals its
batch at once and waits for the answer; ``send_async`` returns a
:class:`~producer._batch.SendHandle`. At most ``max_buffered_bytes`` of
unacknowledged entries are held: beyond that ``send_async`` waits (or raises
BufferFull with ``on_full="raise"``). Retries and idempotence: see
:mod:`producer._lane`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal
from zlib import crc32

import trio

from client.connection import AsyncClient
from client.syncfront import SyncFront
from equeue import wire
from equeue.errors import (
    BufferFull,
    ClientClosed,
    ConfigError,
    EQueueError,
    MessageTooLarge,
    OperationTimeout,
)
from equeue.models import Message, SendResult
from equeue.names import validate_topic
from equeue.routing import RoundRobin
from producer._batch import SendHandle, _Batch, deliver_at_ms, encode_entry
from producer._lane import _Lane, new_producer_id

log = logging.getLogger("equeue.producer")

_pack = wire.ENTRY_HEADER.pack
_HSIZE = wire.ENTRY_HEADER.size - 4
assert wire.FLAG_KEY == 1

__all__ = ["AsyncProducer", "Message", "Producer", "QueueSelector", "SendHandle", "SendResult"]

#: seconds between checks that the loop still runs while a blocking send waits
_LIVENESS_CHECK = 1.0

#: ``queue_selector(queue_count, message) -> queue_id``
QueueSelector = Callable[[int, Message], int]
Body = bytes | bytearray | memoryview | str
Delay = float | dt.timedelta | None


def _producer_id(value: bytes | str | uuid.UUID | None) -> bytes:
    if value is None:
        return new_producer_id()
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, str):
        return uuid.UUID(value).bytes
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return bytes(value)
    raise ConfigError("producer_id must be 16 bytes, a UUID or a UUID string")


class _Route:
    __slots__ = ("count", "fetched", "lanes", "rr")

    def __init__(self, count: int) -> None:
        self.count = count
        self.fetched = time.monotonic()
        self.rr = RoundRobin()
        self.lanes: dict[int, _Lane] = {}


class AsyncProducer:
    """A trio producer. Use ``async with AsyncProducer("host:port") as p``.

    Options (all keyword): ``producer_id`` (16 bytes / UUID; default random),
    ``retries`` (3), ``retry_backoff`` (0.2 s, doubling), ``send_timeout`` (30 s,
    from the call to the answer), ``linger`` (0.005 s), ``max_batch_bytes`` (1 MiB),
    ``max_buffered_bytes`` (64 MiB), ``on_full`` ("block" or "raise"),
    ``max_in_flight`` (8 requests per queue), ``queue_selector``,
    ``max_message_bytes`` (4 MiB, checked before sending), ``auto_create`` (True:
    the broker may create a missing topic if its config allows), ``route_refresh``
    (5 s), ``connect_timeout`` (5 s).
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        producer_id: bytes | str | uuid.UUID | None = None,
        retries: int = 3,
        retry_backoff: float = 0.2,
        send_timeout: float = 30.0,
        linger: float = 0.005,
        max_batch_bytes: int = 1 << 20,
        max_buffered_bytes: int = 64 << 20,
        on_full: Literal["block", "raise"] = "block",
        max_in_flight: int = 8,
        queue_selector: QueueSelector | None = None,
        max_message_bytes: int = 4 << 20,
        auto_create: bool = True,
        route_refresh: float = 5.0,
        connect_timeout: float = 5.0,
    ) -> None:
        if retries < 0 or send_timeout <= 0 or linger < 0 or retry_backoff < 0:
            raise ConfigError("retries, linger and retry_backoff must be >= 0 and send_timeout > 0")
        if not 1 <= max_in_flight <= 16:
            raise ConfigError("max_in_flight must be between 1 and 16 (the broker remembers 16 answers)")
        if max_batch_bytes < 1 or max_batch_bytes > 8 << 20:
            raise ConfigError("max_batch_bytes must be between 1 and 8 MiB")
        if on_full not in ("block", "raise"):
            raise ConfigError("on_full must be 'block' or 'raise'")
        if max_buffered_bytes < max_batch_bytes:
            raise ConfigError("max_buffered_bytes must be >= max_batch_bytes")
        self.brokers = brokers
        self.producer_id = _producer_id(producer_id)
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.send_timeout = send_timeout
        self.linger = linger
        self.max_batch_bytes = max_batch_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.on_full = on_full
        self.max_in_flight = max_in_flight
        self.queue_selector = queue_selector
        self.max_message_bytes = max_message_bytes
        self.auto_create = auto_create
        self.route_refresh = route_refresh
        self.client = AsyncClient(brokers, connect_timeout=connect_timeout)
        #: guards lanes' open/sendq/pending and the buffer count (submitting threads)
        self.lock = threading.Lock()
        self._routes: dict[str, _Route] = {}
        self._buffered = 0
        self._space = trio.Event()
        self._space_waiters = 0
        self._kicks: set[_Lane] = set()
        self._kick_scheduled = False
        self._refresh_now = trio.Event()
        self._closed = False
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop_ident = 0

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> AsyncProducer:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.client)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._token = trio.lowlevel.current_trio_token()
            self._loop_ident = threading.get_ident()
            self._nursery.start_soon(self._refresher)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.aclose()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                await stack.aclose()

    async def aclose(self) -> None:
        """Flush (within ``send_timeout``), then close; later calls raise ClientClosed.

        Messages still unsent after the flush fail with ClientClosed.
        """
        if self._closed:
            return
        if self._nursery is not None:
            with trio.move_on_after(self.send_timeout):
                await self.flush()
        self._closed = True
        for route in list(self._routes.values()):
            for lane in route.lanes.values():
                lane.fail_all(ClientClosed("the producer closed before this message was sent"))
        # close the client first: the caller's task may run inside the cancel scopes
        # entered by __aenter__, so nothing may be awaited after cancelling them
        await self.client.aclose()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ public API
    async def send(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendResult:
        """Send one message and wait until it is stored (or scheduled).

        Raises InvalidName/ReservedTopic, MessageTooLarge, ConfigError before
        sending; TopicNotFound, DelayTooLong and the other mapped broker errors;
        ConnectionBroken/BrokerBusy after ``retries``; OperationTimeout after
        ``send_timeout``; ClientClosed once closed.
        """
        due = deliver_at_ms(delay, deliver_at)
        h = await self._submit(topic, body, key, tags, properties, due, True)
        return await h.wait()

    async def send_async(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendHandle:
        """Buffer one message; return a handle to ``await`` for its SendResult.

        Waits only to learn a new topic's queue count, or for buffer space when
        ``max_buffered_bytes`` are pending (raises BufferFull instead with
        ``on_full="raise"``). Validation errors are raised here; send errors by
        the handle.
        """
        due = 0 if delay is None and deliver_at is None else deliver_at_ms(delay, deliver_at)
        h = self.try_submit(topic, body, key, tags, properties, due, False)
        if h is None:
            h = await self._submit(topic, body, key, tags, properties, due, False)
        elif h._index == 0:
            # yield once per new batch (not per message): lets the lanes run
            await trio.lowlevel.checkpoint()
        return h

    def send_nowait(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendHandle:
        """Like :meth:`send_async` but never waits: raises BufferFull when the buffer
        is full, and trio.WouldBlock when the topic's queue count is not known yet."""
        due = deliver_at_ms(delay, deliver_at)
        h = self.try_submit(topic, body, key, tags, properties, due, False)
        if h is None:
            if topic not in self._routes:
                raise trio.WouldBlock
            raise BufferFull(f"{self._buffered} bytes are buffered (max_buffered_bytes={self.max_buffered_bytes})")
        return h

    async def send_batch(self, topic: str, messages: Iterable[Message | Body]) -> list[SendResult]:
        """Send messages (routed one by one), grouped per queue into as few requests
        as ``max_batch_bytes`` allows; wait for all. Results are in input order.

        Raises the first failure (messages of other queues may have been stored).
        """
        handles: list[SendHandle] = []
        for m in messages:
            if not isinstance(m, Message):
                m = Message(m)
            h = self.try_submit(topic, m.body, m.key, m.tags, m.properties, m.deliver_at, False)
            if h is None:
                h = await self._submit(topic, m.body, m.key, m.tags, m.properties, m.deliver_at, False)
            handles.append(h)
        self._seal_lanes({h._batch.lane for h in handles})
        return [await h.wait() for h in handles]

    async def flush(self) -> None:
        """Send everything buffered now and wait until all of it is answered (stored
        or failed: failures are reported by the handles, not raised here)."""
        lanes = [lane for route in list(self._routes.values()) for lane in route.lanes.values()]
        batches = self._seal_lanes(lanes)
        for b in batches:
            if not b.finished:
                await b.tdone.wait()

    async def queue_count(self, topic: str) -> int:
        """The topic's queue count as this producer routes with it (fetched if unknown)."""
        return (await self._route(topic)).count

    def statistics(self) -> dict[str, int]:
        """Buffered bytes and lanes (for monitoring)."""
        return {
            "buffered_bytes": self._buffered,
            "topics": len(self._routes),
            "lanes": sum(len(r.lanes) for r in self._routes.values()),
        }

    # ------------------------------------------------------------------ submit path
    def try_submit(
        self,
        topic: str,
        body: Body,
        key: str | bytes | None,
        tags: str | None,
        properties: dict[str, Any] | None,
        due: int,
        seal: bool,
    ) -> SendHandle | None:
        """Route, encode and buffer one message without waiting (any thread).

        Returns None when the topic's queue count is not known yet or the buffer is
        full (with ``on_full="block"``); the caller then awaits :meth:`_submit`.
        Raises validation errors, BufferFull, ClientClosed.
        """
        if self._closed:
            raise ClientClosed("the producer is closed")
        route = self._routes.get(topic)
        if route is None:
            return None
        if type(body) is bytes:
            data: bytes = body  # type: ignore[assignment]
        elif isinstance(body, str):
            data = body.encode()
        elif isinstance(body, bytes | bytearray | memoryview):
            data = bytes(body)
        else:
            raise ConfigError(f"message body must be bytes or str, not {type(body).__name__}")
        body = data
        if len(body) > self.max_message_bytes:
            raise MessageTooLarge(f"message body is {len(body)} bytes; the limit is {self.max_message_bytes}")
        kb: bytes | None
        tk = type(key)
        if tk is str:
            kb = key.encode()  # type: ignore[union-attr]
        elif key is None:
            kb = None
        elif isinstance(key, bytes):
            kb = key
        else:
            raise ConfigError(f"key must be str or bytes, not {type(key).__name__}")
        count = route.count
        if self.queue_selector is not None:
            msg = Message(body, key, tags, properties or {}, due, topic)
            qid = self.queue_selector(count, msg)
            if not isinstance(qid, int) or not 0 <= qid < count:
                raise ConfigError(f"queue_selector returned {qid!r}; {topic!r} has {count} queues")
        elif kb is not None:
            qid = (crc32(kb) & 0xFFFFFFFF) % count  # equeue.routing.queue_for_key, inlined
        else:
            qid = route.rr.next(count)
        if tags is None and not properties and kb is not None and len(kb) <= 0xFFFF:
            kl = len(kb)
            entry = b"".join((_pack(_HSIZE + kl + len(data), 1, due, 0, kl, 0, 0), kb, data))
        else:
            if properties:
                properties = {str(k): str(v) for k, v in properties.items()}
            entry = encode_entry(data, kb, tags.encode() if tags is not None else None, properties, due)
        n = len(entry)
        delayed = due > 0
        kick = None
        with self.lock:
            if self._buffered + n > self.max_buffered_bytes and self._buffered > 0:
                if self.on_full == "raise":
                    raise BufferFull(
                        f"{self._buffered} bytes are buffered (max_buffered_bytes={self.max_buffered_bytes})"
                    )
                return None
            lane = route.lanes.get(qid)
            if lane is None:
                lane = route.lanes[qid] = _Lane(self, topic, qid)
            self._buffered += n
            b = lane.open
            if b is not None and (b.delayed != delayed or b.nbytes + n > self.max_batch_bytes):
                lane.sendq.append(b)
                lane.open = b = None
            if b is None:
                now = time.monotonic()
                b = lane.open = _Batch(lane, delayed, now + self.send_timeout, now)
                lane.pending.add(b)
                kick = lane
            idx = b.add(entry)
            if seal:
                lane.sendq.append(b)
                lane.open = None
                kick = lane
        if kick is not None:
            self._kick(kick)
        return SendHandle(b, idx)

    async def _submit(
        self,
        topic: str,
        body: Body,
        key: str | bytes | None,
        tags: str | None,
        properties: dict[str, Any] | None,
        due: int,
        seal: bool,
    ) -> SendHandle:
        while True:
            h = self.try_submit(topic, body, key, tags, properties, due, seal)
            if h is not None:
                return h
            if topic not in self._routes:
                await self._route(topic)
                continue
            self._space_waiters += 1
            try:
                await self._space.wait()
            finally:
                self._space_waiters -= 1

    def release(self, lane: _Lane, b: _Batch) -> None:
        """A batch finished: free its buffer bytes (loop thread)."""
        with self.lock:
            if b not in lane.pending:
                return
            lane.pending.discard(b)
            self._buffered -= b.nbytes
        if self._space_waiters:
            self._space.set()
            self._space = trio.Event()

    def _seal_lanes(self, lanes: Iterable[_Lane]) -> list[_Batch]:
        """Seal the open batches of ``lanes`` and wake them; return their unfinished batches."""
        out: list[_Batch] = []
        for lane in lanes:
            with self.lock:
                if lane.open is not None:
                    lane.sendq.append(lane.open)
                    lane.open = None
                out.extend(lane.pending)
            self._kick(lane)
        return out

    # ------------------------------------------------------------------ waking lanes
    def _kick(self, lane: _Lane) -> None:
        if threading.get_ident() == self._loop_ident:
            self._wake(lane)
            return
        with self.lock:
            self._kicks.add(lane)
            if self._kick_scheduled:
                return
            self._kick_scheduled = True
        assert self._token is not None
        try:
            self._token.run_sync_soon(self._run_kicks)
        except trio.RunFinishedError:
            raise ClientClosed("the producer's event loop is not running") from None

    def _run_kicks(self) -> None:
        with self.lock:
            kicks, self._kicks = self._kicks, set()
            self._kick_scheduled = False
        for lane in kicks:
            self._wake(lane)

    def _wake(self, lane: _Lane) -> None:
        if lane.started:
            lane.kick()
        elif self._nursery is not None and not self._closed:
            lane.started = True
            self._nursery.start_soon(lane.run, name=f"equeue-lane-{lane.topic}-{lane.queue_id}")

    # ------------------------------------------------------------------ routes
    async def _route(self, topic: str) -> _Route:
        """The cached route of ``topic``, fetched (with retries) on first use."""
        route = self._routes.get(topic)
        if route is not None:
            return route
        if self._closed:
            raise ClientClosed("the producer is closed")
        validate_topic(topic)
        attempt = 0
        with trio.move_on_after(self.send_timeout) as cs:
            while True:
                try:
                    info = await self.client.get_route(topic, self.auto_create)
                    break
                except EQueueError as exc:
                    attempt += 1
                    if not exc.transient or isinstance(exc, ClientClosed) or attempt > self.retries:
                        raise
                    await trio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 5.0))
        if cs.cancelled_caught:
            raise OperationTimeout(f"no route for topic {topic!r} within send_timeout ({self.send_timeout:g} s)")
        route = self._routes.get(topic)
        if route is None:
            route = self._routes[topic] = _Route(info.queues)
        return route

    def invalidate_route(self, topic: str) -> None:
        """The broker said a queue does not exist: refresh the queue count now."""
        route = self._routes.get(topic)
        if route is not None:
            route.fetched = 0.0
            self._refresh_now.set()

    async def _refresher(self) -> None:
        while True:
            with trio.move_on_after(self.route_refresh):
                await self._refresh_now.wait()
            self._refresh_now = trio.Event()
            for topic, route in list(self._routes.items()):
                try:
                    info = await self.client.get_route(topic, False)
                except EQueueError as exc:
                    log.debug("route refresh of %s failed: %s", topic, exc)
                    continue
                if info.queues != route.count:
                    log.info("topic %s now has %d queues (was %d)", topic, info.queues, route.count)
                    route.count = info.queues
                route.fetched = time.monotonic()


class Producer(SyncFront[AsyncProducer]):
    """The blocking producer: same methods and options as :class:`AsyncProducer`.

    Safe to share between threads. After ``os.fork()`` the child builds its own
    loop, connection and producer id on first use (nothing of the parent's is
    reused).
    """

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **options: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._options = options
        self._pid = os.getpid()
        self._ensure()  # validates the options now; connects on first send

    def _make_core(self) -> AsyncProducer:
        options = self._options
        if os.getpid() != self._pid and "producer_id" in options:
            # a forked child must not share the parent's sequences
            options = {k: v for k, v in options.items() if k != "producer_id"}
        return AsyncProducer(self.brokers, **options)

    @property
    def producer_id(self) -> bytes:
        return self._ensure()[1].producer_id

    def send(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendResult:
        """Send one message and block until it is stored (see AsyncProducer.send).

        The message is buffered and its batch sealed from the calling thread, which
        then blocks on the batch's thread event (set by the loop when the answer
        arrives): no round trip through ``trio.from_thread`` unless the topic is new
        or the buffer is full.
        """
        due = deliver_at_ms(delay, deliver_at)
        loop, core = self._ensure()
        h = core.try_submit(topic, body, key, tags, properties, due, True)
        if h is None:

            async def run(core: AsyncProducer) -> SendResult:
                h = await core._submit(topic, body, key, tags, properties, due, True)
                return await h.wait()

            return self._call(run)
        b = h._batch
        while not b.finished and not b.thdone.wait(_LIVENESS_CHECK):
            if not loop.alive:
                raise ClientClosed("the producer's event loop is not running (closed or forked)")
        return b.result(h._index)

    def send_async(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendHandle:
        """Buffer one message; return a handle (``handle.result(timeout)``).

        Buffers directly from the calling thread (no hop to the loop) unless the
        topic is new or the buffer is full; then blocks (or raises BufferFull).
        """
        due = 0 if delay is None and deliver_at is None else deliver_at_ms(delay, deliver_at)
        loop, core = self._ensure()
        h = core.try_submit(topic, body, key, tags, properties, due, False)
        if h is not None:
            return h
        return loop.run(lambda: core._submit(topic, body, key, tags, properties, due, False))

    def send_batch(self, topic: str, messages: Iterable[Message | Body]) -> list[SendResult]:
        """Send messages grouped per queue; block until all are stored."""
        msgs = list(messages)
        return self._call(lambda core: core.send_batch(topic, msgs))

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything buffered so far is answered.

        Raises OperationTimeout when ``timeout`` seconds pass first.
        """

        async def run(core: AsyncProducer) -> None:
            with trio.move_on_after(timeout if timeout is not None else float("inf")) as cs:
                await core.flush()
            if cs.cancelled_caught:
                raise OperationTimeout(f"flush did not finish within {timeout} s")

        self._call(run)

    def queue_count(self, topic: str) -> int:
        return self._call(lambda core: core.queue_count(topic))

    def statistics(self) -> dict[str, int]:
        return self._ensure()[1].statistics()

    def close(self) -> None:
        """Flush (within ``send_timeout``) and close. Idempotent."""
        self._close_core(lambda core: core.aclose())

    @property
    def closed(self) -> bool:
        return self._closed
