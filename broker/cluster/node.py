"""The broker's cluster role (docs/cluster.md): one object, one ``async with`` lifetime.

:class:`ClusterNode` owns the broker's etcd client, its registration
(:class:`~equeue.broker.cluster.membership.Membership`), the watched view
(:class:`~equeue.broker.cluster.view.ClusterView`), the placement writes
(:class:`~equeue.broker.cluster.placements.Placements`), the group's election
(:class:`~equeue.broker.cluster.election.GroupElection`) and the materializer. The handlers
see it through :class:`equeue.broker.handlers.roles.ClusterRole`:

* **Ownership.** ``owned`` maps every topic the broker knows from etcd to the queue
  ids its group owns; the produce hot path reads it with one dict lookup. A request
  for a queue owned elsewhere is NOT_OWNER (naming the owner), or QUEUE_UNAVAILABLE
  when that group has no leader (no live broker, or none of its ISR).
* **Materialization.** Every placement in etcd exists in the local store with its
  full queue count (created or grown through the appender), its retention and its
  compression setting; a topic deleted in etcd is deleted locally, and a local copy of an earlier
  incarnation (deleted and created again) is replaced. Done by the group's leader
  (:meth:`ClusterNode.run_leader_duties`: a first pass before it serves, then after
  every change the view sees); a follower's store gets it through replication. ``<data-dir>/cluster-topics.json``
  records which etcd incarnation (``created_ms``) each local copy was made from, so
  this holds across a broker's downtime too, with the highest etcd revision followed:
  a view behind it comes from an etcd that lost its data, whose missing topics are
  kept (not deleted). A local topic etcd does not know and
  the broker never made from etcd (a store that was standalone) is left alone, never
  served, logged, as Kafka keeps stray partitions: a fresh or wiped etcd must not
  destroy a store.
* **Topic administration.** Create, alter, delete and auto-create write etcd
  (Placements), then wait until the local store follows, then answer; etcd
  unreachable is CLUSTER_UNAVAILABLE.
* **Pauses.** A paused topic or consumer group is a ``paused/`` record in etcd
  (:meth:`ClusterNode.set_paused`), never in the store: every broker group reads
  it from its view (:meth:`ClusterNode.paused`). The broker group that answered
  a pause honours it before answering; the others once their watch delivers it
  (typically milliseconds). A new leader after a failover or a restart finds it
  there. A topic's pause is written only while its placement exists, and deleted
  in the same transaction as the placement (creating a topic deletes any pause
  left under its name).
* **Replicas and leadership.** Every broker of a group is a replica; the
  group's :class:`~equeue.broker.cluster.election.GroupElection` (``node.election``, built
  in :meth:`ClusterNode.serving` with the caller's ``eligible``) says which one leads.
  Only the leader writes its store on its own: :meth:`ClusterNode.run_leader_duties`
  (the materializer) runs while it leads; every broker keeps the placements and
  ``owned`` current, so any replica answers GET_ROUTES, whose group addresses name
  each group's leader.

* **Replica identity.** The broker makes a random secret when it starts
  (``replica_secret``) and registers its SHA-256 in its broker record. As a follower
  it sends the secret with every replication request; as a leader it counts such a
  request only when :meth:`ClusterNode.check_replica` finds its broker id registered
  in this group under a live lease with a matching digest, so a client cannot
  acknowledge writes in a replica's name.

``broker_id`` is a UUID kept in ``<data-dir>/broker.id``, so a restarted broker is
the same broker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from equeue import __version__, control
from equeue.broker.cluster.election import GroupElection
from equeue.broker.cluster.etcd import EtcdClient
from equeue.broker.cluster.membership import Membership
from equeue.broker.cluster.placements import Placements
from equeue.broker.cluster.view import ClusterView
from equeue.broker.storage import AlterTopicOp, CreateTopicOp, DeleteTopicOp, StoreReader, WriteOp
from equeue.config import BrokerConfig
from equeue.errors import (
    BadRequest,
    ClusterDataInvalid,
    ClusterUnavailable,
    ConfigError,
    EQueueError,
    NotAReplica,
    NotOwner,
    QueueNotFound,
    QueueUnavailable,
    TopicNotFound,
)
from equeue.logs import RateLimitedLog
from equeue.placement import (
    CLUSTER_KEY,
    BrokerRecord,
    ClusterRecord,
    PauseRecord,
    TopicPlacement,
    decode_cluster,
    encode_cluster,
    encode_pause,
    pause_key,
)

__all__ = ["ClusterNode", "load_broker_id"]

log = logging.getLogger("equeue.cluster")
_errors = RateLimitedLog(log, 10.0, time.monotonic)

#: how long a topic change may take to reach the local store before the request
#: answers CLUSTER_UNAVAILABLE (the change itself is in etcd and will be applied)
FOLLOW_TIMEOUT = 10.0
#: pause before the materializer retries a pass that failed
_RETRY_PAUSE = 1.0
#: seconds a topic etcd did not have answers TOPIC_NOT_FOUND without another etcd read
#: (a client asking for unknown topics in a loop costs etcd nothing); most names kept
ABSENT_TTL = 0.5
_ABSENT_MAX = 10_000

Submit = Callable[[WriteOp], Awaitable[Any]]


def load_broker_id(data_dir: Path) -> str:
    """The broker's id, kept in ``<data_dir>/broker.id`` (created on first use)."""
    path = Path(data_dir) / "broker.id"
    try:
        text = path.read_text().strip()
        if text:
            return str(uuid.UUID(text))
    except FileNotFoundError:
        pass
    except ValueError as exc:
        raise ConfigError(f"{path} does not hold a broker id (a UUID): {exc}") from None
    broker_id = str(uuid.uuid4())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(broker_id + "\n")
    os.replace(tmp, path)
    return broker_id


