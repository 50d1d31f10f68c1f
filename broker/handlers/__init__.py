"""Request handlers: one method per request code (EQueue's one-handler-per-code),
grouped by request family, one module each (produce, pull, topics, offsets,
membership, lookup, dead letters).

Each handler takes the request payload (control requests: the decoded model) and a
:class:`~equeue.broker.handlers.context.RequestContext`, and returns the response payload as
a list of byte pieces; raising an :class:`~equeue.errors.EQueueError` answers with
its code. Expected outcomes of a pull (no new message, offset too small...) are
statuses. Each family receives the collaborators it uses and nothing else.

Authorization is central: with authentication on, :meth:`Handlers.dispatch` checks
every request against :data:`equeue.acl.REQUEST_RULES` before its handler runs
(the produce hot path, which the connection calls directly, checks in
``ProduceHandler.prepare``); listings are filtered to what the user may describe;
admin actions are written to the audit log (:func:`equeue.users.audit`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from equeue import control
from equeue.acl import REQUEST_RULES, ResourceKind
from equeue.broker.auth import Authenticator, Authorizer, BrokerSecurity
from equeue.broker.groups import GroupRegistry
from equeue.broker.handlers.cluster import ClusterHandlers
from equeue.broker.handlers.context import Closing, Parts, RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.dlq import DeadLetterHandlers
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.lookup import LookupHandlers
from equeue.broker.handlers.membership import GroupHandlers
from equeue.broker.handlers.offsets import OffsetHandlers
from equeue.broker.handlers.pauses import PauseHandlers
from equeue.broker.handlers.produce import ProduceHandler, ProduceQueue
from equeue.broker.handlers.pull import PullHandler
from equeue.broker.handlers.replica import ReplicaHandlers
from equeue.broker.handlers.roles import ClusterRole, ReplicaGate
from equeue.broker.handlers.skips import SkipHandlers
from equeue.broker.handlers.topics import TopicHandlers
from equeue.broker.handlers.writes import Submit
from equeue.broker.longpoll import ParkedPulls
from equeue.broker.pauses import Pauses
from equeue.broker.stats import Counters
from equeue.broker.storage import StoreReader
from equeue.errors import BrokerError, UnknownRequest
from equeue.protocol import RequestCode
from equeue.users import audit
from equeue.wire._prims import unpack_str

__all__ = ["Handler", "Handlers"]

#: a handler in the dispatch table; None = the writer thread answered (parked pulls)
Handler = Callable[[bytes, RequestContext], Awaitable[Parts | None]]


class Handlers:
    """The dispatch table over the request families."""

    def __init__(
        self, *, store: StoreReader, appender: ProduceQueue, submit: Submit, groups: GroupRegistry,
        parked: ParkedPulls, counters: Counters, closing: Closing, statistics: Callable[[], control.BrokerStats],
        limits: Limits, replication: ReplicaHandlers, security: BrokerSecurity | None = None,
        cluster: ClusterRole | None = None, replica: ReplicaGate | None = None,
    ) -> None:  # fmt: skip
        security = security or BrokerSecurity(None)
        #: the SCRAM server of the handshake (None: the broker does not authenticate)
        self.authenticator: Authenticator | None = security.authenticator
        self._authorizer: Authorizer | None = security.authorizer
        #: the paused topics and groups (the store's, or etcd's in a cluster)
        self.pauses = Pauses(store, submit, cluster)
        # pulls parked before a group's pause read again, and find it paused
        self.pauses.listeners.append(parked.wake_all)
        may_create = self._authorizer.check_create if self._authorizer is not None else None
        topics = TopicDirectory(store, submit, limits, may_create, cluster)
        #: the produce hot path (the connection calls ``prepare``/``answer`` directly)
        self.produce = ProduceHandler(
            topics, appender, counters, closing, limits, self._authorizer, replica, self.pauses.topics
        )
        #: the replica role (None: standalone): a follower refuses data requests
        self._replica = replica
        pull = PullHandler(topics, store, groups, parked, counters, closing, limits, self.pauses)
        t = TopicHandlers(topics, store, submit, limits)
        o = OffsetHandlers(topics, store, submit, groups)
        g = GroupHandlers(store, groups, cluster, submit)
        c = ClusterHandlers(topics, store)
        lookup = LookupHandlers(topics, store, limits.max_frame - 1024)  # as a pull answer's budget
        dlq = DeadLetterHandlers(topics, store, submit, limits)
        skips = SkipHandlers(topics, store, submit)
        p = PauseHandlers(topics, self.pauses)
        self._statistics = statistics
        self.table: dict[int, Handler] = {
            RequestCode.PRODUCE: self.produce.handle,
            RequestCode.PULL: pull.handle,
            RequestCode.REPLICA_FETCH: replication.fetch,
            RequestCode.REPLICA_KEYS: replication.keys,
            RequestCode.REPLICA_SNAPSHOT: replication.snapshot,
        }
        control_handlers: dict[type, Callable[[Any, RequestContext], Awaitable[Any]]] = {
            control.CreateTopic: t.create_topic,
            control.DeleteTopic: t.delete_topic,
            control.AlterTopic: t.alter_topic,
            control.ListTopics: self._listing(p.list_topics(t.list_topics), ResourceKind.TOPIC, "name"),
            control.GetRoute: t.get_route,
            control.GetRoutes: c.get_routes,
            control.ClusterStatusRequest: c.cluster_status,
            control.ClusterRecover: replication.recover,
            control.ClusterHandover: replication.hand_over,
            control.DescribeTopic: p.describe_topic(t.describe_topic),
            control.QueueOffsets: o.queue_offsets,
            control.OffsetForTime: o.offset_for_time,
            control.CommitOffset: o.commit_offset,
            control.QueryOffset: o.query_offset,
            control.ResetOffsets: o.reset_offsets,
            control.Heartbeat: g.heartbeat,
            control.LeaveGroup: g.leave_group,
            control.ReleaseQueues: g.release_queues,
            control.ListGroups: self._listing(p.list_groups(g.list_groups), ResourceKind.GROUP, "group"),
            control.DescribeGroup: p.describe_group(g.describe_group),
            control.DeleteGroup: g.delete_group,
            control.Stats: self.stats,
            control.GetMessage: lookup.get_message,
            control.FindByKey: lookup.find_by_key,
            control.SendBack: dlq.send_back,
            control.DlqList: dlq.list_letters,
            control.DlqResend: dlq.resend,
            control.SkipMessage: skips.skip_message,
            control.ListSkipped: skips.list_skipped,
            control.PauseTopic: p.pause_topic,
            control.ResumeTopic: p.resume_topic,
            control.PauseGroup: p.pause_group,
            control.ResumeGroup: p.resume_group,
            control.ReplicaDigestRequest: replication.digest,
            control.ReplicationStatusRequest: replication.replication_status,
        }
        for code, cls in control.REQUEST_TYPES.items():
            self.table[code] = self._control(cls, control_handlers[cls])
        self._models = control.REQUEST_TYPES

    @staticmethod
    def _control(cls: type, fn: Callable[[Any, RequestContext], Awaitable[Any]]) -> Handler:
        async def handle(payload: bytes, ctx: RequestContext) -> Parts:
            result = await fn(control.decode(payload, cls), ctx)
            if isinstance(result, list) and result and isinstance(result[0], bytes):
                return result
            return [control.encode(result)] if result is not None else [b"{}"]

        return handle

    def _listing(self, fn: Callable[[Any, RequestContext], Awaitable[list[Any]]], kind: ResourceKind,
                 field: str) -> Callable[[Any, RequestContext], Awaitable[list[Any]]]:  # fmt: skip
        """A listing that shows a user only the names it may describe (as Kafka does)."""

        async def listing(req: Any, ctx: RequestContext) -> list[Any]:
            items = await fn(req, ctx)
            principal, authz = ctx.principal, self._authorizer
            if principal is None or authz is None:
                return items
            return [x for x in items if authz.visible(principal, kind, getattr(x, field))]

        return listing

    def _request_fields(self, code: int, payload: bytes) -> Any:
        """The request as far as its ACL rule reads it: the control model, or, for
        the binary hot paths, the topic (the first field of both layouts)."""
        cls = self._models.get(code)
        if cls is not None:
            return control.decode(payload, cls)
        if code in _REPLICA_BINARY:  # admin-only rules: no field is read
            return None
        return _Topic(unpack_str(payload, 0)[0])

    async def dispatch(self, code: int, payload: bytes, ctx: RequestContext) -> Parts | None:
        """Answer one request; None when the writer thread already answered it.

        Raises UnknownRequest for a code without a handler, NotAuthorized when the
        connection's user may not make this request (checked before anything runs),
        NotLeader on a replica that does not lead its group now, for every request
        but those of :data:`_OPEN_ON_FOLLOWER`.
        """
        fn = self.table.get(code)
        if fn is None:
            raise UnknownRequest(f"unknown request code {code}")
        principal = ctx.principal
        if principal is not None and self._authorizer is not None:
            self._authorizer.check(principal, code, self._request_fields(code, payload), ctx.peer)
        replica = self._replica
        if replica is not None and code not in _OPEN_ON_FOLLOWER:
            replica.check_serving()  # NotLeader: only the group's leader serves data
            if replica.reads_held:  # just promoted: until the high watermark passes the takeover
                await replica.wait_reads()
        if code not in _AUDITED:
            return await fn(payload, ctx)
        return await self._audited(fn, code, payload, ctx)

    async def _audited(self, fn: Handler, code: int, payload: bytes, ctx: RequestContext) -> Parts | None:
        """Run an admin action and write its audit line (who, peer, what, outcome)."""
        action = RequestCode(code).name.lower()
        try:
            req: Any = control.decode(payload, self._models[code])
            resource = _resource(req)
        except Exception:
            resource = "?"
        try:
            result = await fn(payload, ctx)
        except Exception as exc:
            code_name = exc.code.name if isinstance(exc, BrokerError) else "INTERNAL_ERROR"
            audit(action, user=ctx.principal, peer=ctx.peer, resource=resource, outcome=f"error:{code_name}")
            raise
        audit(action, user=ctx.principal, peer=ctx.peer, resource=resource, outcome="ok")
        return result

    async def stats(self, req: control.Stats, ctx: RequestContext) -> control.BrokerStats:
        return self._statistics()


#: what a replica that does not lead its group still answers (docs/cluster.md,
#: "Replicas, acks, failover"): routes and status, and the replication requests (REPLICA_FETCH, KEYS and
#: SNAPSHOT answer NOT_LEADER themselves unless this broker leads)
_OPEN_ON_FOLLOWER = frozenset({
    RequestCode.GET_ROUTES, RequestCode.GET_ROUTE, RequestCode.CLUSTER_STATUS, RequestCode.STATS,
    RequestCode.REPLICATION_STATUS, RequestCode.REPLICA_DIGEST, RequestCode.REPLICA_FETCH,
    RequestCode.REPLICA_KEYS, RequestCode.REPLICA_SNAPSHOT, RequestCode.CLUSTER_RECOVER,
})  # fmt: skip

#: the binary replication requests (their layouts start with no topic)
_REPLICA_BINARY = frozenset({RequestCode.REPLICA_FETCH, RequestCode.REPLICA_KEYS, RequestCode.REPLICA_SNAPSHOT})

#: the admin actions written to the audit log
_AUDITED = frozenset(code for code, rule in REQUEST_RULES.items() if rule.audit)


class _Topic:
    """The topic of a binary request (PRODUCE, PULL), for its ACL rule."""

    __slots__ = ("topic",)

    def __init__(self, topic: str) -> None:
        self.topic = topic


def _resource(req: Any) -> str:
    """``kind:name`` of an admin request's target, for the audit line."""
    for field, kind in (("name", "topic"), ("group", "group"), ("topic", "topic")):
        value = getattr(req, field, None)
        if isinstance(value, str) and value:
            topic = getattr(req, "topic", "")
            extra = f" topic:{topic}" if field == "group" and topic else ""
            return f"{kind}:{value}{extra}"
    return "cluster"
