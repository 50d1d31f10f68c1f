"""The replica's role state machine (docs/cluster.md, "Replicas, acks, failover"): leader or follower,
driven by the group's election (``election.state`` / ``election.changed``).

:class:`ReplicaRole` is owned by the :class:`~equeue.broker.server.Broker` of a cluster,
``async with`` around the time it serves, inside the cluster node's lifetime.

* **Becoming leader** (this broker holds the leader key at ``state.epoch`` and is not
  fenced): stop following; rebuild the store's views from LMDB
  (``Appender.call(store.replication.reload)``); write the epoch marker
  (``Appender.call(store.replication.begin_epoch)``, unless this epoch's marker is already there:
  a leader that was fenced and recovered); build the :class:`LeaderLog`; start the
  leader duties in a leader-scoped nursery (the log's ISR checks and trimming,
  ``Lifecycle.run``: delayed moves, retention, producer expiry, and the cluster
  node's materializer, started with ``nursery.start``: its first pass is done
  before the leader is ready); serve. Client requests wait until the high
  watermark reached the end this replica had when it took over
  (:attr:`ReplicaRole.reads_held`): the promotion's reload published its whole
  store, which may hold entries the other members lack. A broker that leads when
  it starts (a new group's first broker) enters the role only once ready.
* **Losing leadership or fenced**: stop serving at once: every data request is
  NOT_LEADER (:meth:`check_serving`), held acks are answered NOT_LEADER, parked pulls
  are answered NOT_LEADER, consumer leases are dropped; the leader duties are
  cancelled; then follow the new leader (a fenced leader that still holds its key
  waits: it serves again once its lease renews, without a new marker).
* **Following**: ``follow(address, epoch)`` (:class:`equeue.broker.replication.follower.Follower`)
  until it returns (the peer no longer leads that epoch) or the state changes; while
  following, the election is nudged when the store becomes eligible
  (:func:`eligible`: it reached ``consistent_at``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from contextlib import AsyncExitStack
from typing import Any, Protocol, TypeVar

import trio

from equeue import control
from equeue.broker.replication.leader import (
    TRIM_INTERVAL,
    Answers,
    LeaderElection,
    LeaderLog,
    LeaderReplication,
    LeaderState,
    LogTrimmer,
)
from equeue.broker.storage import WriteOutcome
from equeue.client.lifetime import StackOwner, enter_cancelled_nursery
from equeue.config import BrokerConfig
from equeue.errors import (
    BadRequest,
    BrokerBusy,
    BrokerShuttingDown,
    EQueueError,
    NotLeader,
    StaleEpoch,
)
from equeue.logs import RateLimitedLog

__all__ = ["ReplicaRole", "eligible"]

log = logging.getLogger("equeue.replication")
_follow_logs = RateLimitedLog(log, 10.0, time.monotonic)

T = TypeVar("T")

#: pause before following again after a failed follow (seconds)
FOLLOW_RETRY = 0.5
#: the longest a hand-over waits for its target to catch up (writes are refused meanwhile)
HANDOVER_TIMEOUT = 5.0
#: how often a follower checks whether it became eligible to lead (seconds)
ELIGIBLE_CHECK = 0.5
#: the longest a leader's start waits for its first leader duties (seconds)
START_TIMEOUT = 10.0


class RoleReplication(LeaderReplication, Protocol):
    """What the role uses of a replicated store's log
    (:class:`equeue.broker.storage.replicated.StoreReplication`)."""

    @property
    def epoch(self) -> int: ...
    @property
    def last_epoch(self) -> int: ...
    @property
    def consistent_at(self) -> int: ...
    def reload(self) -> None: ...
    def begin_epoch(self, epoch: int) -> int: ...


class RoleStore(Protocol):
    """What the role uses of :class:`equeue.broker.storage.Store` (replicated)."""

    @property
    def next_global(self) -> int: ...
    @property
    def replication(self) -> RoleReplication | None: ...


class RoleState(LeaderState, Protocol):
    @property
    def leader_id(self) -> str | None: ...
    @property
    def leader_address(self) -> str | None: ...


class RoleElection(LeaderElection, Protocol):
    """What the role uses of :class:`equeue.broker.cluster.election.GroupElection`."""

    @property
    def state(self) -> RoleState: ...
    @property
    def changed(self) -> trio.Event: ...
    def is_leader(self) -> bool: ...
    def fenced(self) -> bool: ...
    def nudge(self) -> None: ...
    async def resign(self) -> bool: ...
    async def hand_over(self, to: str) -> bool: ...


class Following(Protocol):
    """What the role uses of :class:`equeue.broker.replication.follower.Follower`."""

    position: int
    high_watermark: int

    async def follow(self, leader_address: str, epoch: int) -> None: ...


class RoleAppender(Answers, Protocol):
    """The appender's side the role uses: its writer thread, held answers, refusal."""

    async def call(self, fn: Callable[[], T]) -> T: ...
    def refuse(self, exc: BaseException | None) -> None: ...