#: ``<data-dir>/`` file naming the etcd incarnation (created_ms) of each local topic
MATERIALIZED_FILE = "cluster-topics.json"


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_materialized(data_dir: Path) -> tuple[int, dict[str, int]]:
    """(the highest etcd revision the broker followed, topic -> the created_ms of
    the placement its local copy was made from), as :func:`save_materialized` left
    them ((0, {}) when absent or unreadable: every local topic is then taken as it is)."""
    try:
        data = json.loads((Path(data_dir) / MATERIALIZED_FILE).read_text())
    except FileNotFoundError:
        return 0, {}
    except (OSError, ValueError) as exc:
        log.warning("cluster: %s unreadable (%s): local topics are taken as they are", MATERIALIZED_FILE, exc)
        return 0, {}
    if not isinstance(data, dict) or not _int(data.get("revision")) or not isinstance(data.get("topics"), dict):
        return 0, {}
    return data["revision"], {k: v for k, v in data["topics"].items() if isinstance(k, str) and _int(v)}


def save_materialized(data_dir: Path, revision: int, made_from: dict[str, int]) -> None:
    """Write :data:`MATERIALIZED_FILE` (atomically: a new file renamed over it)."""
    path = Path(data_dir) / MATERIALIZED_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"revision": revision, "topics": made_from}, sort_keys=True))
    os.replace(tmp, path)


