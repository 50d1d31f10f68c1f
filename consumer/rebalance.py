"""Group membership and rebalance: heartbeats, client-side allocation, queue leases.

Clustering: every ``heartbeat_interval`` (and at once when the broker pushes
GROUP_CHANGED) the member heartbeats, computes the allocation over the live members
subscribed to each topic (:mod:`equeue.allocation`, per topic), acquires leases for
queues newly assigned to it (the broker grants a lease only when no other live member
holds it, so a queue changes hands only after its old owner committed and released),
and revokes the queues no longer assigned (stop pulling, wait for running handlers,
commit, release). Every member also consumes the group's retry topic.

Broadcast: the heartbeat only announces the member; it consumes every queue.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import trio

from equeue import control
from equeue.allocation import allocate_for
from equeue.errors import EQueueError
from equeue.names import retry_topic

if TYPE_CHECKING:
    from consumer.core import AsyncConsumer

log = logging.getLogger("equeue.consumer")

__all__ = ["Coordinator"]


def split_key(key: str) -> tuple[str, int]:
    topic, _, q = key.rpartition("/")
    return topic, int(q)


class Coordinator:
    """Keeps one consumer's membership and queue set in line with its group."""

    def __init__(self, consumer: AsyncConsumer) -> None:
        self.c = consumer
        self.host = socket.gethostname()
        self.retry_topic = retry_topic(consumer.group)
        clustering = consumer.options.mode == "clustering"
        self.topics = [*consumer.topics, self.retry_topic] if clustering else list(consumer.topics)
        self.desired: set[str] = set()
        self.generation = -1
        self.members: list[control.MemberInfo] = []
        self.wake = trio.Event()
        self.rebalances = 0

    def trigger(self) -> None:
        """Rebalance now (membership changed, or a retry topic appeared)."""
        self.wake.set()

    async def run(self) -> None:
        """Heartbeat and rebalance until cancelled."""
        o = self.c.options
        interval = min(o.heartbeat_interval, o.rebalance_interval)
        while True:
            with trio.move_on_after(interval):
                await self.wake.wait()
            self.wake = trio.Event()
            try:
                await self.rebalance()
            except EQueueError as exc:
                log.warning("group %s: heartbeat/rebalance failed: %s", self.c.group, exc)

    def _heartbeat(self, acquire: list[str]) -> control.Heartbeat:
        c = self.c
        return control.Heartbeat(c.group, c.consumer_id, self.topics, c.options.mode, self.host, acquire)

    async def rebalance(self) -> None:
        """One round: heartbeat, compute the allocation, start/revoke queues, acquire."""
        c = self.c
        if c.closing:
            return
        self.rebalances += 1
        if c.options.mode == "broadcast":
            self._apply_broadcast(await c.client.heartbeat(self._heartbeat([])))
            return
        acquire = self._wanted()
        ans = await c.client.heartbeat(self._heartbeat(acquire))
        self._apply(ans)
        more = self._wanted()
        if more and more != acquire and not c.closing:
            self._apply(await c.client.heartbeat(self._heartbeat(more)))

    def _wanted(self) -> list[str]:
        c = self.c
        return sorted(k for k in self.desired if k not in c.queues and k not in c.revoking)

    def _allocation(self, ans: control.HeartbeatAnswer) -> set[str] | None:
        c = self.c
        members = [m for m in ans.members if m.mode == "clustering"]
        desired: set[str] = set()
        for topic in self.topics:
            n = ans.queue_counts.get(topic, 0)
            if not n:
                continue
            subscribed = [m.consumer_id for m in members if topic in m.topics]
            try:
                mine = allocate_for(
                    c.consumer_id, [(topic, i) for i in range(n)], subscribed, c.options.allocation
                )
            except EQueueError as exc:
                log.error("group %s: allocation failed, keeping the current one: %s", c.group, exc)
                return None
            desired.update(f"{t}/{q}" for t, q in mine)
        return desired

    def _apply(self, ans: control.HeartbeatAnswer) -> None:
        c = self.c
        self.members, self.generation = ans.members, ans.generation
        desired = self._allocation(ans)
        if desired is None:
            return
        self.desired = desired
        held = set(ans.held)
        for key, q in list(c.queues.items()):
            if key not in held:
                c.lease_lost(q)
            elif key not in desired:
                c.revoke(q)
        for key in sorted(desired & held):
            if key not in c.queues and key not in c.revoking:
                topic, queue_id = split_key(key)
                c.start_queue(topic, queue_id, retry=topic == self.retry_topic)
        stale = sorted(held - desired - set(c.queues) - c.revoking)
        if stale:
            c.release_later(stale)

    def _apply_broadcast(self, ans: control.HeartbeatAnswer) -> None:
        c = self.c
        self.members, self.generation = ans.members, ans.generation
        for topic in self.topics:
            for q in range(ans.queue_counts.get(topic, 0)):
                if f"{topic}/{q}" not in c.queues:
                    c.start_queue(topic, q, retry=False)
