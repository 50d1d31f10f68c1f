"""The client's route table and its per-group connections (docs/cluster.md, "Routing").

A :class:`Router` answers, for every queue of every topic a client uses, which broker
group owns it and which connection reaches that group. It bootstraps from one
:class:`~equeue.client.async_client.AsyncClient` (any broker of the cluster), asks it
GET_ROUTES, and keeps the newest table it saw (:class:`RouteCache`: within one
cluster incarnation a table whose revision is older than the held one never replaces
it; a table of another incarnation, from an etcd that lost its data, does). Group
``""`` is the bootstrap connection: a standalone broker owns every queue as group
``""``, so standalone and cluster clients run one code path. Every other group gets
one ``AsyncClient`` (the bootstrap's security settings, the group's broker
addresses), opened on first use in the router's nursery and closed when the group
leaves the table.

Bootstrapping: the router remembers every broker address the route tables named
(each group's leader and replicas, newest first, at most :data:`MAX_LEARNT` besides
the bootstrap list) and gives them to the bootstrap client after its own addresses
(:meth:`~equeue.client.async_client.AsyncClient.retarget`), so when every bootstrap broker is
dead or does not answer, GET_ROUTES (and whatever else the bootstrap client carries)
reaches another broker of the cluster; any replica answers it, a follower too.

A broker that answers UNKNOWN_REQUEST to GET_ROUTES (an older broker) is treated as
standalone: each topic is looked up with GET_ROUTE and owned by ``""``.

Routes are refreshed every ``refresh_interval`` seconds, at once after
:meth:`Router.invalidate` (coalesced), and by :meth:`Router.call` after NOT_OWNER,
NOT_LEADER, QUEUE_UNAVAILABLE or a broken connection, before it retries at the (new)
owner. Refreshes of one router are never closer than :data:`MIN_REFRESH_INTERVAL`
(a failover's retries poll the routes at that pace, and no faster).

Replicas (docs/cluster.md, "Clients across a failover"): a group's route names its
leader only. When a refresh names another leader, the group's connection is pointed
at it (:meth:`~equeue.client.async_client.AsyncClient.retarget`: requests still pending at the
old leader fail with ConnectionBroken and are retried by their callers). After a
routing error a caller waits with :meth:`Router.settle`: it returns as soon as the
refreshed table names another endpoint for the queue (the new leader), else after
the caller's backoff, so the first retry after a failover leaves within one refresh
interval of the new leader being in the routes.

Errors: :class:`~equeue.errors.TopicNotFound` for a topic the cluster lacks,
:class:`~equeue.errors.QueueNotFound` for a queue id beyond its count,
:class:`~equeue.errors.QueueUnavailable` when the owner group has no live broker,
:class:`~equeue.errors.ConnectionBroken` when no broker answers GET_ROUTES.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import TypeVar

import attrs
import trio

from equeue import control
from equeue.client.async_client import AsyncClient, PushHandler
from equeue.client.lifetime import StackOwner
from equeue.client.retry import DEFAULT_POLICY, RetryPolicy, is_transient
from equeue.errors import (
    ClientClosed,
    ClusterUnavailable,
    ConnectionBroken,
    EQueueError,
    NotLeader,
    NotOwner,
    QueueNotFound,
    QueueUnavailable,
    TopicNotFound,
    UnknownRequest,
)

log = logging.getLogger("equeue.client")

__all__ = [
    "BOOTSTRAP",
    "MAX_LEARNT",
    "MAX_TOPICS_PER_REQUEST",
    "MIN_REFRESH_INTERVAL",
    "ROUTING_ERRORS",
    "Endpoint",
    "RouteCache",
    "Router",
]

T = TypeVar("T")

#: the group name of the bootstrap connection (a standalone broker's only group)
BOOTSTRAP = ""
#: GET_ROUTES names at most this many topics (the broker's limit): more are asked in turns
MAX_TOPICS_PER_REQUEST = 1000
#: errors after which the route table is refreshed before a retry
ROUTING_ERRORS = (NotOwner, NotLeader, QueueUnavailable, ConnectionBroken)
#: seconds: the least time between two route refreshes of one router (what a client
#: asks of the brokers at most while it waits out a failover)
MIN_REFRESH_INTERVAL = 0.15
#: where a queue is served, as the route table says: (owner group, its addresses)
Endpoint = tuple[str, tuple[str, ...]] | None
#: most broker addresses learnt from route tables that the bootstrap client keeps
#: besides its own (the newest tables' first)
MAX_LEARNT = 64


@attrs.define
class RouteCache:
    """The newest route table seen (pure: no I/O; the rules the unit tests check).

    ``merge`` takes an answer to GET_ROUTES for some topics when it is *current*: it
    names a cluster incarnation other than the held one (etcd lost its data: its
    revisions started again), or its revision is at least the held one (an answer
    naming no incarnation, from a broker that predates it, is judged by revision
    alone). A current answer replaces the groups and the topics it names (and drops
    the topics it says are missing); another one only adds topics not held yet (a
    client must route them somewhere) and changes nothing else. The held incarnation
    is the last one a taken answer named."""

    cluster: bool = False
    revision: int = -1
    groups: dict[str, control.GroupRoute] = attrs.Factory(dict)
    topics: dict[str, control.TopicRoute] = attrs.Factory(dict)
    incarnation: str = ""

    def current(self, table: control.RouteTable) -> bool:
        """Whether ``merge`` would take ``table`` (the rule above)."""
        if table.incarnation and table.incarnation != self.incarnation:
            return True
        return table.revision >= self.revision

    def merge(self, table: control.RouteTable) -> bool:
        """Take ``table`` under the rules above; whether it was current."""
        if not self.current(table):
            for t in table.topics:
                self.topics.setdefault(t.info.name, t)
            return False
        self.cluster = table.cluster
        self.revision = table.revision
        self.incarnation = table.incarnation or self.incarnation
        self.groups = {g.name: g for g in table.groups}
        for t in table.topics:
            self.topics[t.info.name] = t
        for name in table.missing:
            self.topics.pop(name, None)
        return True

    def owner(self, topic: str, queue_id: int) -> str | None:
        """The owner group of a queue, or None when the topic or queue is unknown."""
        t = self.topics.get(topic)
        if t is None or not 0 <= queue_id < len(t.owners):
            return None
        return t.owners[queue_id]

    def group_available(self, group: str) -> bool:
        """The bootstrap group always is; another group when it has an address."""
        if group == BOOTSTRAP and not self.cluster:
            return True
        g = self.groups.get(group)
        return g is not None and bool(g.addresses)

    def available(self, topic: str, queue_id: int) -> bool:
        """The queue is known and its owner group has a live broker."""
        owner = self.owner(topic, queue_id)
        return owner is not None and self.group_available(owner)

    def endpoint(self, topic: str, queue_id: int) -> Endpoint:
        """(owner group, its addresses) of a queue; None when the queue is unknown."""
        owner = self.owner(topic, queue_id)
        if owner is None:
            return None
        g = self.groups.get(owner)
        return owner, tuple(g.addresses) if g is not None else ()

    def available_queues(self, topic: str) -> list[int]:
        """The queue ids of ``topic`` whose group is available (ascending)."""
        t = self.topics.get(topic)
        if t is None:
            return []
        return [q for q, g in enumerate(t.owners) if self.group_available(g)]

    def live_groups(self) -> list[str]:
        """Every group with an address (standalone: the bootstrap group)."""
        if not self.cluster:
            return [BOOTSTRAP]
        return sorted(name for name, g in self.groups.items() if g.addresses)

    def brokers(self) -> list[str]:
        """Every broker address the held groups name, each once: the leaders first
        (they surely answered lately), then the other replicas."""
        leaders = [a for _, g in sorted(self.groups.items()) for a in g.addresses]
        replicas = [a for _, g in sorted(self.groups.items()) for a in g.replicas]
        return list(dict.fromkeys([*leaders, *replicas]))

    def table(self) -> control.RouteTable:
        """What is held, as a RouteTable."""
        return control.RouteTable(
            self.cluster,
            max(self.revision, 0),
            list(self.groups.values()),
            list(self.topics.values()),
            incarnation=self.incarnation,
        )


class _GroupClient:
    """One group's connection and the cancel scope of the task that holds it open."""

    __slots__ = ("client", "ready", "scope")

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.scope = trio.CancelScope()
        #: set once the client's ``async with`` is entered (by :meth:`Router._hold`)
        self.ready = trio.Event()


