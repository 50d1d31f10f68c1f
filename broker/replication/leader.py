"""The leader's side of replication (docs/cluster.md, "Replicas, acks, failover"): followers, the in-sync
set, the high watermark, held acknowledgements, log trimming.

:class:`LeaderLog` lives while this broker leads its group at one epoch (built by
:class:`equeue.broker.replication.role.ReplicaRole` after the epoch marker is written).

* **Followers.** Each REPLICA_FETCH (:meth:`LeaderLog.fetch`) names the follower's
  position: its acknowledgement (every entry below it is durable there). The leader
  keeps, per follower, that position, when it last fetched, and since when it has
  been *caught up* (Kafka's rule: a fetch at the leader's end, or at the end the
  previous answer reached, counts as caught up at that earlier time).
* **High watermark** = the lowest position of the ISR members (the leader's own is
  ``store.replication.position``; a member that has not fetched at this epoch counts as the
  position the leader started from, a member joining counts from the moment its
  etcd write starts). Each rise publishes the store's view up to it
  (``store.replication.publish_upto``), wakes the parked pulls of the queues that became visible
  and answers the held acknowledgements whose transaction lies below it.
* **Acks.** The appender hands every committed transaction to :meth:`hold`. With
  ``--acks all`` its ops are answered once the high watermark passed it; a produce
  is answered NOT_ENOUGH_REPLICAS instead when the ISR shrank below
  ``--min-insync`` meanwhile. With ``--acks leader`` produces are answered at once
  (visibility still follows the high watermark); every other write (offsets, topic
  changes, the broker's own moves) always waits for the high watermark, as Kafka's
  offset commits do whatever the producer's acks.
* **ISR changes** (:meth:`run`, every :data:`ISR_CHECK`): a member not caught up for
  ``--replica-lag-max`` leaves, and so does one whose registration is gone from
  etcd (a follower that stopped cleanly revoked its lease: acks resume after one
  check and one etcd write, not after the lag bound); the leader keeps waiting for
  a leaving member until etcd confirmed the smaller set. A registered follower
  fetching at the end joins (counted from the moment the write starts, so it never
  misses an acknowledged write). One etcd write at a time, through
  ``election.set_isr``. Fetches reach this object only from verified replicas (the
  handler's ``identify``), so no client can move the high watermark or enter the
  ISR in a replica's name.
* **Trimming** (:meth:`run`, every :data:`TRIM_INTERVAL`): the log is cut only
  past ``--replica-log-bytes`` (so a follower down for minutes catches up from the
  log, as Kafka keeps a partition by its retention whatever its followers), in
  steps of what was written between two checks, never past the high watermark nor
  the start of a snapshot in progress (:meth:`pin`); the trim itself runs in the
  writer thread (``Appender.call(repl.trim_log)``).

Everything here runs on the loop; the store's reads (``read_log``, ``entry_info``)
are read transactions; ``log_bytes`` scans run in a worker thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import outcome
import trio

from equeue import control
from equeue.broker.storage import ProduceOp, WriteOutcome
from equeue.config import BrokerConfig
from equeue.errors import ClusterUnavailable, LogTrimmed, NotEnoughReplicas, NotLeader, StaleEpoch
from equeue.logs import RateLimitedLog
from equeue.wire.replica import FetchAnswer, FetchRequest, FetchStatus
from equeue.wire.replog import EntryHeader

__all__ = ["ISR_CHECK", "PIN_KEEP", "TRIM_INTERVAL", "LeaderLog", "LogTrimmer"]

log = logging.getLogger("equeue.replication")
_isr_logs = RateLimitedLog(log, 10.0, time.monotonic)

T = TypeVar("T")

#: how often the ISR is checked for members to drop or add (seconds; at most)
ISR_CHECK = 0.25
#: how often the log is trimmed (seconds)
TRIM_INTERVAL = 1.0
#: a log found at a trimmer's first check is read in steps of this fraction of the bound
SEED_STEPS = 16
#: a snapshot pin not renewed for this long is dropped (seconds)
PIN_KEEP = 60.0


class LeaderReplication(Protocol):
    """What the leader uses of a replicated store's log
    (:class:`equeue.broker.storage.replicated.StoreReplication`, ``store.replication``)."""

    @property
    def position(self) -> int: ...
    @property
    def log_start(self) -> int: ...
    def publish_upto(self, hw: int) -> list[WriteOutcome]: ...
    def read_log(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]: ...
    def entry_info(self, position: int) -> EntryHeader | None: ...
    def end_of_epoch(self, epoch: int) -> int: ...
    def epochs(self) -> list[tuple[int, int]]: ...
    def log_bytes(self, start: int) -> int: ...
    def trim_log(self, before: int) -> int: ...


class LeaderState(Protocol):
    """The group's leadership as etcd has it (:class:`equeue.broker.cluster.election.Leadership`)."""

    @property
    def epoch(self) -> int: ...
    @property
    def isr(self) -> tuple[str, ...]: ...


