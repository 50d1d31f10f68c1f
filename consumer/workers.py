"""The workers of :meth:`equeue.consumer.AsyncConsumer.run`: take a chunk from the
dispatcher, run the handler on it (:mod:`equeue.consumer.invoke`), mark what is done.

A handler that raises sends its message back (:mod:`equeue.consumer.sendback`; broadcast
mode retries locally instead, orderly mode retries in place first) and the message
counts as done, so it never blocks committing later offsets.
"""

from __future__ import annotations

import logging
import time

import trio

from equeue.config import retry_delay
from equeue.consumer.dispatch import Dispatcher
from equeue.consumer.invoke import Invoke, SyncPlacement
from equeue.consumer.options import ConsumerOptions
from equeue.consumer.process_queue import ProcessQueue
from equeue.consumer.sendback import SendBack, SendBackResult
from equeue.consumer.stats import Counters
from equeue.models import Message

log = logging.getLogger("equeue.consumer")

__all__ = ["Workers"]

#: handler time per extra concurrent chunk: fast handlers are CPU-bound Python, which the
#: GIL serialises anyway, so they run one chunk at a time (threads would only contend)
PARALLEL_SECONDS = 0.00002


class Workers:
    """Hands chunks to the handler, ``options.concurrency`` workers at most.

    ``local_retry``: failed messages are retried here instead of sent back (broadcast
    mode: a member's retries must not reach the other members; an ephemeral group: it
    has no retry topic, and past ``max_reconsume_times`` the message is dropped).
    """

    def __init__(
        self, dispatcher: Dispatcher, options: ConsumerOptions, counters: Counters, send_back: SendBack,
        *, local_retry: bool,
    ) -> None:  # fmt: skip
        self.dispatcher = dispatcher
        self.options = options
        self.counters = counters
        self.send_back = send_back
        self.local_retry = local_retry
        self._active = 0

    async def run(self, invoke: Invoke, placement: SyncPlacement | None) -> None:
        """Run the workers until the dispatcher stops (or this is cancelled)."""
        async with trio.open_nursery() as n:
            for _ in range(self.options.concurrency):
                n.start_soon(self._worker, invoke, placement, n)

    async def _worker(self, invoke: Invoke, place: SyncPlacement | None, nursery: trio.Nursery) -> None:
        d = self.dispatcher
        orderly = self.options.orderly
        workers = self.options.concurrency
        clock = time.perf_counter
        while not d.stopping:
            if place is not None and place.inline:
                allowed = 1  # inline calls share the loop thread: one chunk at a time
            else:
                allowed = max(1, min(workers, int(d.handler_time / PARALLEL_SECONDS)))
            item = d.take(d.chunk()) if self._active < allowed else None
            if item is None:
                await d.lot.park()
                continue
            q, msgs, offs = item
            t0 = clock()
            self._active += 1
            try:
                if orderly:
                    await self._process_orderly(q, msgs, offs, invoke)
                else:
                    await self._process(q, msgs, offs, invoke, nursery)
            finally:
                self._active -= 1
                d.release(q, len(msgs))
            d.handler_time = 0.8 * d.handler_time + 0.2 * (clock() - t0) / len(msgs)

    async def _process(
        self, q: ProcessQueue, msgs: list[Message], offs: list[int], invoke: Invoke, nursery: trio.Nursery
    ) -> None:
        processed, fails = await invoke(q, msgs, offs[-1], False)
        o = self.options
        mm, mb = o.max_buffered_messages, o.max_buffered_bytes
        if not fails:
            if processed == len(msgs):
                q.finish_many(offs, sum([len(m.body) for m in msgs]), mm, mb)
            else:
                q.finish_many(offs[:processed], sum([len(m.body) for m in msgs[:processed]]), mm, mb)
            self.counters.consumed += processed
            return
        failed = {i for i, _ in fails}
        for i, exc in fails:
            self.counters.failed += 1
            m = msgs[i]
            log.info("handler failed on %s/%d@%d (attempt %d): %r",
                     m.topic, m.queue_id, m.queue_offset, m.reconsume_times + 1, exc)  # fmt: skip
            if self.local_retry or await self.send_back.send(m, (q.topic, q.queue_id, offs[i])) is SendBackResult.UNSENT:
                nursery.start_soon(self._retry_here, q, m, offs[i])
            else:
                q.finish(offs[i], len(m.body), mm, mb)
        for i in range(processed):
            if i not in failed:
                q.finish(offs[i], len(msgs[i].body), mm, mb)
        self.counters.consumed += processed - len(fails)

    async def _process_orderly(self, q: ProcessQueue, msgs: list[Message], offs: list[int], invoke: Invoke) -> None:
        o = self.options
        mm, mb = o.max_buffered_messages, o.max_buffered_bytes
        i = 0
        while i < len(msgs) and not q.stopped:
            rest = msgs[i:]
            processed, fails = await invoke(q, rest, offs[-1], True)
            ok = processed - len(fails)
            for j in range(i, i + ok):
                q.finish(offs[j], len(msgs[j].body), mm, mb)
            self.counters.consumed += ok
            if not fails:
                if processed < len(rest):
                    return  # stopping: the rest stays undone
                i += processed
                continue
            k = i + ok
            m = msgs[k]
            self.counters.failed += 1
            log.info("orderly handler failed on %s/%d@%d (attempt %d): %r",
                     m.topic, m.queue_id, m.queue_offset, m.reconsume_times + 1, fails[0][1])  # fmt: skip
            if m.reconsume_times >= o.max_reconsume_times:
                # in place: an unsent one is tried again after a pause (the queue waits)
                while await self.send_back.send(m, (q.topic, q.queue_id, offs[k])) is SendBackResult.UNSENT:
                    if not await self._pause(m):
                        return
                q.finish(offs[k], len(m.body), mm, mb)
                i = k + 1
                continue
            if not await self._pause(m):
                return
            m.reconsume_times += 1
            i = k

    async def _pause(self, m: Message) -> bool:
        """Wait the retry delay of ``m`` (cut short by stop); whether to go on."""
        with trio.move_on_after(retry_delay(self.options.retry_delays, m.reconsume_times)):
            await self.dispatcher.stopped.wait()
        return not self.dispatcher.stopping

    async def _retry_here(self, q: ProcessQueue, m: Message, off: int) -> None:
        """Run the handler on ``m`` again after its retry delay (broadcast mode, an
        ephemeral group, or a send-back that could not get through); past
        ``max_reconsume_times`` send it to the dead-letter topic (an ephemeral group:
        drop it)."""
        o = self.options
        if self.local_retry and m.reconsume_times >= o.max_reconsume_times:
            if await self.send_back.send(m, (q.topic, q.queue_id, off)) is not SendBackResult.UNSENT:
                q.finish(off, len(m.body), o.max_buffered_messages, o.max_buffered_bytes)
                if self.dispatcher.on_progress is not None:  # stop_at_end: this may have been the last
                    self.dispatcher.on_progress()
                return
        if not await self._pause(m) or q.stopped:
            return
        if self.local_retry:
            m.reconsume_times += 1
        self.dispatcher.put_back(q, [m], [off])
