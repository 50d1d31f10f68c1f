"""Cluster requests: GET_ROUTES (the route table) and CLUSTER_STATUS.

Both answer on a standalone broker too (docs/cluster.md, "Routing"), so clients
have one code path: there GET_ROUTES says ``cluster`` false, revision 0, no groups
and owner "" for every queue (the client keeps its bootstrap connection), and
CLUSTER_STATUS shows one group "" holding every queue.
"""

from __future__ import annotations

from equeue import control
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.storage import StoreReader
from equeue.errors import BadRequest, TopicNotFound
from equeue.names import is_internal

__all__ = ["MAX_ROUTE_TOPICS", "ClusterHandlers"]

#: most topics one GET_ROUTES may name (each unknown one may cost an etcd read)
MAX_ROUTE_TOPICS = 1000


class ClusterHandlers:
    def __init__(self, topics: TopicDirectory, store: StoreReader) -> None:
        self._topics = topics
        self._store = store

    async def get_routes(self, req: control.GetRoutes, ctx: RequestContext) -> control.RouteTable:
        """The route table of ``req.topics`` (each name once, in the order asked).
        A topic that does not exist is created with ``auto_create`` (when the broker
        allows it and the user may; never a retry or DLQ topic), else listed in ``missing``. Raises InvalidName,
        NotAuthorized (an auto-create without the right), ClusterUnavailable (an
        auto-create while etcd is unreachable, or this broker cut off from etcd: its
        view may be stale), BadRequest past MAX_ROUTE_TOPICS names."""
        if len(req.topics) > MAX_ROUTE_TOPICS:
            raise BadRequest(f"GET_ROUTES names {len(req.topics)} topics; at most {MAX_ROUTE_TOPICS} per request")
        infos: list[control.TopicInfo] = []
        missing: list[str] = []
        for name in dict.fromkeys(req.topics):
            try:
                # (retry/DLQ topics are the broker's to create, at a SEND_BACK)
                create = req.auto_create and not is_internal(name)
                infos.append(await self._topics.require(name, auto_create=create, principal=ctx.principal))
            except TopicNotFound:
                missing.append(name)
        cluster = self._topics.cluster
        if cluster is not None:
            return cluster.route_table(infos, missing)
        return control.RouteTable(
            False, 0, [], [control.TopicRoute(info, [""] * info.queues) for info in infos], missing
        )

    async def cluster_status(self, req: control.ClusterStatusRequest, ctx: RequestContext) -> control.ClusterStatus:
        """What this broker's view of the cluster holds (standalone: one group ""
        owning every queue of the local topics). Cluster mode asks etcd whether it
        answers (``etcd_ok``) but never fails for want of it."""
        cluster = self._topics.cluster
        if cluster is not None:
            return await cluster.status()
        topics = {t.name: list(range(t.queues)) for t in sorted(self._store.topics.values(), key=lambda t: t.name)}
        group = control.GroupStatus("", [], sum(len(q) for q in topics.values()), topics, True)
        return control.ClusterStatus(False, "", "", [], False, 0, [group])
