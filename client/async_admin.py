"""The admin client: requests that span a cluster, asking each broker group and merging.

:class:`AsyncAdminClient` (trio, ``async with AsyncAdminClient(brokers) as admin``) has one
typed method per admin operation: topics (list, create, alter, describe, delete, pause,
resume), consumer groups (list, describe, delete, reset offsets, pause, resume), dead
letters (list, resend), message lookups (by offset, key, time; skipped records) and the
cluster (status, health, stats, replica verification, recovery, hand-over). Its blocking
twin is :class:`equeue.client.admin.AdminClient`. The CLI and the web console use it,
so both show and change the same state the same way.

In a cluster every broker group answers only for the queues it owns (docs/cluster.md,
"Administration"), so operations that show or change per-queue state fan out through the
client's :class:`equeue.client.routing.Router` and merge the answers here. Each request goes
through :meth:`~equeue.client.routing.Router.call` or
:meth:`~equeue.client.routing.Router.call_group`, so a group failing over to another replica
(NOT_LEADER, a broken connection) is waited out and the request is made again at its new
leader. Topic administration goes to any group's leader (it writes etcd). Standalone there is
one group (the bootstrap broker) and each operation makes one request. :func:`run_routed`
runs one call of an admin client in a private trio loop (the CLI's commands).

Errors: the mapped :class:`~equeue.errors.EQueueError` of a failing group (a read
that some groups answered names the others in its result instead, where it says so).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs
import trio

from equeue import control
from equeue.client.async_client import AsyncClient
from equeue.client.lifetime import StackOwner
from equeue.client.retry import DEFAULT_POLICY, RetryPolicy
from equeue.client.routing import Router
from equeue.errors import (
    ClientClosed,
    ConfigError,
    EQueueError,
    GroupHasMembers,
    GroupNotFound,
    NotLeader,
    QueueUnavailable,
    first_error,
)
from equeue.models import PullResult
from equeue.names import is_ephemeral, validate_group
from equeue.security import ClientSecurity

T = TypeVar("T")

__all__ = [
    "VERIFY_POLL",
    "AsyncAdminClient",
    "BrokerHealth",
    "BrokerStatsRow",
    "ClusterReport",
    "GroupReplication",
    "GroupVerdict",
    "MergedDlqPage",
    "MergedTopic",
    "RecoveryCandidate",
    "RecoveryPlan",
    "ReplicaAnswer",
    "Verdict",
    "VerifyReport",
    "compare_digests",
    "judge",
    "run_routed",
]


def run_routed(broker: str, fn: Callable[[AsyncAdminClient], Awaitable[T]]) -> T:
    """``await fn(admin)`` in a fresh trio loop, ``admin`` an :class:`AsyncAdminClient`
    bootstrapped from ``broker`` (one CLI command). Raises what ``fn`` raises (an
    EQueueError as it is, not wrapped in an exception group)."""

    async def main() -> T:
        error: EQueueError | None = None
        async with AsyncAdminClient(broker) as admin:
            try:
                result = await fn(admin)
            except EQueueError as exc:  # raised outside the nurseries: not wrapped in a group
                error = exc
        if error is not None:
            raise error
        return result

    return trio.run(main)


# ---------------------------------------------------------------------- any leader
async def _at_any_leader(router: Router, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """``fn`` at the bootstrap broker; if it is a follower (NOT_LEADER: it serves no
    client request, docs/cluster.md, "Replicas, acks, failover"), at the leader of each live group in turn
    (the first that answers). For topic administration, which any leader serves (it
    writes etcd). A refused request wrote nothing, so asking again elsewhere is safe."""
    try:
        return await fn(router.bootstrap)
    except NotLeader as exc:
        refused: EQueueError = exc
    await router.refresh([])
    for name in router.cache.live_groups():
        try:
            return await router.call_group(name, fn)
        except NotLeader as exc:
            refused = exc
    raise refused


# ---------------------------------------------------------------------- topics
@attrs.frozen
class MergedTopic:
    """A topic's per-queue stats from every owner (None: the owner group is down),
    with the owner group of each queue."""

    info: control.TopicInfo
    queues: list[control.QueueStats | None]
    owners: list[str]
    pending_delayed: int
    store_bytes: int


async def _describe_topic(router: Router, name: str) -> MergedTopic:
    """DESCRIBE_TOPIC at every owner group of ``name``; each queue's row from its owner.
    Raises TopicNotFound.

    A topic that grew since the router last read its route is answered with queue ids
    the held route does not have: the route is read again and the topic asked again
    (once; a topic still growing under the second read shows the new queues as unknown)."""
    merged = await _describe_topic_at(router, name, await router.route(name))
    if merged.info.queues > len(merged.owners):
        await router.refresh([name])
        merged = await _describe_topic_at(router, name, await router.route(name))
    return merged


async def _describe_topic_at(router: Router, name: str, route: control.TopicRoute) -> MergedTopic:
    grown = 0
    stats: dict[int, control.QueueStats] = {}
    delayed = store_bytes = 0
    paused = False
    for owner in sorted(set(route.owners)):
        first = route.owners.index(owner)
        if not router.available(name, first):
            continue  # the group is down: its rows are shown as unknown
        try:
            d = await router.call(name, first, lambda c: c.describe_topic(name))
        except QueueUnavailable:
            continue
        delayed += d.pending_delayed
        store_bytes += d.store_bytes
        grown = max(grown, d.info.queues)
        stats.update(
            {s.queue_id: s for s in d.queues if s.queue_id < len(route.owners) and route.owners[s.queue_id] == owner}
        )
        paused = paused or d.info.paused
    queues = [stats.get(q) for q in range(len(route.owners))]
    info = attrs.evolve(route.info, paused=paused, queues=max(len(route.owners), grown))
    return MergedTopic(info, queues, list(route.owners), delayed, store_bytes)


# ---------------------------------------------------------------------- groups
async def _each_group(router: Router, fn: Callable[[AsyncClient], Awaitable[T]]) -> dict[str, T]:
    """``fn`` at every live group, concurrently; the answers by group name. Raises the
    first failure."""
    clients = await router.all_clients()
    out: dict[str, T] = {}

    async def one(name: str) -> None:
        out[name] = await router.call_group(name, fn)

    async with trio.open_nursery() as nursery:
        for name in clients:
            nursery.start_soon(one, name)
    return {name: out[name] for name in sorted(out)}


async def _list_groups(router: Router) -> list[control.GroupSummary]:
    """Every consumer group known to any broker group (members: the most any reports)."""
    merged: dict[str, control.GroupSummary] = {}
    for answer in (await _each_group(router, lambda c: c.list_groups())).values():
        for g in answer:
            old = merged.get(g.group)
            if old is None:
                merged[g.group] = g
            else:
                topics = sorted(set(old.topics) | set(g.topics))
                merged[g.group] = attrs.evolve(
                    g, members=max(old.members, g.members), topics=topics, paused=old.paused or g.paused
                )
    return [merged[name] for name in sorted(merged)]


async def _describe_group(router: Router, group: str) -> control.GroupDescription:
    """DESCRIBE_GROUP at every broker group: members merged by consumer id, each
    queue's row from its owner (``broker_group`` says which), generation summed.
    Raises InvalidName for a name no group can have, GroupNotFound when no broker
    group knows the group (no member, no committed offset: LIST_GROUPS does not name it)."""
    validate_group(group)
    answers = await _each_group(router, lambda c: c.describe_group(group))
    if not any(d.members or d.queues for d in answers.values()) and group not in {
        g.group for g in await _list_groups(router)
    }:
        raise GroupNotFound(f"no such group {group!r}: no broker group has a live member or a committed offset of it")
    members: dict[str, control.MemberInfo] = {}
    rows: dict[tuple[str, int], control.GroupQueue] = {}
    for name, d in answers.items():
        for m in d.members:
            old = members.get(m.consumer_id)
            if old is None or m.last_seen_ms > old.last_seen_ms:
                members[m.consumer_id] = m
        for q in d.queues:
            owner = router.owner(q.topic, q.queue_id)
            if owner is None or owner == name or (q.topic, q.queue_id) not in rows:
                rows[(q.topic, q.queue_id)] = attrs.evolve(q, broker_group=q.broker_group or name)
    return control.GroupDescription(
        group, sorted(members.values(), key=lambda m: m.consumer_id), [rows[k] for k in sorted(rows)],
        sum(d.generation for d in answers.values()), ephemeral=is_ephemeral(group),
        paused=any(d.paused for d in answers.values()),
    )  # fmt: skip


async def _delete_here(c: AsyncClient, group: str, force: bool) -> control.DeleteGroupAnswer | None:
    try:
        return await c.call(control.DeleteGroup(group, force), control.DeleteGroupAnswer)
    except GroupNotFound:
        return None  # nothing of it at this broker group


async def _delete_group(router: Router, group: str, force: bool) -> dict[str, control.DeleteGroupAnswer]:
    """DELETE_GROUP at every broker group (offsets live with each queue's owner, state
    at every group its members heartbeat to); the answers of the groups that had
    something of it. Without ``force`` the live members are looked for first, at every
    group, so a refused delete deletes nothing anywhere (but for a member that joins in the
    moment between the look and the deletes: the delete is not one atomic step across
    broker groups, and may then be done at some of them only). Raises InvalidName,
    GroupHasMembers, GroupNotFound when no broker group knows the group."""
    validate_group(group)
    if not force:
        live = (await _describe_group(router, group)).members  # GroupNotFound: known nowhere
        if live:
            names = ", ".join(m.consumer_id for m in live)
            raise GroupHasMembers(f"group {group!r} has {len(live)} live member(s) ({names}); stop them first "
                                  "or force the delete (force=True; the CLI's --force)")  # fmt: skip
    answers = await _each_group(router, lambda c: _delete_here(c, group, force))
    found = {name: a for name, a in answers.items() if a is not None}
    if not found:
        raise GroupNotFound(f"no such group {group!r}: no broker group has a live member or a committed offset of it")
    return found


async def _reset_offsets(
    router: Router, group: str, topic: str, to: control.ResetTarget, timestamp_ms: int, force: bool
) -> dict[int, int]:
    """RESET_OFFSETS at every owner group of ``topic``; each queue's new offset from its owner."""
    route = await router.route(topic)
    out: dict[int, int] = {}
    for owner in sorted(set(route.owners)):
        answer = await router.call(
            topic, route.owners.index(owner), lambda c: c.reset_offsets(group, topic, to, timestamp_ms, force)
        )
        out.update({q: off for q, off in answer.items() if route.owners[q] == owner})
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------- pause and resume
async def _pause_topic(router: Router, topic: str) -> control.PauseAnswer:
    """Refuse ``topic``'s produce (TOPIC_PAUSED) everywhere. Standalone, the broker
    keeps it in its store; in a cluster any group's leader writes it to etcd, which
    every broker group watches. Raises TopicNotFound, ReservedTopic, NotAuthorized."""
    return await _at_any_leader(router, lambda c: c.pause_topic(topic))


