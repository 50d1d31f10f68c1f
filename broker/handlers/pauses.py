"""PAUSE_TOPIC, RESUME_TOPIC, PAUSE_GROUP, RESUME_GROUP, and the ``paused`` flag of the
topic and group listings and descriptions (docs/operations.md, "Pause and resume").

The effect is elsewhere: a PRODUCE to a paused topic is refused with TOPIC_PAUSED
(``ProduceHandler.prepare``), a PULL of a paused group is held and answered empty
(``PullHandler.handle``). Where a pause is kept (the store, or etcd in a cluster) is
:class:`equeue.broker.pauses.Pauses`' business.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from equeue import control
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.pauses import Pauses
from equeue.names import validate_group, validate_topic

__all__ = ["PauseHandlers"]

log = logging.getLogger("equeue.handlers")

Handler = Callable[[Any, RequestContext], Awaitable[Any]]


class PauseHandlers:
    def __init__(self, topics: TopicDirectory, pauses: Pauses) -> None:
        self._topics = topics
        self._pauses = pauses

    async def pause_topic(self, req: control.PauseTopic, ctx: RequestContext) -> control.PauseAnswer:
        """Raises InvalidName, ReservedTopic (internal topics are written by the broker
        only: pause their group instead), TopicNotFound, ClusterUnavailable."""
        validate_topic(req.name)
        await self._topics.require(req.name)
        return await self._set("topic", req.name, True)

    async def resume_topic(self, req: control.ResumeTopic, ctx: RequestContext) -> control.PauseAnswer:
        validate_topic(req.name)
        return await self._set("topic", req.name, False)

    async def pause_group(self, req: control.PauseGroup, ctx: RequestContext) -> control.PauseAnswer:
        validate_group(req.group)
        return await self._set("group", req.group, True)

    async def resume_group(self, req: control.ResumeGroup, ctx: RequestContext) -> control.PauseAnswer:
        validate_group(req.group)
        return await self._set("group", req.group, False)

    async def _set(self, kind: str, name: str, paused: bool) -> control.PauseAnswer:
        changed = await self._pauses.set(kind, name, paused)
        if changed:
            log.info("%s %s %s", kind, name, "paused" if paused else "resumed")
        return control.PauseAnswer(kind, name, paused, changed)

    # ------------------------------------------------------------------ listings
    def list_topics(self, fn: Handler) -> Handler:
        """``fn`` (LIST_TOPICS) with each paused topic marked."""

        async def listing(req: control.ListTopics, ctx: RequestContext) -> list[control.TopicInfo]:
            paused = self._pauses.topics()
            return [attrs.evolve(t, paused=True) if t.name in paused else t for t in await fn(req, ctx)]

        return listing

    def describe_topic(self, fn: Handler) -> Handler:
        async def describe(req: control.DescribeTopic, ctx: RequestContext) -> control.TopicDescription:
            d: control.TopicDescription = await fn(req, ctx)
            if not self._pauses.topic_paused(d.info.name):
                return d
            return attrs.evolve(d, info=attrs.evolve(d.info, paused=True))

        return describe

    def list_groups(self, fn: Handler) -> Handler:
        """``fn`` (LIST_GROUPS) with each paused group marked, and the paused groups
        that have nothing else here (no member, no offset) listed too."""

        async def listing(req: control.ListGroups, ctx: RequestContext) -> list[control.GroupSummary]:
            paused = self._pauses.groups()
            out = {g.group: attrs.evolve(g, paused=True) if g.group in paused else g for g in await fn(req, ctx)}
            for name in paused - out.keys():
                out[name] = control.GroupSummary(name, 0, [], paused=True)
            return [out[name] for name in sorted(out)]

        return listing

    def describe_group(self, fn: Handler) -> Handler:
        async def describe(req: control.DescribeGroup, ctx: RequestContext) -> control.GroupDescription:
            d: control.GroupDescription = await fn(req, ctx)
            return attrs.evolve(d, paused=True) if self._pauses.group_paused(d.group) else d

        return describe
