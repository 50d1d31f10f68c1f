"""Topic requests: create, delete, alter, list, route, describe."""

from __future__ import annotations

from broker.handlers.base import Limits, RequestContext, Submit, TopicDirectory
from broker.storage import AlterTopicOp, CreateTopicOp, DeleteTopicOp, StoreReader
from equeue import control
from equeue.errors import BadRequest
from equeue.names import is_internal, validate_topic

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
        return await self._submit(  # type: ignore[no-any-return]
            CreateTopicOp(req.name, req.queues, req.retention_ms, req.retention_bytes, req.exist_ok)
        )

    def _check_queues(self, n: int) -> None:
        if not 1 <= n <= self._max_queues:
            raise BadRequest(f"queue count must be between 1 and {self._max_queues}, got {n}")

    async def delete_topic(self, req: control.DeleteTopic, ctx: RequestContext) -> None:
        await self._topics.require(req.name)
        await self._submit(DeleteTopicOp(req.name))

    async def alter_topic(self, req: control.AlterTopic, ctx: RequestContext) -> control.TopicInfo:
        await self._topics.require(req.name)
        if req.queues is not None:
            self._check_queues(req.queues)
        return await self._submit(  # type: ignore[no-any-return]
            AlterTopicOp(req.name, req.queues, req.retention_ms, req.retention_bytes)
        )

    async def list_topics(
        self, req: control.ListTopics, ctx: RequestContext
    ) -> list[control.TopicInfo]:
        return sorted(
            (
                t
                for t in self._store.topics.values()
                if req.include_internal or not is_internal(t.name)
            ),
            key=lambda t: t.name,
        )

    async def get_route(self, req: control.GetRoute, ctx: RequestContext) -> control.TopicInfo:
        return await self._topics.require(req.topic, auto_create=req.auto_create, principal=ctx.principal)

    async def describe_topic(
        self, req: control.DescribeTopic, ctx: RequestContext
    ) -> control.TopicDescription:
        await self._topics.require(req.name)
        return self._store.describe(req.name)