async def _resume_topic(router: Router, topic: str) -> control.PauseAnswer:
    """Accept ``topic``'s produce again (``changed`` False: it was not paused)."""
    return await _at_any_leader(router, lambda c: c.resume_topic(topic))


async def _pause_group(router: Router, group: str) -> control.PauseAnswer:
    """Hold consumer group ``group``'s pulls at every broker group (nothing delivered;
    offsets, members and leases kept). Raises InvalidName, NotAuthorized."""
    validate_group(group)
    return await _at_any_leader(router, lambda c: c.pause_group(group))


async def _resume_group(router: Router, group: str) -> control.PauseAnswer:
    """Deliver to ``group`` again: its held pulls read at once."""
    validate_group(group)
    return await _at_any_leader(router, lambda c: c.resume_group(group))


# ---------------------------------------------------------------------- dead letters
@attrs.frozen
class MergedDlqPage:
    """Dead letters of every broker group (each with the group that holds it)."""

    letters: list[tuple[str, control.DeadLetter]]
    next_queue_id: int
    next_offset: int
    done: bool


async def _dlq_list(router: Router, group: str, queue_id: int, offset: int, limit: int) -> MergedDlqPage:
    """One page of the group's dead letters from the cursor, from every broker group,
    in (queue, offset) order; the cursor continues after the last letter shown."""
    pages = await _each_group(router, lambda c: c.dlq_list(group, queue_id, offset, limit))
    letters = sorted(
        ((name, d) for name, p in pages.items() for d in p.letters), key=lambda x: (x[1].queue_id, x[1].queue_offset)
    )
    shown = letters[:limit]
    done = all(p.done for p in pages.values()) and len(letters) <= limit
    if shown and not done:
        last = shown[-1][1]
        return MergedDlqPage(shown, last.queue_id, last.queue_offset + 1, False)
    nxt = [(p.next_queue_id, p.next_offset) for p in pages.values() if not p.done]
    q, o = min(nxt) if nxt else (queue_id, offset)
    return MergedDlqPage(shown, q, o, done)