class LeaderElection(Protocol):
    """What the leader uses of :class:`equeue.broker.cluster.election.GroupElection`."""

    @property
    def state(self) -> LeaderState: ...
    def serving(self) -> bool: ...
    async def set_isr(self, members: Sequence[str]) -> bool: ...


class WriterCall(Protocol):
    """``Appender.call``: run ``fn()`` in the writer thread, in order with queued writes."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


class Answers(Protocol):
    """How held ops are answered (:class:`equeue.broker.appender.Appender`)."""

    def release(self, batch: Sequence[Any], results: Sequence[outcome.Outcome[Any]]) -> None: ...
    def fail(self, batch: Sequence[Any], exc: BaseException) -> None: ...


class _Follower:
    """One follower as the leader sees it (loop only)."""

    __slots__ = (
        "acked", "address", "at_end", "broker_id", "caught_up", "consistent", "end_at_answer", "fetched",
        "last_answer", "position",
    )  # fmt: skip

    def __init__(self, broker_id: str, address: str, position: int, now: float) -> None:
        self.broker_id = broker_id
        self.address = address
        #: its acknowledgement: every entry below is durable there
        self.position = position
        #: trio time of its last fetch, of the last answer to it, since when caught up
        self.fetched = now
        self.last_answer = now
        self.caught_up = now
        #: the leader's end when the last OK answer to it was built (-1: none since a
        #: DIVERGED or TOO_OLD answer: a repaired or copied store counts as caught up
        #: only once it reached an end read after its repair)
        self.end_at_answer = -1
        #: its last fetch was at the end (now, or as of the previous answer)
        self.at_end = False
        #: its last fetch said its store is consistent (a repair or copy complete)
        self.consistent = False
        #: ``position`` is an acknowledgement it made at this epoch (not the start value)
        self.acked = False


class LeaderLog:
    """The leader's replication state at one epoch. Build it once the epoch marker is
    written; run :meth:`run` in the leader's nursery; :meth:`close` when leadership
    ends (held acks are answered NotLeader, fetches end)."""

    def __init__(
        self, *, replication: LeaderReplication, election: LeaderElection, answers: Answers,
        call: WriterCall, wake: Callable[[Iterable[tuple[int, int]]], None],
        on_scheduled: Callable[[], None], config: BrokerConfig, broker_id: str, group: str, epoch: int,
        high_watermark: int, promoted_at: int, unsettled: set[str] | None = None,
        clock: Callable[[], float] = trio.current_time, replicas: Callable[[], Collection[str]] | None = None,
    ) -> None:  # fmt: skip
        self._repl = replication
        self._election = election
        self._answers = answers
        self._call = call
        self._wake = wake
        self._on_scheduled = on_scheduled
        self._config = config
        self._all = config.acks == "all"
        self._min_insync = config.min_insync
        self._lag_max = config.replica_lag_max
        self.broker_id = broker_id
        self.group = group
        self.epoch = epoch
        self._clock = clock
        #: the broker ids registered in the group now (None: unknown, every one counts)
        self._replicas = replicas
        #: the high watermark (never goes back): at first the one this replica last
        #: heard from the previous leader (every ISR member has the entries below it)
        self.high_watermark = high_watermark
        #: where an ISR member that has not fetched at this epoch yet counts
        self._start = high_watermark
        #: this replica's end when it took over: its store (published whole by the
        #: promotion's reload) may show entries from the high watermark to here that
        #: the other members lack, so client reads wait until the high watermark is here
        self.promoted_at = promoted_at
        #: set once the high watermark reached ``promoted_at`` (or leadership ended)
        self.readable = trio.Event()
        if high_watermark >= promoted_at:
            self.readable.set()
        self._started_at = clock()
        self._followers: dict[str, _Follower] = {}
        #: followers being added to the ISR (counted in the high watermark meanwhile)
        self._joining: set[str] = set()
        #: followers of an ISR write whose outcome is unknown (etcd did not answer, or
        #: the write was cancelled: it may have been applied): counted until a later
        #: write or refusal settles it. Shared by the leader logs of one epoch (a
        #: fenced leader that serves again keeps it)
        self._unsettled: set[str] = set() if unsettled is None else unsettled
        #: broker id -> (pinned position, trio time of the last pin) of snapshotting followers
        self._pins: dict[str, tuple[int, float]] = {}
        #: committed transactions waiting for the high watermark: (position, ops, results)
        self._held: deque[tuple[int, list[Any], list[outcome.Outcome[Any]]]] = deque()
        #: set (and replaced) at every commit and at close: long-polled fetches wake
        self._committed = trio.Event()
        #: set (and replaced) at every fetch that moved a follower's position, and at close
        self._progress = trio.Event()
        self._closed = False
        self._trimmer = LogTrimmer(replication, call, config.replica_log_bytes)

    # ------------------------------------------------------------------ acks
    def hold(self, batch: list[Any], committed: WriteOutcome) -> None:
        """Loop thread, for every committed transaction (``Appender(hold=...)``):
        answer its ops once the high watermark passed it; wake long-polled fetches."""
        if self._closed:
            self._answers.fail(batch, NotLeader("this broker stopped leading its group: retry at the new leader"))
            return
        results = committed.results
        if not self._all and self._election.serving():  # acks leader: produces are answered at their commit
            now = [i for i, p in enumerate(batch) if isinstance(p.op, ProduceOp)]
            if now:
                self._answers.release([batch[i] for i in now], [results[i] for i in now])
                if len(now) == len(batch):
                    batch, results = [], []
                else:
                    keep = [i for i in range(len(batch)) if not isinstance(batch[i].op, ProduceOp)]
                    batch, results = [batch[i] for i in keep], [results[i] for i in keep]
        if batch:
            self._held.append((committed.position, batch, list(results)))
        self.committed()

    def committed(self) -> None:
        """The log grew (a commit, or a write through ``Appender.call``): wake the
        long-polled fetches and move the high watermark."""
        self._committed.set()
        self._committed = trio.Event()
        self.advance()

    def advance(self) -> None:
        """Move the high watermark to the lowest ISR position; publish, wake parked
        pulls and answer held acks below it. Nothing moves while not serving (fenced:
        no pull is answered with data, no ack given)."""
        if self._closed or not self._election.serving():
            return
        hw = self._compute_hw()
        if hw > self.high_watermark:
            self.high_watermark = hw
            if hw >= self.promoted_at:
                self.readable.set()
            touched: set[tuple[int, int]] = set()
            scheduled = False
            for o in self._repl.publish_upto(hw):
                touched |= o.touched
                scheduled = scheduled or o.scheduled
            if touched:
                self._wake(touched)
            if scheduled:
                self._on_scheduled()
        held = self._held
        if held and held[0][0] <= self.high_watermark:
            short = self._all and len(self._election.state.isr) < self._min_insync
            while held and held[0][0] <= self.high_watermark:
                _, batch, results = held.popleft()
                if short:
                    results = [self._short(p, r) for p, r in zip(batch, results, strict=True)]
                self._answers.release(batch, results)

    def _short(self, p: Any, r: outcome.Outcome[Any]) -> outcome.Outcome[Any]:
        """A produce released while the ISR is below --min-insync: NOT_ENOUGH_REPLICAS
        (it is stored; the producer's retry with the same sequence is stored once)."""
        if isinstance(p.op, ProduceOp) and isinstance(r, outcome.Value):
            isr = len(self._election.state.isr)
            return outcome.Error(NotEnoughReplicas(
                f"the write is stored but the in-sync set shrank to {isr} replica(s), below --min-insync "
                f"{self._min_insync}: retry (the same producer sequence is stored once)"
            ))  # fmt: skip
        return r

    def _compute_hw(self) -> int:
        hw = self._repl.position
        members = set(self._election.state.isr) | self._joining | self._unsettled
        members.discard(self.broker_id)
        for m in members:
            f = self._followers.get(m)
            pos = self._start if f is None else f.position
            if pos < hw:
                hw = pos
        return hw

    def check_produce(self) -> None:
        """Raises NotEnoughReplicas when acks are ``all`` and the ISR (as etcd has it)
        has fewer than --min-insync members: refused before anything is written."""
        if self._all:
            isr = len(self._election.state.isr)
            if isr < self._min_insync:
                raise NotEnoughReplicas(
                    f"the group has {isr} in-sync replica(s), fewer than --min-insync {self._min_insync}: "
                    "nothing was written; retry"
                )

    def close(self, exc: BaseException) -> None:
        """Leadership ended (or fenced): answer every held ack with ``exc``, end the
        long-polled fetches. Idempotent."""
        if self._closed:
            return
        self._closed = True
        held, self._held = self._held, deque()
        for _, batch, _results in held:
            self._answers.fail(batch, exc)
        self._committed.set()
        self._progress.set()
        self.readable.set()  # (the waiting reads find the broker not leading)

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ followers
    def _check(self, epoch: int) -> None:
        if self._closed or not self._election.serving():
            raise NotLeader(f"this broker does not lead group {self.group!r} now")
        if epoch != self.epoch:
            raise StaleEpoch(f"group {self.group!r} is at epoch {self.epoch}, not {epoch}")

    async def fetch(self, req: FetchRequest) -> FetchAnswer:
        """REPLICA_FETCH: the entries from ``req.position`` on (long-polled up to
        ``req.wait_ms`` when there are none), DIVERGED (the follower's log left this
        one's at ``diverge_at``) or TOO_OLD (trimmed: snapshot). Records the
        follower's position. Raises NotLeader (not leading, fenced), StaleEpoch
        (another epoch)."""
        self._check(req.epoch)
        repl = self._repl
        now = self._clock()
        f = self._followers.get(req.broker_id)
        if f is None:
            f = self._followers[req.broker_id] = _Follower(req.broker_id, req.address, self._start, self._started_at)
        f.address = req.address
        f.fetched = now
        f.consistent = req.consistent
        self._pins.pop(req.broker_id, None)  # fetching again: no snapshot in progress
        if req.position < f.position and (f.acked or self._member(f.broker_id)):
            self._regressed(f, req.position)
        if req.position > 0:
            end_of_epoch = repl.end_of_epoch(req.last_epoch)
            if end_of_epoch < req.position:
                return self._reset(f, FetchStatus.DIVERGED, end_of_epoch)
            if req.last_epoch not in dict(repl.epochs()):  # KIP-279: an epoch this log never had
                return self._reset(f, FetchStatus.DIVERGED, min(end_of_epoch, req.position))
        if req.position < repl.log_start:
            return self._reset(f, FetchStatus.TOO_OLD)
        end = repl.position
        # caught up: at the end now, or at the end the previous answer saw (Kafka's
        # rule), with a consistent store (a repair or a fuzzy copy is complete)
        f.at_end = req.consistent and (req.position >= end or req.position >= f.end_at_answer >= 0)
        if f.at_end and req.position >= end:
            f.caught_up = now
        elif f.at_end:
            f.caught_up = max(f.caught_up, f.last_answer)
        f.position = min(req.position, end)
        f.acked = True
        self._progress.set()
        self._progress = trio.Event()
        self.advance()
        if req.position >= repl.position and req.wait_ms > 0:
            with trio.move_on_after(req.wait_ms / 1000):
                while req.position >= repl.position and not self._closed:
                    await self._committed.wait()
            self._check(req.epoch)
        try:
            entries = repl.read_log(req.position, req.max_bytes) if req.position < repl.position else []
        except LogTrimmed:
            return self._reset(f, FetchStatus.TOO_OLD)
        f.last_answer = self._clock()
        f.end_at_answer = repl.position
        return self._answer(FetchStatus.OK, entries=entries)

    def _member(self, broker_id: str) -> bool:
        """``broker_id`` counts in the high watermark now (ISR, joining or unsettled)."""
        return broker_id in self._election.state.isr or broker_id in self._joining or broker_id in self._unsettled

    def _regressed(self, f: _Follower, position: int) -> None:
        """A follower fetching below a position it acknowledged lost entries it had
        (an OS crash with ``--flush async``, a restored disk; Kafka's KIP-966): it is
        not caught up from now on, so it leaves the ISR (the high watermark waits for
        it meanwhile, as for any member) and joins again only once caught up."""
        isr = self._member(f.broker_id)
        _isr_logs.log(logging.WARNING, f"regressed:{f.broker_id}", "group %s: follower %s fetched at %d, below "
                      "%d it had acknowledged (it lost entries)%s", self.group, f.broker_id, position, f.position,
                      ": it leaves the in-sync set" if isr else "")  # fmt: skip
        f.caught_up = -float("inf")
        f.at_end = False
        f.end_at_answer = -1
        f.position = position

    def _reset(self, f: _Follower, status: FetchStatus, diverge_at: int = 0) -> FetchAnswer:
        """A DIVERGED or TOO_OLD answer: the follower repairs or copies its store, and
        is not caught up before it reached an end read after that."""
        f.end_at_answer = -1
        f.at_end = False
        return self._answer(status, diverge_at=diverge_at)

    def _answer(
        self, status: FetchStatus, *, diverge_at: int = 0, entries: list[tuple[int, bytes]] | None = None
    ) -> FetchAnswer:
        repl = self._repl
        return FetchAnswer(
            status, self.epoch, self.high_watermark, repl.position, diverge_at, repl.log_start, entries or []
        )

    def most_caught_up(self, candidates: Iterable[str]) -> str | None:
        """The candidate follower with the highest acknowledged position (None: none
        of them fetched at this epoch)."""
        seen = [(f.position, b) for b in candidates if (f := self._followers.get(b)) is not None and f.acked]
        return max(seen)[1] if seen else None

    async def wait_caught_up(self, broker_id: str) -> None:
        """Return once ``broker_id`` acknowledged the log's end (the caller stopped
        the writes first, so the end stays put). Raises NotLeader when the log closes
        meanwhile. Bound it with a cancel scope."""
        while True:
            if self._closed:
                raise NotLeader(f"this broker stopped leading group {self.group!r}")
            f = self._followers.get(broker_id)
            if f is not None and f.acked and f.position >= self._repl.position:
                return
            await self._progress.wait()

    def pin(self, broker_id: str, position: int) -> None:
        """A follower copying the store (REPLICA_SNAPSHOT) will fetch from
        ``position``: keep the log from there (renewed by each call; dropped when
        it fetches, or after :data:`PIN_KEEP` without a renewal)."""
        old = self._pins.get(broker_id)
        self._pins[broker_id] = (position if old is None else min(old[0], position), self._clock())
        f = self._followers.get(broker_id)
        if f is not None:  # copying: caught up only at an end read after the copy
            f.at_end = False
            f.end_at_answer = -1

    # ------------------------------------------------------------------ duties
    async def run(self) -> None:
        """The ISR checks and the log trimming, until cancelled."""
        async with trio.open_nursery() as n:
            n.start_soon(self._isr_loop)
            n.start_soon(self._trim_loop)

    async def _isr_loop(self) -> None:
        pause = min(ISR_CHECK, self._lag_max / 4)
        while not self._closed:
            await self._update_isr()
            await trio.sleep(pause)

    def _wanted_isr(self) -> tuple[set[str], set[str]]:
        """(members to drop, followers to add) now."""
        now = self._clock()
        written = set(self._election.state.isr)
        registered = None if self._replicas is None else self._replicas()
        drop: set[str] = set()
        for m in written | self._unsettled:
            if m == self.broker_id:
                continue
            f = self._followers.get(m)
            since = self._started_at if f is None else f.caught_up
            if now - since > self._lag_max or (registered is not None and m not in registered):
                drop.add(m)
        add: set[str] = set()
        floor = max(self.high_watermark, self._start)
        for b, f in self._followers.items():
            # registered, caught up at its last fetch (recent), with every acknowledged
            # write (an unsettled member is proposed again: the write settles the record)
            if (
                b not in written and f.at_end and f.consistent and f.position >= floor
                and now - f.fetched <= self._lag_max and (registered is None or b in registered)
            ):  # fmt: skip
                add.add(b)
        return drop, add

    async def _update_isr(self) -> None:
        """One ISR change when one is due: write it through etcd (a joining member
        counts from now; a leaving one until etcd confirmed)."""
        if not self._election.serving():
            return
        drop, add = self._wanted_isr()
        if not drop and not add:
            return
        isr = self._election.state.isr
        members = [self.broker_id, *sorted((set(isr) - drop - {self.broker_id}) | add)]
        self._joining |= add
        try:
            ok = await self._election.set_isr(members)
        except ClusterUnavailable as exc:
            _isr_logs.log(logging.WARNING, "isr", "group %s: cannot write the ISR %s (retrying): %s",
                          self.group, members, exc)  # fmt: skip
            self._unsettled |= add  # etcd may have written it: keep counting them
            ok = False
        except BaseException:  # cancelled mid-write: the outcome is unknown too
            self._unsettled |= add
            raise
        else:  # written or refused: the ISR etcd has is known again
            self._unsettled.clear()
        finally:
            self._joining -= add
        if ok:
            log.info(
                "group %s epoch %d: ISR %s (left: %s; joined: %s)", self.group, self.epoch, ", ".join(members),
                ", ".join(sorted(drop)) or "-", ", ".join(sorted(add)) or "-",
            )  # fmt: skip
        self.advance()  # a smaller set may release held acks

    async def _trim_loop(self) -> None:
        while not self._closed:
            await trio.sleep(TRIM_INTERVAL)
            await self.trim()

    async def trim(self) -> int:
        """Trim the log once (see the module docstring); returns the new log start."""
        now = self._clock()
        floor = self.high_watermark  # never past the high watermark, nor a snapshot's pin
        for b, (pos, at) in list(self._pins.items()):
            if now - at > PIN_KEEP:
                del self._pins[b]
            else:
                floor = min(floor, pos)
        return await self._trimmer.trim(floor)

    # ------------------------------------------------------------------ status
    def status(self) -> list[control.ReplicaStatus]:
        """Each follower seen at this epoch: position, lag in messages and ms, in sync."""
        repl = self._repl
        end = repl.position
        now = self._clock()
        now_ms = time.time_ns() // 1_000_000
        last = repl.entry_info(end - 1) if end > 0 else None
        next_global = 0 if last is None else last.next_global
        isr = set(self._election.state.isr)
        out = []
        for b, f in sorted(self._followers.items()):
            lag_messages = lag_ms = 0
            if f.position < end:
                have = repl.entry_info(f.position - 1) if f.position > 0 else None
                lag_messages = max(0, next_global - (0 if have is None else have.next_global))
                missing = repl.entry_info(f.position)
                lag_ms = 0 if missing is None else max(0, now_ms - missing.time_ms)
            out.append(control.ReplicaStatus(
                b, f.address, f.position, lag_messages, lag_ms, b in isr, round(now - f.fetched, 3),
            ))  # fmt: skip
        return out


class TrimReplication(Protocol):
    """What the trimmer uses of a replicated store's log (``store.replication``)."""

    @property
    def position(self) -> int: ...
    @property
    def log_start(self) -> int: ...
    def read_log(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]: ...
    def log_bytes(self, start: int) -> int: ...
    def trim_log(self, before: int) -> int: ...


class LogTrimmer:
    """Keeps a replica's log at most ``max_bytes`` long (the leader's and each
    follower's): it remembers the bytes written between two checks as steps, and
    cuts whole steps, oldest first, while the log is past the bound, never past
    ``floor``. A log found at the first check is split in steps of
    :data:`SEED_STEPS` ths of the bound (read once in a worker thread), so a long
    log is never cut whole at once."""

    def __init__(self, replication: TrimReplication, call: WriterCall, max_bytes: int) -> None:
        self._repl = replication
        self._call = call
        self._max = max_bytes
        #: (end position, bytes) of each step not cut yet, oldest first
        self._steps: deque[tuple[int, int]] = deque()
        self._scanned = -1

    def _seed(self, start: int, end: int) -> list[tuple[int, int]]:
        """Worker thread: the steps of the log from ``start`` to ``end``."""
        steps: list[tuple[int, int]] = []
        step = max(1, self._max // SEED_STEPS)
        p = start
        while p < end:
            try:
                got = [(q, len(e)) for q, e in self._repl.read_log(p, step) if q < end]
            except (LogTrimmed, ValueError):
                break
            if not got:
                break
            p = got[-1][0] + 1
            steps.append((p, sum(n for _, n in got)))
        return steps

    async def trim(self, floor: int) -> int:
        """Check once: cut what is past the bound (never past ``floor``); returns the
        log start."""
        repl = self._repl
        end = repl.position
        if end < self._scanned:  # truncated or copied since: read it again
            self._steps.clear()
            self._scanned = -1
        if self._scanned < 0:
            self._steps.extend(await trio.to_thread.run_sync(self._seed, repl.log_start, end))
            self._scanned = end
        elif end > self._scanned:  # the bytes of the entries written since the last check
            nbytes = await trio.to_thread.run_sync(repl.log_bytes, self._scanned)
            self._steps.append((end, nbytes))
            self._scanned = end
        steps = self._steps
        start = before = repl.log_start
        while steps and steps[0][0] <= start:
            steps.popleft()
        total = sum(n for _, n in steps)
        while total > self._max and steps and steps[0][0] <= floor:
            step_end, n = steps.popleft()
            total -= n
            before = step_end
        if before > start:
            start = await self._call(lambda: repl.trim_log(before))
        return start
