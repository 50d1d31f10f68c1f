"""A broker's registration in etcd under a lease, kept alive for the broker's life.

``/equeue/brokers/<group>/<broker_id>`` exists exactly while the broker is alive:
it is written under a lease of ``ttl`` seconds renewed ``RENEWALS_PER_TTL`` times per ``ttl``; a crashed
broker's key vanishes when the lease expires, a stopping broker revokes the lease
so the key vanishes at once (clean step-down). The group's own record
(``/equeue/groups/<group>``) is created by the first broker of the group and stays.

**One broker per id.** The key is created only if absent (as Kafka refuses a
second broker with a registered ``broker.id``). A key of this id that another
lease holds is

* this broker's own earlier life when it advertises this broker's address (this
  process holds the data directory's lock and listens on that address, so that
  process is gone): it is deleted and the key created again at once (a restart
  after a crash does not wait for the old lease);
* otherwise another broker's: the registration waits up to one lease TTL (plus
  a second) for that lease to expire, then raises :class:`BrokerIdConflict`, which
  stops the broker: a copied data directory fails loudly instead of two stores
  answering for one replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import trio

from equeue.broker.cluster.etcd import EtcdClient, compare_create, delete_op, put_op
from equeue.client.lifetime import StackOwner, enter_cancelled_nursery
from equeue.errors import BrokerIdConflict, ClusterDataInvalid, ClusterUnavailable, ConfigError
from equeue.placement import (
    BrokerRecord,
    GroupRecord,
    broker_key,
    decode_broker,
    encode_broker,
    encode_group,
    group_key,
)

__all__ = ["Membership"]

log = logging.getLogger("equeue.cluster.membership")

#: seconds between reminders that etcd is still unreachable
_OUTAGE_REMINDER = 30.0
#: how often a registration blocked by another lease's key looks again (seconds)
_CONFLICT_POLL = 0.25
#: renewals per lease TTL, each sent on time whatever became of the previous one, so
#: one slow etcd answer costs one renewal, never the fence window (TTL * 2/3)
RENEWALS_PER_TTL = 6


def boot_clock() -> float:
    """Seconds on CLOCK_BOOTTIME: like the monotonic clock, but it keeps counting
    while the host is suspended, as etcd's lease does (a leader suspended past its
    lease must find itself fenced when it wakes)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Membership(StackOwner):
    """``async with Membership(etcd, record, ttl=5) as m: await m.wait_registered()``.

    Entering starts a task (in the object's own nursery) that registers the broker
    and keeps its lease alive; it does not wait for etcd: :meth:`wait_registered`
    does, ``registered`` says whether the key is surely there now. When etcd is
    unreachable the task keeps retrying (one warning per outage, a reminder every
    30 s, an info line when it is back). When a keepalive says the lease is gone
    (TTL 0: revoked, or etcd lost it) it grants a new lease and registers again.
    Leaving revokes the lease (bounded by the client's retries: if etcd is
    unreachable, the key expires after ``ttl`` seconds instead). Raises ConfigError
    for a ttl under 2 s; the task raises BrokerIdConflict (see the module
    docstring), which ends the broker; etcd errors are logged and retried.
    """

    def __init__(
        self, etcd: EtcdClient, record: BrokerRecord, ttl: int = 5, clock: Callable[[], float] = boot_clock
    ) -> None:
        if ttl < 2:
            raise ConfigError(f"lease ttl must be >= 2 s (etcd's minimum), not {ttl}")
        self._etcd = etcd
        self.record = record
        self.ttl = ttl
        #: the fencing clock (CLOCK_BOOTTIME by default; injectable for tests)
        self.clock = clock
        self.key = broker_key(record.group, record.broker_id)
        #: the current lease id (0 = none)
        self.lease = 0
        #: how many times the broker registered (1 + re-registrations after a lost lease)
        self.registrations = 0
        #: ``clock()`` time at which the last keepalive that succeeded was *sent* (at
        #: first: when the lease was granted). The lease cannot expire before this +
        #: ttl, so a leader fences itself by it (docs/cluster.md, "Election and fencing")
        self.last_renewal_sent = -float("inf")
        self._renewed = trio.Event()  # set and replaced at each successful renewal
        self._first = trio.Event()
        self._last_ok = -float("inf")  # trio time of the last answer that kept us registered
        self._outage_since: float | None = None
        self._reminded = 0.0
        self._nursery: trio.Nursery | None = None

    @property
    def lease_id(self) -> int | None:
        """The current lease (the broker's key and, when it leads, its leader key
        live under it); None while unregistered."""
        return self.lease or None

    async def wait_renewal(self) -> None:
        """Return at the next successful grant or keepalive."""
        await self._renewed.wait()

    @property
    def registered(self) -> bool:
        """True while the key surely exists: registered, and etcd confirmed the lease
        less than ``ttl`` seconds ago."""
        return self.lease != 0 and trio.current_time() - self._last_ok < self.ttl

    async def wait_registered(self) -> None:
        """Return once the broker registered for the first time."""
        await self._first.wait()

    async def _enter(self, stack: AsyncExitStack) -> None:
        # pushed first, so it runs last: the lease is revoked once the renewals ended
        # (whether or not the nursery's exit raised)
        stack.push_async_callback(self._step_down)
        self._nursery = await enter_cancelled_nursery(stack)
        self._nursery.start_soon(self._run, name=f"membership {self.key}")

    async def _step_down(self) -> None:
        lease, self.lease = self.lease, 0
        if not lease:
            return
        # shielded (it runs while the broker is cancelled) but bounded: a frozen etcd
        # must not hold up the broker's stop; the key then expires with the lease
        with trio.move_on_after(self._etcd.request_timeout * 1.5, shield=True) as scope:
            try:
                await self._etcd.revoke(lease)
            except ClusterUnavailable as exc:
                log.warning(
                    "could not revoke lease %x of %s (its key expires in %d s): %s",
                    lease,
                    self.key,
                    self.ttl,
                    exc,
                )
        if scope.cancelled_caught:
            log.warning(
                "could not revoke lease %x of %s in time (its key expires in %d s)",
                lease,
                self.key,
                self.ttl,
            )

    async def _run(self) -> None:
        """Register, then send a keepalive every ``ttl / RENEWALS_PER_TTL`` seconds,
        spaced from when the last one was SENT and each in its own task: a slow etcd
        answer holds up no later renewal (a late success still counts, by the time
        it was sent), so it never costs the fence window (TTL * 2/3)."""
        interval = self.ttl / RENEWALS_PER_TTL
        retry = min(0.5, interval)
        async with trio.open_nursery() as renewals:
            while True:
                sent_at = trio.current_time()
                if not self.lease:
                    try:
                        self._renewed_ok(await self._register())
                    except ClusterUnavailable as exc:
                        self._unreachable(exc)
                        await trio.sleep_until(sent_at + retry)
                        continue
                else:
                    renewals.start_soon(self._renew, self.lease)
                await trio.sleep_until(sent_at + interval)

    async def _renew(self, lease: int) -> None:
        """One keepalive of ``lease``, bounded by the fence window (TTL * 2/3: an
        answer later than that could not keep a leader serving anyway). A lease etcd
        no longer knows makes :meth:`_run` register again."""
        sent = self.clock()
        with trio.move_on_after(self.ttl * 2 / 3):
            try:
                left = await self._etcd.keepalive(lease)
            except ClusterUnavailable as exc:
                self._unreachable(exc)
                return
            if lease != self.lease:
                return  # replaced meanwhile
            if left <= 0:
                log.warning("lease of %s expired in etcd: registering again", self.key)
                self.lease = 0
                return
            self._renewed_ok(sent)

    def _renewed_ok(self, sent: float) -> None:
        """etcd confirmed the lease as of ``sent`` (``clock()`` time the request was sent)."""
        self._last_ok = trio.current_time()
        self.last_renewal_sent = max(self.last_renewal_sent, sent)
        self._renewed.set()
        self._renewed = trio.Event()
        self._reachable()

    async def _register(self) -> float:
        """Grant a lease and put the broker's key under it; returns the ``clock()``
        time the grant was sent (the lease's life counts from about then)."""
        group = self.record.group
        await self._etcd.create(group_key(group), encode_group(GroupRecord(group, _wall_ms())))
        sent = self.clock()
        lease = await self._etcd.grant(self.ttl)
        await self._claim(lease)  # a failure: the lease expires
        self.lease = lease
        self.last_renewal_sent = sent
        self.registrations += 1
        log.info(
            "registered %s at %s (lease %x, ttl %d s)",
            self.key,
            self.record.address,
            lease,
            self.ttl,
        )
        self._first.set()
        return sent

    async def _claim(self, lease: int) -> None:
        """Create the broker's key under ``lease`` if absent (see the module
        docstring for a key another lease holds). Raises BrokerIdConflict,
        ClusterUnavailable."""
        value = encode_broker(self.record)
        waiting_since: float | None = None
        while True:
            ok, _ = await self._etcd.txn([compare_create(self.key, 0)], [put_op(self.key, value, lease=lease)])
            if ok:
                return
            kv = await self._etcd.get(self.key)
            if kv is None:
                continue  # expired meanwhile
            if kv.lease == lease:
                return  # this very claim, whose answer was lost and retried
            try:
                other: BrokerRecord | None = decode_broker(kv.value)
            except ClusterDataInvalid:
                other = None
            if other is None or other.address == self.record.address:
                # this broker's earlier life (it held this address; this process holds
                # the data directory's lock and the port), or an unreadable record
                ok, _ = await self._etcd.txn([compare_create(self.key, kv.create_revision)], [delete_op(self.key)])
                if ok:
                    log.info("removed %s of this broker's previous run (lease %x)", self.key, kv.lease)
                continue
            now = trio.current_time()
            if waiting_since is None:
                waiting_since = now
                log.warning(
                    "broker id %s is registered by a broker at %s (pid %d): waiting up to %d s for its lease to "
                    "expire", self.record.broker_id, other.address, other.pid, self.ttl + 1,
                )  # fmt: skip
            elif now - waiting_since > self.ttl + 1:
                raise BrokerIdConflict(
                    f"broker id {self.record.broker_id} of group {self.record.group} is registered by a live broker "
                    f"at {other.address} (pid {other.pid}): two brokers share one identity (a copied data "
                    "directory?). Start this broker with a data directory of its own; this one refuses to start "
                    "so that no acknowledged write is lost"
                )
            await trio.sleep(_CONFLICT_POLL)

    def _unreachable(self, exc: ClusterUnavailable) -> None:
        now = trio.current_time()
        if self._outage_since is None:
            self._outage_since = self._reminded = now
            log.warning("etcd unreachable for %s, retrying: %s", self.key, exc)
        elif now - self._reminded >= _OUTAGE_REMINDER:
            self._reminded = now
            log.warning(
                "etcd still unreachable for %s (%.0f s): %s",
                self.key,
                now - self._outage_since,
                exc,
            )

    def _reachable(self) -> None:
        if self._outage_since is not None:
            log.info(
                "etcd reachable again for %s after %.1f s",
                self.key,
                trio.current_time() - self._outage_since,
            )
            self._outage_since = None
