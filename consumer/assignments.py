"""Who holds which queue: the queues this member consumes, and handing them back.

:class:`Assignments` is the member's table of :class:`~equeue.consumer.process.ProcessQueue`
by lease, plus the leases being revoked. It starts a queue (its pull loop), revokes
one (stop pulling, drop what waits, let the handlers of what was handed out finish,
commit, and only then release the lease), drops one whose lease was lost (commit
nothing), and commits them all (periodically, and on close). The application's pause
of a queue's fetching (:meth:`Assignments.pause`) lives on its ProcessQueue, so it goes
with the queue when the queue is revoked or lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from equeue.consumer.commit import CommitStatus, Committer
from equeue.consumer.dispatch import Dispatcher
from equeue.consumer.options import ConsumerOptions
from equeue.consumer.process import Lease, ProcessQueue, lease_name
from equeue.consumer.pull import PullEnd, PullLoop
from equeue.errors import ConfigError, EQueueError

log = logging.getLogger("equeue.consumer")

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
        #: the member is closing: no revoke, no new queue
        self.closing = False
        self._nursery: trio.Nursery | None = None

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

    def start(self, lease: Lease, *, retry: bool) -> None:
        """Begin consuming a queue (its lease is held, or broadcast mode)."""
        assert self._nursery is not None
        q = ProcessQueue(*lease, retry=retry, batch=self.options.pull_batch)
        self.queues[lease] = q
        log.info("consumer %s: consuming %s", self.consumer_id, q.key)
        self._nursery.start_soon(self._consume, q)

    async def _consume(self, q: ProcessQueue) -> None:
        if await self.pull.run(q) is PullEnd.LEASE_LOST:
            self.lease_lost(q)

    def revoke(self, q: ProcessQueue) -> None:
        """Hand a queue back: stop pulling, wait for its handlers, commit, release."""
        if q.lease in self.revoking or self.closing:
            return
        self.revoking.add(q.lease)
        q.stop()
        self.dispatcher.drop(q)
        assert self._nursery is not None
        self._nursery.start_soon(self._revoke, q)

    async def _revoke(self, q: ProcessQueue) -> None:
        try:
            if not await self.wait_handlers([q], self.options.revoke_timeout):
                log.warning("revoke %s: %d handlers still running after %.1f s; releasing anyway",
                            q.key, q.inflight, self.options.revoke_timeout)  # fmt: skip
            try:
                if await self.committer.commit(q) is CommitStatus.LEASE_LOST:
                    self.lease_lost(q)
                    return
                await self.client.release_queues(self.group, self.consumer_id, [q.key])
            except EQueueError as exc:
                log.warning("revoke %s: %s (the lease expires with the member)", q.key, exc)
            log.info("consumer %s: released %s", self.consumer_id, q.key)
        finally:
            self.revoking.discard(q.lease)
            if self.queues.get(q.lease) is q:
                del self.queues[q.lease]

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
        self.on_lost()

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
