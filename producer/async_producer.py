"""The trio producer, :class:`AsyncProducer`: the submit path and the lifetime.

Routing (:mod:`equeue.producer.routes`): a keyed message goes to ``crc32(key) mod
queue_count`` (:func:`equeue.routing.queue_for_key`), others round-robin over the
queues whose broker group is available, or wherever the ``queue_selector`` option
says. Each queue's batches go to the broker group that owns the queue
(:class:`equeue.client.routing.Router`; standalone: the one broker), so ``brokers`` may
list any brokers of a cluster (``"h1:5800,h2:5800"``).

Batching: messages accumulate per queue for ``linger`` seconds or up to
``max_batch_bytes``, then go out as one idempotent produce request; up to
``max_in_flight`` requests per queue are in flight at once (:mod:`equeue.producer._lane`).
``send`` seals its batch at once and waits for the answer; ``send_async`` returns a
:class:`~equeue.producer._batch.SendHandle`. At most ``max_buffered_bytes`` of
unacknowledged entries are held (:mod:`equeue.producer.buffer`): beyond that
``send_async`` waits (or raises BufferFull with ``on_full="raise"``). Options:
:class:`~equeue.producer.options.ProducerOptions`.

Delivery callbacks: ``send_async(..., on_delivery=fn)`` calls ``fn(result, error)``
once, on the loop thread, when the message is stored or its send failed for good
(:meth:`equeue.producer._batch._Batch.run_callbacks`); ``flush`` returns how many
messages still wait for their outcome.

Serializers: with ``value_serializer`` / ``key_serializer`` set (:mod:`equeue.serde`),
the send calls take any value and key and serialize them first, on the calling thread,
before anything is routed or buffered (:attr:`AsyncProducer.serialize`); a failure raises
SerializationError there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import trio

from equeue.client.async_client import AsyncClient
from equeue.client.routing import Router
from equeue.errors import ClientClosed, ConfigError, InvalidMessage, MessageTooLarge
from equeue.models import Message, SendResult
from equeue.producer._batch import DeliveryCallback, SendHandle, _Batch, deliver_at_ms
from equeue.producer._lane import LaneLoop, _Lane, cork
from equeue.producer.buffer import Buffer
from equeue.producer.options import OnFull, ProducerOptions, new_producer_id
from equeue.producer.routes import Route, Routes
from equeue.producer.stats import SendStats
from equeue.routing import key_bytes_hash
from equeue.serde import Serialize, make_serialize
from equeue.wire.batches import produced_record

__all__ = ["AsyncProducer", "Body", "Delay"]

Body = bytes | bytearray | memoryview | str
Delay = float | dt.timedelta | None


class AsyncProducer:
    """A trio producer. Use ``async with AsyncProducer("host:port") as p``.

    Options: an ``options=ProducerOptions(...)``, or its fields as keyword
    arguments (``retries=5, linger=0.01, ...``), not both. Raises ConfigError for
    an invalid option.
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        options: ProducerOptions | None = None,
        **kwargs: Any,
    ) -> None:
        if options is None:
            options = ProducerOptions(**kwargs)
        elif kwargs:
            raise ConfigError("give either options= or keyword options, not both")
        self.brokers = brokers
        self.options = options
        self.producer_id = options.producer_id or new_producer_id()
        #: ``(value, key) -> (body, key text)`` from the options' serializers; None
        #: without any (the send calls then check this once and take bodies as they are)
        self.serialize: Serialize | None = make_serialize(options.key_serializer, options.value_serializer)
        self.client = AsyncClient(brokers, connect_timeout=options.connect_timeout, security=options.security)
        self._buffer = Buffer(options.max_buffered_bytes, options.on_full)
        #: guards lanes' open/sendq/pending and the buffer count (submitting threads)
        self.lock = self._buffer.lock
        #: the route table and the owner groups' connections
        self.router = Router(self.client, refresh_interval=options.route_refresh, policy=options.retry_policy)
        self._routes = Routes(self.router, options)
        #: what the sends came to (counted per finished batch)
        self.send_stats = SendStats()
        #: where the lanes' tasks run (attached to the nursery by __aenter__)
        self._loop = LaneLoop(self.lock)
        self._closed = False
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> AsyncProducer:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.client)
            await stack.enter_async_context(self.router)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._loop.attach(self._nursery)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.aclose()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                await stack.aclose()

    async def aclose(self, flush: bool = True) -> None:
        """Flush (within ``send_timeout``), then close; later calls raise ClientClosed.

        Messages still unsent after the flush fail with ClientClosed. With
        ``flush=False`` nothing more is sent: buffered messages fail at once (those
        already written may or may not be stored).
        """
        if self._closed:
            return
        if flush and self._nursery is not None:
            with trio.move_on_after(self.options.send_timeout):
                await self.flush()
        with self._buffer.lock:  # a send_async racing from another thread sees it
            self._closed = self._loop.closed = True
        for lane in self._routes.lanes():
            lane.fail_all(ClientClosed("the producer closed before this message was sent"))
        # close the client first: the caller's task may run inside the cancel scopes
        # entered by __aenter__, so nothing may be awaited after cancelling them
        await self.router.aclose()
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
        body: Body | Any,
        *,
        key: str | bytes | Any | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        delay: Delay = None,
        deliver_at: dt.datetime | None = None,
    ) -> SendResult:
        """Send one message and wait until it is stored (or scheduled).

        ``body`` is bytes or str (UTF-8), or any value the ``value_serializer`` takes;
        ``key`` str or UTF-8 bytes, or any value the ``key_serializer`` takes.
        Raises InvalidName/ReservedTopic, MessageTooLarge, ConfigError,
        SerializationError (a serializer failed), TypeError (a property name or value
        that is not a str) before sending; TopicNotFound, DelayTooLong and the other mapped broker errors;
        ConnectionBroken/BrokerBusy after ``retries``; OperationTimeout after
        ``send_timeout``; ClientClosed once closed.
        """
        due = deliver_at_ms(delay, deliver_at)
        if self.serialize is not None:
            body, key = self.serialize(body, key)
        h = await self.submit(topic, body, key=key, tags=tags, properties=properties, due=due, seal=True)
        return await h.wait()

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
    ) -> SendHandle:
        """Buffer one message; return a handle to ``await`` for its SendResult.

        Waits only to learn a new topic's queue count, or for buffer space when
        ``max_buffered_bytes`` are pending (raises BufferFull instead with
        ``on_full="raise"``). Validation errors are raised here (TypeError for an
        ``on_delivery`` that is not callable or a property that is not a str,
        SerializationError when a serializer fails: nothing is buffered then); send
        errors by the handle.

        ``on_delivery(result, error)`` is called exactly once, on this producer's trio
        loop thread, when the message is stored or scheduled (``result``, ``error`` None)
        or its send failed for good, the producer's close included (``result`` None,
        ``error`` the EQueueError the handle raises). It must be quick and must not
        block or await; an Exception it raises is logged (rate-limited) and swallowed.
        """
        due = 0 if delay is None and deliver_at is None else deliver_at_ms(delay, deliver_at)
        if self.serialize is not None:
            body, key = self.serialize(body, key)
        h = self.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        if h is None:
            h = await self.submit(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        elif h.first_in_batch:
            # yield once per new batch (not per message): lets the lanes run
            await trio.lowlevel.checkpoint()
        return h

    def send_nowait(
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
    ) -> SendHandle:
        """Like :meth:`send_async` but never waits: raises BufferFull when the buffer
        is full, and trio.WouldBlock when the topic's queue count is not known yet.
        Usable from a delivery callback (which must not await)."""
        due = deliver_at_ms(delay, deliver_at)
        if self.serialize is not None:
            body, key = self.serialize(body, key)
        h = self.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        if h is None:
            if self._routes.get(topic) is None:
                raise trio.WouldBlock
            raise self._buffer.full_error()
        return h

    async def send_batch(self, topic: str, messages: Iterable[Message | Body | Any]) -> list[SendResult]:
        """Send messages (routed one by one), grouped per queue into as few requests
        as ``max_batch_bytes`` allows; wait for all. Results are in input order.

        The topic's route is fetched first; every message is then validated and
        encoded, and when the buffer has room for the whole batch all are buffered
        under one lock: a message that fails validation raises before any of the
        batch is sent. When the buffer has no room for the whole batch, messages are
        submitted one by one, waiting for space as ``send_async`` does; with
        ``on_full="raise"`` it raises BufferFull instead and sends none of them.

        With a ``value_serializer``, every item but a Message is a value and is
        serialized first (a SerializationError then sends none of them); a Message is
        sent as it is (its body and key are wire form already).

        Raises the first failure (messages of other queues may have been stored).
        """
        msgs = messages if isinstance(messages, list) else list(messages)
        serialize = self.serialize
        if serialize is not None and self.options.value_serializer is not None:
            msgs = [m if isinstance(m, Message) else serialize(m, None)[0] for m in msgs]
        if msgs and self._routes.get(topic) is None:
            await self._route(topic)  # first: every message is then validated before any is sent
        placed = self._submit_many(topic, msgs)
        if placed is None:  # the buffer cannot hold it whole now (on_full="block"): one by one
            handles: list[SendHandle] = []
            for m in msgs:
                if not isinstance(m, Message):
                    m = Message(m)
                h = self.submit_nowait(topic, m.body, key=m.key, tags=m.tags, properties=m.properties, due=m.deliver_at)
                if h is None:
                    h = await self.submit(topic, m.body, key=m.key, tags=m.tags, properties=m.properties, due=m.deliver_at)
                handles.append(h)
            placed = [(h._batch, h._index) for h in handles]
        self._seal_lanes(self._lanes_of(b for b, _ in placed))
        for b in {id(b): b for b, _ in placed}.values():  # each batch awaited once
            if not b.finished:
                await b.tdone.wait()
        return [b.result(i) for b, i in placed]

    async def flush(self) -> int:
        """Send everything buffered now and wait until all of it is answered (stored
        or failed: failures are reported by the handles and delivery callbacks, not
        raised here; the callbacks of those messages have run when it returns).

        Returns :meth:`pending_messages` then: 0 unless other tasks or threads sent
        meanwhile. There is no timeout parameter: bound it with a trio cancel scope
        (``with trio.move_on_after(5): await p.flush()``), and read
        :meth:`pending_messages` after a timeout.
        """
        batches = self._seal_lanes(self._routes.lanes())
        for b in batches:
            if not b.finished:
                await b.tdone.wait()
        return self.pending_messages()

    def pending_messages(self) -> int:
        """How many messages are buffered or in flight, their outcome not known yet
        (any thread). A message counts until its batch is answered or fails for good."""
        with self.lock:
            return sum(len(b.records) for lane in self._routes.lanes() for b in lane.pending)

    async def queue_count(self, topic: str) -> int:
        """The topic's queue count as this producer routes with it (fetched if unknown)."""
        return (await self._route(topic)).count

    def statistics(self) -> dict[str, int]:
        """Buffered bytes, lanes, and the messages stored, scheduled, answered as
        duplicates and failed so far (for monitoring; see :class:`SendStats`)."""
        return {
            "buffered_bytes": self._buffer.used,
            "topics": len(self._routes.topics),
            "lanes": len(self._routes.lanes()),
            **self.send_stats.counts(),
        }

    # ------------------------------------------------------------------ submit path
    def submit_nowait(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        due: int = 0,
        seal: bool = False,
        on_delivery: DeliveryCallback | None = None,
    ) -> SendHandle | None:
        """Route, encode and buffer one message without waiting (any thread): the
        entry point of the blocking and asyncio fronts, which buffer from their own
        thread with it and hop to the loop only when it returns None.

        ``body`` and ``key`` are wire form (bytes or str, str or bytes): apply
        :attr:`serialize` first. ``due``: the delivery time in ms since the epoch
        (:func:`~equeue.producer._batch.deliver_at_ms`), 0 to deliver at once.
        ``seal``: seal the message's batch at once and send it (a send that waits
        for its answer); else it fills for ``linger``. ``on_delivery`` is registered
        on the batch under the buffer lock, before the batch can be sent, so it
        always runs on the loop thread.

        Returns the message's handle, or None when the topic's queue count is not
        known yet or the buffer is full (with ``on_full="block"``): then await
        :meth:`submit`. Raises validation errors (as ``send_async``; TypeError for an
        ``on_delivery`` that is not callable), BufferFull (``on_full="raise"``),
        ClientClosed.
        """
        if on_delivery is not None and not callable(on_delivery):
            raise TypeError(f"on_delivery must be callable, not {type(on_delivery).__name__}")
        if self._closed:
            raise ClientClosed("the producer is closed")
        route = self._routes.topics.get(topic)
        if route is None:
            return None
        qid, entry = self._encode(route, body, key, tags, properties, due)
        n = len(entry)
        buffer = self._buffer
        with buffer.lock:
            if self._closed:  # under the lock: aclose's fail_all has not run, or it sees this
                raise ClientClosed("the producer is closed")
            used = buffer.used  # Buffer's reservation, inline: the produce hot path
            if used + n > buffer.limit and used > 0:
                if buffer.on_full is OnFull.RAISE:
                    raise buffer.full_error()
                return None
            buffer.used = used + n
            delayed = due > 0
            lane = route.lanes.get(qid)
            b = None if lane is None else lane.open
            if lane is not None and b is not None and b.delayed == delayed and b.nbytes + n <= self.options.max_batch_bytes:
                b.records.append(entry)  # the streaming case, inline: it fits the open batch
                b.nbytes += n
                kick = False
            else:
                lane, b, kick = self._place(route.lanes, topic, qid, entry, delayed)
            idx = len(b.records) - 1
            if on_delivery is not None:  # b is the lane's open batch: not finished, not sent
                b.add_callback((on_delivery, idx, None))
            if seal:
                lane.sendq.append(b)
                lane.open = None
                kick = True
        if kick:
            lane.wake()
        return SendHandle(b, idx)

    def _submit_many(self, topic: str, msgs: list[Message | Body]) -> list[tuple[_Batch, int]] | None:
        """:meth:`send_batch`'s path: encode every message, then buffer them all at
        once (unsealed). Returns each message's (batch, index), or None when the
        route is unknown or the buffer has no room for the whole batch (nothing is
        buffered then). Raises validation errors (nothing buffered), ClientClosed,
        BufferFull (``on_full="raise"`` and no room: nothing buffered).
        """
        if self._closed:
            raise ClientClosed("the producer is closed")
        route = self._routes.topics.get(topic)
        if route is None or not msgs:
            return None
        encode = self._encode
        items: list[tuple[int, bytes, bool]] = []
        total = 0
        for m in msgs:
            if not isinstance(m, Message):
                m = Message(m)
            due = m.deliver_at
            qid, entry = encode(route, m.body, m.key, m.tags, m.properties, due)
            items.append((qid, entry, due > 0))
            total += len(entry)
        return self._buffer_all(topic, route, items, total)

    def _encode(
        self,
        route: Route,
        body: Body,
        key: str | bytes | None,
        tags: str | None,
        properties: dict[str, Any] | None,
        due: int,
    ) -> tuple[int, bytes]:
        """One message's queue and record (:func:`~equeue.wire.batches.produced_record`:
        the lane sends its records as one batch, which the broker checks in one pass
        and stores as sent). Raises ConfigError (a body or key of the wrong type),
        InvalidMessage (a bytes key that is not UTF-8, a key or tags above 65535
        bytes), TypeError (a property name or value that is not a str) and
        MessageTooLarge (over ``max_message_bytes``, which the broker counts as key +
        tags + properties + body)."""
        options = self.options
        if type(body) is bytes:
            data: bytes = body  # type: ignore[assignment]
        elif isinstance(body, str):
            data = body.encode()
        elif isinstance(body, bytes | bytearray | memoryview):
            data = bytes(body)
        else:
            raise ConfigError(f"message body must be bytes or str, not {type(body).__name__}")
        if len(data) > options.max_message_bytes:
            raise MessageTooLarge(f"message body is {len(data)} bytes; the limit is {options.max_message_bytes}")
        kb: bytes | None
        tk = type(key)
        if tk is str:
            kb = key.encode()  # type: ignore[union-attr]
        elif key is None:
            kb = None
        elif isinstance(key, bytes):
            kb = key
            try:
                kb.decode()  # a stored key is text: refused here rather than by the broker
            except UnicodeDecodeError:
                raise InvalidMessage("a bytes key must be UTF-8 text") from None
        else:
            raise ConfigError(f"key must be str or bytes, not {type(key).__name__}")
        if kb is not None and options.queue_selector is None:
            qid = key_bytes_hash(kb) % route.count  # Route.select's common case, inline
        else:
            qid = route.select(kb, options, data, tags, properties, due)
        record = produced_record(
            data, kb, tags.encode() if tags is not None else None, properties, due, options.max_message_bytes
        )
        return qid, record

    def _buffer_all(
        self, topic: str, route: Route, items: list[tuple[int, bytes, bool]], total: int
    ) -> list[tuple[_Batch, int]] | None:
        """Reserve ``total`` buffered bytes and append the encoded ``items`` (queue,
        entry, delayed) to their lanes' open batches, under the lock once; kick the
        lanes that got a new batch. Returns each item's (batch, index), or None when
        the buffer has no room for all of ``total`` (nothing buffered). Raises
        ClientClosed, and BufferFull instead of returning None with ``on_full="raise"``."""
        buffer = self._buffer
        kicks: list[_Lane] = []
        placed: list[tuple[_Batch, int]] = []
        lanes, place = route.lanes, self._place
        with buffer.lock:
            if self._closed:
                raise ClientClosed("the producer is closed")
            if buffer.used + total > buffer.limit:
                if buffer.on_full is OnFull.RAISE:
                    raise buffer.full_error(total)
                return None
            buffer.used += total
            for qid, entry, delayed in items:
                lane, b, new = place(lanes, topic, qid, entry, delayed)
                if new and lane not in kicks:
                    kicks.append(lane)
                placed.append((b, len(b.records) - 1))
        for lane in kicks:
            lane.wake()
        return placed

    def _place(
        self, lanes: dict[int, _Lane], topic: str, qid: int, entry: bytes, delayed: bool
    ) -> tuple[_Lane, _Batch, bool]:
        """Append ``entry`` to its queue's open batch (the caller holds the lock and
        reserved its bytes): a new batch when there is none, or when the open one
        holds the other kind (delayed or not) or would grow past ``max_batch_bytes``
        (the open one is then sealed). Returns the lane, the batch and whether the
        batch is new (its lane must be kicked)."""
        lane = lanes.get(qid)
        if lane is None:
            lane = lanes[qid] = self._new_lane(topic, qid)
        n = len(entry)
        b = lane.open
        if b is not None and (b.delayed != delayed or b.nbytes + n > self.options.max_batch_bytes):
            lane.sendq.append(b)
            lane.open = b = None
        new = b is None
        if b is None:
            now = time.monotonic()
            b = lane.open = _Batch(topic, qid, delayed, now + self.options.send_timeout, now, self.lock)
            lane.pending.add(b)
        b.records.append(entry)
        b.nbytes += n
        return lane, b, new

    async def submit(
        self,
        topic: str,
        body: Body,
        *,
        key: str | bytes | None = None,
        tags: str | None = None,
        properties: dict[str, Any] | None = None,
        due: int = 0,
        seal: bool = False,
        on_delivery: DeliveryCallback | None = None,
    ) -> SendHandle:
        """:meth:`submit_nowait`, waiting (in this producer's trio loop) to learn a new
        topic's queue count and for buffer space (``on_full="block"``); the same
        arguments, and raises as it does (the route's errors too: TopicNotFound...)."""
        while True:
            h = self.submit_nowait(
                topic, body, key=key, tags=tags, properties=properties, due=due, seal=seal, on_delivery=on_delivery
            )
            if h is not None:
                return h
            if self._routes.get(topic) is None:
                await self._route(topic)
                continue
            await self._buffer.wait_space()

    def _new_lane(self, topic: str, queue_id: int) -> _Lane:
        return _Lane(
            topic,
            queue_id,
            router=self.router,
            options=self.options,
            producer_id=self.producer_id,
            buffer=self._buffer,
            stats=self.send_stats,
            on_queue_missing=self._routes.invalidate,
            loop=self._loop,
        )

    def _lanes_of(self, batches: Iterable[_Batch]) -> set[_Lane]:
        """The lanes holding ``batches``."""
        lanes: set[_Lane] = set()
        for topic, queue_id in {(b.topic, b.queue_id) for b in batches}:
            route = self._routes.get(topic)
            lane = route.lanes.get(queue_id) if route is not None else None
            if lane is not None:
                lanes.add(lane)
        return lanes

    def _seal_lanes(self, lanes: Iterable[_Lane]) -> list[_Batch]:
        """Seal the open batches of ``lanes`` and wake them; return their unfinished batches."""
        out: list[_Batch] = []
        on_loop = threading.get_ident() == self._loop.ident
        corked = cork(lanes) if on_loop else ()
        try:
            for lane in lanes:
                with self.lock:
                    if lane.open is not None:
                        lane.sendq.append(lane.open)
                        lane.open = None
                    out.extend(lane.pending)
                lane.wake()
        finally:
            for client in corked:
                client.uncork()
        return out

    # ------------------------------------------------------------------ routes
    async def _route(self, topic: str) -> Route:
        """The cached route of ``topic``, fetched (with retries) on first use."""
        if self._closed and self._routes.get(topic) is None:
            raise ClientClosed("the producer is closed")
        return await self._routes.fetch(topic)