async def _dlq_resend(router: Router, group: str, ids: list[int], all_letters: bool, broker_group: str | None) -> control.DlqResendAnswer:
    """DLQ_RESEND at every broker group (``--all``) or at ``broker_group``: letter ids
    are offsets in one broker's store, so a cluster with several groups needs it with
    ids. Raises ConfigError when it is missing there."""
    clients = await router.all_clients()
    if broker_group is not None:
        if broker_group not in clients:
            raise ConfigError(f"no live broker group {broker_group!r} (live: {', '.join(sorted(clients)) or 'none'})")
        clients = {broker_group: clients[broker_group]}
    elif ids and len(clients) > 1:
        raise ConfigError("dead letter ids are per broker group: name it (broker_group=; the CLI's --broker-group; "
            "equeue dlq list shows each letter's)")
    answer = control.DlqResendAnswer([], [], {})
    for name in clients:
        a = await router.call_group(name, lambda c: c.dlq_resend(group, ids, all_letters))
        answer.resent.extend(a.resent)
        answer.already_resent.extend(a.already_resent)
        answer.failed.update(a.failed)
    return answer


# ---------------------------------------------------------------------- messages
async def _get_message(
    router: Router, topic: str, queue_id: int, queue_offset: int, global_offset: int, broker_group: str | None
) -> PullResult:
    """GET_MESSAGE at the queue's owner, or (by global offset, an offset in one
    broker's store) at ``broker_group``; required then when several groups live."""
    if queue_id >= 0:
        return await router.call(topic, queue_id, lambda c: c.get_message(topic, queue_id=queue_id,
                                                                          queue_offset=queue_offset))  # fmt: skip
    clients = await router.all_clients()
    if broker_group is None:
        if len(clients) > 1:
            raise ConfigError("a global offset is per broker group: name it (broker_group=; the CLI's --broker-group)")
        broker_group = next(iter(clients))
    if broker_group not in clients:
        raise ConfigError(f"no live broker group {broker_group!r}")
    return await router.call_group(broker_group, lambda c: c.get_message(topic, global_offset=global_offset))


async def _find_by_key(router: Router, topic: str, key: str, limit: int, before: int) -> PullResult:
    """FIND_BY_KEY at every owner group of ``topic``, newest first, at most ``limit``.
    ``before`` and the continuation offset are per broker: with several groups the
    continuation is not given (``next_offset`` 0)."""
    route = await router.route(topic)
    groups = sorted(set(route.owners))
    results = []
    for owner in groups:
        results.append(await router.call(topic, route.owners.index(owner),
                                         lambda c: c.find_by_key(topic, key, limit, before)))  # fmt: skip
    if len(results) == 1:
        return results[0]
    msgs = sorted((m for r in results for m in r.messages), key=lambda m: m.timestamp, reverse=True)[:limit]
    return attrs.evolve(results[0], messages=msgs, next_offset=0)


