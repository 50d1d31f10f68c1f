"""The broker's roles as handlers see them: the cluster role (ownership, topics in
etcd, routes, pauses) and the replica gate (leadership, the ISR); both None in a
standalone broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from equeue import control

__all__ = ["ClusterRole", "ReplicaGate"]


class ClusterRole(Protocol):
    """What handlers use of the broker's cluster role (:class:`equeue.broker.cluster.node.ClusterNode`);
    None in a standalone broker. Topic changes go through etcd; queue-level requests
    are checked against the placement (docs/cluster.md, "Routing")."""

    #: this broker's group
    group: str
    #: topic -> the queue ids this group owns, for every topic the view knows (the
    #: produce hot path reads it: one dict lookup); swapped whole on each change
    owned: dict[str, frozenset[int]]

    def refuse(self, topic: str, queue_id: int) -> None:
        """Raises NotOwner naming the owner group, or QueueUnavailable when that group
        has no live broker; TopicNotFound when the view does not know the topic,
        QueueNotFound for a queue id past the cluster's count."""

    def owner_of(self, topic: str, queue_id: int) -> str:
        """The group owning the queue ("" when the view does not know it)."""

    async def require(self, name: str, create_queues: int | None) -> control.TopicInfo:
        """The local topic once it matches its placement: looked up in etcd when the
        view does not know it yet, created there when ``create_queues`` is given (and
        it is absent). Raises TopicNotFound, ClusterUnavailable."""

    async def create_topic(self, req: control.CreateTopic) -> control.TopicInfo: ...
    async def alter_topic(self, req: control.AlterTopic) -> control.TopicInfo: ...
    async def delete_topic(self, name: str) -> None: ...

    async def own_queue(self, topic: str, origin_queue: int) -> tuple[control.TopicInfo, int]:
        """A queue of the internal topic ``topic`` owned by this group, picked by
        ``origin_queue`` modulo the owned ones (one placed here first when none is):
        (the local topic, the queue id). Raises ClusterUnavailable."""

    def route_table(self, topics: list[control.TopicInfo], missing: list[str]) -> control.RouteTable: ...
    async def status(self) -> control.ClusterStatus: ...

    # pauses live in etcd (:class:`equeue.broker.pauses.ClusterPauses`)
    def paused(self, kind: str) -> frozenset[str]: ...
    async def set_paused(self, kind: str, name: str, paused: bool) -> bool: ...
    def on_pauses(self, callback: Callable[[], None]) -> Callable[[], None]: ...


class ReplicaGate(Protocol):
    """What handlers use of the broker's replica role
    (:class:`equeue.broker.replication.role.ReplicaRole`); None in a standalone broker."""

    def check_serving(self) -> None:
        """Raises NotLeader unless this broker leads its group now (and is not fenced)."""

    def check_produce(self) -> None:
        """check_serving, and NotEnoughReplicas when the ISR is below --min-insync."""

    @property
    def reads_held(self) -> bool:
        """Just promoted: requests wait (:meth:`wait_reads`) until the high watermark
        reaches the promotion's end."""

    async def wait_reads(self) -> None:
        """Wait until reads may see the store; raises NotLeader when leadership ends."""

    def status(self) -> control.ReplicationStatus: ...