class Router(StackOwner):
    """The route table of one client and a connection per owner group (module docstring).

    ``async with Router(bootstrap, refresh_interval=30.0) as router`` (the bootstrap
    client must already be open). ``on_push`` receives the pushes of the per-group
    connections (the bootstrap client has its own)."""

    def __init__(
        self,
        bootstrap: AsyncClient,
        *,
        refresh_interval: float,
        on_push: PushHandler | None = None,
        policy: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.bootstrap = bootstrap
        #: the bootstrap client's own addresses (tried first, never forgotten)
        self.seeds = [f"{host}:{port}" for host, port in bootstrap.brokers]
        #: broker addresses learnt from route tables (newest first, at most MAX_LEARNT)
        self.learnt: list[str] = []
        self.refresh_interval = refresh_interval
        self.on_push = on_push
        self.policy = policy
        self.cache = RouteCache()
        #: the broker does not know GET_ROUTES: standalone, routes by GET_ROUTE
        self.legacy = False
        self._clients: dict[str, _GroupClient] = {}
        self._listeners: list[Callable[[], None]] = []
        self._nursery: trio.Nursery | None = None
        self._refresh_lock = trio.Lock()
        self._refresh_now = trio.Event()
        #: trio time the last refresh began and the topics it asked for (callers that
        #: asked for some of them before it began reuse it)
        self._last_start = -1.0
        self._last_topics: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(self._closing)
        self._nursery.start_soon(self._refresher)

    def _closing(self) -> None:
        """On exit, before the nursery waits: no new group connection from now on, the
        refresher and the groups' connections cancelled."""
        nursery, self._nursery = self._nursery, None
        if nursery is not None:
            nursery.cancel_scope.cancel()
        self._clients.clear()

    async def aclose(self) -> None:
        """Close every group's connection (the bootstrap client is its owner's to
        close). Nothing is cancelled that could enclose the caller: the refresher
        stops at ``__aexit__``."""
        clients, self._clients = list(self._clients.values()), {}
        for gc in clients:
            await gc.client.aclose()
            gc.scope.cancel()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (loop thread) after every refresh that took a table."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ lookups (no I/O)
    @property
    def cluster(self) -> bool:
        return self.cache.cluster

    def owner(self, topic: str, queue_id: int) -> str | None:
        """The cached owner group of a queue (None: unknown topic or queue)."""
        return self.cache.owner(topic, queue_id)

    def available(self, topic: str, queue_id: int) -> bool:
        """The cached answer to: is the queue's owner group up?"""
        return self.cache.available(topic, queue_id)

    def endpoint(self, topic: str, queue_id: int) -> Endpoint:
        """The cached (owner group, addresses) of a queue (no I/O)."""
        return self.cache.endpoint(topic, queue_id)

    def group_addresses(self) -> dict[str, tuple[str, ...]]:
        """Every group of the held table and its addresses (its leader; () while it
        has none). No I/O."""
        return {name: tuple(g.addresses) for name, g in self.cache.groups.items()}

    def cached(self, topic: str) -> control.TopicRoute | None:
        """The held route of ``topic`` (no I/O)."""
        return self.cache.topics.get(topic)

    # ------------------------------------------------------------------ routes
    async def route(self, topic: str, *, auto_create: bool = False) -> control.TopicRoute:
        """The route of ``topic``: cached, else fetched (GET_ROUTES, creating it with
        ``auto_create`` where the broker allows). Raises TopicNotFound."""
        t = self.cache.topics.get(topic)
        if t is not None:
            return t
        await self._fetch([topic], auto_create)
        t = self.cache.topics.get(topic)
        if t is None:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return t

    async def refresh(self, topics: Iterable[str] | None = None) -> control.RouteTable:
        """Fetch the routes of ``topics`` (None: every topic held) and take them if
        not older than the held table; return the held table. Concurrent callers
        share one refresh. Raises ConnectionBroken when no broker answers."""
        names = sorted(set(self.cache.topics) if topics is None else set(topics))
        asked = trio.current_time()
        async with self._refresh_lock:
            if self._last_start > asked and self._last_topics.issuperset(names):
                return self.cache.table()  # a refresh that began after we asked covered it
            pause = self._last_start + MIN_REFRESH_INTERVAL - trio.current_time()
            if pause > 0:
                await trio.sleep(pause)
            self._last_start = trio.current_time()
            self._last_topics = frozenset(names)
            await self._fetch(names, False)
        return self.cache.table()

    def invalidate(self, topic: str | None = None) -> None:
        """The held route of ``topic`` may be stale: refresh soon (coalesced)."""
        self._refresh_now.set()

    async def _fetch(self, topics: Sequence[str], auto_create: bool) -> None:
        took = False
        for start in range(0, max(len(topics), 1), MAX_TOPICS_PER_REQUEST):
            table = await self._get_routes(topics[start : start + MAX_TOPICS_PER_REQUEST], auto_create)
            took = self.cache.merge(table) or took
        if took:
            self._learn()
            self._sync_clients()
            for listener in list(self._listeners):
                listener()

    def _learn(self) -> None:
        """Remember the broker addresses of the held table (before the ones learnt
        earlier) and let the bootstrap client try them after its own: GET_ROUTES
        still reaches the cluster once every bootstrap broker is gone."""
        seeds = set(self.seeds)
        named = [a for a in self.cache.brokers() if a not in seeds]
        learnt = list(dict.fromkeys([*named, *self.learnt]))[:MAX_LEARNT]
        if learnt != self.learnt:
            self.learnt = learnt
            self.bootstrap.retarget([*self.seeds, *learnt])

    async def _get_routes(self, topics: Sequence[str], auto_create: bool) -> control.RouteTable:
        """GET_ROUTES at the bootstrap client (its own brokers, then the learnt ones:
        :meth:`_learn`), else at any live group's connection."""
        if self.legacy:
            return await self._legacy_routes(topics, auto_create)
        try:
            return await self._ask(self.bootstrap, topics, auto_create)
        except UnknownRequest:
            log.info("the broker does not know GET_ROUTES: routing as standalone")
            self.legacy = True
            return await self._legacy_routes(topics, auto_create)
        except EQueueError as exc:
            if not is_transient(exc):
                raise
            # a broker cut off from etcd refuses (its view may be stale): ask the next ones
            for _ in range(min(len(self.bootstrap.brokers), 3) - 1 if isinstance(exc, ClusterUnavailable) else 0):
                self.bootstrap.drop_connection(f"GET_ROUTES refused: {exc}")
                try:
                    return await self._ask(self.bootstrap, topics, auto_create)
                except EQueueError as other:
                    if not is_transient(other):
                        raise
                    if not isinstance(other, ClusterUnavailable):
                        break
            for name in self.cache.live_groups():
                gc = self._clients.get(name)
                if name == BOOTSTRAP or gc is None:
                    continue
                try:
                    return await self._ask(gc.client, topics, auto_create)
                except EQueueError as other:
                    if not is_transient(other):
                        raise
            raise

    @staticmethod
    async def _ask(client: AsyncClient, topics: Sequence[str], auto_create: bool) -> control.RouteTable:
        """GET_ROUTES at one client, within its connect timeout + 5 s: a broker that does
        not answer (frozen) has its connection dropped, and ConnectionBroken is raised."""
        with trio.move_on_after(client.connect_timeout + 5):
            return await client.get_routes(topics, auto_create)
        client.drop_connection("no answer to GET_ROUTES")
        raise ConnectionBroken("no answer to GET_ROUTES")

    async def _legacy_routes(self, topics: Sequence[str], auto_create: bool) -> control.RouteTable:
        found, missing = [], []
        for name in topics:
            try:
                info = await self.bootstrap.get_route(name, auto_create)
            except TopicNotFound:
                missing.append(name)
                continue
            found.append(control.TopicRoute(info, [BOOTSTRAP] * info.queues))
        return control.RouteTable(False, 0, [], found, missing)

    async def _refresher(self) -> None:
        while True:
            with trio.move_on_after(self.refresh_interval):
                await self._refresh_now.wait()
            self._refresh_now = trio.Event()
            if not self.cache.topics:
                continue
            try:
                await self.refresh()
            except EQueueError as exc:
                log.debug("route refresh failed: %s", exc)

    # ------------------------------------------------------------------ connections
    def _sync_clients(self) -> None:
        """Close the clients of groups gone from the table; point the others at the
        group's current addresses (its leader): a connection to a broker that is no
        longer named (an old leader) is dropped, and so is every connection of a group
        that has no leader now."""
        for name in list(self._clients):
            g = self.cache.groups.get(name)
            if g is None:
                self._clients.pop(name).scope.cancel()
            elif g.addresses:
                self._clients[name].client.retarget(g.addresses)
            else:
                self._clients[name].client.drop_connection(f"broker group {name!r} has no leader")

    def _group_client(self, group: str) -> _GroupClient | None:
        """The client of ``group`` (being opened, if new); None for the bootstrap.
        Raises QueueUnavailable when the group has no live broker."""
        if group == BOOTSTRAP and not self.cache.cluster:
            return None
        g = self.cache.groups.get(group)
        if g is None or not g.addresses:
            raise QueueUnavailable(f"broker group {group!r} has no live broker")
        gc = self._clients.get(group)
        if gc is not None:
            return gc
        if self._nursery is None:
            raise ClientClosed("use the router inside 'async with'")
        b = self.bootstrap
        gc = _GroupClient(
            AsyncClient(
                g.addresses,
                connect_timeout=b.connect_timeout,
                on_push=self.on_push,
                security=b.security,
            )
        )
        self._clients[group] = gc
        self._nursery.start_soon(self._hold, gc)
        return gc

    @staticmethod
    async def _hold(gc: _GroupClient) -> None:
        """Keep a group's client open until the group leaves the table or the router closes."""
        with gc.scope:
            async with gc.client:
                gc.ready.set()
                await trio.sleep_forever()

    async def _opened(self, group: str) -> AsyncClient:
        """The open client of ``group`` (the bootstrap for ""). Raises QueueUnavailable."""
        gc = self._group_client(group)
        if gc is None:
            return self.bootstrap
        await gc.ready.wait()
        return gc.client

    async def client_for(self, topic: str, queue_id: int) -> AsyncClient:
        """The connection to the owner of (topic, queue_id). Raises TopicNotFound,
        QueueNotFound, QueueUnavailable."""
        t = await self.route(topic)
        if queue_id >= len(t.owners):  # the held queue count may be stale (an alter)
            await self.refresh([topic])
            t = await self.route(topic)
        if not 0 <= queue_id < len(t.owners):
            raise QueueNotFound(f"topic {topic!r} has {len(t.owners)} queues; no queue {queue_id}")
        return await self._opened(t.owners[queue_id])

    def client_now(self, topic: str, queue_id: int) -> AsyncClient | None:
        """The owner's open connection when the route is held and the group up
        (no I/O); None otherwise (then await :meth:`client_for`)."""
        owner = self.cache.owner(topic, queue_id)
        if owner is None:
            return None
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # a sync front's calling thread: only the loop opens connections
            held = self._clients.get(owner)
            if held is None:
                return self.bootstrap if owner == BOOTSTRAP and not self.cache.cluster else None
            return held.client if held.ready.is_set() else None
        try:
            gc = self._group_client(owner)
        except EQueueError:
            return None
        if gc is None:
            return self.bootstrap
        return gc.client if gc.ready.is_set() else None

    async def clients_for_topics(self, topics: Iterable[str]) -> dict[str, AsyncClient]:
        """Every available group owning a queue of ``topics`` (missing topics are
        skipped); the bootstrap when none does (a member must announce itself somewhere)."""
        groups: set[str] = set()
        for name in topics:
            try:
                t = await self.route(name)
            except TopicNotFound:
                continue
            groups.update(t.owners)
        out = {}
        for g in sorted(groups):
            if self.cache.group_available(g):
                out[g] = await self._opened(g)
        if not out and not groups:
            out[BOOTSTRAP] = self.bootstrap
        return out

    async def all_clients(self) -> dict[str, AsyncClient]:
        """Every live group's connection (standalone: the bootstrap), for admin fan-out."""
        if self.cache.revision < 0:
            await self.refresh([])
        return {g: await self._opened(g) for g in self.cache.live_groups()}

    async def settle(self, topic: str, queue_id: int, failed: Endpoint, delay: float) -> None:
        """After a routing error at ``failed`` (the queue's endpoint the failed attempt
        used): refresh the routes now and then every :data:`MIN_REFRESH_INTERVAL`,
        returning as soon as they name another endpoint for the queue whose group is up
        (a new owner or a new leader), else after ``delay`` seconds (the caller's
        backoff). Standalone (no cluster) it just waits ``delay``. Never raises for a
        failed refresh (logged at debug)."""
        await self._settle([topic], lambda: self.cache.endpoint(topic, queue_id), failed, delay)

    def group_endpoint(self, group: str) -> Endpoint:
        """(group, its addresses) as held (no I/O)."""
        g = self.cache.groups.get(group)
        return group, tuple(g.addresses) if g is not None else ()

    async def _settle(self, topics: list[str], now: Callable[[], Endpoint], failed: Endpoint, delay: float) -> None:
        with trio.move_on_after(max(delay, 0.0)):
            while True:
                try:
                    await self.refresh(topics)
                except EQueueError as exc:
                    log.debug("route refresh of %s failed: %s", topics, exc)
                if not self.cache.cluster:
                    await trio.sleep_forever()
                endpoint = now()
                if endpoint is not None and endpoint != failed and endpoint[1]:
                    return
                await trio.sleep(MIN_REFRESH_INTERVAL)

    async def call(
        self,
        topic: str,
        queue_id: int,
        fn: Callable[[AsyncClient], Awaitable[T]],
        policy: RetryPolicy | None = None,
    ) -> T:
        """``await fn(owner's client)``, retried under ``policy`` (the router's by
        default). After NOT_OWNER, NOT_LEADER, QUEUE_UNAVAILABLE or a broken connection
        the routes are refreshed and the call retried at the queue's (new) owner or
        leader as soon as the routes name one (:meth:`settle`); these routing errors are
        retried until the policy's ``timeout`` and do not count against its
        ``attempts`` (a failover lasts about one lease TTL). Other transient errors
        are retried with the policy's backoff, within its attempts and timeout. Raises
        the last error once the policy gives up, any other error at once."""
        return await self._retry(
            lambda: self.cache.endpoint(topic, queue_id),
            lambda: self.client_for(topic, queue_id),
            fn,
            lambda seen, delay: self.settle(topic, queue_id, seen, delay),
            policy or self.policy,
        )

    async def call_group(
        self, group: str, fn: Callable[[AsyncClient], Awaitable[T]], policy: RetryPolicy | None = None
    ) -> T:
        """``await fn(group's client)`` (the bootstrap for the standalone group ""),
        retried like :meth:`call`: after a routing error, at the group's new leader as
        soon as the routes name one. For requests a group answers as a whole (group
        listings, dead letters, lookups by global offset)."""
        return await self._retry(
            lambda: self.group_endpoint(group),
            lambda: self._opened(group),
            fn,
            lambda seen, delay: self._settle([], lambda: self.group_endpoint(group), seen, delay),
            policy or self.policy,
        )

    async def _retry(
        self,
        endpoint: Callable[[], Endpoint],
        connect: Callable[[], Awaitable[AsyncClient]],
        fn: Callable[[AsyncClient], Awaitable[T]],
        settle: Callable[[Endpoint, float], Awaitable[None]],
        policy: RetryPolicy,
    ) -> T:
        deadline = math.inf if policy.timeout is None else trio.current_time() + policy.timeout
        attempts = reroutes = 0
        error: EQueueError
        while True:
            seen = endpoint()
            try:
                return await fn(await connect())
            except ROUTING_ERRORS as exc:
                reroutes += 1
                routing, error = True, exc
            except EQueueError as exc:
                if not is_transient(exc):
                    raise
                attempts += 1
                routing, error = False, exc
                if attempts >= policy.attempts:
                    raise
            left = deadline - trio.current_time()
            if left <= 0:
                raise error
            if routing:
                await settle(seen, min(policy.delay(reroutes), left))
            else:
                await trio.sleep(min(policy.delay(attempts), left))