class ClusterNode:
    """The broker's cluster role. Build it with the store, the appender's submit and
    ``eligible`` (whether the store may lead now), then ``async with
    node.serving(port):`` around the time the broker serves: it registers, loads the
    view and the placements, and enters the election (a new group's first broker
    leads when it returns); run :meth:`run_leader_duties` while leading.
    """

    def __init__(
        self,
        config: BrokerConfig,
        store: StoreReader,
        submit: Submit,
        *,
        eligible: Callable[[], bool] = lambda: True,
        floor_epoch: Callable[[], int] = lambda: 0,
        led_epoch: Callable[[], int] | None = None,
    ) -> None:
        self.group = config.broker_group
        self._eligible = eligible
        self._floor_epoch = floor_epoch
        self._led_epoch = led_epoch
        self.endpoints = list(config.cluster)
        self._config = config
        self._store = store
        self._submit = submit
        self._ttl = config.cluster_lease_ttl
        self._default_queues = config.default_queues
        self.broker_id = ""
        self.address = ""
        #: this process's replica secret: sent with its replication requests, its
        #: SHA-256 registered in etcd (a new one at each start: a copied data
        #: directory cannot answer for this process)
        self.replica_secret = secrets.token_bytes(32)
        self._impostors = RateLimitedLog(log, 10.0, time.monotonic)
        #: topic -> queue ids this group owns, for every topic known from etcd
        self.owned: dict[str, frozenset[int]] = {}
        #: the placements the handlers go by: the view's, plus newer ones this broker
        #: wrote or looked up that the view has not shown yet
        self._placements: dict[str, TopicPlacement] = {}
        self._ahead: dict[str, TopicPlacement] = {}
        #: topic -> created_ms of the placement its local copy was materialized from,
        #: kept in MATERIALIZED_FILE: a copy of an earlier incarnation (the topic was
        #: deleted, maybe created again, while this broker was down) is told apart
        self._made_from: dict[str, int] = {}
        #: the highest etcd revision followed: a view behind it is another etcd's (its
        #: data was lost, or it was replaced), whose missing topics are never deleted
        self._revision = 0
        self._saved: tuple[int, dict[str, int]] = (0, {})
        #: the incarnation id the view held at the last pass that found etcd's revision
        #: moving forward; and the one to renew after etcd went back (a restore)
        self._incarnation_seen: str | None = None
        self._stale_incarnation: str | None = None
        self._rolled_back = trio.Event()
        #: the topic names of the last view snapshot materialized (a name that leaves
        #: it was deleted in etcd)
        self._seen: set[str] | None = None
        #: set (and replaced) after every materializer pass
        self._passed = trio.Event()
        self._etcd: EtcdClient = None  # type: ignore[assignment]  # set by serving()
        self._view: ClusterView = None  # type: ignore[assignment]
        self._writes: Placements = None  # type: ignore[assignment]
        #: topic -> trio time etcd last answered that it has no such topic
        self._absent: dict[str, float] = {}
        self._lock = trio.Lock()  # one materializer pass (or direct apply) at a time
        #: set when the view's topics changed since the last pass (of the leader's
        #: loop, and of the loop that keeps the placements only)
        self._dirty = trio.Event()
        self._dirty_placements = trio.Event()
        #: the group's election (set while :meth:`serving`)
        self.election: GroupElection = None  # type: ignore[assignment]
        #: True while :meth:`run_leader_duties` runs: passes write the local store
        self._leading = False

    # ------------------------------------------------------------------ lifetime
    @asynccontextmanager
    async def serving(self, port: int) -> AsyncIterator[ClusterNode]:
        """Join the cluster for the block's duration (advertising ``port`` unless
        ``--advertise`` says otherwise): register, load the view, take the placements
        (without writing the store: :meth:`run_leader_duties` does that), and enter
        the group's election (``self.election``); leave it (lease revoked, which ends
        a leadership) on exit.

        Raises ClusterUnavailable when etcd does not answer."""
        cfg = self._config
        self.broker_id = await trio.to_thread.run_sync(load_broker_id, cfg.data_dir)
        self._saved = await trio.to_thread.run_sync(load_materialized, cfg.data_dir)
        self._revision, self._made_from = self._saved[0], dict(self._saved[1])
        followed = self._revision  # before this start: a restored etcd is behind it
        self.address = cfg.advertised(port)
        async with EtcdClient(self.endpoints) as etcd, trio.open_nursery() as nursery:
            self._etcd = etcd
            record = BrokerRecord(
                self.group, self.broker_id, self.address, int(time.time() * 1000), os.getpid(), __version__,
                hashlib.sha256(self.replica_secret).hexdigest(),
            )
            async with Membership(etcd, record, ttl=self._ttl) as membership, ClusterView(etcd) as view:
                self._view = view
                self._writes = Placements(etcd, view)
                with trio.move_on_after(FOLLOW_TIMEOUT) as starting:
                    await membership.wait_registered()
                    await view.ready.wait()
                    await view.wait_for(self._sees_itself)  # so its first placements count its group
                    await self._ensure_incarnation()  # so GET_ROUTES names one from the start
                if starting.cancelled_caught:
                    raise ClusterUnavailable(
                        f"etcd at {','.join(self.endpoints)} did not let the broker register and load the "
                        f"cluster within {FOLLOW_TIMEOUT:g} s"
                    )
                unsubscribe = view.on_topics(self._topics_changed)
                election = GroupElection(
                    etcd, group=self.group, broker_id=self.broker_id, address=self.address,
                    membership=membership, ttl=self._ttl, eligible=self._eligible, floor_epoch=self._floor_epoch,
                    led_epoch=self._led_epoch, seen_revision=followed,
                )  # fmt: skip
                try:
                    await self._pass(write=False)
                    nursery.start_soon(partial(self._materializer, write=False))
                    nursery.start_soon(self._keep_incarnation)
                    nursery.start_soon(self._renew_incarnation)
                    async with election:
                        self.election = election
                        with trio.move_on_after(FOLLOW_TIMEOUT):
                            await election.wait_settled()  # a new group's first broker leads at once
                        log.info(
                            "cluster: broker %s of group %s at %s (etcd %s), %d topics",
                            self.broker_id, self.group, self.address, ",".join(self.endpoints), len(self.owned),
                        )  # fmt: skip
                        yield self
                finally:
                    unsubscribe()
                    nursery.cancel_scope.cancel()
                    self._save_followed()

    def _save_followed(self) -> None:
        """At the end of :meth:`serving`: keep the highest etcd revision this run saw
        (the view follows every cluster key), so the next start tells an etcd restored
        from an older backup (its revision is behind) even when no topic changed."""
        revision = max(self._revision, self._view.revision if self._view is not None else 0)
        if revision > self._saved[0]:
            try:
                save_materialized(self._config.data_dir, revision, self._saved[1])
            except OSError as exc:  # the next start then knows a lower revision: logged
                log.warning("cluster: saving the followed etcd revision failed: %s", exc)

    async def run_leader_duties(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """While this broker leads its group (run it in a task; cancel it when the
        leadership ends): materialize every placement in the local store (a first
        pass at once, then one after each change the view sees), until cancelled.
        With ``nursery.start`` it returns once the first pass is done. Only the
        leader writes its store on its own; a follower's store gets the topics
        through replication."""
        if self._leading:
            raise RuntimeError("run_leader_duties is already running")
        self._leading = True
        try:
            async with trio.open_nursery() as nursery:
                if not await self._pass(write=True):
                    self._dirty.set()  # (logged; retried by the loop)
                task_status.started()
                nursery.start_soon(self._recheck_ahead)
                await self._materializer(write=True)
        finally:
            self._leading = False
            self._dirty_placements.set()  # the placements loop takes over

    def _topics_changed(self, _change: object) -> None:
        self._dirty.set()
        self._dirty_placements.set()

    def _sees_itself(self) -> bool:
        state = self._view.groups().get(self.group)
        return state is not None and any(b.broker_id == self.broker_id for b in state.brokers)

    # ------------------------------------------------------------------ incarnation
    async def _ensure_incarnation(self) -> None:
        """Return once the view holds the cluster's incarnation record, creating it
        (create-if-absent: of brokers racing, one id wins) while etcd has none: at
        the first start of a cluster, and after etcd lost its data. An etcd error is
        logged and retried after a pause."""
        view = self._view
        while view.incarnation is None:
            record = ClusterRecord(uuid.uuid4().hex, int(time.time() * 1000))
            try:
                if await self._etcd.create(CLUSTER_KEY, encode_cluster(record)):
                    log.info("cluster: new cluster incarnation %s", record.id)
            except ClusterUnavailable as exc:
                _errors.log(logging.WARNING, "incarnation", "cluster: creating the incarnation record failed "
                            "(retrying): %s", exc)  # fmt: skip
                await trio.sleep(_RETRY_PAUSE)
                continue
            with trio.move_on_after(_RETRY_PAUSE):  # the watch brings it (or a reload does)
                await view.wait_for(lambda: view.incarnation is not None)

    async def _keep_incarnation(self) -> None:
        """For the node's life: whenever the view finds no incarnation record (etcd
        lost its data, or the key was deleted), create one (:meth:`_ensure_incarnation`)."""
        view = self._view
        while True:
            await view.wait_for(lambda: view.incarnation is None)
            await self._ensure_incarnation()

    async def _renew_incarnation(self) -> None:
        """For the node's life: when etcd went back to an older state with the
        incarnation record this broker held (restored from a backup: the same id,
        revisions behind what clients hold), replace the record with a new id, so
        clients take the restored etcd's route tables instead of refusing them as
        old. Of brokers racing, one replacement wins (compare-and-swap on the record
        they saw); an etcd error is logged and retried after a pause."""
        while True:
            await self._rolled_back.wait()
            self._rolled_back = trio.Event()
            stale = self._stale_incarnation
            while stale is not None:
                try:
                    kv = await self._etcd.get(CLUSTER_KEY)
                    if kv is None or decode_cluster(kv.value).id != stale:
                        break  # gone (recreated by _keep_incarnation), or renewed by another broker
                    record = ClusterRecord(uuid.uuid4().hex, int(time.time() * 1000))
                    if await self._etcd.replace(CLUSTER_KEY, encode_cluster(record), kv.mod_revision):
                        log.warning("cluster: etcd went back to an older state: new cluster incarnation %s "
                                    "(clients take its route tables)", record.id)  # fmt: skip
                    break
                except ClusterUnavailable as exc:
                    _errors.log(logging.WARNING, "incarnation", "cluster: renewing the incarnation record failed "
                                "(retrying): %s", exc)  # fmt: skip
                    await trio.sleep(_RETRY_PAUSE)
                except ClusterDataInvalid:  # a record that does not decode: left as it is
                    break

    # ------------------------------------------------------------------ materializer
    async def _materializer(self, *, write: bool) -> None:
        """Take every topic change the view sees, forever (a failed pass is retried
        after a pause): into the local store too with ``write`` (the leader's loop,
        run by :meth:`run_leader_duties`), into the placements only otherwise (the
        loop :meth:`serving` runs, which skips its passes while the leader's runs)."""
        while True:
            dirty = self._dirty if write else self._dirty_placements
            await dirty.wait()
            if write:
                self._dirty = trio.Event()
            else:
                self._dirty_placements = trio.Event()
                if self._leading:
                    continue
            if not await self._pass(write=write):
                await trio.sleep(_RETRY_PAUSE)
                (self._dirty if write else self._dirty_placements).set()

    async def _recheck_ahead(self) -> None:
        """Wake a pass after each view change while a placement this broker is ahead
        of the view with is missing from it: a topic created here and deleted before
        the view saw it (both in one batch, or while it was reloading) changes no
        topic of the view, yet must be dropped (the pass asks etcd)."""
        view = self._view
        while True:
            await view.wait_for(partial(self._ahead_unseen, view.snapshot))
            self._dirty.set()

    def _ahead_unseen(self, since: object) -> bool:
        """Whether the view changed since the snapshot ``since`` and lacks a topic of ``_ahead``."""
        view = self._view
        return view.snapshot is not since and any(name not in view.topics() for name in self._ahead)

    async def _pass(self, *, write: bool) -> bool:
        """Bring ``owned`` and the placements in line with the view (plus what this
        broker is ahead of it with), and with ``write`` the local store too. False
        when a write failed (logged)."""
        async with self._lock:
            view = dict(self._view.topics())
            dropped: set[str] = set()
            for name, p in list(self._ahead.items()):
                seen = view.get(name)
                if seen is None:  # the view lags, or never saw it: created and deleted
                    try:  # while it was reloading (then no event will ever remove it)
                        found = await self._view.lookup(name)
                    except ClusterUnavailable:
                        continue  # kept until etcd answers
                    if self._ahead.get(name) is not p:
                        continue  # changed while etcd answered (a delete_topic or _learn)
                    if found is None:
                        del self._ahead[name]
                        dropped.add(name)
                    elif found.created_ms > p.created_ms:
                        self._ahead[name] = found  # a later incarnation
                    continue
                if (
                    seen.created_ms > p.created_ms or (seen.created_ms == p.created_ms and seen.queues >= p.queues)
                ):
                    del self._ahead[name]  # the view caught up (or shows a later incarnation)
            merged = {**view, **self._ahead}
            # deleted in etcd: seen by the view and gone, or (first pass) made from etcd
            # before this start and no longer there
            gone = ((self._seen if self._seen is not None else set(self._made_from)) - set(view)) | dropped
            revision = self._view.revision
            if revision < self._revision:
                self._etcd_replaced(revision, view)
                gone = set()
            elif self._view.incarnation:
                self._incarnation_seen = self._view.incarnation
            self._revision = revision
            if self._seen is None:
                stray = sorted(set(self._store.topics) - set(merged) - set(self._made_from))
                if stray:
                    log.warning(
                        "cluster: %d local topic(s) unknown to etcd are kept but not served: %s",
                        len(stray), ", ".join(stray[:20]),
                    )  # fmt: skip
            self._placements = merged
            self.owned = {name: frozenset(p.queues_of(self.group)) for name, p in merged.items()}
            if not write:
                if not self._following():  # the leader's first pass compares with the store
                    self._wake()
                    return True
                # the leader materializes what etcd says and replication brings it: the
                # local copies are the view's (as this broker knows when it leads later)
                for name in gone - set(merged):
                    self._made_from.pop(name, None)
                self._made_from.update({name: p.created_ms for name, p in merged.items()})
                return await self._settle(set(view))
            try:
                for name in sorted(gone - set(merged)):
                    if name in self._store.topics:
                        await self._submit(DeleteTopicOp(name))
                        log.info("cluster: topic %s deleted in etcd: deleted here", name)
                    self._made_from.pop(name, None)
                for p in merged.values():
                    await self._apply(p)
            except (EQueueError, OSError) as exc:
                _errors.log(logging.ERROR, "materialize", "cluster: materializing failed (retrying): %s", exc)
                self._wake()
                return False
            return await self._settle(set(view))  # (after a failure, the next pass deletes again)

    async def _settle(self, seen: set[str]) -> bool:
        """End a pass: persist what the local copies were made from, remember the
        names seen, wake the waiters. False when the file could not be written."""
        try:
            await self._persist()
        except OSError as exc:
            _errors.log(logging.ERROR, "materialize", "cluster: saving %s failed (retrying): %s", MATERIALIZED_FILE, exc)
            self._wake()
            return False
        self._seen = seen
        self._wake()
        return True

    def _following(self) -> bool:
        """Whether another broker leads this group now (this one follows it)."""
        election = self.election
        return election is not None and election.state.leader_id not in (None, self.broker_id)

    def _etcd_replaced(self, revision: int, known: Mapping[str, TopicPlacement]) -> None:
        """The view's revision is behind one this broker followed: etcd lost its data
        (or is another etcd). Its missing topics are kept here, not served, never
        deleted: they turn into stray local topics. A topic it has again (created
        anew since) takes the local copy as it is: nothing is deleted."""
        lost = sorted(set(self._made_from) - set(known))
        for name in lost:
            del self._made_from[name]
        for name in self._made_from:
            self._made_from[name] = known[name].created_ms
        self._seen = None
        held = self._view.incarnation
        if held and held == self._incarnation_seen:  # restored from a backup: same record, older revisions
            self._stale_incarnation = held
            self._rolled_back.set()
        log.error(
            "cluster: etcd's revision went back from %d to %d: its data was lost or it is another etcd; "
            "%d local topic(s) it lacks are kept but not served: %s",
            self._revision, revision, len(lost), ", ".join(lost[:20]),
        )  # fmt: skip

    async def _persist(self) -> None:
        """Save the revision and ``_made_from`` when they changed (raises OSError)."""
        state = (self._revision, dict(self._made_from))
        if state != self._saved:
            await trio.to_thread.run_sync(save_materialized, self._config.data_dir, *state)
            self._saved = state

    def _wake(self) -> None:
        self._passed.set()
        self._passed = trio.Event()

    async def _apply(self, p: TopicPlacement) -> None:
        """Create or grow the local topic of ``p`` and give it ``p``'s retention. A
        local copy materialized from an earlier incarnation of the topic (deleted and
        created again in etcd, possibly in one batch) is deleted first."""
        local = self._store.topics.get(p.name)
        made_from = self._made_from.get(p.name, p.created_ms)
        if local is not None and made_from != p.created_ms:
            await self._submit(DeleteTopicOp(p.name))
            log.info("cluster: topic %s was deleted and created again in etcd: recreated here", p.name)
            local = None
        self._made_from[p.name] = p.created_ms
        if local is None:
            await self._submit(
                CreateTopicOp(p.name, p.queues, p.retention_ms, p.retention_bytes, True, p.compression)
            )
            return
        if local.queues > p.queues:
            _errors.log(
                logging.WARNING, f"more:{p.name}",
                "cluster: local topic %s has %d queues, etcd %d (a stale copy?): kept", p.name, local.queues, p.queues,
            )  # fmt: skip
        grow = p.queues if local.queues < p.queues else None
        rms = p.retention_ms if local.retention_ms != p.retention_ms else None
        rbytes = p.retention_bytes if local.retention_bytes != p.retention_bytes else None
        reset = tuple(
            name
            for name, mine, wanted in (
                ("retention_ms", local.retention_ms, p.retention_ms),
                ("retention_bytes", local.retention_bytes, p.retention_bytes),
                ("compression", local.compression, p.compression),
            )
            if mine is not None and wanted is None
        )
        codec = p.compression if local.compression != p.compression else None
        if grow is not None or rms is not None or rbytes is not None or codec is not None or reset:
            await self._submit(AlterTopicOp(p.name, grow, rms, rbytes, reset, codec))

    async def _follow(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` (checked after each materializer pass). Raises
        ClusterUnavailable when the local store has not followed in FOLLOW_TIMEOUT."""
        with trio.move_on_after(FOLLOW_TIMEOUT):
            while not done():
                await self._passed.wait()
            return
        raise ClusterUnavailable(
            f"etcd has the change but this broker has not applied it within {FOLLOW_TIMEOUT:g} s; retry"
        )

    async def _learn(self, p: TopicPlacement) -> control.TopicInfo:
        """Take ``p`` (just written or looked up in etcd) ahead of the view, apply it
        to the local store, and return the local topic."""
        async with self._lock:
            current = self._placements.get(p.name)
            if current is None or current.created_ms < p.created_ms or current.queues <= p.queues:
                self._ahead[p.name] = p
                self._placements = {**self._placements, p.name: p}
                self.owned = {**self.owned, p.name: frozenset(p.queues_of(self.group))}
            p = self._placements[p.name]  # (a later incarnation the view has wins)
            if not self._leading:  # the leader materializes it; replication brings it here
                info = self._store.topics.get(p.name)
                if info is not None and info.queues >= p.queues:
                    return info
                return control.TopicInfo(
                    p.name, 0, p.queues, p.created_ms, p.retention_ms, p.retention_bytes, compression=p.compression
                )
            await self._apply(p)
            await self._persist()
        info = self._store.topics.get(p.name)
        if info is None or info.queues < p.queues:
            raise TopicNotFound(f"topic {p.name!r} was deleted")
        return info

    @property
    def view(self) -> ClusterView:
        """The watched view of the cluster (set while :meth:`serving`)."""
        return self._view

    # ------------------------------------------------------------------ replicas
    def replicas(self) -> frozenset[str]:
        """The broker ids registered in this broker's group now (under a live etcd
        lease, as the view last saw them), this broker included."""
        state = self._view.groups().get(self.group) if self._view is not None else None
        return frozenset(b.broker_id for b in state.brokers) if state is not None else frozenset()

    async def recover(self, req: control.ClusterRecover) -> None:
        """CLUSTER_RECOVER (docs/cluster.md, "When etcd loses its data"): write this
        group's ISR record ``{req.epoch, req.members}`` where etcd has none, or one at
        an older epoch, and no leader. Raises BadRequest when the request is for
        another group, names no or unregistered members, or an epoch below this
        replica's store's; when etcd holds a leader or a record at that epoch or
        later (nothing to recover). Raises ClusterUnavailable."""
        if req.group != self.group:
            raise BadRequest(f"this broker is a replica of group {self.group!r}, not {req.group!r}: ask one of "
                             f"{req.group!r}'s replicas")  # fmt: skip
        if not req.members:
            raise BadRequest("name the replica to lead (members must not be empty)")
        unknown = sorted(set(req.members) - self.replicas())
        if unknown:
            raise BadRequest(f"not registered in group {self.group!r}: {', '.join(unknown)}")
        floor = self._floor_epoch()
        if req.epoch < floor:
            raise BadRequest(f"epoch {req.epoch} is below this replica's last epoch {floor}: an epoch would be "
                             "used twice")  # fmt: skip
        if not await self.election.recover(req.epoch, req.members):
            raise BadRequest(f"etcd has a leader of group {self.group!r}, or an ISR record at epoch {req.epoch} "
                             "or later: nothing to recover")  # fmt: skip

    def check_replica(self, broker_id: str, proof: bytes, peer: str = "?") -> None:
        """Accept a replication request only from another broker of this group that
        is registered under a live lease and whose ``proof`` hashes to the digest of
        its registration. Raises NotAReplica otherwise (logged, rate-limited: a
        forged request is worth an operator's look)."""
        state = self._view.groups().get(self.group) if self._view is not None else None
        record = next((b for b in state.brokers if b.broker_id == broker_id), None) if state is not None else None
        if broker_id == self.broker_id:
            why = "it names this broker itself"
        elif record is None:
            why = "no broker of that id is registered in the group (its etcd lease ended, or it never registered)"
        elif not record.proof_sha256:
            why = "its registration carries no proof (a broker from before replica proofs: upgrade it)"
        elif not hmac.compare_digest(hashlib.sha256(proof).hexdigest(), record.proof_sha256):
            why = "its proof does not match that broker's registration"
        else:
            return
        self._impostors.log(logging.WARNING, broker_id, "group %s: replication request from %s refused "
                            "(broker id %r): %s", self.group, peer, broker_id, why)  # fmt: skip
        raise NotAReplica(f"replication request refused: broker {broker_id!r} is not a replica of group "
                          f"{self.group!r} that this leader can verify: {why}")  # fmt: skip

    # ------------------------------------------------------------------ ClusterRole
    def owner_of(self, topic: str, queue_id: int) -> str:
        p = self._placements.get(topic)
        return p.owners[queue_id] if p is not None and 0 <= queue_id < p.queues else ""

    def refuse(self, topic: str, queue_id: int) -> None:
        p = self._placements.get(topic)
        if p is None:
            raise TopicNotFound(f"no topic {topic!r} in the cluster (create it with: equeue topic create {topic})")
        owner = self.owner_of(topic, queue_id)
        if not owner:  # the local copy has more queues than the cluster's topic
            raise QueueNotFound(f"topic {topic!r} has {p.queues} queues in the cluster; no queue {queue_id}")
        if owner == self.group:
            return
        if self._view.address_of(owner) is None:
            raise QueueUnavailable(
                f"queue {topic}/{queue_id} is owned by broker group {owner!r}, which has no live broker now"
            )
        raise NotOwner(
            f"queue {topic}/{queue_id} is owned by broker group {owner!r}, not {self.group!r}: refresh routes"
        )

    async def require(self, name: str, create_queues: int | None) -> control.TopicInfo:
        p = self._placements.get(name)
        if p is None and not self._recently_absent(name):
            p = await self._view.lookup(name)
            if p is None:
                self._note_absent(name)
        if p is None and create_queues is not None:
            p = await self._writes.create_topic(name, create_queues, exist_ok=True)
            log.info("auto-created topic %s in the cluster: %d queues", name, p.queues)
        if p is None:
            raise TopicNotFound(f"no topic {name!r} (create it with: equeue topic create {name})")
        return await self._learn(p)

    def _recently_absent(self, name: str) -> bool:
        """Whether etcd did not have ``name`` less than ABSENT_TTL ago (requests for
        unknown topics then cost no etcd read each: the watch brings a new topic)."""
        since = self._absent.get(name)
        return since is not None and trio.current_time() - since < ABSENT_TTL

    def _note_absent(self, name: str) -> None:
        if len(self._absent) >= _ABSENT_MAX:
            self._absent.clear()
        self._absent[name] = trio.current_time()

    async def create_topic(self, req: control.CreateTopic) -> control.TopicInfo:
        p = await self._writes.create_topic(
            req.name, req.queues, req.retention_ms, req.retention_bytes, exist_ok=req.exist_ok,
            compression=req.compression,
        )  # fmt: skip
        return await self._learn(p)

    async def alter_topic(self, req: control.AlterTopic) -> control.TopicInfo:
        p = await self._writes.alter_topic(
            req.name, req.queues, req.retention_ms, req.retention_bytes, req.reset, req.compression
        )
        return await self._learn(p)

    async def delete_topic(self, name: str) -> None:
        if not await self._writes.delete_topic(name):
            if name in self._store.topics and name not in self._placements:
                await self._submit(DeleteTopicOp(name))  # a stray local copy: the one way to drop it
                return
            raise TopicNotFound(f"no topic {name!r}")
        self._ahead.pop(name, None)
        await self._follow(lambda: self._view.topic(name) is None)  # the view saw the delete
        async with self._lock:
            if name in self._placements:
                self._placements = {k: v for k, v in self._placements.items() if k != name}
                self.owned = {k: v for k, v in self.owned.items() if k != name}
            self._made_from.pop(name, None)
            if name in self._store.topics:
                await self._submit(DeleteTopicOp(name))
            await self._persist()

    async def own_queue(self, topic: str, origin_queue: int) -> tuple[control.TopicInfo, int]:
        p = self._placements.get(topic) or await self._view.lookup(topic)
        if p is None:
            p = await self._writes.create_topic(topic, self._default_queues, exist_ok=True)
        if not p.queues_of(self.group):
            p = await self._writes.ensure_queue_on(topic, self.group)
            log.info("cluster: placed a queue of %s on group %s (retries stay in their group)", topic, self.group)
        info = await self._learn(p)
        mine = p.queues_of(self.group)
        return info, mine[origin_queue % len(mine)]

    def route_table(self, topics: list[control.TopicInfo], missing: list[str]) -> control.RouteTable:
        """GET_ROUTES' answer from the view: per group its leader's address (where
        requests go) and every registered replica's (where routes may be fetched),
        the placements of ``topics``, and the cluster's incarnation ("" while etcd's
        record is missing or does not decode). Raises ClusterUnavailable while this
        broker is cut off from etcd (no lease renewal in the fence window): its view
        may be stale (naming a dead leader), and the client asks another broker."""
        election = self.election
        if election is not None and election.cut_off():
            raise ClusterUnavailable(
                f"broker {self.broker_id} has not reached etcd lately: its routes may be stale; ask another broker"
            )
        view = self._view
        groups = [
            control.GroupRoute(name, state.addresses, state.replica_addresses)
            for name, state in sorted(view.groups().items())
        ]
        routes = []
        for info in topics:
            p = self._placements.get(info.name)
            if p is None:
                missing.append(info.name)
                continue
            routes.append(control.TopicRoute(attrs.evolve(info, queues=p.queues), list(p.owners)))
        return control.RouteTable(True, view.revision, groups, routes, missing, view.incarnation or "")

    # ------------------------------------------------------------------ pauses
    def paused(self, kind: str) -> frozenset[str]:
        """The names of ``kind`` ("topic", "group") paused in etcd, as the view has them."""
        snap = self._view.snapshot
        return snap.paused_topics if kind == "topic" else snap.paused_groups

    def on_pauses(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after each change of the paused names (the view's)."""
        return self._view.on_pauses(callback)

    async def set_paused(self, kind: str, name: str, paused: bool) -> bool:
        """Write (pause) or delete (resume) the ``paused/`` record of ``name``; return
        once this broker's view shows it (other broker groups' views follow within a
        watch round trip). True when it changed something. A topic's pause is written
        only while etcd has its placement (one transaction: it cannot outlive a
        concurrent delete). Raises TopicNotFound (pausing a topic etcd does not
        have), ClusterUnavailable."""
        key = pause_key(kind, name)
        if paused:
            record = encode_pause(PauseRecord(kind, name, int(time.time() * 1000)))
            if kind == "topic":
                changed = await self._writes.pause_topic(name, record)
            else:
                changed = await self._etcd.create(key, record)
        else:
            changed = await self._etcd.delete(key)
        with trio.move_on_after(FOLLOW_TIMEOUT):
            await self._view.wait_for(lambda: (name in self.paused(kind)) == paused)
            return changed
        raise ClusterUnavailable(
            f"etcd has the {'pause' if paused else 'resume'} but this broker's view has not shown it "
            f"within {FOLLOW_TIMEOUT:g} s; retry"
        )

    async def status(self) -> control.ClusterStatus:
        etcd_ok = False
        with trio.move_on_after(2.0):
            try:
                await self._etcd.status()
                etcd_ok = True
            except ClusterUnavailable:
                pass
        view = self._view
        placements = sorted(self._placements.values(), key=lambda p: p.name)
        groups = []
        for g, state in sorted(view.groups().items()):
            topics = {p.name: qs for p in placements if (qs := p.queues_of(g))}
            members = [control.BrokerStatus(b.broker_id, b.group, b.address, b.started_ms, True) for b in state.brokers]
            leader, isr = state.leader, state.isr
            groups.append(
                control.GroupStatus(
                    g, members, sum(map(len, topics.values())), topics, bool(state.addresses),
                    leader=leader.broker_id if leader else "",
                    epoch=leader.epoch if leader else (isr.epoch if isr else 0),
                    isr=list(isr.members) if isr else [],
                )
            )  # fmt: skip
        return control.ClusterStatus(True, self.group, self.broker_id, self.endpoints, etcd_ok, view.revision, groups)

