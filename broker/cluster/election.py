"""The leader election of one broker group (docs/cluster.md, "Election and fencing").

:class:`GroupElection` watches the group's two records in etcd,
``/equeue/leaders/<g>`` (under the leader's membership lease) and ``/equeue/isr/<g>``
(persistent), keeps them as one :class:`Leadership` state, and campaigns: when the
group has no leader key, this broker is an ISR member (or the group has no ISR record
yet: it bootstraps the group) and ``eligible()`` (its store is consistent), it runs
the **takeover transaction**

    if   leader key absent  and  ISR record's mod_revision == the one seen (0: absent)
    then put leader key {epoch + 1, me} under my lease,
         put ISR record {epoch + 1, leader: me, members: old members - old leader + me}

so exactly one contender wins, and only an ISR member can (no unclean election). The
campaign reacts to the watch's delete event at once (no polling): a leader's death
costs its lease expiry plus one transaction.

**Fencing.** The leader's lease is renewed by :class:`~equeue.broker.cluster.membership.Membership`;
:meth:`GroupElection.fenced` is true once no renewal sent in the last ``ttl * 2/3``
seconds succeeded (on the membership's clock, CLOCK_BOOTTIME: suspended time counts)
and another broker might take over after the lease expires: a member of the ISR etcd
last showed, or of an ISR write whose outcome is not known (etcd may have applied it
and lost the answer; a member being added is one of these while its write is under
way). The lease cannot have expired before ``last_renewal_sent + ttl``, so a fenced
leader stops serving before anyone else can lead. A leader alone in its ISR, with no
write pending or unsettled, is never fenced: no one else may take over.

Leadership ends with the lease: a crash lets it expire, a clean stop revokes it (the
membership does, after this object's exit), and the followers see the delete at once.

**etcd that lost its data, or was restored from a backup.** A replica whose store has
seen an epoch newer than etcd's ISR record (``floor_epoch()`` above the record's
epoch), or that finds no ISR record while its store has led or followed an epoch
(``floor_epoch() > 0``), does not campaign: etcd forgot who was in sync, and a stale
replica winning could reuse an epoch number the old leader used (its divergent
entries would then pass the truncation checks) or lose acknowledged writes. It logs
why (ERROR, rate-limited) and waits for the operator's ``equeue cluster recover``,
which writes an ISR record at an epoch no live replica has passed (:meth:`recover`).

A restored backup is told by the revision: a reload reads etcd at a revision below
one this broker already saw (or, at start, below ``seen_revision``, the highest the
broker followed before). The group's records then may be older than the group: a
replica whose store is no further than the record could otherwise win and reuse an
epoch a later leader used. So the broker marks the restored ISR record ``restored``
(compare-and-swap: one mark, seen by every replica, those restarted later too), the
leader key from the backup is deleted (its leadership is the backup's, not this
run's: its holder, frozen across the failover, may still renew the lease it was
under), and no replica takes over from a marked record until the operator's
recovery writes a new one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack

import attrs
import trio

from equeue.broker.cluster.etcd import (
    EtcdClient,
    EtcdError,
    KeyValue,
    WatchEvent,
    compare_create,
    compare_mod,
    delete_op,
    put_op,
)
from equeue.broker.cluster.membership import Membership
from equeue.client.lifetime import StackOwner, enter_cancelled_nursery
from equeue.errors import ClusterDataInvalid, ClusterUnavailable
from equeue.logs import RateLimitedLog
from equeue.placement import (
    IsrRecord,
    LeaderRecord,
    decode_isr,
    decode_leader,
    encode_isr,
    encode_leader,
    isr_key,
    leader_key,
)

__all__ = ["GroupElection", "Leadership"]

log = logging.getLogger("equeue.cluster.election")

#: back-off between reloads while etcd is unreachable (seconds)
_RETRY_MIN, _RETRY_MAX = 0.1, 2.0
#: pause before campaigning again after a takeover whose outcome is unknown
_UNKNOWN_PAUSE = 0.2


@attrs.frozen
class Leadership:
    """One broker group's leadership as etcd has it."""

    #: the leader's broker id; None: the group has no leader now
    leader_id: str | None = None
    leader_address: str | None = None
    #: the leader record's epoch (or the ISR record's when there is no leader)
    epoch: int = 0
    #: ISR members, leader included (() while the group has no ISR record)
    isr: tuple[str, ...] = ()
    #: mod_revision of the ISR record (0: none)
    isr_revision: int = 0