async def _offset_for_time(router: Router, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """OFFSET_FOR_TIME at the queue's owner: the first queue offset stored at or after
    ``timestamp_ms`` (the queue's end when none is)."""
    return await router.call(topic, queue_id, lambda c: c.offset_for_time(topic, queue_id, timestamp_ms))


async def _list_skipped(router: Router, topic: str) -> dict[int, list[int]]:
    """The skipped offsets of ``topic`` from each queue's owner."""
    route = await router.route(topic)
    out: dict[int, list[int]] = {}
    for owner in sorted(set(route.owners)):
        skipped = await router.call(topic, route.owners.index(owner), lambda c: c.list_skipped(topic))
        for q, offsets in skipped.items():
            if 0 <= q < len(route.owners) and route.owners[q] == owner:
                out[q] = offsets
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------- cluster status
@attrs.frozen
class BrokerHealth:
    """Whether this CLI reaches a broker: STATS answered, with the round trip."""

    group: str
    broker_id: str
    address: str
    reachable: bool
    rtt_ms: float | None
    error: str = ""


@attrs.frozen
class GroupReplication:
    """REPLICATION_STATUS as a group's leader answers it (None: no leader, or it did
    not answer: ``error`` says why)."""

    group: str
    status: control.ReplicationStatus | None
    error: str = ""


@attrs.frozen
class ClusterReport:
    """CLUSTER_STATUS as the bootstrap broker sees it, each broker's health, and each
    group's replication state (asked of its leader)."""

    status: control.ClusterStatus
    health: list[BrokerHealth]
    replication: list[GroupReplication] = attrs.Factory(list)


async def _health(client: AsyncClient, group: str, broker_id: str, address: str) -> BrokerHealth:
    t0 = time.perf_counter()
    try:
        with trio.fail_after(client.connect_timeout + 5):
            await client.stats()
    except (EQueueError, trio.TooSlowError) as exc:
        return BrokerHealth(group, broker_id, address, False, None, str(exc) or type(exc).__name__)
    return BrokerHealth(group, broker_id, address, True, round((time.perf_counter() - t0) * 1000, 2))


async def _cluster_report(router: Router, connect_timeout: float = 3.0) -> ClusterReport:
    """CLUSTER_STATUS at the bootstrap broker, and STATS at every alive broker it lists
    (standalone: at the bootstrap itself), each over its own connection."""
    boot = router.bootstrap
    status = await boot.cluster_status()
    if not status.cluster:
        address = ",".join(f"{h}:{p}" for h, p in boot.brokers)
        return ClusterReport(status, [await _health(boot, "", status.broker_id, address)])
    health: list[BrokerHealth] = []

    async def probe(group: str, b: control.BrokerStatus) -> None:
        if not b.alive or not b.address:
            health.append(BrokerHealth(group, b.broker_id, b.address, False, None, "not registered"))
            return
        async with AsyncClient(b.address, connect_timeout=connect_timeout, security=boot.security) as c:
            health.append(await _health(c, group, b.broker_id, b.address))

    replication: list[GroupReplication] = []

    async def leader_state(g: control.GroupStatus) -> None:
        leader = next((b for b in g.brokers if b.broker_id == g.leader and b.alive and b.address), None)
        if leader is None:
            replication.append(GroupReplication(g.name, None, "no leader" if not g.leader else "leader not registered"))
            return
        async with AsyncClient(leader.address, connect_timeout=connect_timeout, security=boot.security) as c:
            try:  # inside the client's block: its errors are raised here, not wrapped in a group
                with trio.fail_after(connect_timeout + 5):
                    replication.append(GroupReplication(g.name, await c.replication_status()))
            except (EQueueError, trio.TooSlowError) as exc:
                replication.append(GroupReplication(g.name, None, str(exc) or type(exc).__name__))

    async with trio.open_nursery() as nursery:
        for g in status.groups:
            nursery.start_soon(leader_state, g)
            for b in g.brokers:
                nursery.start_soon(probe, g.name, b)
    health.sort(key=lambda h: (h.group, h.address))
    replication.sort(key=lambda r: r.group)
    return ClusterReport(status, health, replication)


@attrs.frozen
class BrokerStatsRow:
    """One broker's STATS (None: it did not answer, ``error`` says why)."""

    group: str
    broker_id: str
    address: str
    stats: control.BrokerStats | None
    error: str = ""


async def _stats(client: AsyncClient, group: str, broker_id: str, address: str, bound: float) -> BrokerStatsRow:
    try:
        with trio.fail_after(bound):
            return BrokerStatsRow(group, broker_id, address, await client.stats())
    except (EQueueError, trio.TooSlowError) as exc:
        return BrokerStatsRow(group, broker_id, address, None, str(exc) or type(exc).__name__)


async def _broker_stats(router: Router, connect_timeout: float = 3.0) -> list[BrokerStatsRow]:
    """STATS of every registered broker as CLUSTER_STATUS lists them, each over its own
    connection, concurrently (standalone: the bootstrap broker's). Raises what
    CLUSTER_STATUS raises at the bootstrap (NotAuthorized, ConnectionBroken)."""
    boot = router.bootstrap
    status = await boot.cluster_status()
    bound = connect_timeout + 5
    if not status.cluster:
        address = ",".join(f"{h}:{p}" for h, p in boot.brokers)
        return [await _stats(boot, "", status.broker_id, address, bound)]
    rows: list[BrokerStatsRow] = []

    async def one(group: str, b: control.BrokerStatus) -> None:
        if not b.alive or not b.address:
            rows.append(BrokerStatsRow(group, b.broker_id, b.address, None, "not registered"))
            return
        async with AsyncClient(b.address, connect_timeout=connect_timeout, security=boot.security) as c:
            rows.append(await _stats(c, group, b.broker_id, b.address, bound))

    async with trio.open_nursery() as nursery:
        for g in status.groups:
            for b in g.brokers:
                nursery.start_soon(one, g.name, b)
    return sorted(rows, key=lambda r: (r.group, r.broker_id))


# ---------------------------------------------------------------------- cluster verify
#: seconds between two rounds of REPLICA_DIGEST while a group's replicas are at
#: different positions (or one does not answer)
VERIFY_POLL = 0.2


class Verdict(enum.StrEnum):
    """What comparing one group's replicas found."""

    EQUAL = "equal"
    DIFFER = "differ"
    #: not compared: a replica did not answer, or they never stood at one position
    INCOMPARABLE = "incomparable"


@attrs.frozen
class ReplicaAnswer:
    """One replica's REPLICA_DIGEST (None: it did not answer; ``error`` says why)."""

    broker_id: str
    address: str
    digest: control.ReplicaDigest | None
    error: str = ""


@attrs.frozen
class GroupVerdict:
    """The comparison of one group's live replicas: at which ``position`` (None: not
    compared), the parts whose checksum differs (``"part: id=hex, id=hex"``), and
    why it could not compare (``detail``)."""

    group: str
    verdict: Verdict
    position: int | None
    replicas: list[ReplicaAnswer]
    differences: list[str]
    detail: str = ""


@attrs.frozen
class VerifyReport:
    groups: list[GroupVerdict]

    @property
    def exit_code(self) -> int:
        """0 every group's replicas are equal; 1 some differ; 2 some could not be compared."""
        verdicts = {g.verdict for g in self.groups}
        if Verdict.DIFFER in verdicts:
            return 1
        return 2 if Verdict.INCOMPARABLE in verdicts else 0


def compare_digests(digests: Sequence[control.ReplicaDigest]) -> list[str]:
    """The parts whose checksum is not the same on every replica (a part one replica
    lacks counts as different), each as ``"part: broker=hex, broker=-"``, sorted."""
    parts = sorted({part for d in digests for part in d.digests})
    out = []
    for part in parts:
        values = [d.digests.get(part) for d in digests]
        if len(set(values)) > 1:
            out.append(f"{part}: " + ", ".join(f"{d.broker_id}={v or '-'}" for d, v in zip(digests, values, strict=True)))
    return out


def judge(group: str, answers: Sequence[ReplicaAnswer]) -> GroupVerdict | None:
    """The verdict on one round of answers, or None when they cannot be compared yet
    (a replica did not answer, or they stand at different positions: ask again)."""
    answers = sorted(answers, key=lambda a: a.broker_id)
    if not answers:
        return GroupVerdict(group, Verdict.INCOMPARABLE, None, [], [], "no live replica")
    if any(a.digest is None for a in answers):
        return None
    digests = [a.digest for a in answers if a.digest is not None]
    if len({d.position for d in digests}) > 1:
        return None
    diff = compare_digests(digests)
    return GroupVerdict(group, Verdict.DIFFER if diff else Verdict.EQUAL, digests[0].position, list(answers), diff)


def _gave_up(group: str, answers: Sequence[ReplicaAnswer], timeout: float) -> GroupVerdict:
    answers = sorted(answers, key=lambda a: a.broker_id)
    missing = [f"{a.broker_id} ({a.address}): {a.error}" for a in answers if a.digest is None]
    if missing:
        detail = "no answer from " + "; ".join(missing)
    else:
        positions = ", ".join(f"{a.broker_id}={a.digest.position}" for a in answers if a.digest is not None)
        detail = f"the replicas were never at one position within {timeout:g} s ({positions})"
    return GroupVerdict(group, Verdict.INCOMPARABLE, None, list(answers), [], detail)


async def _digest(b: control.BrokerStatus, boot: AsyncClient, connect_timeout: float, deadline: float) -> ReplicaAnswer:
    """One replica's REPLICA_DIGEST, bounded by ``deadline`` (trio time; at least
    VERIFY_POLL from now): a frozen replica makes a round slow, not the command."""
    bound = min(connect_timeout + 5, max(deadline - trio.current_time(), VERIFY_POLL))
    async with AsyncClient(b.address, connect_timeout=min(connect_timeout, bound), security=boot.security) as c:
        try:  # inside the client's block: its errors are raised here, not wrapped in a group
            with trio.fail_after(bound):
                return ReplicaAnswer(b.broker_id, b.address, await c.replica_digest())
        except (EQueueError, trio.TooSlowError) as exc:
            return ReplicaAnswer(b.broker_id, b.address, None, str(exc) or type(exc).__name__)


async def _verify_cluster(router: Router, timeout: float, connect_timeout: float = 3.0) -> VerifyReport:
    """REPLICA_DIGEST of every live replica of every group (as CLUSTER_STATUS lists
    them), asked again every :data:`VERIFY_POLL` s until a group's replicas answer at
    one position (then compared: :func:`judge`) or ``timeout`` passes (INCOMPARABLE).
    Replicas the cluster knows but that are not live are named in the verdict's
    ``detail``, not compared. Standalone: the one broker, compared with nothing (EQUAL)."""
    boot = router.bootstrap
    status = await boot.cluster_status()
    deadline = trio.current_time() + timeout
    verdicts: list[GroupVerdict] = []

    async def one(g: control.GroupStatus) -> None:
        if status.cluster:
            live = [b for b in g.brokers if b.alive and b.address]
        else:
            address = ",".join(f"{h}:{p}" for h, p in boot.brokers)
            live = [control.BrokerStatus(status.broker_id, "", address, 0, True)]
        while True:
            answers: list[ReplicaAnswer] = []

            async def ask(b: control.BrokerStatus, into: list[ReplicaAnswer]) -> None:
                into.append(await _digest(b, boot, connect_timeout, deadline))

            async with trio.open_nursery() as nursery:
                for b in live:
                    nursery.start_soon(ask, b, answers)
            found = judge(g.name, answers)
            if found is not None:
                gone = [f"{b.broker_id} ({b.address or 'no address'})" for b in g.brokers if b not in live]
                if gone and found.verdict is not Verdict.INCOMPARABLE:
                    found = attrs.evolve(found, detail="not live, not compared: " + ", ".join(gone))
                verdicts.append(found)
                return
            if trio.current_time() + VERIFY_POLL > deadline:
                verdicts.append(_gave_up(g.name, answers, timeout))
                return
            await trio.sleep(VERIFY_POLL)

    async with trio.open_nursery() as nursery:
        for g in status.groups:
            nursery.start_soon(one, g)
    return VerifyReport(sorted(verdicts, key=lambda v: v.group))


# ----------------------------------------------------------------------------- recovery
@attrs.frozen
class RecoveryCandidate:
    """One live replica of a group as ``equeue cluster recover`` sees it: the epoch of
    its last entry and its log position (None: it did not answer, ``error`` says why)."""

    broker_id: str
    address: str
    last_epoch: int | None
    position: int | None
    error: str = ""


@attrs.frozen
class RecoveryPlan:
    """What ``equeue cluster recover`` would write: the ISR record of ``group`` at
    ``epoch`` (the highest last epoch of the replicas that answered) with ``leader``
    alone (the most advanced replica, or the one asked for); ``problem`` (not empty):
    why nothing can be written."""

    group: str
    candidates: list[RecoveryCandidate]
    epoch: int
    leader: str
    problem: str = ""


async def _plan_recovery(router: Router, group: str, leader: str = "", connect_timeout: float = 3.0) -> RecoveryPlan:
    """Ask every live replica of ``group`` (as CLUSTER_STATUS lists them) for its
    REPLICATION_STATUS and plan the recovery (see :class:`RecoveryPlan`)."""
    boot = router.bootstrap
    status = await boot.cluster_status()
    if not status.cluster:
        return RecoveryPlan(group, [], 0, "", "the broker is standalone: there is no broker group to recover")
    g = next((g for g in status.groups if g.name == group), None)
    if g is None:
        known = ", ".join(x.name for x in status.groups) or "none"
        return RecoveryPlan(group, [], 0, "", f"no broker group {group!r} is registered (known: {known})")
    candidates: list[RecoveryCandidate] = []

    async def ask(b: control.BrokerStatus) -> None:
        async with AsyncClient(b.address, connect_timeout=connect_timeout, security=boot.security) as c:
            try:  # inside the client's block: its errors are raised here, not wrapped in a group
                with trio.fail_after(connect_timeout + 5):
                    st = await c.replication_status()
            except (EQueueError, OSError, trio.TooSlowError) as exc:
                candidates.append(RecoveryCandidate(b.broker_id, b.address, None, None, str(exc) or type(exc).__name__))
                return
        candidates.append(RecoveryCandidate(b.broker_id, b.address, st.last_epoch, st.position))

    async with trio.open_nursery() as nursery:
        for b in g.brokers:
            if b.alive and b.address:
                nursery.start_soon(ask, b)
    candidates.sort(key=lambda c: c.broker_id)
    answered = [c for c in candidates if c.last_epoch is not None and c.position is not None]
    if not answered:
        return RecoveryPlan(group, candidates, 0, "", f"no replica of group {group!r} answered")
    epoch = max(c.last_epoch or 0 for c in answered)
    if leader:
        chosen = next((c for c in answered if c.broker_id == leader), None)
        if chosen is None:
            return RecoveryPlan(group, candidates, epoch, leader, f"{leader} is not a live replica of {group!r} "
                                "that answered")  # fmt: skip
    else:
        chosen = max(answered, key=lambda c: (c.last_epoch or 0, c.position or 0))
    return RecoveryPlan(group, candidates, epoch, chosen.broker_id)


async def _recover_group(router: Router, plan: RecoveryPlan, connect_timeout: float = 3.0) -> control.ReplicationStatus:
    """Send the plan's CLUSTER_RECOVER to its leader-to-be. Raises BrokerError (the
    broker's refusal: etcd has a leader or a newer record, an epoch below its own)."""
    boot = router.bootstrap
    chosen = next(c for c in plan.candidates if c.broker_id == plan.leader)
    async with AsyncClient(chosen.address, connect_timeout=connect_timeout, security=boot.security) as c:
        return await c.call(control.ClusterRecover(plan.group, plan.epoch, [plan.leader]), control.ReplicationStatus)


# ----------------------------------------------------------------------------- hand-over
async def _hand_over_group(router: Router, group: str, to: str = "", connect_timeout: float = 3.0) -> control.ReplicationStatus:
    """CLUSTER_HANDOVER to ``group``'s leader (as the route table names it). Raises
    ConfigError (no such group, or it has no leader now), BrokerError (the leader's
    refusal: not an in-sync follower, the target did not catch up in time)."""
    boot = router.bootstrap
    table = await boot.get_routes([])
    route = next((g for g in table.groups if g.name == group), None)
    if not table.cluster or route is None:
        known = ", ".join(g.name for g in table.groups) or "none"
        raise ConfigError(f"no broker group {group!r} (known: {known})")
    if not route.addresses:
        raise ConfigError(f"group {group!r} has no leader now: nothing to hand over")
    async with AsyncClient(route.addresses[0], connect_timeout=connect_timeout, security=boot.security) as c:
        return await c.call(control.ClusterHandover(group, to), control.ReplicationStatus)


# ----------------------------------------------------------------------------- the client
P = ParamSpec("P")


def _operation(
    method: Callable[Concatenate[AsyncAdminClient, P], Awaitable[T]],
) -> Callable[Concatenate[AsyncAdminClient, P], Coroutine[Any, Any, T]]:
    """An admin operation as the SDK promises it: ClientClosed once the client is
    closed, and the EQueueError a failing broker group raised itself, not the exception
    group of the nursery that fanned the operation out (the first one, as
    :func:`equeue.errors.first_error` finds it; anything else passes unchanged)."""

    @functools.wraps(method)
    async def run(self: AsyncAdminClient, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise ClientClosed("the admin client is closed")
        try:
            return await method(self, *args, **kwargs)
        except BaseExceptionGroup as group:
            error = first_error(group)
            if error is None:
                raise
            raise error from None

    return run


class AsyncAdminClient(StackOwner):
    """The trio admin client of one equeue cluster (module docstring).

    ``async with AsyncAdminClient("host:5800,host2:5800") as admin`` opens a bootstrap
    :class:`~equeue.client.async_client.AsyncClient` and a
    :class:`~equeue.client.routing.Router` over it (one connection per broker group, made
    when first needed); leaving the block closes them. ``connect_timeout`` and
    ``security`` are the bootstrap client's (None: from the ``EQUEUE_*`` environment),
    ``refresh_interval`` the seconds between two route refreshes, ``policy`` how a request
    is retried across a failover.

    Every method raises ClientClosed outside the block, the broker's refusal as its
    :class:`~equeue.errors.EQueueError` (NotAuthorized, TopicNotFound, ...) and
    ConnectionBroken when no broker answers; bad arguments (an invalid group name, a
    missing ``broker_group``) are refused before anything is sent.
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        connect_timeout: float = 5.0,
        security: ClientSecurity | None = None,
        refresh_interval: float = 60.0,
        policy: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self._client = AsyncClient(brokers, connect_timeout=connect_timeout, security=security)
        self._router = Router(self._client, refresh_interval=refresh_interval, policy=policy)
        #: set by :meth:`aclose`: every operation raises ClientClosed from then on (a
        #: cluster's router would otherwise open a group's connection again)
        self._closed = False

    async def _enter(self, stack: AsyncExitStack) -> None:
        await stack.enter_async_context(self._client)
        await stack.enter_async_context(self._router)
        # on exit, close the groups' connections before the router's nursery cancels their tasks
        stack.push_async_callback(self._router.aclose)

    async def aclose(self) -> None:
        """Close every connection (the groups' and the bootstrap's); later calls raise
        ClientClosed. Idempotent; leaving the ``async with`` block does it too."""
        self._closed = True
        await self._router.aclose()
        await self._client.aclose()

    @property
    def client(self) -> AsyncClient:
        """The bootstrap connection (single-broker requests: STATS of that broker, ...)."""
        return self._client

    @property
    def router(self) -> Router:
        """The route table and the per-group connections the operations fan out over."""
        return self._router

    # ------------------------------------------------------------------ topics
    @_operation
    async def list_topics(self, include_internal: bool = True) -> list[control.TopicInfo]:
        """Every topic (with ``include_internal``, the retry and dead-letter topics too),
        from any group's leader."""
        return await _at_any_leader(self._router, lambda c: c.list_topics(include_internal))

    @_operation
    async def create_topic(
        self,
        name: str,
        queues: int = 4,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Create topic ``name`` with ``queues`` queues, at any group's leader (arguments
        as :meth:`AsyncClient.create_topic <equeue.client.async_client.AsyncClient.create_topic>`).
        Raises TopicExists (unless ``exist_ok``), InvalidName, ConfigError (a bad
        setting, before anything is sent)."""
        return await _at_any_leader(self._router, lambda c: c.create_topic(
            name, queues, retention_ms=retention_ms, retention_bytes=retention_bytes, exist_ok=exist_ok,
            compression=compression,
        ))  # fmt: skip

    @_operation
    async def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        reset: Iterable[str] = (),
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Grow ``name``'s queue count and/or change its retention overrides or
        compression, at any group's leader (arguments as
        :meth:`AsyncClient.alter_topic <equeue.client.async_client.AsyncClient.alter_topic>`).
        Raises TopicNotFound, ConfigError (a shrink, a bad setting)."""
        reset = list(reset)
        return await _at_any_leader(self._router, lambda c: c.alter_topic(
            name, queues=queues, retention_ms=retention_ms, retention_bytes=retention_bytes, reset=reset,
            compression=compression,
        ))  # fmt: skip

    @_operation
    async def describe_topic(self, name: str) -> MergedTopic:
        """``name``'s settings and each queue's stats from the group that owns it (None:
        that group is down). Raises TopicNotFound."""
        return await _describe_topic(self._router, name)

    @_operation
    async def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` (its messages are removed in the background), at any
        group's leader. Raises TopicNotFound, ReservedTopic."""
        await _at_any_leader(self._router, lambda c: c.delete_topic(name))

    @_operation
    async def pause_topic(self, name: str) -> control.PauseAnswer:
        """Refuse ``name``'s produce (TOPIC_PAUSED) at every broker group; consumers
        still read what it holds. Raises TopicNotFound, ReservedTopic, NotAuthorized."""
        return await _pause_topic(self._router, name)

    @_operation
    async def resume_topic(self, name: str) -> control.PauseAnswer:
        """Accept ``name``'s produce again (``changed`` False: it was not paused)."""
        return await _resume_topic(self._router, name)

    # ------------------------------------------------------------------ consumer groups
    @_operation
    async def list_groups(self) -> list[control.GroupSummary]:
        """Every consumer group known to any broker group, by name."""
        return await _list_groups(self._router)

    @_operation
    async def describe_group(self, group: str) -> control.GroupDescription:
        """``group``'s live members and each queue's committed offset and lag, from every
        broker group. Raises InvalidName, GroupNotFound."""
        return await _describe_group(self._router, group)

    @_operation
    async def delete_group(self, group: str, force: bool = False) -> dict[str, control.DeleteGroupAnswer]:
        """Delete ``group``'s offsets and state at every broker group; the answers of the
        broker groups that had something of it. Raises InvalidName, GroupNotFound,
        GroupHasMembers (live members and not ``force``: nothing is deleted)."""
        return await _delete_group(self._router, group, force)

    @_operation
    async def reset_offsets(
        self, group: str, topic: str, to: control.ResetTarget | str, timestamp_ms: int = 0, force: bool = False
    ) -> dict[int, int]:
        """Set ``group``'s committed offsets of ``topic`` to ``to`` (a
        :class:`~equeue.control.ResetTarget` or its string; ``time`` takes
        ``timestamp_ms``) at each queue's owner; the new offset of each queue. Raises
        ConfigError for another target (before anything is sent), TopicNotFound,
        GroupHasMembers while members are live (unless ``force``)."""
        try:
            target = control.ResetTarget(to)
        except ValueError:
            choices = ", ".join(t.value for t in control.ResetTarget)
            raise ConfigError(f"reset target {to!r}: expected one of {choices}") from None
        return await _reset_offsets(self._router, group, topic, target, timestamp_ms, force)

    @_operation
    async def pause_group(self, group: str) -> control.PauseAnswer:
        """Hold ``group``'s pulls at every broker group (nothing delivered; offsets,
        members and leases kept). Raises InvalidName, NotAuthorized."""
        return await _pause_group(self._router, group)

    @_operation
    async def resume_group(self, group: str) -> control.PauseAnswer:
        """Deliver to ``group`` again (``changed`` False: it was not paused)."""
        return await _resume_group(self._router, group)

    # ------------------------------------------------------------------ dead letters
    @_operation
    async def dlq_list(self, group: str, queue_id: int = 0, offset: int = 0, limit: int = 100) -> MergedDlqPage:
        """One page of ``group``'s dead letters from the cursor (``queue_id``,
        ``offset``), from every broker group; the page's cursor continues after it."""
        return await _dlq_list(self._router, group, queue_id, offset, limit)

    @_operation
    async def dlq_resend(
        self, group: str, ids: Sequence[int] = (), all_letters: bool = False, broker_group: str | None = None
    ) -> control.DlqResendAnswer:
        """Send ``group``'s dead letters ``ids`` (or every one: ``all_letters``) back to
        their topic, each at most once. Letter ids are offsets in one broker group's
        store: with ids and several groups, ``broker_group`` says which (ConfigError
        when it is missing or not live)."""
        return await _dlq_resend(self._router, group, list(ids), all_letters, broker_group)

    # ------------------------------------------------------------------ messages
    @_operation
    async def get_message(
        self,
        topic: str = "",
        queue_id: int = -1,
        queue_offset: int = -1,
        global_offset: int = -1,
        broker_group: str | None = None,
    ) -> PullResult:
        """The message at (``topic``, ``queue_id``, ``queue_offset``) from the queue's
        owner, or, with ``queue_id`` -1, at ``global_offset`` of ``broker_group``'s store
        (required when several groups are live: ConfigError)."""
        if queue_id < 0 and global_offset < 0:
            raise ConfigError("get_message: give a queue id and queue offset, or a global offset")
        return await _get_message(self._router, topic, queue_id, queue_offset, global_offset, broker_group)

    @_operation
    async def find_by_key(self, topic: str, key: str, limit: int = 32, before: int = -1) -> PullResult:
        """Messages of ``topic`` with ``key`` from every owner group, newest first, at
        most ``limit``, below global offset ``before`` (-1: all; one group only)."""
        return await _find_by_key(self._router, topic, key, limit, before)

    @_operation
    async def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of the queue stored at or after ``timestamp_ms`` (the
        queue's end when none is), from its owner."""
        return await _offset_for_time(self._router, topic, queue_id, timestamp_ms)

    @_operation
    async def skip_message(self, topic: str, queue_id: int, queue_offset: int) -> control.SkipAnswer:
        """Make the queue's owner stop serving the record at ``queue_offset`` (consumers
        stuck on a corrupt record move past it)."""
        return await self._router.call(topic, queue_id, lambda c: c.skip_message(topic, queue_id, queue_offset))

    @_operation
    async def list_skipped(self, topic: str) -> dict[int, list[int]]:
        """The skipped offsets of ``topic`` by queue, from each queue's owner."""
        return await _list_skipped(self._router, topic)

    # ------------------------------------------------------------------ cluster
    @_operation
    async def cluster_status(self) -> control.ClusterStatus:
        """CLUSTER_STATUS as the bootstrap broker sees it (standalone: ``cluster``
        false)."""
        return await self._client.cluster_status()

    @_operation
    async def cluster_report(self, connect_timeout: float = 3.0) -> ClusterReport:
        """The cluster status, whether each registered broker answers (with its round
        trip) and each group's replication state."""
        return await _cluster_report(self._router, connect_timeout)

    @_operation
    async def broker_stats(self, connect_timeout: float = 3.0) -> list[BrokerStatsRow]:
        """STATS of every registered broker, concurrently (a row with ``error`` for one
        that does not answer)."""
        return await _broker_stats(self._router, connect_timeout)

    @_operation
    async def verify_cluster(self, timeout: float = 30.0, connect_timeout: float = 3.0) -> VerifyReport:
        """Compare the replicas of every group at one log position (REPLICA_DIGEST),
        waiting at most ``timeout`` s for them to stand at one (see
        :attr:`VerifyReport.exit_code`). Needs an admin user under authentication."""
        return await _verify_cluster(self._router, timeout, connect_timeout)

    @_operation
    async def plan_recovery(self, group: str, leader: str = "", connect_timeout: float = 3.0) -> RecoveryPlan:
        """What recovering leaderless broker group ``group`` would write (its
        ``problem`` says why nothing can be); ``leader``: the replica to make leader
        (empty: the most advanced)."""
        return await _plan_recovery(self._router, group, leader, connect_timeout)

    @_operation
    async def recover_group(self, plan: RecoveryPlan, connect_timeout: float = 3.0) -> control.ReplicationStatus:
        """Carry out ``plan`` (from :meth:`plan_recovery`). Raises BrokerError (the
        broker's refusal: etcd has a leader or a newer record)."""
        return await _recover_group(self._router, plan, connect_timeout)

    @_operation
    async def hand_over_group(self, group: str, to: str = "", connect_timeout: float = 3.0) -> control.ReplicationStatus:
        """Move ``group``'s leadership to in-sync follower ``to`` (empty: the leader
        picks one). Raises ConfigError (no such group, no leader now), BrokerError."""
        return await _hand_over_group(self._router, group, to, connect_timeout)
