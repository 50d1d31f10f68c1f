"""``Consumer``: the blocking front of :class:`equeue.consumer.core.AsyncConsumer`.

All logic lives in the async core, running on a private trio loop in a helper thread
(:class:`equeue.client.syncfront.SyncFront`); this class only forwards. Sync handlers run
in worker threads of that loop, or inline on the loop thread once they prove fast
(``handler_threads``, see docs/consumer.md). The iterator form takes messages from
the loop a batch at a time (one hand-off per batch, sized to the loop body's speed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from equeue.client.syncfront import SyncFront
from equeue.consumer.core import AsyncConsumer, ConsumerStatistics, log
from equeue.consumer.dispatch import CHUNK_SECONDS, MAX_CHUNK
from equeue.errors import ClientClosed, EQueueError
from equeue.models import Message

__all__ = ["Consumer"]


class Consumer(SyncFront[AsyncConsumer]):
    """A member of a consumer group (blocking). Same arguments as
    :class:`~equeue.consumer.core.AsyncConsumer`; joins the group on the first
    :meth:`run` or iteration. Raises ConfigError for invalid arguments."""

    def __init__(self, brokers: str | Sequence[str], group: str, topics: str | Sequence[str], **kwargs: Any) -> None:
        super().__init__()
        probe = AsyncConsumer(brokers, group, topics, **kwargs)  # validates; no I/O
        kwargs["consumer_id"] = probe.consumer_id
        self.consumer_id = probe.consumer_id
        self.group = probe.group
        self.topics = probe.topics
        self._args = (brokers, group, topics)
        self._kwargs = kwargs
        self._token: trio.lowlevel.TrioToken | None = None
        self._close_pending = False

    def _make_core(self) -> AsyncConsumer:
        self._token = trio.lowlevel.current_trio_token()  # runs on the loop
        return AsyncConsumer(*self._args, **self._kwargs)

    def _on_loop(self) -> bool:
        """Called by a handler running inline on this consumer's loop thread?"""
        if self._token is None or not trio.lowlevel.in_trio_run():
            return False
        return trio.lowlevel.current_trio_token() is self._token

    def start(self) -> None:
        """Join the group now (otherwise the first run/iteration does)."""
        self._ensure()

    def run(self, handler: Callable[[Message], Any]) -> None:
        """Call ``handler(msg)`` for every message until :meth:`stop` or :meth:`close`
        (from another thread, a signal handler or the handler). Ctrl-C closes cleanly
        (commit, leave) and re-raises KeyboardInterrupt."""
        try:
            self._call(lambda core: core.run(handler))
        except KeyboardInterrupt:
            self.close()
            raise
        except (trio.Cancelled, trio.RunFinishedError, ClientClosed):
            if not self._closed:
                raise
        if self._close_pending:
            self.close()

    def __iter__(self) -> Iterator[Message]:
        """Iterate messages; one is done when the loop asks for the next. Breaking out
        (or an exception) leaves the current one undone: it is delivered again.

        Messages come from the consumer's loop in batches of one queue (one hand-off
        per batch; one message per batch while the loop body is slow, up to 512 while
        it is fast); the messages before the current one are marked done on the loop
        at the next hand-off. Stop, or losing the queue, ends the batch early."""
        loop, core = self._ensure()
        it = loop.run_sync(core._iter_begin)
        per_msg = CHUNK_SECONDS  # moving average of the loop body, seconds per message
        clock = time.perf_counter
        done = 0
        try:
            while True:
                limit = max(1, min(MAX_CHUNK, int(CHUNK_SECONDS / max(per_msg, 1e-7))))
                # once handed over, the loop owns the count (an interrupted hand-off may
                # or may not have settled it: then those messages are redelivered)
                settled, done = done, 0
                try:
                    batch = loop.run(core._iter_next_batch, it, settled, limit)
                except (trio.Cancelled, trio.RunFinishedError, ClientClosed):
                    if self._closed:
                        return
                    raise
                if batch is None:
                    return
                q = it.current[0] if it.current is not None else None
                t0 = clock()
                for msg in batch:
                    if core._stopping or (q is not None and q.stopped):
                        break
                    yield msg
                    done += 1
                if done:
                    per_msg = 0.8 * per_msg + 0.2 * (clock() - t0) / done
        finally:
            if loop.alive:
                try:
                    loop.run_sync(core._iter_end, it, done)
                except (trio.RunFinishedError, ClientClosed):
                    pass

    def stop(self) -> None:
        """Stop handing out messages; :meth:`run` returns (safe from a handler)."""
        loop, core = self._loop, self._core
        if loop is None or not loop.alive or core is None:
            return
        if self._on_loop():
            core.stop()
        else:
            loop.run_sync(core.stop)

    def commit(self) -> None:
        """Commit offsets that moved, now. From a handler running inline (on the
        consumer's loop) the commit is scheduled: it runs once the handler returns."""
        if self._on_loop():
            core = self._core
            assert core is not None and core._nursery is not None

            async def commit() -> None:
                try:
                    await core.commit()
                except EQueueError as exc:
                    log.warning("offset commit failed: %s", exc)

            core._nursery.start_soon(commit)
            return
        self._call(lambda core: core.commit())

    def statistics(self) -> ConsumerStatistics:
        if self._on_loop():
            assert self._core is not None
            return self._core.statistics()
        loop, core = self._ensure()
        return loop.run_sync(core.statistics)

    def close(self) -> None:
        """Stop, wait for running handlers (bounded), commit, leave the group. From a
        handler running inline (on the consumer's loop) it stops, and :meth:`run`
        closes before it returns."""
        if self._on_loop():
            self._close_pending = True
            self.stop()
            return
        self._close_core(lambda core: core.aclose())