@attrs.frozen
class _Leader:
    record: LeaderRecord
    create_revision: int
    lease: int


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupElection(StackOwner):
    """``async with GroupElection(etcd, group=g, broker_id=b, address=a, membership=m,
    ttl=5, eligible=f) as e:`` watch, campaign, fence (see the module docstring).

    ``eligible()`` says whether this broker may lead now (its store is consistent);
    call :meth:`nudge` when it turns true. ``floor_epoch()`` (default 0) is the
    highest epoch this broker's store has seen: a takeover's epoch is above it too,
    so an etcd that lost its records never makes a leader reuse an epoch.
    ``led_epoch()`` (default: ``floor_epoch()``) is the last epoch the store got from
    a leader: above 0, the store has been part of the group, and a missing or older
    ISR record is not elected from (see the module docstring). ``changed``
    is set (then replaced) at every change of ``state`` and every flip of
    :meth:`fenced`. Nothing here raises on etcd trouble but :meth:`set_isr`
    (ClusterUnavailable): the watch reloads and the campaign retries.
    """

    def __init__(
        self,
        etcd: EtcdClient,
        *,
        group: str,
        broker_id: str,
        address: str,
        membership: Membership,
        ttl: int,
        eligible: Callable[[], bool],
        floor_epoch: Callable[[], int] = lambda: 0,
        led_epoch: Callable[[], int] | None = None,
        seen_revision: int = 0,
    ) -> None:
        self._etcd = etcd
        self.group = group
        self.broker_id = broker_id
        self.address = address
        self._membership = membership
        self._ttl = ttl
        self._eligible = eligible
        self._floor_epoch = floor_epoch
        self._led_epoch = floor_epoch if led_epoch is None else led_epoch
        self._leader_key = leader_key(group)
        self._isr_key = isr_key(group)
        # one watch covers both keys, so the two puts of a takeover arrive in one
        # batch: the range from the ISR key to just past the leader key ("/equeue/isr/"
        # sorts before "/equeue/leaders/"); other groups' records in it are skipped
        assert self._isr_key < self._leader_key
        self._range = (self._isr_key, self._leader_key + "\0")
        self.state = Leadership()
        self.changed = trio.Event()
        #: set after the first read of the group's records
        self.loaded = trio.Event()
        #: takeover transactions this broker tried, and those it won
        self.campaigns = 0
        self.takeovers = 0
        #: times this broker was fenced (no lease renewal within ttl * 2/3)
        self.fences = 0
        self._leader: _Leader | None = None
        self._isr: IsrRecord | None = None
        self._isr_revision = 0
        # the etcd revision up to which each key's state is known (older events skipped)
        self._known = {self._leader_key: 0, self._isr_key: 0}
        #: the highest etcd revision seen (a reload below it: etcd went back)
        self._seen_revision = seen_revision
        #: the revision of the read that found etcd gone back, until the records
        #: read then are marked (:meth:`_mark_restored`)
        self._restored_at = 0
        self._present = {self._leader_key: False, self._isr_key: False}
        self._wake = trio.Event()  # the campaign re-checks
        self._recheck = trio.Event()  # the fence watcher re-checks
        self._vacant_since: float | None = None  # trio time the leader key was seen gone
        self._was_fenced = False
        #: other brokers named by an ISR write whose outcome is not known yet (under
        #: way, or etcd did not answer): they may be ISR members in etcd, so they
        #: count for fencing until a later answer settles the record
        self._unsettled: frozenset[str] = frozenset()
        self._stale_tried = 0  # create_revision of the stale leader key last deleted
        self._bad = RateLimitedLog(log, 30.0, trio.current_time)
        self._outage_since: float | None = None
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        """Watch and campaign until exit. Leadership itself ends with the membership
        lease (revoked on a clean stop right after), so exit makes no etcd call."""
        self._nursery = await enter_cancelled_nursery(stack)
        self._nursery.start_soon(self._watch, name=f"election watch {self.group}")
        self._nursery.start_soon(self._campaign, name=f"election campaign {self.group}")
        self._nursery.start_soon(self._follow_lease, name=f"election lease {self.group}")
        self._nursery.start_soon(self._fence_watch, name=f"election fence {self.group}")

    # ------------------------------------------------------------------ reading
    def is_leader(self) -> bool:
        """This broker holds the group's leader key, under its current lease, at
        ``state.epoch``."""
        lead = self._leader
        return (
            lead is not None
            and lead.record.broker_id == self.broker_id
            and lead.lease != 0
            and lead.lease == self._membership.lease
            and lead.record.epoch == self.state.epoch
        )

    def replaceable(self) -> bool:
        """Another broker might take over once this leader's lease expires: the ISR
        etcd last showed has another member, or an ISR write naming one has an
        unknown outcome (see the module docstring)."""
        return len(self.state.isr) > 1 or bool(self._unsettled)

    def fenced(self) -> bool:
        """Leading, replaceable, and no lease renewal sent in the last ``ttl * 2/3``
        s succeeded: stop serving (see the module docstring)."""
        m = self._membership
        return self.is_leader() and self.replaceable() and m.clock() - m.last_renewal_sent > self._ttl * 2 / 3

    def cut_off(self) -> bool:
        """No lease renewal sent in the last ``ttl * 2/3`` s succeeded (leader or not):
        this broker may not hear from etcd, so what its view says (the route tables it
        would answer) may be stale."""
        m = self._membership
        return m.clock() - m.last_renewal_sent > self._ttl * 2 / 3

    def serving(self) -> bool:
        """Leading and not fenced: this broker may answer clients now."""
        return self.is_leader() and not self.fenced()

    async def wait_settled(self) -> None:
        """Return once the records were read and the group has a leader or this
        broker cannot campaign now (not eligible, not an ISR member, unregistered):
        a group's first broker leads when its start returns. Bound it with a cancel
        scope (etcd may not answer)."""
        await self.loaded.wait()
        while self.state.leader_id is None and self._may_campaign():
            await self.changed.wait()

    def nudge(self) -> None:
        """Re-check the campaign now (``eligible()`` may have turned true)."""
        self._wake.set()

    async def hand_over(self, to: str) -> bool:
        """Give the leadership to the ISR member ``to``: in one transaction, delete
        this broker's leader key (by its create revision) and mark the ISR record's
        ``handover`` with ``to``, which the other members leave the first try for one
        TTL. The caller made sure ``to`` has every entry (writes stopped, ``to`` at the
        end). True: done (this broker no longer leads); False: not the leader, or the
        records changed. Raises ValueError (``to`` not another ISR member),
        ClusterUnavailable."""
        lead, isr = self._leader, self._isr
        if lead is None or isr is None or not self.is_leader():
            return False
        if to == self.broker_id or to not in isr.members:
            raise ValueError(f"{to} is not another in-sync replica of group {self.group}: {isr.members}")
        record = IsrRecord(isr.group, isr.epoch, isr.leader, isr.members, to)
        ok, _ = await self._etcd.txn(
            [compare_create(self._leader_key, lead.create_revision), compare_mod(self._isr_key, self._isr_revision)],
            [delete_op(self._leader_key), put_op(self._isr_key, encode_isr(record))],
        )
        if ok:
            log.info("group %s: handed the leadership of epoch %d over to %s", self.group, lead.record.epoch, to)
            await self._refresh()
        return ok

    async def resign(self) -> bool:
        """Give the leader key back: delete it if it is still this broker's (the same
        key, by its create revision), so another ISR member takes over at a new epoch.
        For a leader that cannot serve (its store is not consistent at the takeover):
        while ``eligible()`` is false it does not campaign again. True: resigned;
        False: not the leader (any more). Raises ClusterUnavailable (retry)."""
        lead = self._leader
        if lead is None or not self.is_leader():
            return False
        ok, _ = await self._etcd.txn(
            [compare_create(self._leader_key, lead.create_revision)], [delete_op(self._leader_key)]
        )
        if ok:
            log.warning("group %s: resigned the leadership of epoch %d", self.group, lead.record.epoch)
            await self._refresh()  # no longer the leader from now on, not from the watch's next event
        return ok

    # ------------------------------------------------------------------ ISR changes
    async def set_isr(self, members: Sequence[str]) -> bool:
        """Write the ISR record ``members`` (the leader included) at ``state.epoch``,
        comparing the record's mod_revision and that this broker still holds the
        leader key. True: written (``state`` updated). False: this broker is not the
        leader any more or the record changed (``state`` refreshed from etcd).
        Raises ClusterUnavailable when etcd does not answer (retry), ValueError when
        ``members`` lacks this broker."""
        members = tuple(members)
        if self.broker_id not in members:
            raise ValueError(f"the ISR must hold its leader {self.broker_id}: {members}")
        lead = self._leader
        if lead is None or not self.is_leader():
            return False
        record = IsrRecord(self.group, lead.record.epoch, self.broker_id, members)
        compare = [
            compare_create(self._leader_key, lead.create_revision),
            compare_mod(self._isr_key, self._isr_revision),
        ]
        # until etcd's answer is known, the members may be in the record: they count
        # for fencing (and stay counted if the answer never comes)
        self._unsettled = self._unsettled | (frozenset(members) - {self.broker_id})
        self._recheck.set()  # the fence watcher's deadline may start now
        ok, revision = await self._etcd.txn(compare, [put_op(self._isr_key, encode_isr(record))])
        if ok:
            self._unsettled = frozenset()
            self._take_isr(record, revision, revision)
            self._publish()
            log.info("group %s: ISR at epoch %d is now %s", self.group, record.epoch, ", ".join(members))
            return True
        await self._refresh()
        self._unsettled = frozenset()  # the record as etcd has it now is known
        # an earlier try whose outcome was unknown may have written this very record
        return self.is_leader() and self._isr == record

    async def _refresh(self) -> None:
        """Read both records now (not waiting for the watch) and take what is newer."""
        kvs, revision = await self._etcd.get_range(*self._range)
        self._take_read(kvs, revision, reset=False)
        self._publish()

    # ------------------------------------------------------------------ the watch
    async def _watch(self) -> None:
        retry = _RETRY_MIN
        while True:
            try:
                kvs, revision = await self._etcd.get_range(*self._range)
                seen = max(self._seen_revision, *self._known.values())
                if revision < seen:  # etcd went back: restored from a backup, or wiped
                    self._restored_at = revision
                    log.error(
                        "group %s: etcd went back from revision %d to %d (wiped, or restored from a backup): "
                        "its records of the group may be older than the group; no replica takes over from them "
                        "until an operator recovers it: equeue cluster recover --group %s",
                        self.group, seen, revision, self.group,
                    )  # fmt: skip
                self._seen_revision = revision
                self._take_read(kvs, revision, reset=True)
                self._publish()
                if self._restored_at:
                    await self._mark_restored()
                self.loaded.set()
                if self._outage_since is not None:
                    log.info(
                        "group %s: election watch back after %.1f s",
                        self.group, trio.current_time() - self._outage_since,
                    )  # fmt: skip
                    self._outage_since = None
                retry = _RETRY_MIN
                async with self._etcd.watch_range(*self._range, revision + 1) as stream:
                    async for batch in stream:
                        self._take_events(batch)
                        self._publish()
            except ClusterUnavailable as exc:  # a broken stream and WatchCompacted too
                if self._outage_since is None:
                    self._outage_since = trio.current_time()
                    log.warning("group %s: election watch lost, reloading: %s", self.group, exc)
                await trio.sleep(retry)
                retry = min(retry * 2, _RETRY_MAX)

    async def _mark_restored(self) -> None:
        """etcd went back to an older state (module docstring): mark the ISR record
        read then ``restored``, and delete the leader key read then.
        Both compare what was read, so nothing written since is touched. Raises
        ClusterUnavailable (the watch reloads and this runs again)."""
        at = self._restored_at
        isr = self._isr
        if isr is not None and not isr.restored and self._isr_revision <= at:
            marked = attrs.evolve(isr, restored=True)
            ok, revision = await self._etcd.txn(
                [compare_mod(self._isr_key, self._isr_revision)], [put_op(self._isr_key, encode_isr(marked))]
            )
            if ok:
                self._take_isr(marked, revision, revision)
                log.warning("group %s: marked etcd's record of the group (epoch %d) as restored", self.group, isr.epoch)
        lead = self._leader
        if lead is not None and lead.create_revision <= at:
            # the backup's leader key: its holder may still renew the lease it was
            # under (a broker frozen across the failover and the restore) and would
            # lead at the backup's epoch again
            ok, _ = await self._etcd.txn([compare_create(self._leader_key, lead.create_revision)],
                                         [delete_op(self._leader_key)])  # fmt: skip
            if ok:
                log.warning("group %s: deleted the leader key (%s, epoch %d) that came back with etcd's older state",
                            self.group, lead.record.broker_id, lead.record.epoch)  # fmt: skip
        self._restored_at = 0
        self._publish()

    def _take_read(self, kvs: list[KeyValue], revision: int, *, reset: bool) -> None:
        """Take a range read at ``revision``: each of the two keys is as read (absent
        when not in ``kvs``). ``reset``: unconditionally (the watch's reload: etcd
        may have lost its data, its revisions gone back); else only keys known at an
        older revision."""
        found = {kv.key: kv for kv in kvs}
        for key in (self._leader_key, self._isr_key):
            if not reset and revision <= self._known[key]:
                continue
            kv = found.get(key)
            if kv is None:
                self._take_delete(key, revision)
            else:
                self._take_put(kv, revision)

    def _take_events(self, batch: list[WatchEvent]) -> None:
        for event in batch:
            key = event.kv.key
            if key not in self._known or event.revision <= self._known[key]:
                continue  # another group's record, or older than what is known
            if event.kind == "delete":
                self._take_delete(key, event.revision)
            else:
                self._take_put(event.kv, event.revision)

    def _take_put(self, kv: KeyValue, revision: int) -> None:
        self._known[kv.key] = revision
        self._present[kv.key] = True
        try:
            if kv.key == self._leader_key:
                self._leader = _Leader(decode_leader(kv.value), kv.create_revision, kv.lease)
            else:
                self._take_isr(decode_isr(kv.value), kv.mod_revision, revision)
        except ClusterDataInvalid as exc:
            # present but unreadable: nobody can take over (the compare needs it
            # absent, or the ISR's members), until an operator repairs it
            if kv.key == self._leader_key:
                self._leader = None
            else:
                self._isr, self._isr_revision = None, kv.mod_revision
            self._bad.log(logging.ERROR, kv.key, "group %s: %s does not decode: %s", self.group, kv.key, exc)

    def _take_delete(self, key: str, revision: int) -> None:
        self._known[key] = revision
        self._present[key] = False
        if key == self._leader_key:
            self._leader = None
        else:
            self._isr, self._isr_revision = None, 0

    def _take_isr(self, record: IsrRecord, mod_revision: int, known: int) -> None:
        self._isr, self._isr_revision = record, mod_revision
        self._known[self._isr_key] = max(self._known[self._isr_key], known)
        self._present[self._isr_key] = True

    def _publish(self) -> None:
        """Rebuild ``state`` from the records; on a change, set ``changed`` and wake
        the campaign and the fence watcher."""
        lead, isr = self._leader, self._isr
        state = Leadership(
            leader_id=lead.record.broker_id if lead else None,
            leader_address=lead.record.address if lead else None,
            epoch=lead.record.epoch if lead else (isr.epoch if isr else 0),
            isr=isr.members if isr else (),
            isr_revision=self._isr_revision,
        )
        if state == self.state:
            return
        old, self.state = self.state, state
        if old.leader_id is not None and state.leader_id is None:
            self._vacant_since = trio.current_time()
        if old.leader_id != state.leader_id or old.epoch != state.epoch:
            log.info(
                "group %s: leader %s at epoch %d (ISR %s)",
                self.group, state.leader_id or "none", state.epoch, ", ".join(state.isr) or "none",
            )  # fmt: skip
        self._fire()

    def _fire(self) -> None:
        self.changed.set()
        self.changed = trio.Event()
        self._wake.set()
        self._recheck.set()

    # ------------------------------------------------------------------ campaigning
    def _may_campaign(self) -> bool:
        if not self.loaded.is_set() or self._present[self._leader_key]:
            return False
        if self._present[self._isr_key] and (self._isr is None or self.broker_id not in self._isr.members):
            return False  # an ISR member must take over (or the record is unreadable)
        if not (self._membership.registered and self._eligible()):
            return False
        if self._handover_wait() > 0:
            return False  # the leader handed the group over to another member: its turn first
        return self.stale_record() is None

    def _handover_wait(self) -> float:
        """Seconds this broker leaves the member the leader handed over to to take
        over first (0: none, or this broker is that member, or it had its TTL)."""
        isr = self._isr
        if isr is None or not isr.handover or isr.handover == self.broker_id or self._vacant_since is None:
            return 0.0
        return max(0.0, self._vacant_since + self._ttl - trio.current_time())

    def stale_record(self) -> str | None:
        """Why etcd's record of the group cannot be trusted to elect from (see the
        module docstring), or None. Logged (ERROR, rate-limited) when not None."""
        floor = self._led_epoch()
        isr = self._isr
        if isr is None and not self._present[self._isr_key] and floor > 0:
            why = (f"etcd has no record of group {self.group} but this replica's store has epoch {floor}: etcd "
                   "lost its data")  # fmt: skip
        elif isr is not None and floor > isr.epoch:
            why = (f"etcd's record of group {self.group} is at epoch {isr.epoch} but this replica's store has "
                   f"epoch {floor}: etcd was restored from an older state")  # fmt: skip
        elif isr is not None and isr.restored:
            why = (f"etcd's record of group {self.group} (epoch {isr.epoch}) came back with etcd's older state "
                   "(restored from a backup): the group may have moved on since")  # fmt: skip
        else:
            return None
        self._bad.log(logging.ERROR, "stale", "group %s: not taking over: %s. Recover with: equeue cluster "
                      "recover --group %s", self.group, why, self.group)  # fmt: skip
        return why

    async def recover(self, epoch: int, members: Sequence[str]) -> bool:
        """The operator's recovery after etcd lost the group's records (``equeue
        cluster recover``): write the ISR record ``{epoch, members}`` when etcd has
        none, one at an older epoch, or one marked ``restored`` at ``epoch`` or older,
        and no leader key. ``epoch`` must be at least
        every live replica's (the caller asked them), so the next takeover's epoch
        (``epoch + 1``) was never used. True: written; False: not written (etcd has
        a leader or an unmarked record at ``epoch`` or later, ``epoch`` is below this replica's
        last epoch, or the records changed meanwhile). Raises ClusterUnavailable."""
        if not members:
            raise ValueError("an ISR needs a member")
        if epoch < self._floor_epoch():
            return False  # this replica has seen a later epoch: it would be used twice
        await self._refresh()
        if self._present[self._leader_key]:
            return False
        current = self._isr
        if current is not None and (current.epoch > epoch or (current.epoch == epoch and not current.restored)):
            return False
        record = IsrRecord(self.group, epoch, members[0], tuple(members))
        ok, _ = await self._etcd.txn(
            [compare_create(self._leader_key, 0), compare_mod(self._isr_key, self._isr_revision)],
            [put_op(self._isr_key, encode_isr(record))],
        )
        if ok:
            log.warning("group %s: recovered by an operator: ISR %s at epoch %d", self.group,
                        ", ".join(members), epoch)  # fmt: skip
        return ok

    async def _campaign(self) -> None:
        while True:
            self._wake = trio.Event()
            self._drop_stale_self()
            if self._may_campaign():
                try:
                    won = await self._takeover()
                except EtcdError as exc:  # refused: e.g. the lease just expired
                    self._bad.log(logging.WARNING, "takeover", "group %s: takeover refused by etcd: %s", self.group, exc)
                    won = False
                except ClusterUnavailable as exc:
                    # the outcome may be unknown: the watch says who won; try again soon
                    self._bad.log(
                        logging.WARNING, "takeover", "group %s: takeover failed (retrying): %s", self.group, exc
                    )
                    with trio.move_on_after(_UNKNOWN_PAUSE):
                        await self._wake.wait()
                    continue
                if won:
                    continue
            wait = self._handover_wait()  # past it, campaign even if that member never did
            with trio.move_on_after(wait if wait > 0 else float("inf")):
                await self._wake.wait()

    def _drop_stale_self(self) -> None:
        """A leader key of this broker's id under another lease is a previous life's
        (this process holds the data dir lock, so that process is dead): delete it
        rather than wait for its lease to expire (a restart after a crash)."""
        lead = self._leader
        lease = self._membership.lease
        if (
            lead is not None
            and lead.record.broker_id == self.broker_id
            and lease
            and lead.lease != lease
            and self._membership.registered
            and self._nursery is not None
            and lead.create_revision != self._stale_tried
        ):
            self._stale_tried = lead.create_revision
            self._nursery.start_soon(self._delete_stale, lead.create_revision)

    async def _delete_stale(self, create_revision: int) -> None:
        try:
            ok, _ = await self._etcd.txn(
                [compare_create(self._leader_key, create_revision)],
                [delete_op(self._leader_key)],
            )
        except ClusterUnavailable as exc:
            log.warning("group %s: could not remove this broker's stale leader key: %s", self.group, exc)
            return
        if ok:
            log.info("group %s: removed this broker's leader key of a previous run", self.group)

    async def _takeover(self) -> bool:
        """The takeover transaction (see the module docstring). True when won."""
        isr = self._isr
        lease = self._membership.lease
        base = max(isr.epoch if isr else 0, self.state.epoch, self._floor_epoch())
        epoch = base + 1
        others = tuple(m for m in isr.members if m not in (isr.leader, self.broker_id)) if isr else ()
        members = (self.broker_id, *others)
        leader = LeaderRecord(self.group, self.broker_id, self.address, epoch, _wall_ms())
        record = IsrRecord(self.group, epoch, self.broker_id, members)
        started = trio.current_time()
        self.campaigns += 1
        ok, revision = await self._etcd.txn(
            [compare_create(self._leader_key, 0), compare_mod(self._isr_key, self._isr_revision)],
            [put_op(self._leader_key, encode_leader(leader), lease=lease), put_op(self._isr_key, encode_isr(record))],
        )
        if not ok:
            return False  # another contender won, or the state moved: the watch tells
        self.takeovers += 1
        self._unsettled = frozenset()  # a new epoch: its record is the one just written
        vacant_since, self._vacant_since = self._vacant_since, None
        if revision > self._known[self._leader_key]:
            self._leader = _Leader(leader, revision, lease)
            self._known[self._leader_key] = revision
            self._present[self._leader_key] = True
            self._take_isr(record, revision, revision)
        self._publish()
        now = trio.current_time()
        vacant = f", {now - vacant_since:.3f} s after the leader key went" if vacant_since is not None else ""
        log.info(
            "group %s: took over as leader at epoch %d (ISR %s) in %.3f s%s",
            self.group, epoch, ", ".join(members), now - started, vacant,
        )  # fmt: skip
        return True

    # ------------------------------------------------------------------ the lease
    async def _follow_lease(self) -> None:
        """Wake the campaign and the fence watcher at every grant or renewal (a new
        lease may make this broker eligible; a renewal lifts a fence)."""
        while True:
            await self._membership.wait_renewal()
            self._wake.set()
            self._recheck.set()

    async def _fence_watch(self) -> None:
        """Set ``changed`` when :meth:`fenced` flips, at the moment it does."""
        while True:
            self._recheck = trio.Event()
            fenced = self.fenced()
            if fenced != self._was_fenced:
                self._was_fenced = fenced
                if fenced:
                    self.fences += 1
                    log.warning(
                        "group %s: fenced: no lease renewal for %.1f s (stops serving until one succeeds)",
                        self.group, self._membership.clock() - self._membership.last_renewal_sent,
                    )  # fmt: skip
                else:
                    log.info("group %s: fence lifted", self.group)
                self._fire()
            wait = float("inf")
            if not fenced and self.is_leader() and self.replaceable():
                m = self._membership
                wait = max(0.0, m.last_renewal_sent + self._ttl * 2 / 3 + 0.001 - m.clock())
            with trio.move_on_after(wait):
                await self._recheck.wait()
