"""Who holds which queue: the queues this member consumes, and handing them back.

:class:`Assignments` is the member's table of :class:`~equeue.consumer.process_queue.ProcessQueue`
by lease, plus the leases being revoked. It starts a queue (its pull loop), revokes
one (stop pulling, drop what waits, let the handlers of what was handed out finish,
commit, and only then release the lease), drops one whose lease was lost (commit
nothing), and commits them all (periodically, and on close). The application's pause
of a queue's fetching (:meth:`Assignments.pause`) lives on its ProcessQueue, so it goes
with the queue when the queue is revoked or lost.

Rebalance listeners (``on_assigned``, ``on_revoked``, ``on_lost`` of
:class:`~equeue.consumer.options.ConsumerOptions`; docs/consumer.md, "Rebalance
listeners") run in tasks of the member's nursery, one call per step: the queues started
(revoked, lost) in one synchronous step -- a rebalance round's apply, a loop of
expiries -- are batched into one call. A started queue's pull loop begins only once
``on_assigned`` returned, so no message of it is handed out before; a revoked queue's
``on_revoked`` runs after its handlers finished (or ``revoke_timeout``) and before its
commit and release, so the lease is still held meanwhile and what it commits counts;
a queue's end (``on_revoked`` or ``on_lost``, exactly one of them) is announced only
after its ``on_assigned`` returned. A raising listener is logged (rate-limited) and the
step goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from equeue.consumer.commit import CommitStatus, Committer
from equeue.consumer.dispatch import Dispatcher
from equeue.consumer.options import ConsumerOptions, Listener
from equeue.consumer.process_queue import Lease, ProcessQueue, lease_name
from equeue.consumer.pull import PullEnd, PullLoop
from equeue.errors import ConfigError, EQueueError
from equeue.logs import RateLimitedLog

log = logging.getLogger("equeue.consumer")

#: seconds between two logs of one listener's failures
LISTENER_LOG_INTERVAL = 10.0

__all__ = ["Assignments"]


class LeaseClient(Protocol):
    """The client call handing leases back."""

    def release_queues(self, group: str, consumer_id: str, leases: list[str]) -> Awaitable[None]: ...


class Assignments:
    """The queues of one member, by lease. Tasks run in the nursery given to :meth:`open`."""

    def __init__(
        self, client: LeaseClient, group: str, consumer_id: str, options: ConsumerOptions,
        committer: Committer, dispatcher: Dispatcher, pull: PullLoop, on_lost: Callable[[], None],
    ) -> None:  # fmt: skip
        self.client = client
        self.group = group
        self.consumer_id = consumer_id
        self.options = options
        self.committer = committer
        self.dispatcher = dispatcher
        self.pull = pull
        #: called when a lease was lost (the member should rebalance)
        self.on_lost = on_lost
        self.queues: dict[Lease, ProcessQueue] = {}
        self.revoking: set[Lease] = set()
        #: the member is closing: no revoke, no new queue (heartbeats go on, keeping the leases)
        self.closing = False
        #: the member is leaving: no heartbeat is sent any more (:meth:`Coordinator.wait_idle`)
        self.leaving = False
        self._nursery: trio.Nursery | None = None
        #: queues started (revoked, lost) in the current step, by kind: one listener call each
        self._batches: dict[str, list[ProcessQueue]] = {}
        self._listener_logs = RateLimitedLog(log, LISTENER_LOG_INTERVAL, trio.current_time)

    def open(self, nursery: trio.Nursery) -> None:
        """Run this member's queue tasks in ``nursery`` from now on."""
        self._nursery = nursery

    def busy(self, lease: Lease) -> bool:
        """Held and consumed, or being handed back."""
        return lease in self.queues or lease in self.revoking

    def retry_held(self) -> bool:
        """A queue of the group's retry topic is consumed here."""
        return any(q.retry for q in self.queues.values())

    def assigned(self) -> set[Lease]:
        """The queues consumed here now (not those being handed back)."""
        return {lease for lease, q in self.queues.items() if not q.stopped}

    def _assigned(self, leases: list[Lease], what: str) -> list[ProcessQueue]:
        """The ProcessQueues of ``leases``; ConfigError naming those not assigned here."""
        qs = [self.queues.get(lease) for lease in leases]
        missing = [lease for lease, q in zip(leases, qs, strict=True) if q is None or q.stopped]
        if missing:
            names = ", ".join(lease_name(lease) for lease in missing)
            raise ConfigError(f"cannot {what} {names}: not assigned to this consumer (assigned: "
                              f"{', '.join(sorted(lease_name(x) for x in self.assigned())) or 'none'})")  # fmt: skip
        return [q for q in qs if q is not None]

    def pause(self, leases: list[Lease]) -> None:
        """Stop fetching from ``leases`` (all assigned here, or ConfigError and none is
        paused); what they buffered is still handed out."""
        for q in self._assigned(leases, "pause"):
            q.hold()

    def resume(self, leases: list[Lease]) -> None:
        """Fetch from ``leases`` again (all assigned here, or ConfigError and none is
        resumed); resuming a queue not paused does nothing."""
        o = self.options
        for q in self._assigned(leases, "resume"):
            q.unhold(o.max_buffered_messages, o.max_buffered_bytes)

    def paused(self) -> set[Lease]:
        """The queues assigned here whose fetching the application paused."""
        return {lease for lease, q in self.queues.items() if q.held and not q.stopped}

    def seek(self, lease: Lease, offset: int) -> None:
        """The next message of ``lease`` handed out is the one at ``offset``: what it
        buffered is dropped, a pull in flight discarded (ConfigError when not assigned)."""
        (q,) = self._assigned([lease], "seek")
        dropped, size = self.dispatcher.drop(q)
        o = self.options
        q.seek(offset, dropped, size, o.max_buffered_messages, o.max_buffered_bytes)

    def assign_manually(self, leases: list[Lease]) -> None:
        """Manual assignment (no membership): consume exactly ``leases``. Queues no
        longer given are stopped (what they buffered is dropped; nothing is released:
        there is no lease) and, when offsets are committed (a group), committed once
        their running handlers finished (:meth:`_commit_dropped`); new ones start."""
        wanted = set(leases)
        for lease, q in list(self.queues.items()):
            if lease not in wanted:
                del self.queues[lease]
                q.stop()
                self.dispatcher.drop(q)
                log.info("consumer %s: no longer consuming %s", self.consumer_id, q.key)
                if self.options.commit_offsets and self._nursery is not None:
                    self._nursery.start_soon(self._commit_dropped, q)
        for lease in leases:
            if lease not in self.queues:
                self.start(lease, retry=False)

    async def _commit_dropped(self, q: ProcessQueue) -> None:
        """Commit what was done of a queue manual assignment no longer gives, once its
        handlers finished (or ``revoke_timeout``); a failure is logged."""
        await self.wait_handlers([q], self.options.revoke_timeout)
        if q.lease in self.queues:
            # assigned again meanwhile: its new queue started from the group's offset and
            # commits from there; this older position could move the offset backwards
            log.info("consumer %s: %s was assigned again; its earlier position is not committed",
                     self.consumer_id, q.key)  # fmt: skip
            return
        try:
            await self.committer.commit(q)
        except EQueueError as exc:
            log.warning("commit of %s (no longer assigned) failed: %s", q.key, exc)

    def start(self, lease: Lease, *, retry: bool) -> None:
        """Begin consuming a queue (its lease is held, or broadcast mode): its pull loop
        starts once ``on_assigned`` (if any) returned."""
        assert self._nursery is not None
        q = ProcessQueue(*lease, retry=retry, batch=self.options.pull_batch)
        self.queues[lease] = q
        log.info("consumer %s: consuming %s", self.consumer_id, q.key)
        if self.options.on_assigned is None:
            q.announced = True
            q.assigned.set()
            self._nursery.start_soon(self._consume, q)
        else:
            self._later("assigned", q, self._start_batch)

    async def _start_batch(self, qs: list[ProcessQueue]) -> None:
        """``on_assigned`` for the queues started in one step (those not stopped
        meanwhile), then their pull loops."""
        fresh = [q for q in qs if not q.stopped]
        try:
            for q in fresh:
                q.announced = True
            if fresh and self.options.on_assigned is not None:
                await self.notify("on_assigned", self.options.on_assigned, fresh)
        finally:
            for q in qs:
                q.assigned.set()
        assert self._nursery is not None
        for q in qs:
            if not q.stopped:
                self._nursery.start_soon(self._consume, q)

    def _later(self, kind: str, q: ProcessQueue, run: Callable[[list[ProcessQueue]], Awaitable[None]]) -> None:
        """Add ``q`` to the current batch of ``kind``; the first of a batch schedules
        ``run(batch)``, which starts once the current step yields: the queues of one
        step make one listener call."""
        assert self._nursery is not None
        batch = self._batches.get(kind)
        if batch is None:
            batch = self._batches[kind] = []

            async def take() -> None:
                if self._batches.get(kind) is batch:
                    del self._batches[kind]
                await run(batch)

            self._nursery.start_soon(take)
        batch.append(q)

    async def notify(self, name: str, fn: Listener, qs: list[ProcessQueue]) -> None:
        """Call listener ``fn`` with the leases of ``qs`` (a set), awaiting it if it is
        async. An Exception it raises is logged (rate-limited) and swallowed: the
        rebalance goes on (a lease is never left held because of it)."""
        leases = {q.lease for q in qs}
        try:
            result = fn(set(leases))
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self._listener_logs.log(
                logging.ERROR, name, "consumer %s: %s(%s) raised (ignored; the rebalance goes on): %r",
                self.consumer_id, name, sorted(leases), exc, exc_info=exc,
            )  # fmt: skip

    async def farewell(self, qs: list[ProcessQueue], name: str, fn: Listener | None, *, wait: bool = False) -> None:
        """Announce the end of ``qs`` with ``fn`` (``on_revoked`` or ``on_lost``): after
        their ``on_assigned`` returned (and, with ``wait``, after their handlers finished
        or ``revoke_timeout``), once per queue (a queue another call announces already is
        waited for, not announced again); returns once every queue's end is announced."""
        for q in qs:
            await q.assigned.wait()
        mine = [q for q in qs if q.announced and not q.farewell]
        for q in mine:
            q.farewell = True
        try:
            if wait and mine and fn is not None:
                await self.wait_handlers(mine, self.options.revoke_timeout)
            if mine and fn is not None:
                await self.notify(name, fn, mine)
        finally:
            for q in mine:
                q.farewell_done.set()
        for q in qs:
            if q.announced:
                await q.farewell_done.wait()

    async def _consume(self, q: ProcessQueue) -> None:
        if await self.pull.run(q) is PullEnd.LEASE_LOST:
            self.lease_lost(q)

    def revoke(self, q: ProcessQueue) -> None:
        """Hand a queue back: stop pulling, wait for its handlers, ``on_revoked``, commit,
        release (the queues revoked in one step together)."""
        if q.lease in self.revoking or self.closing:
            return
        self.revoking.add(q.lease)
        q.stop()
        self.dispatcher.drop(q)
        self._later("revoked", q, self._revoke)

    async def _revoke(self, qs: list[ProcessQueue]) -> None:
        try:
            if not await self.wait_handlers(qs, self.options.revoke_timeout):
                for q in qs:
                    if q.inflight:
                        log.warning("revoke %s: %d handlers still running after %.1f s; releasing anyway",
                                    q.key, q.inflight, self.options.revoke_timeout)  # fmt: skip
            await self.farewell(qs, "on_revoked", self.options.on_revoked)
            async with trio.open_nursery() as nursery:
                for q in qs:
                    nursery.start_soon(self._hand_back, q)
        finally:
            for q in qs:
                self.revoking.discard(q.lease)
                if self.queues.get(q.lease) is q:
                    del self.queues[q.lease]

    async def _hand_back(self, q: ProcessQueue) -> None:
        """Commit a revoked queue, then release its lease."""
        try:
            if await self.committer.commit(q) is CommitStatus.LEASE_LOST:
                self.lease_lost(q)
                return
            await self.client.release_queues(self.group, self.consumer_id, [q.key])
        except EQueueError as exc:
            log.warning("revoke %s: %s (the lease expires with the member)", q.key, exc)
        log.info("consumer %s: released %s", self.consumer_id, q.key)

    @staticmethod
    async def wait_handlers(queues: list[ProcessQueue], timeout: float) -> bool:
        """Wait (up to ``timeout``) until no message of ``queues`` is in a handler's
        hands; whether that happened."""
        with trio.move_on_after(timeout):
            while any(q.inflight for q in queues):
                await trio.sleep(0.005)
        return not any(q.inflight for q in queues)

    def lease_lost(self, q: ProcessQueue) -> None:
        """The broker says we no longer hold the queue: stop at once, commit nothing."""
        if self.queues.get(q.lease) is q:
            del self.queues[q.lease]
        self.revoking.discard(q.lease)
        if not q.stopped and not self.closing:
            log.warning("consumer %s: lost the lease of %s; stopping it", self.consumer_id, q.key)
        q.stop()
        self.dispatcher.drop(q)
        o = self.options
        if (o.on_lost is not None or o.on_revoked is not None) and not q.farewell and self._nursery is not None:
            self._later("lost", q, self._lost)  # its end is announced by on_lost, not on_revoked
        self.on_lost()

    async def _lost(self, qs: list[ProcessQueue]) -> None:
        """``on_lost`` for queues whose lease was lost, once their handlers finished
        (or ``revoke_timeout``); not for those whose end is announced already."""
        await self.farewell(qs, "on_lost", self.options.on_lost, wait=True)

    async def revoke_all(self) -> None:
        """Closing: ``on_revoked`` for every queue consumed here whose end is not yet
        announced (waiting for those another call announces), before the final commit
        and the leave. The queues are stopped and their handlers waited for already."""
        await self.farewell(list(self.queues.values()), "on_revoked", self.options.on_revoked)

    def release_later(self, leases: list[Lease]) -> None:
        """Release leases held but not consumed (granted after the allocation moved on)."""
        names = [lease_name(lease) for lease in leases]

        async def release() -> None:
            try:
                await self.client.release_queues(self.group, self.consumer_id, names)
            except EQueueError as exc:
                log.warning("releasing %s failed: %s", names, exc)

        assert self._nursery is not None
        self._nursery.start_soon(release)

    async def commit_all(self) -> None:
        """Commit every queue whose committable offset moved. A queue whose commit
        fails (its broker group down, say) does not hold back the others' commits;
        the first failure is raised after all were tried."""
        queues = list(self.queues.values())
        if self.committer.store is not None:
            await self.committer.save_local(queues)
            return
        error: EQueueError | None = None
        for q in queues:
            try:
                status = await self.committer.commit(q)
            except EQueueError as exc:
                error = error or exc
                continue
            if status is CommitStatus.LEASE_LOST:
                self.lease_lost(q)
        if error is not None:
            raise error

    async def commit_loop(self) -> None:
        """Commit every ``commit_interval`` until cancelled."""
        while True:
            await trio.sleep(self.options.commit_interval)
            try:
                await self.commit_all()
            except EQueueError as exc:
                log.warning("offset commit failed: %s", exc)
