"""What every request family shares: the per-request context, the narrow write
side, the configuration values handlers read, and topic lookup (with auto-create).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs

from equeue import control
from equeue.broker.groups import Notify
from equeue.broker.handshake import Session
from equeue.broker.storage import CreateTopicOp, StoreReader, WriteOp
from equeue.broker.thread_answer import ThreadWritable
from equeue.config import BrokerConfig
from equeue.errors import BadRequest, QueueNotFound, TopicNotFound
from equeue.names import is_internal, validate_topic

log = logging.getLogger("equeue.handlers")

__all__ = [
    "Closing",
    "ClusterRole",
    "Limits",
    "OpQueue",
    "Parts",
    "ReplicaGate",
    "RequestContext",
    "Submit",
    "TopicDirectory",
    "check_queue",
]

#: a response payload, as pieces
Parts = list[bytes]
#: the appender's submit: queue a write op, wait until it committed, its result
Submit = Callable[[WriteOp], Awaitable[Any]]


class OpQueue(Protocol):
    """The appender's write side as the produce fast path uses it."""

    def enqueue(self, op: WriteOp, callback: Any = None, *, defer: bool = False) -> Any: ...
    def kick(self) -> None: ...
    async def wait(self, p: Any) -> Any: ...


class RequestContext:
    """What a handler may know of the request it answers and of its connection.

    ``notify`` pushes GROUP_CHANGED to the connection (heartbeats register it).
    ``output`` is where the writer thread may write this request's answer itself
    (parked pulls, :mod:`equeue.broker.thread_answer`); None: answers go through the caller.
    ``session`` says who sent it (:class:`equeue.broker.handshake.Session`: the user, the
    peer); None, or a session without a user: the broker does not authenticate.
    """

    __slots__ = ("notify", "output", "request_id", "session")

    def __init__(
        self,
        request_id: int = 0,
        notify: Notify | None = None,
        output: ThreadWritable | None = None,
        session: Session | None = None,
    ) -> None:
        self.request_id = request_id
        self.notify = notify
        self.output = output
        self.session = session

    @property
    def principal(self) -> str | None:
        """The authenticated user (None: authentication is off)."""
        return None if self.session is None else self.session.principal

    @property
    def peer(self) -> str:
        return "?" if self.session is None else self.session.peer


class Closing:
    """Whether the broker is shutting down (set once by the server; read by handlers)."""

    __slots__ = ("closing",)

    def __init__(self) -> None:
        self.closing = False


@attrs.frozen
class Limits:
    """The configuration values the handlers read."""

    auto_create_topics: bool
    default_queues: int
    max_queues: int
    max_message_bytes: int
    max_delay_ms: int
    max_frame: int
    max_pull_wait: float

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> Limits:
        return cls(
            cfg.auto_create_topics, cfg.default_queues, cfg.max_queues, cfg.max_message_bytes,
            int(cfg.max_delay * 1000), cfg.max_frame, cfg.max_pull_wait,
        )  # fmt: skip


#: the largest offset (or id) the store's keys can hold
U64_MAX = (1 << 64) - 1


def check_offset(name: str, value: int) -> None:
    """Raises BadRequest unless ``value`` fits the store's u64 keys (0 .. 2^64-1): a
    negative or oversized offset from a client is a coded refusal, never an internal
    error inside a read or a write transaction."""
    if not 0 <= value <= U64_MAX:
        raise BadRequest(f"{name} must be in 0..2^64-1, got {value}")


def check_queue(info: control.TopicInfo, queue_id: int) -> None:
    """Raises QueueNotFound unless ``queue_id`` is one of the topic's queues."""
    if not 0 <= queue_id < info.queues:
        raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")


#: ``may_create(principal, topic)``: raises NotAuthorized unless the user may create it
MayCreate = Callable[[str, str], None]


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


class TopicDirectory:
    """Topic lookup for handlers: an existing topic, or one created on first use
    (when the broker auto-creates topics; retry and dead-letter topics always)."""

    def __init__(
        self, store: StoreReader, submit: Submit, limits: Limits, may_create: MayCreate | None = None,
        cluster: ClusterRole | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        #: the cluster role (None: standalone): topics come from etcd, queues are owned
        self.cluster = cluster
        self._submit = submit
        self._auto_create = limits.auto_create_topics
        self._default_queues = limits.default_queues
        #: with authentication on: raises NotAuthorized unless the user may create it
        self._may_create = may_create

    def get(self, name: str) -> control.TopicInfo | None:
        return self._store.topics.get(name)

    async def require(self, name: str, auto_create: bool = False, principal: str | None = None) -> control.TopicInfo:
        """The topic ``name``; raises TopicNotFound (or InvalidName), or
        NotAuthorized when ``principal`` (None: no authentication) would auto-create
        it without the ``admin`` permission on its name (Kafka's CREATE)."""
        info = self._store.topics.get(name)
        cluster = self.cluster
        if info is not None and (cluster is None or name in cluster.owned):
            return info
        validate_topic(name, allow_internal=True)
        # internal retry/DLQ topics are always created on first use
        internal = is_internal(name)
        create = auto_create and (self._auto_create or internal)
        if cluster is not None:  # etcd knows the topic (the local store follows), or gets it
            try:
                return await cluster.require(name, None)
            except TopicNotFound:
                if not create:
                    raise
        if create and principal is not None and self._may_create is not None and not internal:
            self._may_create(principal, name)
        if cluster is not None:
            return await cluster.require(name, self._default_queues)
        if create:
            info = await self._submit(CreateTopicOp(name, self._default_queues, exist_ok=True))
            log.info("auto-created topic %s with %d queues", name, info.queues)
            return info  # type: ignore[no-any-return]
        raise TopicNotFound(f"no topic {name!r} (create it with: equeue topic create {name})")

    def check_owner(self, topic: str, queue_id: int) -> None:
        """Raises NotOwner (or QueueUnavailable) when this broker's group does not own
        the queue (cluster mode; a standalone broker owns every queue)."""
        cluster = self.cluster
        if cluster is not None:
            owned = cluster.owned.get(topic)
            if owned is None or queue_id not in owned:
                cluster.refuse(topic, queue_id)

    async def require_queue(self, topic: str, queue_id: int) -> control.TopicInfo:
        """The topic of a queue-level request, once the queue is checked: it exists
        (QueueNotFound) and this broker's group owns it (NotOwner, QueueUnavailable)."""
        info = await self.require(topic)
        if self.cluster is not None and queue_id >= info.queues:
            info = await self.cluster.require(topic, None)  # the local store may lag a grow
        check_queue(info, queue_id)
        self.check_owner(topic, queue_id)
        return info