class Parked(Protocol):
    def wake(self, queues: Any) -> None: ...
    def fail_all(self, exc: BaseException) -> None: ...


class Leases(Protocol):
    def drop_all(self) -> None: ...


class Scheduler(Protocol):
    async def run(self) -> None: ...
    def schedule_changed(self) -> None: ...


def eligible(replication: RoleReplication) -> bool:
    """Whether this replica may lead or join the ISR: its store (``replication``,
    ``store.replication``) reached ``consistent_at`` (a store being copied has it
    unreachable)."""
    return replication.position >= replication.consistent_at


class ReplicaRole(StackOwner):
    """Leader or follower of one broker group; see the module docstring. Raises
    ValueError when ``store`` is not replicated (it has no ``replication``)."""

    def __init__(
        self, *, store: RoleStore, appender: RoleAppender, election: RoleElection, follower: Following,
        parked: Parked, leases: Leases, lifecycle: Scheduler, leader_duties: Callable[..., Awaitable[None]],
        config: BrokerConfig, broker_id: str, replicas: Callable[[], Collection[str]] | None = None,
    ) -> None:  # fmt: skip
        if store.replication is None:
            raise ValueError("a replica's store must be replicated (Store(..., replicated=True))")
        self._store = store
        self._repl = store.replication
        self._appender = appender
        self._election = election
        self._follower = follower
        self._parked = parked
        self._leases = leases
        self._lifecycle = lifecycle
        self._leader_duties = leader_duties
        self._config = config
        self.broker_id = broker_id
        #: the broker ids registered in the group now (None: not known, every one counts)
        self._replicas = replicas
        self.group = config.broker_group
        #: the leader's replication state while leading (None: not serving)
        self.leader_log: LeaderLog | None = None
        self._duty: trio.CancelScope | None = None
        self._duty_done: trio.Event | None = None
        #: (leader address, epoch) followed now
        self._following: tuple[str, int] | None = None
        self._nursery: trio.Nursery | None = None
        #: set once leading with the leader duties' first pass done (start-up waits for it)
        self._ready = trio.Event()
        #: leadership taken (epochs led), for tests and statistics
        self.promotions = 0
        #: times it stopped serving as the leader (fenced, or lost its leadership)
        self.step_downs = 0
        #: (epoch, ISR members of a write with an unknown outcome) of the last epoch led
        self._unsettled: tuple[int, set[str]] = (0, set())
        #: the follower's log bound (a replica keeps at most --replica-log-bytes of log)
        self._trimmer = LogTrimmer(self._repl, appender.call, config.replica_log_bytes)
        #: the high watermark this broker reached when it last led (committed: every
        #: later leader has the entries below it)
        self._led_hw = 0

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        self._nursery = await enter_cancelled_nursery(stack)
        # on exit (or a cancelled entry), stop serving before the tasks are cancelled
        stack.callback(self._shutting_down)
        # only a serving leader writes its store through client ops
        self._appender.refuse(NotLeader(self._not_leader_text()))
        self._nursery.start_soon(self._drive, name=f"replica role {self.group}")
        if self._election.is_leader():  # a leader serves once its first duties ran (topics materialized)
            with trio.move_on_after(START_TIMEOUT):
                await self._ready.wait()

    def _shutting_down(self) -> None:
        self._stop_serving(BrokerShuttingDown("the broker is stopping: retry at the group's new leader"))

    # ------------------------------------------------------------------ serving
    def check_serving(self) -> None:
        """Raises NotLeader unless this broker leads its group now and is not fenced."""
        if self.leader_log is None or not self._election.serving():
            raise NotLeader(self._not_leader_text())

    @property
    def reads_held(self) -> bool:
        """Just promoted: client requests wait (:meth:`wait_reads`) until the high
        watermark reaches the end this replica had when it took over (its store,
        published whole, may hold entries the other members lack)."""
        ll = self.leader_log
        return ll is not None and not ll.readable.is_set()

    async def wait_reads(self) -> None:
        """Wait until client reads may see the store (see :attr:`reads_held`); raises
        NotLeader when the leadership ends meanwhile."""
        ll = self.leader_log
        if ll is not None:
            await ll.readable.wait()
        self.check_serving()

    def check_produce(self) -> None:
        """The produce path's check: NotLeader (not serving), NotEnoughReplicas (the
        ISR is below --min-insync with acks all)."""
        ll = self.leader_log
        if ll is None or not self._election.serving():
            raise NotLeader(self._not_leader_text())
        ll.check_produce()

    def _not_leader_text(self) -> str:
        st = self._election.state
        if st.leader_id and st.leader_id != self.broker_id:
            return (
                f"this broker follows group {self.group!r}; its leader is {st.leader_id} at "
                f"{st.leader_address}: refresh routes"
            )
        return f"this broker does not lead group {self.group!r} now (a failover is under way): refresh routes"

    def hold(self, batch: list[Any], committed: WriteOutcome) -> None:
        """``Appender(hold=...)``: hand a committed transaction's ops to the leader
        log; not leading: they are answered NotLeader (the producer retries at the
        leader with the same sequence)."""
        ll = self.leader_log
        if ll is None:
            self._appender.fail(batch, NotLeader(self._not_leader_text()))
            return
        ll.hold(batch, committed)

    # ------------------------------------------------------------------ the state machine
    async def _drive(self) -> None:
        while True:
            changed = self._election.changed
            await self._step()
            await changed.wait()

    async def _step(self) -> None:
        e = self._election
        st = e.state
        if e.is_leader() and not e.fenced():
            if self.leader_log is None or self.leader_log.epoch != st.epoch:
                if self.leader_log is not None:
                    self._stop_serving(NotLeader(self._not_leader_text()))
                await self._lead(st.epoch)
            return
        if self.leader_log is not None:
            self.step_downs += 1
            reason = "fenced (no lease renewal reached etcd)" if e.is_leader() else "lost its leadership"
            log.warning("group %s: this broker %s at epoch %d: it stops serving", self.group, reason,
                        self.leader_log.epoch)  # fmt: skip
            self._stop_serving(NotLeader(self._not_leader_text()))
        if e.is_leader():
            return  # fenced: wait for the lease to renew (or for it to expire)
        target = (st.leader_address, st.epoch) if st.leader_id and st.leader_address else None
        if target is not None and st.leader_id == self.broker_id:
            target = None  # our own stale key: the election deletes it
        if target != self._following:
            await self._end_duty()
            # the client writes queued before the step-down are refused; this call runs
            # after the last one written, so the follower starts from the final position
            await self._appender.call(lambda: None)
            if target is not None:
                self._start_duty(self._follow, *target)
                self._following = target

    async def _lead(self, epoch: int) -> None:
        await self._end_duty()
        repl, call = self._repl, self._appender.call
        await call(repl.reload)
        if not eligible(repl):  # a repair or a copy committed after the campaign began
            log.error("group %s: this broker won epoch %d but its store is not consistent (position %d, "
                      "consistent at %d): it does not serve", self.group, epoch, repl.position,
                      repl.consistent_at)  # fmt: skip
            await self._resign(epoch)
            return
        promoted_at = repl.position
        # every member has what was below the previous leader's high watermark
        high_watermark = min(promoted_at, max(self._follower.high_watermark, self._led_hw))
        if repl.last_epoch < epoch:
            await call(lambda: repl.begin_epoch(epoch))
        e = self._election
        if not (e.is_leader() and not e.fenced() and e.state.epoch == epoch):
            return  # changed meanwhile: the next step decides
        ll = LeaderLog(
            replication=repl, election=e, answers=self._appender, call=call, wake=self._parked.wake,
            on_scheduled=self._lifecycle.schedule_changed, config=self._config, broker_id=self.broker_id,
            group=self.group, epoch=epoch, high_watermark=high_watermark, promoted_at=promoted_at,
            unsettled=self._unsettled_at(epoch), replicas=self._replicas,
        )  # fmt: skip
        self.leader_log = ll
        self._appender.refuse(None)
        self.promotions += 1
        ll.committed()  # the marker: fetches wake, a lone leader publishes it
        log.info("group %s: this broker leads at epoch %d (log %d..%d, high watermark %d)", self.group, epoch,
                 repl.log_start, repl.position, ll.high_watermark)  # fmt: skip
        self._start_duty(self._leading, ll)

    async def hand_over(self, to: str = "", timeout: float = HANDOVER_TIMEOUT) -> str:
        """Hand the group's leadership to the in-sync follower ``to`` (default: the
        one furthest ahead), as Kafka's preferred-leader election: stop taking client
        writes (answered NOT_LEADER, so producers retry at the new leader with the
        same sequence), wait until ``to`` has every entry, then give the leader key up
        marking ``to`` as the one to take over (:meth:`GroupElection.hand_over`); this
        broker then follows it. Returns ``to``. On failure it serves again and raises
        NotLeader (not leading), BadRequest (``to`` is not an in-sync follower, or
        there is none), BrokerBusy (``to`` did not catch up within
        ``timeout``), ClusterUnavailable (etcd)."""
        ll, e = self.leader_log, self._election
        if ll is None or not e.serving():
            raise NotLeader(self._not_leader_text())
        followers = [m for m in e.state.isr if m != self.broker_id]
        target = to or ll.most_caught_up(followers) or ""
        if not target or target not in followers:
            raise BadRequest(f"{target or 'no follower'} is not an in-sync follower of group {self.group!r} "
                             f"(ISR: {', '.join(e.state.isr)})")  # fmt: skip
        self._appender.refuse(NotLeader(f"group {self.group!r} is handing its leadership over to {target}: "
                                        "retry at the new leader"))  # fmt: skip
        try:
            await self._appender.call(lambda: None)  # the last transaction is over: the end stays put
            with trio.move_on_after(timeout) as waited:
                await ll.wait_caught_up(target)
            if waited.cancelled_caught:
                raise BrokerBusy(f"{target} did not catch up within {timeout:g} s: group {self.group!r} "
                                       "keeps its leader")  # fmt: skip
            if not await e.hand_over(target):
                raise NotLeader(f"the leadership of group {self.group!r} changed during the hand-over")
        except BaseException:
            if self.leader_log is ll and e.serving():
                self._appender.refuse(None)  # serve again
            raise
        log.info("group %s: handed the leadership over to %s", self.group, target)
        return target

    async def hand_over_at_stop(self) -> None:
        """A clean stop of a leader with in-sync followers hands the group over first
        (:meth:`hand_over`, bounded by its timeout), so clients move to a leader that
        has every entry at once; failing that, the stop revokes the lease as before."""
        ll, e = self.leader_log, self._election
        if ll is None or not e.serving() or len(e.state.isr) < 2:
            return
        try:
            await self.hand_over()
        except EQueueError as exc:
            log.warning("group %s: no hand-over before stopping (%s): the lease is revoked instead", self.group, exc)

    async def _resign(self, epoch: int) -> None:
        """Give back a leadership this broker cannot serve, so that another in-sync
        replica leads (it follows that one and repairs its store). Alone in the ISR
        it keeps the key: no one else may lead, and an operator must act (logged).
        etcd errors are retried while it still holds the key."""
        e = self._election
        while e.is_leader() and e.state.epoch == epoch and not eligible(self._repl):
            if len(e.state.isr) < 2:
                log.error("group %s: no other in-sync replica can take over: the group has no serving leader "
                          "until this broker's store is repaired (restart it, or copy a replica's store)",
                          self.group)  # fmt: skip
                return
            try:
                if await e.resign():
                    return
            except EQueueError as exc:
                _follow_logs.log(logging.WARNING, "resign", "group %s: resigning failed (retrying): %s",
                                 self.group, exc)  # fmt: skip
            await trio.sleep(FOLLOW_RETRY)

    def _unsettled_at(self, epoch: int) -> set[str]:
        """The ISR members whose write had an unknown outcome at ``epoch`` (shared by
        the leader logs of that epoch: a fenced leader serving again keeps them)."""
        if self._unsettled[0] != epoch:
            self._unsettled = (epoch, set())
        return self._unsettled[1]

    def _stop_serving(self, exc: BaseException) -> None:
        """Stop answering clients at once (no await): held acks and parked pulls are
        answered ``exc``, consumer leases dropped, the leader duties cancelled."""
        ll = self.leader_log
        if ll is None:
            return
        self.leader_log = None
        self._appender.refuse(exc)
        self._led_hw = max(self._led_hw, ll.high_watermark)
        if self._duty is not None:
            self._duty.cancel()
        ll.close(exc)
        self._parked.fail_all(exc)
        self._leases.drop_all()

    def _start_duty(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self._nursery is not None
        scope = self._duty = trio.CancelScope()
        done = self._duty_done = trio.Event()

        async def duty() -> None:
            try:
                with scope:
                    await fn(*args)
            finally:
                done.set()

        self._nursery.start_soon(duty)

    async def _end_duty(self) -> None:
        """Cancel the current duty (leading or following) and wait until it ended."""
        self._following = None
        if self._duty is not None:
            self._duty.cancel()
            assert self._duty_done is not None
            await self._duty_done.wait()
            self._duty = self._duty_done = None

    async def _leading(self, ll: LeaderLog) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(ll.run)
            n.start_soon(self._lifecycle.run)
            await n.start(self._leader_duties)  # the first materializer pass
            self._ready.set()

    async def _follow(self, address: str, epoch: int) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._watch_eligible)
            n.start_soon(self._trim_following)
            while True:
                try:
                    await self._follower.follow(address, epoch)
                except* (NotLeader, StaleEpoch):
                    pass
                except* (EQueueError, OSError, ValueError) as group:  # ValueError: the store refused entries
                    _follow_logs.log(logging.WARNING, "follow", "group %s: following %s at epoch %d failed "
                                     "(retrying): %s", self.group, address, epoch, group.exceptions[0])  # fmt: skip
                # the peer no longer leads this epoch (or failed): ask again after a
                # pause; a new leader ends this duty through the election
                await trio.sleep(FOLLOW_RETRY)

    async def _trim_following(self) -> None:
        """A follower's log stays under --replica-log-bytes too, never cut past the
        leader's high watermark (what it may need to lead)."""
        while True:
            await trio.sleep(TRIM_INTERVAL)
            await self._trimmer.trim(min(self._follower.high_watermark, self._repl.position))

    async def _watch_eligible(self) -> None:
        was = eligible(self._repl)
        while True:
            await trio.sleep(ELIGIBLE_CHECK)
            now = eligible(self._repl)
            if now and not was:
                self._election.nudge()
            was = now

    # ------------------------------------------------------------------ status
    def status(self) -> control.ReplicationStatus:
        """REPLICATION_STATUS: this replica's view (a leader: every follower)."""
        st = self._election.state
        store, repl = self._store, self._repl
        cfg = self._config
        ll = self.leader_log
        if ll is not None:
            return control.ReplicationStatus(
                "leader", self.group, self.broker_id, ll.epoch, self.broker_id, repl.position,
                ll.high_watermark, store.next_global, list(st.isr), cfg.acks, cfg.min_insync, ll.status(),
                last_epoch=repl.last_epoch,
            )  # fmt: skip
        return control.ReplicationStatus(
            "follower", self.group, self.broker_id, st.epoch, st.leader_id or "", repl.position,
            self._follower.high_watermark, store.next_global, list(st.isr), cfg.acks, cfg.min_insync,
            last_epoch=repl.last_epoch,
        )  # fmt: skip

