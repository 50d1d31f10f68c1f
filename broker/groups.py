"""Consumer-group registry: membership by heartbeats, expiry, and queue leases.

A member is alive while it heartbeats (expiry: ``member_expiry`` seconds of
silence). In clustering mode a member consumes a queue only while it holds that
queue's lease (group, topic, queue): the broker grants a lease to one live member at
a time, renews it with each heartbeat, and the pull/commit handlers reject members
that do not hold it. Membership changes bump the group's ``generation`` and push
GROUP_CHANGED to every live member so they rebalance at once.

An ephemeral group (``<name>#ephemeral``, docs/consumer.md "Ephemeral groups") also
keeps its committed offsets here, in memory only (never in the store): they go, with
the group and its leases, when its last member leaves or expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from equeue import control
from equeue.errors import GroupNotFound
from equeue.names import is_ephemeral

log = logging.getLogger("equeue.groups")

__all__ = ["GroupRegistry"]

Notify = Callable[[str], None]  # called with the group name; the server pushes


@attrs.define
class Member:
    consumer_id: str
    host: str
    topics: list[str]
    mode: str
    since_ms: int
    last_seen: float  # trio clock
    last_seen_ms: int
    notify: Notify | None = None
    #: poison records the member reported skipping (its last heartbeat)
    quarantined: int = 0

    def info(self) -> control.MemberInfo:
        return control.MemberInfo(
            self.consumer_id, self.host, list(self.topics), self.mode, self.since_ms, self.last_seen_ms,
            self.quarantined,
        )  # fmt: skip


@attrs.define
class Group:
    name: str
    members: dict[str, Member] = attrs.Factory(dict)
    leases: dict[str, str] = attrs.Factory(dict)  # "topic/queue" -> consumer id
    generation: int = 0
    #: an ephemeral group: ``offsets`` holds its committed offsets (nothing in the store)
    ephemeral: bool = False
    offsets: dict[tuple[str, int], int] = attrs.Factory(dict)  # (topic, queue) -> offset

    def gone(self) -> bool:
        """No state left worth keeping: no member and no lease; an ephemeral group
        goes with its last member (its leases and offsets with it)."""
        return not self.members and (self.ephemeral or not self.leases)


def lease_key(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


class GroupRegistry:
    def __init__(self, member_expiry: float) -> None:
        self.member_expiry = member_expiry
        self.groups: dict[str, Group] = {}

    # ---------------------------------------------------------------- membership
    def heartbeat(
        self, hb: control.Heartbeat, notify: Notify | None, queue_counts: dict[str, int]
    ) -> control.HeartbeatAnswer:
        g = self.groups.get(hb.group)
        if g is None:
            g = self.groups[hb.group] = Group(hb.group, ephemeral=is_ephemeral(hb.group))
        now = trio.current_time()
        wall = time.time_ns() // 1_000_000
        m = g.members.get(hb.consumer_id)
        changed = False
        if m is None:
            m = g.members[hb.consumer_id] = Member(
                hb.consumer_id, hb.host, list(hb.topics), hb.mode, wall, now, wall, notify, hb.quarantined
            )
            changed = True
            log.info("group %s: member %s joined", hb.group, hb.consumer_id)
        else:
            if sorted(m.topics) != sorted(hb.topics) or m.mode != hb.mode:
                changed = True
            m.topics, m.mode, m.host = list(hb.topics), hb.mode, hb.host or m.host
            m.last_seen, m.last_seen_ms = now, wall
            m.quarantined = hb.quarantined
            if notify is not None:
                m.notify = notify
        for key in hb.release:
            if g.leases.get(key) == hb.consumer_id:
                del g.leases[key]
        if hb.release:
            # a released lease may be what another member waits for
            self._notify(g, exclude=hb.consumer_id)
        for key in hb.acquire:
            holder = g.leases.get(key)
            if holder is None or holder == hb.consumer_id or holder not in g.members:
                g.leases[key] = hb.consumer_id
        if changed:
            g.generation += 1
            self._notify(g, exclude=hb.consumer_id)
        held = sorted(k for k, v in g.leases.items() if v == hb.consumer_id)
        return control.HeartbeatAnswer(
            [x.info() for x in g.members.values()], g.generation, held, queue_counts
        )

    def leave(self, group: str, consumer_id: str) -> None:
        g = self.groups.get(group)
        if g is None or consumer_id not in g.members:
            return
        del g.members[consumer_id]
        self._drop_leases(g, consumer_id)
        g.generation += 1
        log.info("group %s: member %s left", group, consumer_id)
        self._notify(g)
        if g.gone():  # as expire() does: an empty group is no state
            self._delete(g, "its last member left")

    def forget(self, group: str) -> bool:
        """Drop ``group``'s state (DELETE_GROUP of a group with no live member): its
        leases; whether there was any. Its members, if any, register again with their
        next heartbeat."""
        return self.groups.pop(group, None) is not None

    def release(self, group: str, consumer_id: str, leases: list[str]) -> None:
        g = self.groups.get(group)
        if g is None:
            return
        for key in leases:
            if g.leases.get(key) == consumer_id:
                del g.leases[key]
        self._notify(g, exclude=consumer_id)

    def holds(self, group: str, consumer_id: str, topic: str, queue_id: int) -> bool:
        """Whether ``consumer_id`` is live in ``group`` and holds the queue's lease."""
        g = self.groups.get(group)
        if g is None or consumer_id not in g.members:
            return False
        return g.leases.get(lease_key(topic, queue_id)) == consumer_id

    def live_members(self, group: str) -> list[control.MemberInfo]:
        g = self.groups.get(group)
        return [m.info() for m in g.members.values()] if g else []

    def owner(self, group: str, topic: str, queue_id: int) -> str | None:
        g = self.groups.get(group)
        if g is None:
            return None
        holder = g.leases.get(lease_key(topic, queue_id))
        return holder if holder in g.members else None

    def expire(self) -> None:
        """Drop members silent for longer than the expiry, with their leases."""
        deadline = trio.current_time() - self.member_expiry
        for g in list(self.groups.values()):
            dead = [cid for cid, m in g.members.items() if m.last_seen < deadline]
            for cid in dead:
                del g.members[cid]
                self._drop_leases(g, cid)
                log.warning("group %s: member %s expired (no heartbeat)", g.name, cid)
            if dead:
                g.generation += 1
                self._notify(g)
            if g.gone():
                self._delete(g, "its last member expired")

    def _delete(self, g: Group, why: str) -> None:
        del self.groups[g.name]
        if g.ephemeral:
            log.info("ephemeral group %s deleted with %d committed offset(s): %s", g.name, len(g.offsets), why)

    # ---------------------------------------------------------- ephemeral groups
    def ephemeral(self, group: str) -> Group:
        """The live ephemeral ``group`` (its offsets are held here). Raises
        GroupNotFound when it has no state here (no live member: it does not exist)."""
        g = self.groups.get(group)
        if g is None or not g.members:
            raise GroupNotFound(
                f"no such group {group!r}: an ephemeral group exists only while it has a live member"
            )
        return g

    def commit_ephemeral(self, group: str, topic: str, queue_id: int, offset: int, forward_only: bool) -> None:
        """Record an ephemeral group's committed offset, in memory (``forward_only``:
        a member's commit never moves it back, as ``CommitOffsetOp``). Raises
        GroupNotFound when the group has no live member here."""
        offsets = self.ephemeral(group).offsets
        if forward_only and offsets.get((topic, queue_id), -1) > offset:
            return
        offsets[(topic, queue_id)] = offset

    def ephemeral_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queue) -> committed offset of ephemeral ``group`` (empty when it is gone)."""
        g = self.groups.get(group)
        return dict(g.offsets) if g is not None else {}

    def all_ephemeral_offsets(self) -> dict[tuple[str, str, int], int]:
        """(group, topic, queue) -> committed offset of every live ephemeral group: a
        copy, taken on the loop for ``/metrics`` (the shape of ``StoreView.offsets``)."""
        return {(g.name, t, q): off for g in self.groups.values() for (t, q), off in g.offsets.items()}

    def forget_connection(self, notify: Notify) -> None:
        """A connection closed: stop pushing to it (members expire by heartbeat).

        Compared with ``==``: a bound method is a new object at every attribute
        access, so identity never matches; equal bound methods share their object.
        """
        for g in self.groups.values():
            for m in g.members.values():
                if m.notify == notify:
                    m.notify = None

    def drop_all(self) -> None:
        """Forget every member and lease (a replica that stops leading its group: the
        new leader grants leases afresh, so no queue is held at two brokers)."""
        if self.groups:
            log.warning("dropping %d consumer group(s) and their leases: this broker stopped leading",
                        len(self.groups))  # fmt: skip
        self.groups.clear()

    async def run_expiry(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.member_expiry / 5))
            self.expire()

    @staticmethod
    def _drop_leases(g: Group, cid: str) -> None:
        for key in [k for k, v in g.leases.items() if v == cid]:
            del g.leases[key]

    @staticmethod
    def _notify(g: Group, exclude: str | None = None) -> None:
        for m in g.members.values():
            if m.consumer_id != exclude and m.notify is not None:
                m.notify(g.name)
