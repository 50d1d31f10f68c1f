"""Background message lifecycle: delayed delivery, retention, producer-state expiry.

Delayed delivery: the scheduler sleeps until the earliest due time in the LMDB
``schedule`` index (no polling loop; a long sleep is capped at
:data:`MAX_SLEEP` so a wall-clock step cannot strand a message) and is woken early
when a commit schedules something (the broker's commit callback calls
:meth:`schedule_changed`). It moves due messages with
:class:`~equeue.broker.storage.MoveDueOp` -- remove from the schedule + append to the log
in ONE transaction, submitted through the appender so it never races other writes.
A move either commits whole or not at all, so a crash at any point delivers each
message exactly once (after restart, whatever is still in the schedule and due is
moved at once).

Fairness: one move takes at most ``move_batch`` messages (a burst of 100,000 due at
the same second becomes ~50 transactions). The appender folds every produce or
commit queued meanwhile into the same group-commit transaction as the next move, so
producers wait at most about one move transaction; pulls read MVCC snapshots and
are never blocked by a write.

Retention runs every ``retention_check_interval`` (and on demand through
:meth:`enforce_retention`) as :class:`~equeue.broker.storage.RetentionOp` batches of at most
``retention_batch`` deletions each, repeated until a batch comes back short.
Producer idempotence state older than ``producer_state_ttl`` is expired in
bounded batches too (:meth:`expire_producers`).

Collaborators: the store reader (the schedule's next due time, the store's wall
clock that due times are measured on, and the move counters, committed with each
move), the appender's ``submit``, the broker's configuration and the live
subscriptions of the group registry. Sleeps use the trio clock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from equeue.broker.groups import GroupRegistry
from equeue.broker.storage import ExpireProducersOp, MoveDueOp, RetentionOp, StoreReader, WriteOp
from equeue.config import BrokerConfig
from equeue.errors import BrokerShuttingDown, EQueueError, NotLeader

log = logging.getLogger("equeue.lifecycle")

__all__ = ["MAX_SLEEP", "MOVE_BATCH", "Lifecycle", "LiveGroups", "Submit", "subscribed_groups"]

#: queue a write op and wait for its result (``Appender.submit``)
Submit = Callable[[WriteOp], Awaitable[Any]]
#: topic -> groups with a live member subscribed (what ``delete_consumed`` protects)
LiveGroups = Callable[[], Mapping[str, frozenset[str]]]

#: most delayed messages moved into the log per transaction
MOVE_BATCH = 2000
#: longest single sleep of the scheduler (re-reads the schedule and the wall clock)
MAX_SLEEP = 30.0
#: how often producer idempotence state is checked for expiry (seconds)
PRODUCER_EXPIRY_INTERVAL = 3600.0
#: producer-state entries examined per expiry transaction
PRODUCER_EXPIRY_BATCH = 10_000


class Lifecycle:
    """Owns the scheduler and the retention loop; :meth:`run` lives in the broker's nursery.

    The public coroutines (:meth:`move_due`, :meth:`enforce_retention`,
    :meth:`expire_producers`) may also be awaited directly (tests, admin), from the
    broker's trio thread.
    """

    def __init__(
        self,
        store: StoreReader,
        submit: Submit,
        config: BrokerConfig,
        live_groups: LiveGroups,
        *,
        move_batch: int = MOVE_BATCH,
    ) -> None:
        self._store = store
        self._submit = submit
        self._config = config
        self._live_groups = live_groups
        self.move_batch = move_batch
        self._schedule_changed = trio.Event()
        self.retention_removed = 0
        self.producers_expired = 0

    @property
    def moved(self) -> int:
        """Delayed messages taken from the schedule since the store opened. Counted
        in the move's own commit, so whoever sees a moved message sees it counted."""
        return self._store.view.moved

    @property
    def move_transactions(self) -> int:
        """Transactions that moved delayed messages since the store opened."""
        return self._store.view.move_transactions

    def schedule_changed(self) -> None:
        """Wake the scheduler: something may now be due earlier than it thought."""
        self._schedule_changed.set()

    async def run(self) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._scheduler)
            n.start_soon(self._retention)

    # ------------------------------------------------------------------ delayed delivery
    async def _scheduler(self) -> None:
        store = self._store
        while True:
            # reset before reading the schedule: a wake-up after the read is not lost
            self._schedule_changed = trio.Event()
            due = store.next_due()
            if due is None:
                await self._schedule_changed.wait()
                continue
            wait = (due - store.clock()) / 1000  # the store's wall clock: due times are its ms
            if wait > 0:
                with trio.move_on_after(min(wait, MAX_SLEEP)):
                    await self._schedule_changed.wait()
                continue
            try:
                await self.move_due()
            except BrokerShuttingDown:
                return
            except NotLeader as exc:  # a failover (or a hand-over) under way: the new leader moves them
                log.warning("moving due delayed messages stopped: %s; retrying in 1 s", exc)
                await trio.sleep(1)
                continue
            except EQueueError as exc:
                log.error("moving due delayed messages failed: %s; retrying in 1 s", exc)
                await trio.sleep(1)
                continue
            await trio.sleep(0)  # let handlers queue their ops before the next move

    async def move_due(self) -> int:
        """Move one bounded batch of due delayed messages into their queues now.

        Returns how many left the schedule. Raises the EQueueError of a failed
        transaction (nothing moved then).
        """
        moved: int = await self._submit(MoveDueOp(self.move_batch, self._config.compression))
        return moved

    # ------------------------------------------------------------------ retention
    async def _retention(self) -> None:
        cfg = self._config
        next_expiry = trio.current_time()
        while True:
            await trio.sleep(cfg.retention_check_interval)
            try:
                await self.enforce_retention()
                if trio.current_time() >= next_expiry:
                    next_expiry = trio.current_time() + min(PRODUCER_EXPIRY_INTERVAL, cfg.producer_state_ttl)
                    await self.expire_producers()
            except BrokerShuttingDown:
                return
            except NotLeader as exc:  # a failover (or a hand-over) under way: the new leader enforces it
                log.warning("retention pass stopped: %s; next try in %.0f s", exc, cfg.retention_check_interval)
            except EQueueError as exc:
                log.error("retention pass failed: %s; next try in %.0f s", exc, cfg.retention_check_interval)

    async def enforce_retention(self) -> int:
        """Apply retention now in bounded transactions until nothing is left to delete.

        Returns the number of messages removed. Raises the EQueueError of a failed
        transaction (earlier batches stay committed).
        """
        cfg = self._config
        live = self._live_groups() if cfg.delete_consumed else {}
        total = 0
        while True:
            op = RetentionOp(cfg.retention_ms, cfg.retention_bytes, cfg.delete_consumed, cfg.retention_batch, live)
            n: int = await self._submit(op)
            total += n
            self.retention_removed += n
            if n < cfg.retention_batch:
                break
            await trio.sleep(0)
        if total:
            log.info("retention removed %d messages", total)
        return total

    async def expire_producers(self, ttl: float | None = None) -> int:
        """Forget idempotent-producer state idle longer than ``ttl`` seconds (default
        ``producer_state_ttl``), walking the table in bounded transactions."""
        ttl_ms = int((self._config.producer_state_ttl if ttl is None else ttl) * 1000)
        start = b""
        total = 0
        while True:
            n, nxt = await self._submit(ExpireProducersOp(ttl_ms, PRODUCER_EXPIRY_BATCH, start))
            total += n
            if nxt is None:
                break
            start = nxt
            await trio.sleep(0)
        if total:
            log.info("expired the idempotence state of %d idle producers", total)
        self.producers_expired += total
        return total


def subscribed_groups(registry: GroupRegistry) -> Mapping[str, frozenset[str]]:
    """topic -> groups with a live member subscribed in ``registry`` (a
    :data:`LiveGroups` once bound with ``functools.partial``)."""
    out: dict[str, set[str]] = {}
    for g in registry.groups.values():
        for m in g.members.values():
            for t in m.topics:
                out.setdefault(t, set()).add(g.name)
    return {t: frozenset(gs) for t, gs in out.items()}
