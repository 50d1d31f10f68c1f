"""The workload: trio tasks of the harness, each writing what it does to the history.

- **producers** (``p0..``): :class:`equeue.producer.AsyncProducer`, keyed (keys are per
  producer, ``p<n>k<j>``, so a key's order is its producer's send order) and keyless
  sends of bodies ``"<mid>|<filler>"`` (``mid`` = ``p<n>-<seq>``), to the main topic and
  now and then to a topic the admin created; every send is an operation;
- **consumers**: two consumer groups of two members each (:class:`equeue.consumer.AsyncConsumer`,
  from the earliest offset): ``cg-plain`` (concurrent handlers) and ``cg-orderly``
  (``orderly=True``); every delivery is a "read" observation and every offset commit
  the SDK makes is an operation (the member's ``RoutedCalls.commit_offset`` is wrapped);
- **admin**: creates a topic or grows one now and then (``create`` / ``alter``), and
  records the route table after each (``routes``);
- **samplers**: REPLICATION_STATUS of every running broker every 0.5 s ("status");
  DESCRIBE_GROUP of both consumer groups at every running broker every 0.5 s
  ("leases": which member holds each queue; only a serving leader answers); and the
  committed offset of each group and queue of the main topic every second ("query").
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from equeue import Message, control
from equeue.client.async_client import AsyncClient
from equeue.client.retry import RetryPolicy
from equeue.client.routing import Router
from equeue.consumer import AsyncConsumer
from equeue.errors import (
    BufferFull,
    ClusterUnavailable,
    ConfigError,
    EQueueError,
    InvalidName,
    MessageTooLarge,
    NoLiveGroups,
    NotQueueOwner,
    TopicExists,
)
from equeue.producer import AsyncProducer
from tests.chaos.cluster import Cluster
from tests.chaos.history import History

__all__ = ["MAIN_TOPIC", "Probe", "Workload", "body_of", "split_body"]

MAIN_TOPIC = "chaos"
CONSUMER_GROUPS = {"cg-plain": False, "cg-orderly": True}
#: raised before a send left the client: the send did not happen
_NOT_SENT = (ConfigError, InvalidName, MessageTooLarge, BufferFull)
#: answers that say an admin write was refused before anything was written
_REFUSED = (ClusterUnavailable, NoLiveGroups, TopicExists, InvalidName, ConfigError)
_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


def body_of(mid: str, rng: random.Random) -> str:
    """``"<mid>|<filler>"``: 16-160 pseudo-random characters after the id."""
    return f"{mid}|{''.join(rng.choices(_LETTERS, k=rng.randint(16, 160)))}"


def split_body(body: bytes) -> tuple[str, int, int]:
    """(mid, crc32, length) of a stored body."""
    mid = body.split(b"|", 1)[0].decode("utf-8", errors="replace")
    return mid, zlib.crc32(body), len(body)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:160]}"


class Probe:
    """One pinned :class:`AsyncClient` per broker (no rerouting), for status samples,
    leader look-ups and the final reads; and the latest status each broker gave.
    ``async with Probe(cluster) as probe``: the clients live in its nursery."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.clients: dict[str, AsyncClient] = {}
        #: node -> (monotonic time, its last REPLICATION_STATUS)
        self.latest: dict[str, tuple[float, control.ReplicationStatus]] = {}
        self._nursery: trio.Nursery | None = None
        self._cm: Any = None

    async def __aenter__(self) -> Probe:
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._cm.__aexit__(*exc)

    async def client(self, node: str) -> AsyncClient:
        c = self.clients.get(node)
        if c is None:
            assert self._nursery is not None
            c = self.clients[node] = AsyncClient(self.cluster.address(node), connect_timeout=1.0)
            await self._nursery.start(_hold, c)
        return c

    async def ask(
        self, node: str, fn: Callable[[AsyncClient], Awaitable[Any]], timeout: float = 1.5
    ) -> Any:
        """``fn(node's client)`` within ``timeout`` s (trio.TooSlowError past it)."""
        with trio.fail_after(timeout):
            return await fn(await self.client(node))

    async def status(self, node: str, timeout: float = 1.5) -> control.ReplicationStatus | None:
        if not self.cluster.live(node):
            return None
        try:
            st: control.ReplicationStatus = await self.ask(
                node, lambda c: c.replication_status(), timeout
            )
        except (EQueueError, OSError, trio.TooSlowError):
            return None
        self.latest[node] = (time.monotonic(), st)
        return st

    def leader_now(self, group: str, fresh: float = 3.0) -> str | None:
        """The broker of ``group`` that said "leader" at the highest epoch within the
        last ``fresh`` seconds (None: none did)."""
        now = time.monotonic()
        best: tuple[int, str] | None = None
        for node in self.cluster.members(group):
            seen = self.latest.get(node)
            if seen is None or now - seen[0] > fresh or not self.cluster.live(node):
                continue
            st = seen[1]
            if st.role == "leader" and (best is None or st.epoch > best[0]):
                best = (st.epoch, node)
        return best[1] if best else None

    async def settled_leader(self, group: str) -> str | None:
        """The group's serving leader: the one live broker that says "leader" at the
        epoch etcd's leader record (its own CLUSTER_STATUS) names, with every member
        it lists in sync. None while there is none."""
        statuses = {n: await self.status(n) for n in self.cluster.members(group)}
        leading = [n for n, st in statuses.items() if st is not None and st.role == "leader"]
        if len(leading) != 1:
            return None
        node = leading[0]
        try:
            cs: control.ClusterStatus = await self.ask(node, lambda c: c.cluster_status(), 3.0)
        except (EQueueError, OSError, trio.TooSlowError):
            return None
        rec = next((g for g in cs.groups if g.name == group), None)
        st = statuses[node]
        assert st is not None
        if rec is None or rec.leader != st.broker_id or rec.epoch != st.epoch:
            return None
        return node


