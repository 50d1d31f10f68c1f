"""Topic requests: create, delete, alter, list, route, describe.

Cluster mode: create, alter and delete change the placement in etcd and answer once
the local store follows; a listing shows the topics etcd has; a description lists
only the queues this broker's group owns (the CLI merges the groups' answers).

Retention settings are checked here, whatever the client checked
(:func:`equeue.retention.check_topic_settings`): -1 keeps forever, > 0 is the limit,
anything else is BAD_REQUEST before anything is written, here or in etcd."""

from __future__ import annotations

import attrs

from equeue import control
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import AlterTopicOp, CreateTopicOp, DeleteTopicOp, StoreReader
from equeue.errors import BadRequest
from equeue.names import is_internal, validate_topic
from equeue.retention import check_topic_settings

__all__ = ["TopicHandlers"]


class TopicHandlers:
    def __init__(
        self, topics: TopicDirectory, store: StoreReader, submit: Submit, limits: Limits
    ) -> None:
        self._topics = topics
        self._store = store
        self._submit = submit
        self._max_queues = limits.max_queues

    async def create_topic(
        self, req: control.CreateTopic, ctx: RequestContext
    ) -> control.TopicInfo:
        validate_topic(req.name)
        self._check_queues(req.queues)
        check_topic_settings(req.retention_ms, req.retention_bytes, error=BadRequest)
        control.check_compression(req.compression)
        if self._topics.cluster is not None:
            return await self._topics.cluster.create_topic(req)
        return await self._submit(  # type: ignore[no-any-return]
            CreateTopicOp(req.name, req.queues, req.retention_ms, req.retention_bytes, req.exist_ok, req.compression)
        )

    def _check_queues(self, n: int) -> None:
        if not 1 <= n <= self._max_queues:
            raise BadRequest(f"queue count must be between 1 and {self._max_queues}, got {n}")

    async def delete_topic(self, req: control.DeleteTopic, ctx: RequestContext) -> None:
        if self._topics.cluster is not None:
            validate_topic(req.name, allow_internal=True)
            await self._topics.cluster.delete_topic(req.name)
            return
        await self._topics.require(req.name)
        await self._submit(DeleteTopicOp(req.name))

    async def alter_topic(self, req: control.AlterTopic, ctx: RequestContext) -> control.TopicInfo:
        retention_reset = [r for r in req.reset if r != "compression"]
        check_topic_settings(req.retention_ms, req.retention_bytes, retention_reset, error=BadRequest)
        control.check_compression(req.compression)
        if req.compression is not None and "compression" in req.reset:
            raise BadRequest("compression is both set and reset: give one or the other")
        await self._topics.require(req.name)
        if req.queues is not None:
            self._check_queues(req.queues)
        if self._topics.cluster is not None:
            return await self._topics.cluster.alter_topic(req)
        return await self._submit(  # type: ignore[no-any-return]
            AlterTopicOp(
                req.name, req.queues, req.retention_ms, req.retention_bytes, tuple(req.reset), req.compression
            )
        )

    async def list_topics(
        self, req: control.ListTopics, ctx: RequestContext
    ) -> list[control.TopicInfo]:
        cluster = self._topics.cluster
        return sorted(
            (
                t
                for t in self._store.topics.values()
                if (req.include_internal or not is_internal(t.name))
                and (cluster is None or t.name in cluster.owned)  # etcd's topics only
            ),
            key=lambda t: t.name,
        )

    async def get_route(self, req: control.GetRoute, ctx: RequestContext) -> control.TopicInfo:
        create = req.auto_create and not is_internal(req.topic)  # retry/DLQ topics: created at a SEND_BACK
        return await self._topics.require(req.topic, auto_create=create, principal=ctx.principal)

    async def describe_topic(
        self, req: control.DescribeTopic, ctx: RequestContext
    ) -> control.TopicDescription:
        await self._topics.require(req.name)
        desc = self._store.describe(req.name)
        cluster = self._topics.cluster
        if cluster is None:
            return desc
        owned = cluster.owned.get(req.name, frozenset())
        return attrs.evolve(desc, queues=[q for q in desc.queues if q.queue_id in owned])

