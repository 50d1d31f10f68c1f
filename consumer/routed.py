"""The consumer's queue-level calls, each sent to the broker group owning the queue.

:class:`RoutedCalls` has the client methods the consumer's parts use (offsets,
releases, send-backs, leaving) with the signatures of
:class:`~equeue.client.async_client.AsyncClient`, so :class:`~equeue.consumer.commit.Committer`,
:class:`~equeue.consumer.assignments.Assignments` and :class:`~equeue.consumer.sendback.SendBack`
take it where they took the client. Each call goes to the queue's owner through
:meth:`equeue.client.routing.Router.call` (refresh and retry on NOT_OWNER,
QUEUE_UNAVAILABLE, a broken connection); a release naming queues of several groups
is split per group; leaving is announced to every live group. A call for a queue
whose group the route table shows down fails at once with QueueUnavailable (the
table is refreshed at each rebalance): a commit or a close never waits on a group
that is known to be gone. Standalone, every call goes to the one broker, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from equeue import control
from equeue.client.async_client import AsyncClient
from equeue.client.retry import RetryPolicy
from equeue.client.routing import Router
from equeue.consumer.process_queue import parse_lease
from equeue.errors import EQueueError, QueueUnavailable

log = logging.getLogger("equeue.consumer")

__all__ = ["RoutedCalls"]

T = TypeVar("T")


class RoutedCalls:
    """Queue-level consumer calls routed to each queue's owner (module docstring).
    ``policy`` bounds the refresh-and-retry of one call."""

    def __init__(self, router: Router, policy: RetryPolicy) -> None:
        self.router = router
        self.policy = policy

    async def _call(self, topic: str, queue_id: int, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
        owner = self.router.owner(topic, queue_id)
        if owner is not None and not self.router.available(topic, queue_id):
            raise QueueUnavailable(f"{topic}/{queue_id}: broker group {owner!r} has no live broker")
        return await self.router.call(topic, queue_id, fn, self.policy)

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, consumer_id: str = "") -> None:
        await self._call(topic, queue_id, lambda c: c.commit_offset(group, topic, queue_id, offset, consumer_id))

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        return await self._call(topic, queue_id, lambda c: c.query_offset(group, topic, queue_id))

    async def queue_offsets(self, topic: str, queue_id: int) -> control.QueueStats:
        return await self._call(topic, queue_id, lambda c: c.queue_offsets(topic, queue_id))

    async def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._call(topic, queue_id, lambda c: c.offset_for_time(topic, queue_id, timestamp_ms))

    async def send_back(
        self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int,
        max_reconsume_times: int = 16, retry_delays_ms: Sequence[int] = (),
    ) -> control.SendBackAnswer:  # fmt: skip
        return await self._call(
            topic, queue_id,
            lambda c: c.send_back(group, topic, queue_id, queue_offset, reconsume_times, max_reconsume_times,
                                  retry_delays_ms),
        )  # fmt: skip

    async def release_queues(self, group: str, consumer_id: str, leases: list[str]) -> None:
        """Release ``leases`` at their owners, one request per owner group. Raises the
        first failure (the other groups' releases are still made)."""
        by_owner: dict[str, list[str]] = {}
        for name in leases:
            owner = self.router.owner(*parse_lease(name))
            by_owner.setdefault("" if owner is None else owner, []).append(name)
        error: EQueueError | None = None
        for names in by_owner.values():
            try:
                await self._release(group, consumer_id, names)
            except EQueueError as exc:
                error = error or exc
        if error is not None:
            raise error

    async def _release(self, group: str, consumer_id: str, names: list[str]) -> None:
        topic, qid = parse_lease(names[0])
        await self._call(topic, qid, lambda c: c.release_queues(group, consumer_id, names))

    async def leave_group(self, group: str, consumer_id: str) -> None:
        """LEAVE_GROUP at every live group. Raises the first failure (after trying all)."""
        error: EQueueError | None = None
        for name, client in (await self.router.all_clients()).items():
            try:
                await client.leave_group(group, consumer_id)
            except EQueueError as exc:
                log.debug("leave %s at broker group %r failed: %s", group, name, exc)
                error = error or exc
        if error is not None:
            raise error
