"""Group membership and rebalance: heartbeats, client-side allocation, queue leases.

Clustering: every ``heartbeat_interval`` (and at once when the broker pushes
GROUP_CHANGED) the member heartbeats, computes the allocation over the live members
subscribed to each topic (:mod:`equeue.allocation`, per topic), acquires leases for
queues newly assigned to it (the broker grants a lease only when no other live member
holds it, so a queue changes hands only after its old owner committed and released),
and revokes the queues no longer assigned (stop pulling, wait for running handlers,
``on_revoked``, commit, release). While the member closes, rounds only heartbeat
(keeping its leases while handlers and ``on_revoked`` finish); once it leaves, none
is sent. Every member also consumes the group's retry topic.

Across broker groups (docs/cluster.md, "Consumer groups across broker groups"): each
round first refreshes the routes, then heartbeats to every available group owning
queues of the subscribed topics (and of the retry topic), each heartbeat asking for
the leases of the queues that group owns. The answers are merged: the members are
the union (by consumer id), the generation the sum of the groups' (it changes when
any does), the queue counts come from the route table, the held leases are the union.
A group that does not answer keeps its queues as they are (its leases expire at the
broker if this member stays away; no queue of it is started meanwhile). Standalone
there is one group and one heartbeat, as before.

Across a failover (docs/cluster.md, "Clients across a failover"): leases live in the
leader's memory, so a group's new leader starts with none. Each heartbeat asks the
group again for the leases of the queues this member consumes there (granted only if
no other live member took them), so the member keeps its queues at the new leader.
When the routes name a new leader for a group this member heartbeats to, a round runs
at once (not at the next timer tick); after a heartbeat failed on a routing error
(NOT_LEADER, QUEUE_UNAVAILABLE, a broken connection) rounds repeat every
:data:`RETRY_INTERVAL` until it answers. A pull or commit refused with
NOT_QUEUE_OWNER first asks for such a round (:meth:`Coordinator.heartbeat_now`).

Client-side lease expiry (like RocketMQ's lock expiry): when no heartbeat to a broker
group has succeeded for ``lease_expiry`` seconds, counted from the sending of the last
one answered, the member drops that group's queues (:meth:`Assignments.lease_lost`:
nothing more of them is handed out, what was buffered is dropped, nothing committed),
since the broker has expired this member by then and another may hold them.

Broadcast: the heartbeat only announces the member; it consumes every queue of every
group.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

import trio

from equeue import control
from equeue.allocation import allocate_for
from equeue.client.routing import ROUTING_ERRORS
from equeue.consumer.assignments import Assignments
from equeue.consumer.options import ConsumeMode, ConsumerOptions
from equeue.consumer.process_queue import Lease, lease_name, parse_lease
from equeue.consumer.stats import Counters
from equeue.errors import ConnectionBroken, EQueueError, QueueUnavailable
from equeue.logs import RateLimitedLog
from equeue.names import is_ephemeral, retry_topic

log = logging.getLogger("equeue.consumer")

__all__ = ["RETRY_INTERVAL", "Coordinator"]

#: seconds between rounds while a broker group's heartbeat fails on a routing error
RETRY_INTERVAL = 0.5


class GroupClient(Protocol):
    """The client call membership needs."""

    def heartbeat(self, hb: control.Heartbeat) -> Awaitable[control.HeartbeatAnswer]: ...


class GroupRouter(Protocol):
    """What membership needs of the routes (:class:`equeue.client.routing.Router`)."""

    def refresh(self, topics: Iterable[str] | None = None) -> Awaitable[control.RouteTable]: ...

    def clients_for_topics(self, topics: Iterable[str]) -> Awaitable[Mapping[str, GroupClient]]: ...

    def owner(self, topic: str, queue_id: int) -> str | None: ...

    def cached(self, topic: str) -> control.TopicRoute | None: ...

    def subscribe(self, listener: Callable[[], None]) -> None: ...

    def group_addresses(self) -> dict[str, tuple[str, ...]]: ...


class Coordinator:
    """Keeps one member's queue set (its :class:`~equeue.consumer.assignments.Assignments`) in
    line with its group."""

    def __init__(
        self, router: GroupRouter, group: str, consumer_id: str, topics: Sequence[str], options: ConsumerOptions,
        assignments: Assignments, *, counters: Counters | None = None, on_round: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        #: called after every round (the allocation may have changed)
        self.on_round = on_round
        #: the member's counters: its heartbeat reports the poison records it skipped
        self.counters = counters
        self.router = router
        self.group = group
        self.consumer_id = consumer_id
        self.options = options
        self.assignments = assignments
        self.host = socket.gethostname()
        self.retry_topic = retry_topic(group)
        clustering = options.mode == ConsumeMode.CLUSTERING
        # an ephemeral group has no retry topic (its failed messages are retried in place)
        retry = clustering and not is_ephemeral(group)
        self.topics = [*topics, self.retry_topic] if retry else list(topics)
        self.desired: set[Lease] = set()
        self.generation = -1
        #: the broker groups that answered the last heartbeat round
        self.reached: list[str] = []
        self.members: list[control.MemberInfo] = []
        self.wake = trio.Event()
        self.rebalances = 0
        #: heartbeat failures repeat every RETRY_INTERVAL during a failover: rate-limited
        self.logs = RateLimitedLog(log, 10.0, trio.current_time)
        #: broker group -> trio time the last answered heartbeat to it was sent
        self.last_ok: dict[str, float] = {}
        #: broker groups whose last heartbeat failed on a routing error
        self.unreached: set[str] = set()
        #: rounds begun and finished (:meth:`heartbeat_now` waits on them)
        self._begun = self._finished = 0
        self._round_done = trio.Event()
        #: the addresses (leaders) of the broker groups, as last seen in the routes
        self._leaders: dict[str, tuple[str, ...]] = {}
        router.subscribe(self._routes_changed)

    def trigger(self) -> None:
        """Rebalance now (membership changed, or a retry topic appeared)."""
        self.wake.set()

    def _routes_changed(self) -> None:
        """The router took a table: a round now if a group this member heartbeats to
        has a new leader (its leases are to be asked of it)."""
        now = self.router.group_addresses()
        moved = any(addrs and self._leaders.get(name) != addrs for name, addrs in now.items() if name in self.last_ok)
        self._leaders = now
        if moved:
            self.trigger()

    async def heartbeat_now(self) -> None:
        """Run a round that begins after this call, and wait for its end (a pull or a
        commit refused with NOT_QUEUE_OWNER: the broker may be a new leader that has
        not seen this member yet)."""
        target = self._begun + 1
        self.trigger()
        with trio.move_on_after(self.options.heartbeat_interval + self.options.connect_timeout):
            while self._finished < target:
                await self._round_done.wait()

    async def wait_idle(self) -> None:
        """Wait until no round is running. With ``assignments.leaving`` set, a round
        begun later sends nothing, so after this no heartbeat of this member is in
        flight (one answered after the member's LEAVE_GROUP would register it again)."""
        while self._finished < self._begun:
            await self._round_done.wait()

    async def run(self) -> None:
        """Heartbeat and rebalance until cancelled; expire this member's queues of a
        group it could not heartbeat to for ``lease_expiry`` (module docstring)."""
        o = self.options
        interval = min(o.heartbeat_interval, o.rebalance_interval)
        while True:
            with trio.move_on_after(min(interval, RETRY_INTERVAL) if self.unreached else interval):
                await self.wake.wait()
            self.wake = trio.Event()
            try:
                await self.rebalance()
            except EQueueError as exc:
                self.logs.log(logging.WARNING, "rebalance", "group %s: heartbeat/rebalance failed: %s", self.group, exc)

    async def expire_loop(self) -> None:
        """Drop the queues of a broker group not heartbeaten for ``lease_expiry``, at
        that moment (a task of its own: a round may hang on a frozen broker)."""
        while True:
            await trio.sleep(max(0.0, min(self._next_expiry() - trio.current_time(), 1.0)))
            self._expire()

    def _owner(self, lease: Lease) -> str:
        return self.router.owner(*lease) or ""

    def _next_expiry(self) -> float:
        """When the first of this member's queues expires client-side (inf: none)."""
        groups = {self._owner(lease) for lease in self.assignments.queues}
        return min((self.last_ok[g] + self.options.lease_expiry for g in groups if g in self.last_ok),
                   default=float("inf"))  # fmt: skip

    def _expire(self) -> None:
        """Drop the queues of every group not heartbeaten for ``lease_expiry``."""
        if self.options.mode != ConsumeMode.CLUSTERING:
            return
        now = trio.current_time()
        a = self.assignments
        for lease, q in list(a.queues.items()):
            seen = self.last_ok.get(self._owner(lease))
            if seen is not None and now - seen >= self.options.lease_expiry:
                log.warning("group %s: no heartbeat to broker group %r answered for %.1f s; dropping %s "
                            "(its lease has expired at the broker)", self.group, self._owner(lease), now - seen,
                            q.key)  # fmt: skip
                a.lease_lost(q)

    def _heartbeat(self, acquire: list[Lease]) -> control.Heartbeat:
        return control.Heartbeat(
            self.group, self.consumer_id, self.topics, self.options.mode.value, self.host,
            [lease_name(lease) for lease in acquire],
            quarantined=self.counters.quarantined if self.counters is not None else 0,
        )  # fmt: skip

    async def rebalance(self) -> None:
        """One round: heartbeat, compute the allocation, start/revoke queues, acquire."""
        self._begun += 1
        try:
            if not self.assignments.leaving:
                await self._round()
        finally:
            self._finished += 1
            self._round_done.set()
            self._round_done = trio.Event()
            if self.on_round is not None:
                self.on_round()

    async def _round(self) -> None:
        a = self.assignments
        self.rebalances += 1
        try:
            await self.router.refresh(self.topics)
        except EQueueError as exc:
            log.debug("group %s: route refresh failed (keeping the held routes): %s", self.group, exc)
        clients = await self.router.clients_for_topics(self.topics)
        # a group owning queues of these topics with no leader now (down, or failing
        # over): rounds repeat every RETRY_INTERVAL until it answers
        owners = {g for t in self.topics if (r := self.router.cached(t)) is not None for g in r.owners}
        self.unreached = {g for g in self.unreached if g in owners} | (owners - set(clients))
        if a.closing:  # handlers finishing, on_revoked running: keep the leases, change nothing
            await self._fan_out(clients, [])
            return
        if self.options.mode == ConsumeMode.BROADCAST:
            self._apply_broadcast(await self._fan_out(clients, []))
            return
        acquire = self._wanted()
        ans = await self._fan_out(clients, acquire)
        self._apply(ans)
        more = self._wanted()
        if more and more != acquire and not a.closing:
            self._apply(await self._fan_out(clients, more))

    async def _fan_out(self, clients: Mapping[str, GroupClient], acquire: list[Lease]) -> control.HeartbeatAnswer:
        """Heartbeat to every group of ``clients`` (each asked for the leases it owns);
        the merged answer (module docstring). Raises the error of the first group
        when none answers, QueueUnavailable when no group is available."""
        answers: dict[str, control.HeartbeatAnswer] = {}
        errors: list[EQueueError] = []

        # the queues consumed here are asked for again: a new leader starts with no lease
        consumed = [lease for lease in self.assignments.queues if lease not in self.assignments.revoking]
        wanted = sorted(set(acquire) | set(consumed)) if self.options.mode == ConsumeMode.CLUSTERING else []

        async def one(name: str, client: GroupClient) -> None:
            mine = [lease for lease in wanted if self._owner(lease) == name]
            sent = trio.current_time()
            try:
                with trio.move_on_after(self.options.connect_timeout + 5) as cs:
                    answers[name] = await client.heartbeat(self._heartbeat(mine))
                if cs.cancelled_caught:
                    raise ConnectionBroken(f"no answer within {self.options.connect_timeout + 5:g} s")
            except EQueueError as exc:
                if isinstance(exc, ROUTING_ERRORS):
                    self.unreached.add(name)
                    if self.options.mode == ConsumeMode.CLUSTERING:
                        # its leader died or changed: hand out nothing buffered from its
                        # queues until a heartbeat or a pull answered there confirms the leases
                        for lease, q in self.assignments.queues.items():
                            if self._owner(lease) == name:
                                q.suspended = True
                self.logs.log(logging.WARNING, f"heartbeat {name}", "group %s: heartbeat to broker group %r failed: %s",
                              self.group, name, exc)  # fmt: skip
                errors.append(exc)
                return
            self.unreached.discard(name)
            self.last_ok[name] = sent

        async with trio.open_nursery() as nursery:
            for name, client in clients.items():
                nursery.start_soon(one, name, client)
        if not answers:
            raise errors[0] if errors else QueueUnavailable(f"no broker group of {self.topics} is available")
        self.reached = sorted(answers)
        return self._merge(answers)

    def _merge(self, answers: dict[str, control.HeartbeatAnswer]) -> control.HeartbeatAnswer:
        members: dict[str, control.MemberInfo] = {}
        held: set[str] = set()
        for ans in answers.values():
            for m in ans.members:
                old = members.get(m.consumer_id)
                if old is None or m.last_seen_ms > old.last_seen_ms:
                    members[m.consumer_id] = m
            held.update(ans.held)
        # a group that did not answer: its queues stay as the leases dictate
        a = self.assignments
        for lease in [*a.queues, *a.revoking]:
            if (self.router.owner(*lease) or "") not in answers:
                held.add(lease_name(lease))
        counts: dict[str, int] = {}
        for ans in answers.values():
            for topic, n in ans.queue_counts.items():
                counts[topic] = max(counts.get(topic, 0), n)
        for topic in self.topics:
            route = self.router.cached(topic)
            if route is not None:
                counts[topic] = route.info.queues
        generation = sum(ans.generation for ans in answers.values())
        return control.HeartbeatAnswer(sorted(members.values(), key=lambda m: m.consumer_id), generation,
                                       sorted(held), counts)  # fmt: skip

    def _wanted(self) -> list[Lease]:
        return sorted(lease for lease in self.desired if not self.assignments.busy(lease))

    def _allocation(self, ans: control.HeartbeatAnswer) -> set[Lease] | None:
        members = [m for m in ans.members if m.mode == ConsumeMode.CLUSTERING]
        desired: set[Lease] = set()
        for topic in self.topics:
            n = ans.queue_counts.get(topic, 0)
            if not n:
                continue
            subscribed = [m.consumer_id for m in members if topic in m.topics]
            try:
                mine = allocate_for(
                    self.consumer_id, [(topic, i) for i in range(n)], subscribed, self.options.allocation
                )
            except EQueueError as exc:
                log.error("group %s: allocation failed, keeping the current one: %s", self.group, exc)
                return None
            desired.update((t, int(q)) for t, q in mine)
        return desired

    def _apply(self, ans: control.HeartbeatAnswer) -> None:
        a = self.assignments
        self.members, self.generation = ans.members, ans.generation
        desired = self._allocation(ans)
        if desired is None:
            return
        self.desired = desired
        held = {parse_lease(name) for name in ans.held}
        for lease, q in list(a.queues.items()):
            if lease not in held:
                a.lease_lost(q)
                continue
            if q.suspended and self._owner(lease) in self.reached:
                a.dispatcher.resume(q)  # the group answered: the lease is confirmed
            if lease not in desired:
                a.revoke(q)
        for lease in sorted(desired & held):
            if not a.busy(lease):
                a.start(lease, retry=lease[0] == self.retry_topic)
        stale = sorted(held - desired - set(a.queues) - a.revoking)
        if stale:
            a.release_later(stale)

    def _apply_broadcast(self, ans: control.HeartbeatAnswer) -> None:
        a = self.assignments
        self.members, self.generation = ans.members, ans.generation
        for topic in self.topics:
            for q in range(ans.queue_counts.get(topic, 0)):
                if (topic, q) not in a.queues:
                    a.start((topic, q), retry=False)
