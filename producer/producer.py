"""The blocking producer, :class:`Producer`: forwards to an
:class:`~equeue.producer.async_producer.AsyncProducer` running on a private trio loop in a
helper thread (:mod:`equeue.client.loop_thread`); the logic exists once, in the async class.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import trio

from equeue.client.loop_thread import SyncFront
from equeue.errors import ClientClosed, ConfigError
from equeue.models import Message, SendResult
from equeue.producer._batch import DeliveryCallback, SendHandle, deliver_at_ms
from equeue.producer.async_producer import AsyncProducer, Body, Delay
from equeue.producer.options import ProducerOptions
from equeue.producer.stats import SendStats

__all__ = ["Producer"]

#: seconds between checks that the loop still runs while a blocking send waits
_LIVENESS_CHECK = 1.0


class Producer(SyncFront[AsyncProducer]):
    """The blocking producer: same methods and options as :class:`AsyncProducer`.

    Safe to share between threads. After ``os.fork()`` the child builds its own
    loop, connection and producer id on first use (nothing of the parent's is
    reused).
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        options: ProducerOptions | None = None,
        **kwargs: Any,
    ) -> None:
        if options is None:
            options = ProducerOptions(**kwargs)  # validates the options now
        elif kwargs:
            raise ConfigError("give either options= or keyword options, not both")
        super().__init__()
        self.brokers = brokers
        self.options = options
        self._pid = os.getpid()
        self._ensure()  # connects on first send

    def _make_core(self) -> AsyncProducer:
        options = self.options
        if os.getpid() != self._pid and options.producer_id is not None:
            # a forked child must not share the parent's sequences
            options = attrs.evolve(options, producer_id=None)
        return AsyncProducer(self.brokers, options=options)

    @property
    def producer_id(self) -> bytes:
        return self._ensure()[1].producer_id

    def send(
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
        """Send one message and block until it is stored (see AsyncProducer.send).

        ``body`` and ``key`` are serialized first when the options name serializers
        (SerializationError, raised here). The message is buffered and its batch
        sealed from the calling thread, which
        then blocks on the batch's thread event (set by the loop when the answer
        arrives): no round trip through ``trio.from_thread`` unless the topic is new
        or the buffer is full.
        """
        due = deliver_at_ms(delay, deliver_at)
        loop, core = self._ensure()
        if core.serialize is not None:
            body, key = core.serialize(body, key)
        h = core.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, seal=True)
        if h is None:

            async def run(core: AsyncProducer) -> SendResult:
                h = await core.submit(topic, body, key=key, tags=tags, properties=properties, due=due, seal=True)
                return await h.wait()

            return self._call(run)
        while not h.wait_done(_LIVENESS_CHECK):
            if not loop.alive:
                raise ClientClosed("the producer's event loop is not running (closed or forked)")
        return h.result()

    def send_async(
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
        """Buffer one message; return a handle (``handle.result(timeout)``).

        Buffers directly from the calling thread (no hop to the loop) unless the
        topic is new or the buffer is full; then blocks (or raises BufferFull).

        ``on_delivery(result, error)`` is called once when the message is stored
        (``error`` None) or failed for good (``result`` None), as in
        AsyncProducer.send_async: on the producer's loop thread, not the caller's.
        It must be quick and must not block (no ``send``, ``flush``, ``close`` or
        ``result()`` there: they wait on that very thread); an Exception it raises is
        logged (rate-limited) and swallowed.
        """
        due = 0 if delay is None and deliver_at is None else deliver_at_ms(delay, deliver_at)
        loop, core = self._ensure()
        if core.serialize is not None:
            body, key = core.serialize(body, key)
        h = core.submit_nowait(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        if h is not None:
            return h
        return loop.run(
            lambda: core.submit(topic, body, key=key, tags=tags, properties=properties, due=due, on_delivery=on_delivery)
        )

    def send_batch(self, topic: str, messages: Iterable[Message | Body | Any]) -> list[SendResult]:
        """Send messages grouped per queue; block until all are stored (values are
        serialized as in AsyncProducer.send_batch)."""
        msgs = list(messages)
        return self._call(lambda core: core.send_batch(topic, msgs))

    def flush(self, timeout: float | None = None) -> int:
        """Block until everything buffered so far is answered, or ``timeout`` seconds
        passed; return how many messages still wait for their outcome
        (:meth:`pending_messages`): 0 when all were answered (stored or failed: the
        failures are reported by the handles and delivery callbacks, which have run
        for the answered messages by then), as confluent-kafka's ``flush`` does.
        """

        async def run(core: AsyncProducer) -> int:
            with trio.move_on_after(timeout if timeout is not None else float("inf")):
                return await core.flush()
            return core.pending_messages()

        return self._call(run)

    def pending_messages(self) -> int:
        """Messages buffered or in flight, their outcome not known yet (see
        AsyncProducer.pending_messages)."""
        return self._ensure()[1].pending_messages()

    def queue_count(self, topic: str) -> int:
        return self._call(lambda core: core.queue_count(topic))

    def statistics(self) -> dict[str, int]:
        """Buffered bytes, lanes and message outcomes (see AsyncProducer.statistics)."""
        return self._ensure()[1].statistics()

    @property
    def send_stats(self) -> SendStats:
        """What the sends came to so far (complete up to the last ``flush``)."""
        return self._ensure()[1].send_stats

    def close(self, flush: bool = True) -> None:
        """Flush (within ``send_timeout``; not with ``flush=False``) and close.
        Idempotent. See AsyncProducer.aclose."""
        self._close_core(lambda core: core.aclose(flush))

    @property
    def closed(self) -> bool:
        return self._closed
