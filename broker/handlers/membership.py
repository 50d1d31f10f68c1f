"""Group requests: heartbeat (membership and leases), leave, release, list, describe,
delete.

Cluster mode (docs/cluster.md, "Consumer groups across broker groups"): a broker
grants, and describes, only the leases of queues its group owns; members heartbeat
to every group and merge.

An ephemeral group (``<name>#ephemeral``) is described from the registry alone (its
offsets are in memory there) and exists only while it has a live member."""

from __future__ import annotations

import attrs

from equeue import control
from equeue.broker.groups import GroupRegistry
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.roles import ClusterRole
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import DeleteGroupOffsetsOp, StoreReader
from equeue.errors import GroupHasMembers, GroupNotFound
from equeue.names import is_ephemeral, validate_group

__all__ = ["GroupHandlers"]


class GroupHandlers:
    def __init__(
        self, store: StoreReader, groups: GroupRegistry, cluster: ClusterRole | None = None,
        submit: Submit | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._groups = groups
        self._cluster = cluster
        self._submit = submit

    def _owns(self, key: str) -> bool:
        """Whether this broker's group owns the queue of lease ``key`` ("topic/queue")."""
        topic, _, queue = key.rpartition("/")
        owned = self._cluster.owned.get(topic) if self._cluster is not None else None
        return owned is not None and queue.isdigit() and int(queue) in owned

    async def heartbeat(
        self, req: control.Heartbeat, ctx: RequestContext
    ) -> control.HeartbeatAnswer:
        validate_group(req.group)
        if self._cluster is not None and req.acquire:  # leases of other groups' queues: theirs to grant
            req = attrs.evolve(req, acquire=[k for k in req.acquire if self._owns(k)])
        counts: dict[str, int] = {}
        for t in req.topics:
            info = self._store.topics.get(t)
            if info is not None:
                counts[t] = info.queues
        return self._groups.heartbeat(req, ctx.notify, counts)

    async def leave_group(self, req: control.LeaveGroup, ctx: RequestContext) -> None:
        self._groups.leave(req.group, req.consumer_id)

    async def release_queues(self, req: control.ReleaseQueues, ctx: RequestContext) -> None:
        self._groups.release(req.group, req.consumer_id, req.leases)

    def _offsets(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queue) -> ``group``'s committed offset held here (an ephemeral
        group's: in the registry's memory)."""
        if is_ephemeral(group):
            return self._groups.ephemeral_offsets(group)
        return self._store.group_offsets(group)

    async def list_groups(
        self, req: control.ListGroups, ctx: RequestContext
    ) -> list[control.GroupSummary]:
        store, groups = self._store, self._groups
        names = set(groups.groups) | store.groups_of()
        out = []
        for name in sorted(names):
            members = groups.live_members(name)
            topics = sorted(
                {t for m in members for t in m.topics}
                | {t for (t, _q) in self._offsets(name)}
            )
            out.append(control.GroupSummary(name, len(members), topics, ephemeral=is_ephemeral(name)))
        return out

    async def describe_group(
        self, req: control.DescribeGroup, ctx: RequestContext
    ) -> control.GroupDescription:
        validate_group(req.group)
        store, groups = self._store, self._groups
        members = groups.live_members(req.group)
        offsets = self._offsets(req.group)
        topics = {t for m in members for t in m.topics} | {t for (t, _q) in offsets}
        cluster = self._cluster
        me = cluster.group if cluster is not None else ""
        queues = []
        for t in sorted(topics):
            info = store.topics.get(t)
            if info is None:
                continue
            owned = cluster.owned.get(t, frozenset()) if cluster is not None else None
            for q in range(info.queues):
                if owned is not None and q not in owned:
                    continue  # the owner group answers for it
                qs = store.queue_state(info.topic_id, q)
                committed = offsets.get((t, q), -1)
                base = committed if committed >= 0 else qs.min_offset
                gq = control.GroupQueue(
                    t, q, groups.owner(req.group, t, q), committed, qs.next_offset,
                    max(0, qs.next_offset - max(base, qs.min_offset)), me,
                )  # fmt: skip
                queues.append(gq)
        g = groups.groups.get(req.group)
        return control.GroupDescription(
            req.group, members, queues, g.generation if g else 0, ephemeral=is_ephemeral(req.group)
        )

    async def delete_group(self, req: control.DeleteGroup, ctx: RequestContext) -> control.DeleteGroupAnswer:
        """Delete the group's committed offsets held here (in a cluster: of the queues
        this broker group owns; the CLI asks every group) and its state. Raises
        InvalidName, GroupHasMembers while it has live members (unless ``force``: its
        offsets go, its members stay), GroupNotFound when nothing of it is here."""
        validate_group(req.group)
        live = self._groups.live_members(req.group)
        if live and not req.force:
            raise GroupHasMembers(
                f"group {req.group!r} has {len(live)} live member(s); stop them first or pass --force"
            )
        if is_ephemeral(req.group):  # its offsets are in memory; no member: it does not exist
            g = self._groups.ephemeral(req.group)
            gone = len(g.offsets)
            g.offsets.clear()
            return control.DeleteGroupAnswer(req.group, gone, len(live))
        known = req.group in self._groups.groups
        # the delete decides from the store's own transaction, not the published view (on a
        # replicated leader, offsets committed but not yet replicated are not in the view)
        assert self._submit is not None
        gone = await self._submit(DeleteGroupOffsetsOp(req.group))
        # a member may have joined while the delete was written: its state stays
        live = self._groups.live_members(req.group)
        if not live:
            self._groups.forget(req.group)
        if not gone and not known and not live:
            raise GroupNotFound(f"no such group {req.group!r}")
        return control.DeleteGroupAnswer(req.group, gone, len(live))

