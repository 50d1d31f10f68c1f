"""A broker's registration in etcd under a lease, kept alive for the broker's life.

``/equeue/brokers/<group>/<broker_id>`` exists exactly while the broker is alive:
it is written under a lease of ``ttl`` seconds renewed every ``ttl/3``; a crashed
broker's key vanishes when the lease expires, a stopping broker revokes the lease
so the key vanishes at once (clean step-down). The group's own record
(``/equeue/groups/<group>``) is created by the first broker of the group and stays.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any

import trio

from broker.cluster.etcd import EtcdClient
from equeue.errors import ClusterUnavailable, ConfigError
from equeue.placement import (
    BrokerRecord,
    GroupRecord,
    broker_key,
    encode_broker,
    encode_group,
    group_key,
)

__all__ = ["Membership"]

log = logging.getLogger("equeue.cluster.membership")

#: seconds between reminders that etcd is still unreachable
_OUTAGE_REMINDER = 30.0


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Membership:
    """``async with Membership(etcd, record, ttl=5) as m: await m.wait_registered()``.

    Entering starts a task (in the object's own nursery) that registers the broker
    and keeps its lease alive; it does not wait for etcd: :meth:`wait_registered`
    does, ``registered`` says whether the key is surely there now. When etcd is
    unreachable the task keeps retrying (one warning per outage, a reminder every
    30 s, an info line when it is back). When a keepalive says the lease is gone
    (TTL 0: revoked, or etcd lost it) it grants a new lease and registers again.
    Leaving revokes the lease (bounded by the client's retries: if etcd is
    unreachable, the key expires after ``ttl`` seconds instead). Raises ConfigError
    for a ttl under 2 s; nothing else: etcd errors are logged and retried.
    """

    def __init__(self, etcd: EtcdClient, record: BrokerRecord, ttl: int = 5) -> None:
        if ttl < 2:
            raise ConfigError(f"lease ttl must be >= 2 s (etcd's minimum), not {ttl}")
        self._etcd = etcd
        self.record = record
        self.ttl = ttl
        self.key = broker_key(record.group, record.broker_id)
        #: the current lease id (0 = none)
        self.lease = 0
        #: how many times the broker registered (1 + re-registrations after a lost lease)
        self.registrations = 0
        #: trio time at which the last keepalive that succeeded was *sent* (at first:
        #: when the lease was granted). The lease cannot expire before this + ttl, so
        #: a leader fences itself by it (docs/cluster.md, "Election and fencing")
        self.last_renewal_sent = -float("inf")
        self._renewed = trio.Event()  # set and replaced at each successful renewal
        self._first = trio.Event()
        self._last_ok = -float("inf")  # trio time of the last answer that kept us registered
        self._outage_since: float | None = None
        self._reminded = 0.0
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None  # trio's nursery manager, opened on entry

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

    async def __aenter__(self) -> Membership:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._run, name=f"membership {self.key}")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            return await self._nursery_cm.__aexit__(et, ev, tb)
        finally:
            await self._step_down()

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
        # renewals are spaced from when the last one was SENT (not answered), so a slow
        # etcd does not stretch the gap that fencing measures
        interval = self.ttl / 3
        retry = min(0.5, interval)
        while True:
            sent = trio.current_time()
            try:
                if not self.lease:
                    sent = await self._register()
                elif await self._etcd.keepalive(self.lease) <= 0:
                    log.warning("lease of %s expired in etcd: registering again", self.key)
                    self.lease = 0
                    continue
                self._last_ok = trio.current_time()
                self.last_renewal_sent = sent
                self._renewed.set()
                self._renewed = trio.Event()
                self._reachable()
            except ClusterUnavailable as exc:
                self._unreachable(exc)
                await trio.sleep(retry)
                continue
            await trio.sleep_until(sent + interval)

    async def _register(self) -> float:
        """Grant a lease and put the broker's key under it; returns the trio time
        the grant was sent (the lease's life counts from about then)."""
        group = self.record.group
        await self._etcd.create(group_key(group), encode_group(GroupRecord(group, _wall_ms())))
        sent = trio.current_time()
        lease = await self._etcd.grant(self.ttl)
        await self._etcd.put(
            self.key, encode_broker(self.record), lease=lease
        )  # a failure: the lease expires
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
