"""The broker's in-memory copy of the cluster's records (``/equeue/`` in etcd).

Loaded with one range read, then kept current by a prefix watch from the read's
revision + 1, so no change is ever missed: when the watch breaks (etcd restarted,
history compacted) the view reads everything again and watches from the new
revision. Readers see an immutable :class:`Snapshot`, swapped whole after each
batch of changes (like the store's view), so a request handler never sees half a
change and needs no lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from types import MappingProxyType

import attrs
import trio

from equeue.broker.cluster.etcd import EtcdClient, KeyValue, WatchEvent
from equeue.client.lifetime import StackOwner, enter_cancelled_nursery
from equeue.errors import ClusterDataInvalid, ClusterUnavailable
from equeue.logs import RateLimitedLog
from equeue.placement import (
    ROOT,
    BrokerRecord,
    GroupRecord,
    IsrRecord,
    LeaderRecord,
    PauseRecord,
    TopicPlacement,
    decode_broker,
    decode_cluster,
    decode_group,
    decode_isr,
    decode_leader,
    decode_pause,
    decode_topic,
    load,
    parse_key,
    topic_key,
)

__all__ = ["ClusterView", "GroupState", "Snapshot", "TopicChange"]

log = logging.getLogger("equeue.cluster.view")

#: back-off between reload attempts while etcd is unreachable (seconds)
_RETRY_MIN, _RETRY_MAX = 0.1, 2.0
#: seconds between reminders that etcd is still unreachable
_OUTAGE_REMINDER = 30.0


@attrs.frozen
class GroupState:
    """A broker group, its registered brokers (its replicas, sorted by id), its
    leader and its in-sync set. A group with no broker is down: its queues are
    unavailable until a broker registers; one with brokers but no leader is
    unavailable until one takes over."""

    name: str
    brokers: tuple[BrokerRecord, ...] = ()
    record: GroupRecord | None = None
    leader: LeaderRecord | None = None
    isr: IsrRecord | None = None

    @property
    def live(self) -> bool:
        return bool(self.brokers)

    @property
    def addresses(self) -> list[str]:
        """Where clients send this group's requests: ``[the leader's address]``, or
        ``[]`` while it has none. A group that never held an election (no leader
        nor ISR record) with exactly one broker gives that broker (a group of
        one broker without replicas; a group's first broker bootstraps its election)."""
        if self.leader is not None:
            return [self.leader.address]
        if self.isr is None and len(self.brokers) == 1:
            return [self.brokers[0].address]
        return []

    @property
    def replica_addresses(self) -> list[str]:
        """The client addresses of every registered broker (leader and followers),
        each once, in broker id order: any of them answers GET_ROUTES."""
        return list(dict.fromkeys(b.address for b in self.brokers))


@attrs.frozen
class TopicChange:
    """Topics created or altered (their new placement) and deleted (names) by one
    batch of etcd changes, or found different by a reload. Deletions come first: a
    name in both was deleted and created again (drop the old topic's data, then
    create the new one)."""

    changed: tuple[TopicPlacement, ...] = ()
    deleted: tuple[str, ...] = ()


@attrs.frozen
class Snapshot:
    """One consistent state of the cluster as of etcd ``revision``. ``incarnation``
    is the id of etcd's :class:`~equeue.placement.ClusterRecord`: None while etcd
    holds none, "" for one that does not decode (logged)."""

    revision: int = 0
    groups: Mapping[str, GroupState] = MappingProxyType({})
    topics: Mapping[str, TopicPlacement] = MappingProxyType({})
    incarnation: str | None = None
    #: the topics and consumer groups an operator paused (``paused/`` records)
    paused_topics: frozenset[str] = frozenset()
    paused_groups: frozenset[str] = frozenset()


class ClusterView(StackOwner):
    """``async with ClusterView(etcd) as view: await view.ready.wait()``.

    Entering starts the load-and-watch task in the view's own nursery and returns at
    once; ``ready`` is set after the first load (before it, the view is empty).
    Topic changes reach the broker through callbacks registered with
    :meth:`on_topics`: each is called synchronously on the trio loop, after the
    snapshot was swapped, with a :class:`TopicChange`; it must not block (start a
    task to do slow work); an exception it raises is logged and does not stop the
    view. A (re)load reports what differs from before: the first load reports every
    topic as changed. Accessors read the current snapshot and never raise.
    """

    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self.snapshot = Snapshot()
        self.ready = trio.Event()
        #: how many times the view (re)loaded everything from etcd
        self.loads = 0
        self._group_records: dict[str, GroupRecord] = {}
        self._brokers: dict[tuple[str, str], BrokerRecord] = {}
        self._leaders: dict[str, LeaderRecord] = {}
        self._isrs: dict[str, IsrRecord] = {}
        #: the cluster record: absent (None), or its id ("": it does not decode)
        self._incarnation: str | None = None
        self._topics: dict[str, TopicPlacement] = {}
        self._topic_revs: dict[str, int] = {}  # mod_revision of each topic's record
        self._listeners: list[Callable[[TopicChange], None]] = []
        #: (kind, name) -> the pause record
        self._pauses: dict[tuple[str, str], PauseRecord] = {}
        self._pause_listeners: list[Callable[[], None]] = []
        self._changed = trio.Event()  # set and replaced on every snapshot swap
        self._bad = RateLimitedLog(log, 30.0, trio.current_time)
        self._outage_since: float | None = None
        self._reminded = 0.0
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        self._nursery = await enter_cancelled_nursery(stack)
        self._nursery.start_soon(self._run, name="cluster view")

    # ------------------------------------------------------------------ reading
    @property
    def revision(self) -> int:
        return self.snapshot.revision

    @property
    def incarnation(self) -> str | None:
        """The id of the cluster's incarnation record (see :class:`Snapshot`)."""
        return self.snapshot.incarnation

    def groups(self) -> Mapping[str, GroupState]:
        """Every known group (from its record or its brokers), live or down."""
        return self.snapshot.groups

    def live_groups(self) -> list[str]:
        """Names of the groups with at least one registered broker, sorted."""
        return [name for name, g in self.snapshot.groups.items() if g.live]

    def topics(self) -> Mapping[str, TopicPlacement]:
        return self.snapshot.topics

    def topic(self, name: str) -> TopicPlacement | None:
        return self.snapshot.topics.get(name)

    def owner(self, topic: str, queue_id: int) -> str | None:
        """The group owning ``queue_id`` of ``topic``; None for an unknown topic or queue."""
        placement = self.snapshot.topics.get(topic)
        if placement is None or not 0 <= queue_id < placement.queues:
            return None
        return placement.owners[queue_id]

    def address_of(self, group: str) -> str | None:
        """The address that serves ``group`` (:attr:`GroupState.addresses`: its
        leader's); None when the group is down, has no leader, or is unknown."""
        state = self.snapshot.groups.get(group)
        addresses = state.addresses if state is not None else []
        return addresses[0] if addresses else None

    def load(self) -> dict[str, int]:
        """Queues owned per group across all topics (the placement rules' input)."""
        return load(self.snapshot.topics.values())

    async def lookup(self, name: str) -> TopicPlacement | None:
        """The topic's placement, read from etcd when the view does not know it yet
        (a produce may reach the owner before the watch brought the new topic); a
        record found that way is added to the view. Raises ClusterUnavailable
        (etcd unreachable) or ClusterDataInvalid (the record does not decode)."""
        placement = self.snapshot.topics.get(name)
        if placement is not None:
            return placement
        kv = await self._etcd.get(topic_key(name))
        if kv is None:
            return None
        placement = decode_topic(kv.value)
        # cache it unless the watch is already past this revision (then the topic was
        # deleted since, or is cached already); the watch's later events still apply
        if kv.mod_revision > self.snapshot.revision and kv.mod_revision > self._topic_revs.get(
            name, 0
        ):
            self._topics[name] = placement
            self._topic_revs[name] = kv.mod_revision
            self._swap(
                self.snapshot.revision,
                topics_changed=True,
                change=TopicChange(changed=(placement,)),
            )
        return placement

    async def wait_for(self, predicate: Callable[[], object]) -> None:
        """Return once ``predicate()`` is truthy, re-checking after every change (no
        polling). Bound it with a cancel scope."""
        while not predicate():
            await self._changed.wait()

    def on_topics(self, callback: Callable[[TopicChange], None]) -> Callable[[], None]:
        """Call ``callback`` after each change of topics (see the class docstring);
        returns a function that unregisters it."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def on_pauses(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously, on the loop, after the swap) each time the
        paused topics or groups change; returns a function that unregisters it."""
        self._pause_listeners.append(callback)
        return lambda: self._pause_listeners.remove(callback) if callback in self._pause_listeners else None

    # ------------------------------------------------------------------ the task
    async def _run(self) -> None:
        retry = _RETRY_MIN
        while True:
            try:
                kvs, revision = await self._etcd.get_prefix(ROOT)
                self._reload(kvs, revision)
                self._reachable()
                retry = _RETRY_MIN
                async with self._etcd.watch_prefix(ROOT, revision + 1) as stream:
                    async for batch in stream:
                        self._apply(batch)
            except ClusterUnavailable as exc:  # WatchCompacted and a broken stream too
                self._unreachable(exc)
                await trio.sleep(retry)
                retry = min(retry * 2, _RETRY_MAX)

    def _reload(self, kvs: list[KeyValue], revision: int) -> None:
        old = dict(self._topics)
        self._group_records.clear()
        self._brokers.clear()
        self._leaders.clear()
        self._isrs.clear()
        self._incarnation = None
        self._topics.clear()
        self._topic_revs.clear()
        self._pauses.clear()
        for kv in kvs:
            self._put(kv)
        changed = tuple(p for name, p in self._topics.items() if old.get(name) != p)
        # gone, or deleted and created again while the watch was down (a new created_ms)
        deleted = tuple(
            name
            for name, p in old.items()
            if name not in self._topics or self._topics[name].created_ms != p.created_ms
        )
        self.loads += 1
        self._swap(revision, topics_changed=True, change=TopicChange(changed, deleted))
        self.ready.set()

    def _apply(self, batch: list[WatchEvent]) -> None:
        changed: dict[str, TopicPlacement] = {}
        deleted: list[str] = []
        topics_touched = False
        for event in batch:
            parsed = parse_key(event.kv.key)
            if parsed is None:
                continue
            kind, names = parsed
            if kind == "topic":
                topics_touched = True
                name = names[0]
                if event.kind == "delete":
                    if event.revision < self._topic_revs.get(name, 0):
                        continue  # lookup() cached a later re-creation already
                    if self._topics.pop(name, None) is not None:
                        deleted.append(name)
                    self._topic_revs.pop(name, None)
                    changed.pop(name, None)
                elif self._put(event.kv):
                    changed[name] = self._topics[name]
            elif event.kind == "delete":
                if kind == "group":
                    self._group_records.pop(names[0], None)
                elif kind == "leader":
                    self._leaders.pop(names[0], None)
                elif kind == "isr":
                    self._isrs.pop(names[0], None)
                elif kind == "cluster":
                    self._incarnation = None
                elif kind == "paused":
                    self._pauses.pop((names[0], names[1]), None)
                else:
                    self._brokers.pop((names[0], names[1]), None)
            else:
                self._put(event.kv)
        revision = max((e.revision for e in batch), default=self.snapshot.revision)
        change = TopicChange(tuple(changed.values()), tuple(deleted))
        self._swap(
            max(revision, self.snapshot.revision), topics_changed=topics_touched, change=change
        )

    def _put(self, kv: KeyValue) -> bool:
        """Take in one record; False when it was skipped (not ours, does not decode,
        or older than what the view has)."""
        parsed = parse_key(kv.key)
        if parsed is None:
            return False
        kind, names = parsed
        if kind == "cluster":
            self._incarnation = ""  # (a record that does not decode still exists)
        if kind == "paused":  # the key is the pause: honoured even when its value does not decode
            try:
                record = decode_pause(kv.value)
            except ClusterDataInvalid as exc:
                self._bad.log(logging.WARNING, kv.key, "%s: %s (the pause holds)", kv.key, exc)
                record = PauseRecord(names[0], names[1], 0)
            self._pauses[(names[0], names[1])] = record
            return True
        try:
            if kind == "cluster":
                self._incarnation = decode_cluster(kv.value).id
            elif kind == "group":
                self._group_records[names[0]] = decode_group(kv.value)
            elif kind == "broker":
                self._brokers[(names[0], names[1])] = decode_broker(kv.value)
            elif kind == "leader":
                self._leaders[names[0]] = decode_leader(kv.value)
            elif kind == "isr":
                self._isrs[names[0]] = decode_isr(kv.value)
            else:
                if kv.mod_revision <= self._topic_revs.get(names[0], 0):
                    return False  # lookup() cached this or a newer version already
                self._topics[names[0]] = decode_topic(kv.value)
                self._topic_revs[names[0]] = kv.mod_revision
        except ClusterDataInvalid as exc:
            # keep what the view had: a topic's queues never move, so the last good
            # placement is still right for the queues it names
            self._bad.log(logging.WARNING, kv.key, "skipping %s: %s", kv.key, exc)
            return False
        return True

    def _swap(self, revision: int, *, topics_changed: bool, change: TopicChange) -> None:
        members: dict[str, list[BrokerRecord]] = {name: [] for name in sorted(self._group_records)}
        for (group, _), broker in sorted(self._brokers.items()):
            members.setdefault(group, []).append(broker)
        groups = {
            name: GroupState(
                name,
                tuple(members[name]),
                self._group_records.get(name),
                self._leaders.get(name),
                self._isrs.get(name),
            )
            for name in sorted(members)
        }
        topics = MappingProxyType(dict(self._topics)) if topics_changed else self.snapshot.topics
        old = self.snapshot
        paused_topics = frozenset(name for kind, name in self._pauses if kind == "topic")
        paused_groups = frozenset(name for kind, name in self._pauses if kind == "group")
        self.snapshot = Snapshot(
            revision, MappingProxyType(groups), topics, self._incarnation, paused_topics, paused_groups
        )
        self._changed.set()
        self._changed = trio.Event()
        if (old.paused_topics, old.paused_groups) != (paused_topics, paused_groups):
            for listener in list(self._pause_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("a pause listener failed (the view goes on)")
        if change.changed or change.deleted:
            for callback in list(self._listeners):
                try:
                    callback(change)
                except Exception:
                    log.exception("a topic-change listener failed (the view goes on)")

    def _unreachable(self, exc: ClusterUnavailable) -> None:
        now = trio.current_time()
        if self._outage_since is None:
            self._outage_since = self._reminded = now
            log.warning("cluster view: etcd watch lost, reloading: %s", exc)
        elif now - self._reminded >= _OUTAGE_REMINDER:
            self._reminded = now
            log.warning(
                "cluster view: etcd still unreachable (%.0f s): %s", now - self._outage_since, exc
            )

    def _reachable(self) -> None:
        if self._outage_since is not None:
            log.info("cluster view reloaded after %.1f s", trio.current_time() - self._outage_since)
            self._outage_since = None
