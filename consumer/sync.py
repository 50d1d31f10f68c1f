"""``Consumer``: the blocking front of :class:`consumer.core.AsyncConsumer`.

All logic lives in the async core, running on a private trio loop in a helper thread
(:class:`producer.syncfront.SyncFront`); this class only forwards. Sync handlers run
in worker threads of that loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from consumer.core import AsyncConsumer, ConsumerStatistics
from equeue.errors import ClientClosed
from equeue.models import Message
from producer.syncfront import SyncFront

__all__ = ["Consumer"]


class Consumer(SyncFront[AsyncConsumer]):
    """A member of a consumer group (blocking). Same arguments as
    :class:`~consumer.core.AsyncConsumer`; joins the group on the first
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

    def _make_core(self) -> AsyncConsumer:
        return AsyncConsumer(*self._args, **self._kwargs)

    def start(self) -> None:
        """Join the group now (otherwise the first run/iteration does)."""
        self._ensure()

    def run(self, handler: Callable[[Message], Any]) -> None:
        """Call ``handler(msg)`` for every message until :meth:`stop` or :meth:`close`
        (from another thread or a signal handler). Ctrl-C closes cleanly (commit,
        leave) and re-raises KeyboardInterrupt."""
        try:
            self._call(lambda core: core.run(handler))
        except KeyboardInterrupt:
            self.close()
            raise
        except (trio.Cancelled, trio.RunFinishedError, ClientClosed):
            if not self._closed:
                raise

    def __iter__(self) -> Iterator[Message]:
        """Iterate messages; one is done when the loop asks for the next. Breaking out
        (or an exception) leaves the current one undone: it is delivered again."""
        loop, core = self._ensure()
        it = loop.run_sync(core._iter_begin)
        try:
            while True:
                try:
                    msg = loop.run(core._iter_next, it)
                except (trio.Cancelled, trio.RunFinishedError, ClientClosed):
                    if self._closed:
                        return
                    raise
                if msg is None:
                    return
                yield msg
        finally:
            if loop.alive:
                try:
                    loop.run_sync(core._iter_end, it)
                except (trio.RunFinishedError, ClientClosed):
                    pass

    def stop(self) -> None:
        """Stop handing out messages; :meth:`run` returns (safe from a handler)."""
        loop = self._loop
        if loop is not None and loop.alive and self._core is not None:
            loop.run_sync(self._core.stop)

    def commit(self) -> None:
        """Commit offsets that moved, now."""
        self._call(lambda core: core.commit())

    def statistics(self) -> ConsumerStatistics:
        loop, core = self._ensure()
        return loop.run_sync(core.statistics)

    def close(self) -> None:
        """Stop, wait for running handlers (bounded), commit, leave the group."""
        self._close_core(lambda core: core.aclose())
