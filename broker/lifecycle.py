"""Background message lifecycle: delayed delivery, retention, producer-state expiry.

The scheduler sleeps until the earliest due time in the schedule index (no polling
loop) and is woken early when a commit schedules something; it moves due messages
with :class:`~broker.store.MoveDueOp` (remove from schedule + append to the log in
one transaction, through the appender, so it never races other writes). Retention
runs every ``retention_check_interval`` in bounded transactions.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from broker.store import ExpireProducersOp, MoveDueOp, RetentionOp
from equeue.errors import EQueueError

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("equeue.lifecycle")

MOVE_BATCH = 5000


class Lifecycle:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._schedule_changed = trio.Event()
        self.moved = 0
        self.retention_removed = 0

    def schedule_changed(self) -> None:
        self._schedule_changed.set()

    async def run(self) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._scheduler)
            n.start_soon(self._retention)

    async def _scheduler(self) -> None:
        store = self.b.store
        while True:
            self._schedule_changed = trio.Event()
            due = store.next_due()
            if due is None:
                await self._schedule_changed.wait()
                continue
            wait = (due - time.time_ns() / 1e6) / 1000
            if wait > 0:
                with trio.move_on_after(wait):
                    await self._schedule_changed.wait()
                continue
            try:
                moved = await self.b.appender.submit(MoveDueOp(MOVE_BATCH))
            except EQueueError as exc:
                log.error("moving due delayed messages failed: %s; retrying in 1 s", exc)
                await trio.sleep(1)
                continue
            self.moved += moved

    async def _retention(self) -> None:
        cfg = self.b.config
        last_expire = 0.0
        while True:
            await trio.sleep(cfg.retention_check_interval)
            await self.enforce_retention()
            if trio.current_time() - last_expire > 3600:
                last_expire = trio.current_time()
                try:
                    await self.b.appender.submit(ExpireProducersOp(int(cfg.producer_state_ttl * 1000)))
                except EQueueError as exc:
                    log.warning("expiring producer state failed: %s", exc)

    async def enforce_retention(self) -> int:
        """Run retention now, in bounded transactions, until nothing is left to delete."""
        cfg = self.b.config
        total = 0
        while True:
            op = RetentionOp(cfg.retention_ms, cfg.retention_bytes, cfg.delete_consumed, cfg.retention_batch)
            try:
                n = await self.b.appender.submit(op)
            except EQueueError as exc:
                log.error("retention pass failed: %s", exc)
                return total
            total += n
            if n < cfg.retention_batch:
                break
            await trio.sleep(0)
        if total:
            log.info("retention removed %d messages", total)
        self.retention_removed += total
        return total
