"""The appender: the single writer. It drains every pending write op into one LMDB
write transaction (group commit) run in one worker thread, then answers the ops
and wakes parked pulls. A transaction never spans an ``await``: it opens and
commits inside :meth:`broker.store.Store.write`, in the worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from broker.store import Store, WriteOp, WriteOutcome
from equeue.errors import BrokerShuttingDown, EQueueError, InternalBrokerError

log = logging.getLogger("equeue.appender")

__all__ = ["Appender"]


class _Pending:
    __slots__ = ("done", "op", "result")

    def __init__(self, op: WriteOp) -> None:
        self.op = op
        self.done = trio.Event()
        self.result: Any = None


class Appender:
    """Owns the write path. Run :meth:`run` in a nursery; :meth:`submit` from handlers."""

    def __init__(
        self,
        store: Store,
        *,
        max_batch_ops: int = 2048,
        on_commit: Callable[[WriteOutcome], None] | None = None,
    ) -> None:
        self.store = store
        self.max_batch_ops = max_batch_ops
        self.on_commit = on_commit
        self._pending: list[_Pending] = []
        self._wakeup = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self._closing = False
        self._idle = trio.Event()
        self._idle.set()
        self.transactions = 0

    async def submit(self, op: WriteOp) -> Any:
        """Queue ``op`` for the next transaction and wait until it committed.

        Returns the op's result; raises the EQueueError the op (or the whole
        transaction) failed with, or BrokerShuttingDown once closing.
        """
        return await self.wait(self.enqueue(op))

    def enqueue(self, op: WriteOp) -> _Pending:
        """Queue ``op`` now (no checkpoint), so ops enqueued one after another are
        committed in that order; :meth:`wait` for its outcome."""
        if self._closing:
            raise BrokerShuttingDown("the broker is shutting down")
        p = _Pending(op)
        self._pending.append(p)
        self._wakeup.set()
        return p

    async def wait(self, p: _Pending) -> Any:
        """Wait until an enqueued op committed; return its result or raise its error."""
        # shielded: once queued, the op may commit; we must not drop its outcome
        with trio.CancelScope(shield=True):
            await p.done.wait()
        if isinstance(p.result, BaseException):
            raise p.result
        return p.result

    async def run(self) -> None:
        """Commit loop; returns after :meth:`close` once every queued op is answered.

        If cancelled, the transaction in progress still completes and is answered
        (it is shielded); ops still queued are failed with BrokerShuttingDown.
        """
        try:
            await self._loop()
        finally:
            self._closing = True
            err = BrokerShuttingDown("the broker stopped before this request was written")
            for p in self._pending:
                p.result = err
                p.done.set()
            self._pending.clear()

    async def _loop(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            batch = self._pending[: self.max_batch_ops]
            del self._pending[: len(batch)]
            self._idle = trio.Event()
            try:
                ops = [p.op for p in batch]
                with trio.CancelScope(shield=True):
                    outcome = await trio.to_thread.run_sync(self.store.write, ops, limiter=self._limiter)
            except EQueueError as exc:
                for p in batch:
                    p.result = exc
                    p.done.set()
                self._idle.set()
                continue
            except BaseException as exc:  # an unexpected bug must not strand waiters
                log.exception("store write failed unexpectedly")

                err = InternalBrokerError(f"store write failed: {exc!r}")
                for p in batch:
                    p.result = err
                    p.done.set()
                self._idle.set()
                if not isinstance(exc, Exception):
                    raise
                continue
            self.transactions += 1
            for p, r in zip(batch, outcome.results, strict=True):
                p.result = r
                p.done.set()
            self._idle.set()
            if self.on_commit is not None:
                self.on_commit(outcome)

    def close(self) -> None:
        """Refuse new ops; :meth:`run` returns after answering the queued ones."""
        self._closing = True
        self._wakeup.set()

