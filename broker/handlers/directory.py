"""Topic lookup for handlers: an existing topic, or one created on first use, and
the checks of a queue-level request (the queue exists, this broker's group owns it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from equeue import control
from equeue.broker.handlers.limits import Limits, check_queue
from equeue.broker.handlers.roles import ClusterRole
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import CreateTopicOp, StoreReader
from equeue.errors import TopicNotFound
from equeue.names import is_internal, validate_topic

log = logging.getLogger("equeue.handlers")

__all__ = ["MayCreate", "TopicDirectory"]

#: ``may_create(principal, topic)``: raises NotAuthorized unless the user may create it
MayCreate = Callable[[str, str], None]


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
