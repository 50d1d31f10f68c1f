"""The client core's typed request API, shared by the producer, the consumer, the CLI
and Spark.

:class:`AsyncClient` is one typed method per request (``create_topic``, ``pull``,
``produce``, ``describe_group``...): each checks its arguments (ConfigError before
anything is sent), encodes the request (``equeue.wire`` for the hot-path layouts,
``equeue.control`` for the rest), sends it over the client's
:class:`~equeue.client.transport.Transport` (:attr:`AsyncClient.transport`: one
multiplexed connection, reconnects, framing, request ids, the connect handshake) and
decodes the answer. The transport's own operations (``request``, ``send_request``,
``send_request_nowait``, ``can_send_now``, ``cork``/``uncork``, ``answer``,
``retarget``, ``drop_connection``, ``connected``) are forwarded under the same names;
code that sends many requests per second on the loop may call them on
:attr:`AsyncClient.transport` directly. Its lifetime is ``async with``: the transport
(and its reader task) is entered with it.

Errors: those of the transport (:mod:`equeue.client.transport`:
:class:`~equeue.errors.ConnectionBroken`, :class:`~equeue.errors.TlsError`,
:class:`~equeue.errors.AuthenticationError`, :class:`~equeue.errors.ClientClosed`),
the mapped :class:`~equeue.errors.BrokerError` for error answers, ConfigError for
bad arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import attrs

from equeue import control, wire
from equeue.client.lifetime import StackOwner
from equeue.client.link import PendingReply, parse_brokers
from equeue.client.transport import PushHandler, Transport
from equeue.codec import DEFAULT_MAX_FRAME
from equeue.errors import ConfigError
from equeue.models import PullResult
from equeue.protocol import RequestCode
from equeue.retention import check_topic_settings
from equeue.security import ClientSecurity

__all__ = ["AsyncClient", "PendingReply", "parse_brokers"]

T = TypeVar("T")


def _compression_setting(value: str | None) -> str | None:
    """A topic's ``compression=`` argument as sent: one of
    :data:`equeue.control.COMPRESSION_SETTINGS` (case-insensitive), or None for None
    and ``"default"`` (the broker's ``--compression``). Raises ConfigError for
    anything else, before anything is sent."""
    if value is None:
        return None
    setting = value.strip().lower()
    if setting == "default":
        return None
    control.check_compression(setting, ConfigError)
    return setting


class AsyncClient(StackOwner):
    """A trio client for one equeue cluster (a list of broker addresses): the typed
    requests over the :class:`~equeue.client.transport.Transport` it owns.

    The arguments are the transport's: ``brokers`` (``"h:p"``, ``"h1:p1,h2:p2"`` or a
    list), ``connect_timeout`` (seconds per connect: TCP, TLS and the handshake),
    ``on_push`` (called in the loop with each push), ``security`` (TLS settings and
    credentials; None: from the ``EQUEUE_*`` environment), ``max_frame`` (the largest
    frame read: a broker's follower connection to its leader reads larger ones,
    equeue.wire.replica.REPLICA_MAX_FRAME). Raises ConfigError for an empty broker
    list or unreadable TLS files.
    """

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        connect_timeout: float = 5.0,
        on_push: PushHandler | None = None,
        security: ClientSecurity | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        #: the connection, its framing and multiplexing (owned: entered and closed with the client)
        self.transport = Transport(
            brokers, connect_timeout=connect_timeout, on_push=on_push, security=security, max_frame=max_frame
        )
        #: the transport's fixed settings, as given (``security`` resolved from the environment)
        self.security = self.transport.security
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        await stack.enter_async_context(self.transport)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with ClientClosed."""
        await self.transport.aclose()

    # ------------------------------------------------------------------ the transport's, forwarded
    @property
    def brokers(self) -> list[tuple[str, int]]:
        """The broker addresses in use, as (host, port) (:meth:`retarget` changes them)."""
        return self.transport.brokers

    @property
    def connection_epoch(self) -> int:
        """Incremented on every new connection (consumers re-register after a reconnect)."""
        return self.transport.connection_epoch

    @property
    def connected(self) -> bool:
        """A connection is open and not broken (:attr:`Transport.connected`)."""
        return self.transport.connected

    def drop_connection(self, reason: str) -> None:
        """:meth:`Transport.drop_connection`: close the current connection; the next
        request connects to the next broker of the list."""
        self.transport.drop_connection(reason)

    def retarget(self, brokers: str | Sequence[str]) -> None:
        """:meth:`Transport.retarget`: use ``brokers`` from now on. Raises ConfigError
        for an empty list."""
        self.transport.retarget(brokers)

    async def request(self, code: int, payload: bytes) -> bytes:
        """:meth:`Transport.request`: send one request, wait for its answer payload."""
        return await self.transport.request(code, payload)

    async def send_request(
        self, code: int, payload: bytes, notify: Callable[[], None] | None = None
    ) -> PendingReply:
        """:meth:`Transport.send_request`: write one request now, return its pending answer."""
        return await self.transport.send_request(code, payload, notify)

    def can_send_now(self) -> bool:
        """:meth:`Transport.can_send_now`: whether :meth:`send_request_nowait` writes at once."""
        return self.transport.can_send_now()

    def send_request_nowait(
        self, code: int, payload: bytes, notify: Callable[[], None] | None = None
    ) -> PendingReply:
        """:meth:`Transport.send_request_nowait`: one non-blocking write (loop thread)."""
        return self.transport.send_request_nowait(code, payload, notify)

    def cork(self) -> None:
        """:meth:`Transport.cork`: collect :meth:`send_request_nowait`'s frames."""
        self.transport.cork()

    def uncork(self) -> None:
        """:meth:`Transport.uncork`: write what was collected, in one write."""
        self.transport.uncork()

    #: :meth:`Transport.answer`: the payload of a finished reply (raises its error)
    answer = staticmethod(Transport.answer)

    # ------------------------------------------------------------------ typed API

    async def call(self, req: Any, answer: type[T] | Any = None) -> T:
        """Send a control request (an equeue.control model); decode the answer."""
        payload = await self.transport.request(req.CODE, control.encode(req))
        if answer is None:
            return None  # type: ignore[return-value]
        return control.decode(payload, answer)

    async def produce(self, req: wire.ProduceRequest) -> wire.ProduceResponse:
        return wire.ProduceResponse.decode(await self.transport.request(RequestCode.PRODUCE, req.encode()))

    async def pull(self, req: wire.PullRequest) -> PullResult:
        """Read one queue: at most ``req.max_messages`` messages from ``req.offset``
        (the answer carries whole stored batches: ``PULL_BATCHES`` is always set, and
        ``next_offset`` is past the last record delivered). Raises CorruptRecord for a
        batch that does not decode, RemoteProtocolError for a malformed answer."""
        if not req.flags & wire.PULL_BATCHES:
            req = attrs.evolve(req, flags=req.flags | wire.PULL_BATCHES)
        payload = await self.transport.request(RequestCode.PULL, req.encode())
        return wire.decode_pull_response(req.topic, payload, req.offset, limit=req.max_messages)

    async def create_topic(
        self,
        name: str,
        queues: int = 4,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Create topic ``name`` with ``queues`` queues. Retention overrides: None =
        the broker's default, -1 = keep forever, > 0 = the limit (ms, bytes).
        ``compression``: how the topic stores batches (``producer``, ``none``, ``zstd``,
        ``lz4``; None or ``"default"``: the broker's ``--compression``).

        Raises ConfigError for any other retention value (0, -5...) or compression
        setting before anything is sent; TopicExists unless ``exist_ok``; BadRequest,
        InvalidName from the broker."""
        check_topic_settings(retention_ms, retention_bytes)
        codec = _compression_setting(compression)
        return await self.call(
            control.CreateTopic(name, queues, retention_ms, retention_bytes, exist_ok, codec), control.TopicInfo
        )

    async def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        reset: Iterable[str] = (),
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Grow ``name`` to ``queues`` queues and/or change its retention overrides:
        None leaves one unchanged, -1 = keep forever, > 0 = the limit; ``reset``
        names settings (``"retention_ms"``, ``"retention_bytes"``, ``"compression"``)
        to put back to the broker's default. ``compression``: the topic's new
        compression setting (``producer``, ``none``, ``zstd``, ``lz4``; None leaves it
        unchanged; ``"default"`` puts it back to the broker's ``--compression``, like
        naming it in ``reset``). Returns the topic as changed.

        Raises ConfigError before anything is sent for any other retention value or
        compression setting, an unknown name in ``reset`` or a setting both given and
        reset; TopicNotFound, BadRequest (fewer queues) from the broker."""
        names = [reset] if isinstance(reset, str) else list(reset)
        codec = _compression_setting(compression)
        if compression is not None and codec is None:  # "default"
            names.append("compression")
        if codec is not None and "compression" in names:
            raise ConfigError("compression is both set and reset: give one or the other")
        check_topic_settings(retention_ms, retention_bytes, [n for n in names if n != "compression"])
        names = list(dict.fromkeys(names))
        return await self.call(
            control.AlterTopic(name, queues, retention_ms, retention_bytes, names, codec), control.TopicInfo
        )

    async def delete_topic(self, name: str) -> None:
        await self.call(control.DeleteTopic(name))

    async def list_topics(self, include_internal: bool = True) -> list[control.TopicInfo]:
        return await self.call(control.ListTopics(include_internal), list[control.TopicInfo])

    async def describe_topic(self, name: str) -> control.TopicDescription:
        return await self.call(control.DescribeTopic(name), control.TopicDescription)

    async def get_route(self, topic: str, auto_create: bool = True) -> control.TopicInfo:
        return await self.call(control.GetRoute(topic, auto_create), control.TopicInfo)

    async def get_routes(self, topics: Sequence[str], auto_create: bool = False) -> control.RouteTable:
        """The route table of ``topics`` (GET_ROUTES): the owner group of each queue and
        each group's broker addresses (docs/cluster.md). A standalone broker answers
        ``cluster`` false, every queue owned by group ""."""
        return await self.call(control.GetRoutes(list(topics), auto_create), control.RouteTable)

    async def queue_offsets(self, topic: str, queue_id: int) -> control.QueueStats:
        return await self.call(control.QueueOffsets(topic, queue_id), control.QueueStats)

    async def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        ans: control.OffsetAnswer = await self.call(control.OffsetForTime(topic, queue_id, timestamp_ms), control.OffsetAnswer)
        return ans.offset

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, consumer_id: str = "") -> None:
        await self.call(control.CommitOffset(group, topic, queue_id, offset, consumer_id))

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        return (await self.call(control.QueryOffset(group, topic, queue_id), control.OffsetAnswer)).offset

    async def reset_offsets(
        self, group: str, topic: str, to: control.ResetTarget | str, timestamp_ms: int = 0, force: bool = False
    ) -> dict[int, int]:
        """Set ``group``'s committed offsets of ``topic`` to ``to`` (a
        :class:`~equeue.control.ResetTarget` or its string; ``time`` takes
        ``timestamp_ms``). Raises ValueError for another target, GroupHasMembers
        while members are live (unless ``force``)."""
        ans: control.ResetAnswer = await self.call(control.ResetOffsets(group, topic, to, timestamp_ms, force), control.ResetAnswer)
        return ans.offsets

    async def heartbeat(self, hb: control.Heartbeat) -> control.HeartbeatAnswer:
        return await self.call(hb, control.HeartbeatAnswer)

    async def leave_group(self, group: str, consumer_id: str) -> None:
        await self.call(control.LeaveGroup(group, consumer_id))

    async def release_queues(self, group: str, consumer_id: str, leases: list[str]) -> None:
        await self.call(control.ReleaseQueues(group, consumer_id, leases))

    async def list_groups(self) -> list[control.GroupSummary]:
        return await self.call(control.ListGroups(), list[control.GroupSummary])

    async def describe_group(self, group: str) -> control.GroupDescription:
        return await self.call(control.DescribeGroup(group), control.GroupDescription)

    async def stats(self) -> control.BrokerStats:
        return await self.call(control.Stats(), control.BrokerStats)

    async def pause_topic(self, name: str) -> control.PauseAnswer:
        """Refuse ``name``'s PRODUCE requests (TOPIC_PAUSED) until :meth:`resume_topic`
        (docs/operations.md, "Pause and resume"). Raises TopicNotFound, ReservedTopic,
        NotAuthorized (``admin`` on the topic)."""
        return await self.call(control.PauseTopic(name), control.PauseAnswer)

    async def resume_topic(self, name: str) -> control.PauseAnswer:
        """Accept ``name``'s produce again (``changed`` False: it was not paused)."""
        return await self.call(control.ResumeTopic(name), control.PauseAnswer)

    async def pause_group(self, group: str) -> control.PauseAnswer:
        """Hold consumer group ``group``'s pulls (nothing delivered, offsets and members
        kept) until :meth:`resume_group`. Raises InvalidName, NotAuthorized (``reset``
        on the group)."""
        return await self.call(control.PauseGroup(group), control.PauseAnswer)

    async def resume_group(self, group: str) -> control.PauseAnswer:
        """Deliver to ``group`` again; its held pulls read at once."""
        return await self.call(control.ResumeGroup(group), control.PauseAnswer)

    async def cluster_status(self) -> control.ClusterStatus:
        """The answering broker's view of the cluster (CLUSTER_STATUS)."""
        return await self.call(control.ClusterStatusRequest(), control.ClusterStatus)

    async def replication_status(self) -> control.ReplicationStatus:
        """The answering broker's replication state (REPLICATION_STATUS): a leader
        reports every follower's position and lag, a follower its own position."""
        return await self.call(control.ReplicationStatusRequest(), control.ReplicationStatus)

    async def replica_digest(self, range_size: int = 65536) -> control.ReplicaDigest:
        """Checksums of the answering replica's store at one log position
        (REPLICA_DIGEST, admin only), for comparing replicas (``equeue cluster verify``)."""
        return await self.call(control.ReplicaDigestRequest(range_size), control.ReplicaDigest)

    async def get_message(
        self, topic: str = "", queue_id: int = -1, queue_offset: int = -1, global_offset: int = -1
    ) -> PullResult:
        payload = await self.transport.request(
            RequestCode.GET_MESSAGE, control.encode(control.GetMessage(topic, queue_id, queue_offset, global_offset))
        )
        return wire.decode_pull_response(topic, payload, end=-1)

    async def find_by_key(self, topic: str, key: str, limit: int = 32, before: int = -1) -> PullResult:
        """Messages of ``topic`` with ``key``, newest first, below global offset
        ``before`` (-1: all). The broker bounds the walk: a non-zero ``next_offset``
        in the result means it stopped early; pass it as ``before`` to go on."""
        req = control.FindByKey(topic, key, limit, before)
        payload = await self.transport.request(RequestCode.FIND_BY_KEY, control.encode(req))
        return wire.decode_pull_response(topic, payload, end=-1)

    # ------------------------------------------------------------------ retry / dead letters
    async def send_back(
        self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int,
        max_reconsume_times: int = 16, retry_delays_ms: Sequence[int] = (),
    ) -> control.SendBackAnswer:  # fmt: skip
        """Hand back the message at (topic, queue_id, queue_offset) whose handler
        failed: the broker copies it to the group's retry topic (delayed) or, once
        ``reconsume_times >= max_reconsume_times``, to its dead-letter topic."""
        req = control.SendBack(
            group, topic, queue_id, queue_offset, reconsume_times, max_reconsume_times, list(retry_delays_ms)
        )
        return await self.call(req, control.SendBackAnswer)

    async def dlq_list(self, group: str, queue_id: int = 0, offset: int = 0, limit: int = 100) -> control.DlqPage:
        """One page of the group's dead letters from the cursor (queue_id, offset);
        continue with the page's ``next_queue_id``/``next_offset`` until ``done``."""
        return await self.call(control.DlqList(group, queue_id, offset, limit), control.DlqPage)

    async def dlq_resend(
        self, group: str, ids: Sequence[int] = (), all_letters: bool = False
    ) -> control.DlqResendAnswer:
        """Send dead letters back to their origin topic, each at most once (a letter
        resent before is reported in ``already_resent``, not sent again)."""
        return await self.call(control.DlqResend(group, list(ids), all_letters), control.DlqResendAnswer)

    # ------------------------------------------------------------------ corruption (admin)
    async def skip_message(self, topic: str, queue_id: int, queue_offset: int) -> control.SkipAnswer:
        """Make the broker stop serving the record at (topic, queue_id, queue_offset):
        pulls step over it, so consumers stuck on a corrupt record move past it."""
        return await self.call(control.SkipMessage(topic, queue_id, queue_offset), control.SkipAnswer)

    async def list_skipped(self, topic: str) -> dict[int, list[int]]:
        """The skipped queue offsets of ``topic``, by queue id."""
        return (await self.call(control.ListSkipped(topic), control.SkippedAnswer)).skipped
