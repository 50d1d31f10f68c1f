"""The dispatcher: pulled batches wait in one ready line until a worker (or the
iterator) takes them, a chunk at a time.

``deliver`` (from a pull loop) appends a batch and wakes workers; ``take`` hands out
the next chunk (orderly: of a queue no worker is handling); ``release`` gives a chunk
back once handled; ``drop`` forgets what a stopped queue still had waiting. The
``stopping`` flag is the consumer's stop (final): handlers see it from any thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from equeue.consumer.options import ConsumerOptions
from equeue.consumer.process_queue import ProcessQueue
from equeue.consumer.retry import as_origin
from equeue.consumer.stats import Counters
from equeue.models import Message

__all__ = ["CHUNK_SECONDS", "MAX_CHUNK", "Dispatcher", "Item", "chunk_size"]

MAX_CHUNK = 512
#: a chunk is sized to hold about this much handler time (amortises the thread hand-off
#: for fast handlers; slow handlers get one message per chunk, i.e. full parallelism)
CHUNK_SECONDS = 0.002
#: (queue, messages, their offsets) handed out together
Item = tuple[ProcessQueue, list[Message], list[int]]


def chunk_size(seconds_per_message: float) -> int:
    """How many messages to hand over at once to a body taking ``seconds_per_message``
    each (a moving average): about :data:`CHUNK_SECONDS` of its time, 1 to :data:`MAX_CHUNK`
    (the dispatcher's chunks, and the batches of the blocking and asyncio iterators)."""
    return max(1, min(MAX_CHUNK, int(CHUNK_SECONDS / max(seconds_per_message, 1e-7))))


class Dispatcher:
    """The ready line between the pull loops and the workers (loop thread only, but
    :attr:`stopping`, a plain flag read by handlers in any thread)."""

    def __init__(self, options: ConsumerOptions, counters: Counters) -> None:
        self.options = options
        self.counters = counters
        #: stop() was called: hand out nothing more (final)
        self.stopping = False
        self.stopped = trio.Event()
        self._ready: deque[list[Any]] = deque()  # [queue, messages, offsets, next index]
        self.ready_count = 0
        self.lot = trio.lowlevel.ParkingLot()
        #: moving average of one handler call, seconds
        self.handler_time = CHUNK_SECONDS
        #: trio time of the last delivery or finished chunk (kept with ``idle_timeout``:
        #: :func:`equeue.consumer.ending.watch_idle`)
        self.activity = 0.0
        self._track = options.idle_timeout is not None
        #: called after every finished chunk (``stop_at_end``: :class:`equeue.consumer.ending.EndWatch`)
        self.on_progress: Callable[[], None] | None = None

    def stop(self) -> None:
        """Hand out nothing more (loop thread); wake everyone waiting for messages."""
        self.stopping = True
        self.stopped.set()
        self.lot.unpark_all()

    def chunk(self) -> int:
        """Messages per chunk: about CHUNK_SECONDS of handler time."""
        return chunk_size(self.handler_time)

    def deliver(self, q: ProcessQueue, msgs: list[Message], nxt: int) -> None:
        """A pull loop got ``msgs`` (the next pull starts at ``nxt``)."""
        first, last = msgs[0].queue_offset, msgs[-1].queue_offset
        # a pull's messages have increasing offsets: as many as their span, they are all of it
        offs = list(range(first, last + 1)) if last - first + 1 == len(msgs) else [m.queue_offset for m in msgs]
        if q.retry:
            for m in msgs:
                as_origin(m)
        q.window.add(offs, nxt)
        q.buffered_bytes += sum([len(m.body) for m in msgs])
        n = len(q.window)
        if n > q.peak_buffered:
            q.peak_buffered = n
        self._ready.append([q, msgs, offs, 0])
        self.ready_count += len(msgs)
        self.lot.unpark(count=-(-len(msgs) // self.chunk()))
        if self._track:
            self.activity = trio.current_time()

    def put_back(self, q: ProcessQueue, msgs: list[Message], offs: list[int]) -> None:
        """Messages handed out but not handled go back first in line."""
        self._ready.appendleft([q, msgs, offs, 0])
        self.ready_count += len(msgs)
        self.lot.unpark()

    def take(self, limit: int) -> Item | None:
        """The next chunk of at most ``limit`` messages of one queue, or None."""
        ready = self._ready
        if not ready:
            return None
        if self.options.orderly:
            for item in ready:
                q = item[0]
                if not q.busy and not q.stopped and not q.suspended:
                    break
            else:
                return None
        else:
            item = ready[0]
            if item[0].suspended:
                for item in ready:
                    if not item[0].suspended:
                        break
                else:
                    return None
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
        self.ready_count -= n
        q.inflight += n
        if offs[-1] > q.taken_top:
            q.taken_top = offs[-1]
        if self.options.orderly:
            q.busy = True
        return q, msgs, offs

    def resume(self, q: ProcessQueue) -> None:
        """``q``'s lease is confirmed again: hand out what it buffered."""
        if q.suspended:
            q.suspended = False
            self.lot.unpark_all()

    def release(self, q: ProcessQueue, n: int) -> None:
        """``n`` messages of ``q`` handed out are no longer in a handler's hands."""
        q.inflight -= n
        if q.busy:
            q.busy = False
            self.lot.unpark()
        if self._track:
            self.activity = trio.current_time()
        if self.on_progress is not None:
            self.on_progress()

    def drop(self, q: ProcessQueue) -> tuple[list[int], int]:
        """Forget what ``q`` still has waiting (it was never handed out): a stopped
        queue's, or a seek's. The offsets dropped and their body bytes."""
        offs: list[int] = []
        size = 0
        if any(item[0] is q for item in self._ready):
            for item in self._ready:
                if item[0] is q:
                    pos = item[3]
                    offs.extend(item[2][pos:])
                    size += sum([len(m.body) for m in item[1][pos:]])
            self._ready = deque(item for item in self._ready if item[0] is not q)
            self.ready_count = sum(len(item[1]) - item[3] for item in self._ready)
        return offs, size

    # ------------------------------------------------------------------ iteration
    async def next_batch(self, limit: int) -> Item | None:
        """Wait for the next chunk of at most ``limit`` messages (None once stopped)."""
        while not self.stopping:
            item = self.take(limit)
            if item is not None:
                return item
            await self.lot.park()
        return None

    def settle(self, item: Item, done: int) -> None:
        """The first ``done`` messages of ``item`` (handed out by :meth:`next_batch`)
        are done; the rest go back first in line."""
        q, msgs, offs = item
        o = self.options
        if done:
            q.finish_many(offs[:done], sum([len(m.body) for m in msgs[:done]]),
                          o.max_buffered_messages, o.max_buffered_bytes)  # fmt: skip
            self.counters.consumed += done
        self.release(q, len(msgs))
        if done < len(msgs) and not q.stopped:
            self.put_back(q, msgs[done:], offs[done:])
