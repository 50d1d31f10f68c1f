"""The asyncio producer: :class:`AsyncProducer` over the trio
:class:`equeue.producer.AsyncProducer` on a private loop thread (:mod:`equeue.aio.bridge`),
and :class:`AioSendHandle`, the pending result of one ``send_async``.

A message is buffered from the caller's thread (no hop to the loop unless the topic is new
or the buffer is full); a send whose message is already buffered is still sent when its
wait is cancelled (only the wait is abandoned).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Generator, Iterable, Sequence
from typing import Any

from equeue.aio.bridge import _Front
from equeue.models import Message, SendResult
from equeue.producer._batch import DeliveryCallback, SendHandle, deliver_at_ms
from equeue.producer.async_producer import AsyncProducer as _TrioProducer
from equeue.producer.async_producer import Body, Delay
from equeue.producer.options import ProducerOptions
from equeue.producer.stats import SendStats

__all__ = ["AioSendHandle", "AsyncProducer"]


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
            return h.result()  # finished: no wait
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
        return h.result()  # finished: no wait

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
        elif h.first_in_batch:
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