async def _queue_offsets(c: AsyncClient, q: int) -> control.QueueStats:
    return await c.queue_offsets(MAIN_TOPIC, q)


async def _describe(c: AsyncClient, group: str) -> control.GroupDescription:
    return await c.describe_group(group)


async def _query_offset(c: AsyncClient, group: str, q: int) -> int:
    return await c.query_offset(group, MAIN_TOPIC, q)


async def _hold(cm: Any, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Enter ``cm``, report started, and keep it open until cancelled."""
    async with cm:
        task_status.started()
        await trio.sleep_forever()


class Workload:
    """Everything the harness does to the cluster as a client (module docstring)."""

    def __init__(self, history: History, cluster: Cluster, probe: Probe, seed: int, producers: int = 3,
                 pace: float = 0.05) -> None:  # fmt: skip
        self.h, self.cluster, self.probe, self.seed = history, cluster, probe, seed
        self.producers, self.pace = producers, pace
        #: topic -> queue count, as the route table last said (what producers may use)
        self.topics: dict[str, int] = {}
        self.producing = True
        self.running = True
        self.bootstrap: AsyncClient | None = None
        self.router: Router | None = None
        self.consumers: dict[str, AsyncConsumer] = {}
        #: messages the producers have sent and not yet had answered; acknowledged so far
        self.in_flight = 0
        self.acked = 0
        self._done_producing = trio.Event()
        self._producers_left = producers
        #: held around every topic change; the nemesis holds it while it restores etcd
        #: from a backup (topic changes made after the backup would be lost with it)
        self.admin_lock = trio.Lock()

    # ------------------------------------------------------------------ setup
    async def open(self, nursery: trio.Nursery) -> None:
        """The harness's routed client (in ``nursery``), then the main topic (4 queues)."""
        self.bootstrap = AsyncClient(self.cluster.bootstrap, connect_timeout=2.0)
        await nursery.start(_hold, self.bootstrap)
        self.router = Router(self.bootstrap, refresh_interval=2.0)
        await nursery.start(_hold, self.router)
        await self.admin_op("create", MAIN_TOPIC, 4, group=self.cluster.group_names[0])
        if MAIN_TOPIC not in self.topics:
            raise EQueueError(f"could not create the topic {MAIN_TOPIC!r} on a healthy cluster")

    def start(self, nursery: trio.Nursery) -> None:
        for p in range(self.producers):
            nursery.start_soon(self._producer, p)
        for group, orderly in CONSUMER_GROUPS.items():
            for m in range(2):
                nursery.start_soon(self._consumer, group, orderly, m)
        nursery.start_soon(self._admin)
        for node in self.cluster.brokers:
            nursery.start_soon(self._sample_status, node)
            nursery.start_soon(self._sample_leases, node)
        nursery.start_soon(self._sample_offsets)

    async def stop_producing(self, timeout: float) -> None:
        """Stop new sends and wait (at most ``timeout`` s) for the outstanding ones."""
        self.producing = False
        with trio.move_on_after(timeout):
            await self._done_producing.wait()

    # ------------------------------------------------------------------ producers
    async def _producer(self, p: int) -> None:
        """Send until :meth:`stop_producing`; a producer that fails as a whole is
        noted and replaced (its sends all answered first, so a key's order holds)."""
        rng = random.Random(f"{self.seed}/producer/{p}")
        name = f"p{p}"
        limit = trio.Semaphore(150)  # sends awaiting their answer, at most
        seq = 0
        try:
            while self.producing:
                try:
                    async with AsyncProducer(self.cluster.bootstrap, send_timeout=15.0, retries=50, retry_backoff=0.1,
                                             connect_timeout=2.0, route_refresh=2.0, auto_create=False) as prod:  # fmt: skip
                        async with trio.open_nursery() as waiters:
                            while self.producing:
                                for _ in range(rng.randint(1, 8)):
                                    extra = [t for t in self.topics if t != MAIN_TOPIC]
                                    topic = (
                                        rng.choice(extra)
                                        if extra and rng.random() < 0.15
                                        else MAIN_TOPIC
                                    )
                                    key = (
                                        f"{name}k{rng.randrange(8)}" if rng.random() < 0.6 else None
                                    )
                                    mid = f"{name}-{seq}"
                                    seq += 1
                                    await limit.acquire()
                                    sent = await self._send(
                                        prod, name, mid, topic, key, body_of(mid, rng), limit
                                    )
                                    if sent is not None:
                                        waiters.start_soon(self._answer, *sent, name, mid, limit)
                                await trio.sleep(rng.uniform(0, 2 * self.pace))  # pacing the load
                            await prod.flush()
                except EQueueError as exc:
                    self.h.info("producer-crashed", producer=name, error=_err(exc))
                    await trio.sleep(1.0)  # a new producer after a pause, as a supervisor would
        finally:
            self._producers_left -= 1
            if self._producers_left == 0:
                self._done_producing.set()

    async def _send(self, prod: AsyncProducer, name: str, mid: str, topic: str, key: str | None, body: str,
                    limit: trio.Semaphore) -> tuple[Any, int] | None:  # fmt: skip
        """Invoke one send: (its handle, the operation id), or None when it ended at
        once (recorded, and its slot of ``limit`` given back)."""
        data = body.encode()
        op = self.h.invoke(
            name, "send", mid=mid, topic=topic, key=key, crc=zlib.crc32(data), len=len(data)
        )
        try:
            handle = await prod.send_async(topic, body, key=key)
        except _NOT_SENT as exc:
            self.h.complete(op, "fail", name, "send", mid=mid, error=_err(exc))
        except EQueueError as exc:
            self.h.complete(op, "unknown", name, "send", mid=mid, error=_err(exc))
        else:
            self.in_flight += 1
            return handle, op
        limit.release()
        return None

    async def _answer(
        self, handle: Any, op: int, name: str, mid: str, limit: trio.Semaphore
    ) -> None:
        try:
            r = await handle.wait()
        except EQueueError as exc:
            self.h.complete(op, "unknown", name, "send", mid=mid, error=_err(exc))
        else:
            self.acked += 1
            self.h.complete(op, "ok", name, "send", mid=mid, topic=r.topic, queue=r.queue_id, offset=r.queue_offset,
                            duplicate=r.duplicate)  # fmt: skip
        finally:
            self.in_flight -= 1
            limit.release()

    # ------------------------------------------------------------------ consumers
    async def _consumer(self, group: str, orderly: bool, m: int) -> None:
        name = f"{group}-m{m}"
        while self.running:
            try:
                c = AsyncConsumer(self.cluster.bootstrap, group, [MAIN_TOPIC], start_from="earliest", orderly=orderly,
                                  concurrency=4, consumer_id=name, connect_timeout=2.0)  # fmt: skip
                self._wrap_commits(c, name)
                self.consumers[name] = c
                async with c:
                    self.h.info("consumer-joined", member=name)

                    async def handle(msg: Message, name: str = name, group: str = group) -> None:
                        mid, crc, n = split_body(msg.body)
                        self.h.observe(name, "read", group=group, topic=msg.topic, queue=msg.queue_id,
                                       offset=msg.queue_offset, mid=mid, crc=crc, len=n, key=msg.key,
                                       redelivery=msg.reconsume_times)  # fmt: skip

                    await c.run(handle)
                return
            except Exception as exc:  # a member that dies is replaced, and the crash noted
                self.h.info("consumer-crashed", member=name, error=_err(exc))
                await trio.sleep(1.0)  # a new member after a pause, as a supervisor would

    def _wrap_commits(self, c: AsyncConsumer, name: str) -> None:
        calls = c.calls
        inner = calls.commit_offset

        async def commit_offset(
            group: str, topic: str, queue_id: int, offset: int, consumer_id: str = ""
        ) -> None:
            op = self.h.invoke(
                name, "commit", group=group, topic=topic, queue=queue_id, offset=offset
            )
            try:
                await inner(group, topic, queue_id, offset, consumer_id)
            except BaseException as exc:
                outcome = (
                    "fail" if isinstance(exc, NotQueueOwner) else "unknown"
                )  # NotQueueOwner: refused, unwritten
                self.h.complete(op, outcome, name, "commit", group=group, topic=topic, queue=queue_id, offset=offset,
                                error=_err(exc))  # fmt: skip
                raise
            self.h.complete(
                op, "ok", name, "commit", group=group, topic=topic, queue=queue_id, offset=offset
            )

        calls.commit_offset = commit_offset  # type: ignore[method-assign]

    async def stop_consumers(self, timeout: float) -> None:
        """Stop every member (they commit and leave), at most ``timeout`` s."""
        self.running = False
        for c in self.consumers.values():
            c.stop()
        with trio.move_on_after(timeout):
            for c in self.consumers.values():
                await c.aclose()

    async def caught_up(self) -> bool:
        """Every consumer group's committed offset of every main-topic queue is at its end."""
        assert self.router is not None
        router = self.router
        policy = RetryPolicy(attempts=2, timeout=3.0)
        try:
            for q in range(self.topics.get(MAIN_TOPIC, 0)):
                stats = await router.call(MAIN_TOPIC, q, partial(_queue_offsets, q=q), policy)
                for group in CONSUMER_GROUPS:
                    got = await router.call(
                        MAIN_TOPIC, q, partial(_query_offset, group=group, q=q), policy
                    )
                    if got < stats.max_offset:
                        return False
        except EQueueError:
            return False
        return True

    # ------------------------------------------------------------------ admin
    async def _admin(self) -> None:
        rng = random.Random(f"{self.seed}/admin")
        made = 0
        while self.producing:
            await trio.sleep(rng.uniform(4.0, 10.0))  # the admin's schedule
            if not self.producing:
                return
            group = rng.choice(self.cluster.group_names)
            extra = [t for t in self.topics if t != MAIN_TOPIC]
            roll = rng.random()
            async with self.admin_lock:
                if roll < 0.4 and made < 3:
                    made += 1
                    await self.admin_op(
                        "create", f"{MAIN_TOPIC}-x{made}", rng.randint(1, 3), group=group
                    )
                elif roll < 0.8 and self.topics.get(MAIN_TOPIC, 8) < 8:
                    await self.admin_op(
                        "alter", MAIN_TOPIC, self.topics[MAIN_TOPIC] + 1, group=group
                    )
                elif extra:
                    t = rng.choice(extra)
                    if self.topics[t] < 4:
                        await self.admin_op("alter", t, self.topics[t] + 1, group=group)

    async def admin_op(self, f: str, topic: str, queues: int, group: str) -> None:
        """Create or grow ``topic`` at ``group``'s leader, then record the routes."""
        assert self.router is not None
        router = self.router
        op = self.h.invoke("admin", f, topic=topic, queues=queues, via=group)
        policy = RetryPolicy(attempts=3, timeout=15.0)

        async def call(c: AsyncClient) -> control.TopicInfo:
            if f == "create":
                return await c.create_topic(topic, queues)
            return await c.alter_topic(topic, queues=queues)

        try:
            with trio.fail_after(20):
                info = await router.call_group(group, call, policy)
        except _REFUSED as exc:
            self.h.complete(op, "fail", "admin", f, topic=topic, error=_err(exc))
        except (EQueueError, trio.TooSlowError) as exc:
            self.h.complete(op, "unknown", "admin", f, topic=topic, error=_err(exc))
        else:
            self.h.complete(op, "ok", "admin", f, topic=topic, queues=info.queues)
        await self.record_routes([*self.topics, topic])

    async def record_routes(self, topics: list[str]) -> None:
        """GET_ROUTES of ``topics``; the owners go to the history ("routes") and the
        queue counts to :attr:`topics`."""
        assert self.router is not None
        try:
            with trio.fail_after(10):
                table = await self.router.refresh(sorted(set(topics)))
        except (EQueueError, trio.TooSlowError) as exc:
            self.h.info("routes-failed", error=_err(exc))
            return
        owners = {t.info.name: list(t.owners) for t in table.topics if t.info.name in topics}
        for name, o in owners.items():
            self.topics[name] = max(self.topics.get(name, 0), len(o))
        self.h.observe("admin", "routes", owners=owners)

    # ------------------------------------------------------------------ samplers
    async def _sample_status(self, node: str) -> None:
        while self.running:
            sent = self.h.now()
            st = await self.probe.status(node)
            if st is not None:
                self.h.observe("status", "status", sent=round(sent, 6), node=node, group=st.group, broker=st.broker_id, role=st.role,
                               epoch=st.epoch, leader=st.leader, position=st.position, hw=st.high_watermark,
                               isr=sorted(st.isr))  # fmt: skip
            await trio.sleep(0.5)  # the sampling period

    async def _sample_leases(self, node: str) -> None:
        """Who holds each queue, as ``node`` says while it serves: an "ok" line per
        answer, with the time the request went out (``sent``), so the checker can tell
        whether two brokers' answers overlapped."""
        while self.running:
            if self.cluster.live(node):
                for group in CONSUMER_GROUPS:
                    sent = self.h.now()
                    try:
                        d: control.GroupDescription = await self.probe.ask(node, partial(_describe, group=group), 1.5)
                    except (EQueueError, OSError, trio.TooSlowError):
                        continue  # a follower (NOT_LEADER), fenced, or unreachable: no claim
                    held = {f"{q.topic}/{q.queue_id}": q.owner for q in d.queues if q.owner}
                    self.h.observe(
                        "leases", "leases", node=node, group=group, sent=round(sent, 6), held=held
                    )
            await trio.sleep(0.5)  # the sampling period

    async def _sample_offsets(self) -> None:
        assert self.router is not None
        router = self.router
        policy = RetryPolicy(attempts=2, timeout=2.0)

        async def one(group: str, q: int) -> None:
            op = self.h.invoke("offsets", "query", group=group, topic=MAIN_TOPIC, queue=q)
            try:
                with trio.fail_after(3):
                    got = await router.call(
                        MAIN_TOPIC, q, partial(_query_offset, group=group, q=q), policy
                    )
            except (EQueueError, trio.TooSlowError) as exc:
                self.h.complete(op, "fail", "offsets", "query", error=_err(exc))
            else:
                self.h.complete(
                    op, "ok", "offsets", "query", group=group, topic=MAIN_TOPIC, queue=q, offset=got
                )

        while self.running:
            async with trio.open_nursery() as n:
                for group in CONSUMER_GROUPS:
                    for q in range(self.topics.get(MAIN_TOPIC, 0)):
                        n.start_soon(one, group, q)
            await trio.sleep(1.0)  # the sampling period
