"""Control-plane payloads: attrs models encoded as JSON by one dedicated cattrs
converter (never the global one). Hot paths (produce, pull) use :mod:`equeue.wire`.

Each request model names its :class:`~equeue.protocol.RequestCode` in ``CODE``;
:data:`REQUEST_TYPES` maps codes back to models for the broker's dispatcher.
"""

from __future__ import annotations

import json
import typing
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import attrs
from cattrs.preconf.json import make_converter

from equeue.errors import BadRequest, RemoteProtocolError
from equeue.protocol import RequestCode
from equeue.wire.batches import Codec

__all__ = [
    "REQUEST_TYPES",
    "converter",
    "decode",
    "encode",
]

converter = make_converter(forbid_extra_keys=False)
T = TypeVar("T")


# cattrs' default hooks coerce (``str(None) == "None"``, ``bool("false") is True``,
# ``int(1.9) == 1``): a wrong JSON type must be a bad payload, not a silent new meaning.
def _structure_str(value: object, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    if not value.isascii():  # JSON may escape a lone surrogate ("\ud800"): not text
        value.encode()  # raises UnicodeEncodeError (a ValueError): a bad payload
    return value


def _structure_bool(value: object, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _structure_int(value: object, _: type) -> int:
    # str is allowed: JSON object keys (dict[int, ...]) are always strings
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return int(value)


def _is_list(tp: Any) -> bool:
    return typing.get_origin(tp) is list


def _structure_list(value: object, tp: Any) -> list[Any]:
    # cattrs would iterate a string: "retention_ms" as a list[str] is 12 letters
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    (item,) = typing.get_args(tp) or (Any,)
    return [converter.structure(v, item) for v in value]


converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook_func(_is_list, _structure_list)


def encode(obj: Any) -> bytes:
    """Encode a control model (or list of them) as compact JSON bytes."""
    return json.dumps(converter.unstructure(obj), separators=(",", ":")).encode()


def decode(payload: bytes, cls: type[T] | Any) -> T:
    """Decode JSON ``payload`` into ``cls``; malformed input raises RemoteProtocolError."""
    try:
        return converter.structure(json.loads(payload or b"{}"), cls)  # type: ignore[no-any-return]
    except Exception as exc:  # cattrs raises several kinds; all mean "bad payload"
        raise RemoteProtocolError(f"malformed {getattr(cls, '__name__', cls)} payload: {exc}") from exc


# ----------------------------------------------------------------------------- topics
#: a topic's ``compression`` setting (like Kafka's ``compression.type``): ``producer``
#: stores each producer batch as sent; a codec name stores every batch with that
#: codec (a batch sent with another is recompressed, entries are compressed)
COMPRESSION_SETTINGS: typing.Final = ("producer", "none", "zstd", "lz4")


def check_compression(value: str | None, error: type[Exception] = BadRequest) -> None:
    """Raises ``error`` unless ``value`` is None or one of :data:`COMPRESSION_SETTINGS`."""
    if value is not None and value not in COMPRESSION_SETTINGS:
        raise error(f"compression must be one of {', '.join(COMPRESSION_SETTINGS)}, got {value!r}")


def stored_codec(setting: str) -> Codec | None:
    """The codec a ``compression`` setting stores batches with; None for
    ``producer`` (each batch as sent, entries uncompressed)."""
    return None if setting == "producer" else Codec.parse(setting)


@attrs.frozen
class CreateTopic:
    """Create a topic. Retention overrides (:mod:`equeue.retention`): None = the
    broker's default, -1 = keep forever, > 0 = the limit; any other value is
    refused (BAD_REQUEST) and nothing is created."""

    CODE: ClassVar = RequestCode.CREATE_TOPIC
    name: str
    queues: int = 4
    retention_ms: int | None = None
    retention_bytes: int | None = None
    exist_ok: bool = False
    #: one of :data:`COMPRESSION_SETTINGS`; None: the broker's ``--compression``
    compression: str | None = None


@attrs.frozen
class DeleteTopic:
    CODE: ClassVar = RequestCode.DELETE_TOPIC
    name: str


@attrs.frozen
class AlterTopic:
    """Change the queue count (grow only) and/or the retention overrides: None leaves
    one unchanged, -1 = keep forever, > 0 = the limit (any other value is refused,
    BAD_REQUEST, and nothing changes). ``reset`` names the settings to put back to
    the broker's default (``"retention_ms"``, ``"retention_bytes"``), like Kafka's
    incremental alter DELETE; a setting may not be both given and reset. (Before
    ``reset`` existed -1 meant "back to the default"; it now means forever.)"""

    CODE: ClassVar = RequestCode.ALTER_TOPIC
    name: str
    queues: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    reset: list[str] = attrs.Factory(list)
    #: one of :data:`COMPRESSION_SETTINGS` (None: unchanged; ``reset`` may name
    #: ``"compression"`` to put it back to the broker's ``--compression``)
    compression: str | None = None


@attrs.frozen
class ListTopics:
    CODE: ClassVar = RequestCode.LIST_TOPICS
    include_internal: bool = True


@attrs.frozen
class GetRoute:
    """Queue count of a topic; creates it when ``auto_create`` and the broker allows."""

    CODE: ClassVar = RequestCode.GET_ROUTE
    topic: str
    auto_create: bool = True


@attrs.frozen
class GetRoutes:
    """The route table for ``topics`` (docs/cluster.md, "Routing"): which broker group
    owns each queue, and where each group's brokers listen. A standalone broker
    answers too (``cluster`` false, every queue owned by group ""), so clients have
    one code path. With ``auto_create`` a missing topic is created (as GET_ROUTE does);
    without it, missing topics are listed in ``missing``."""

    CODE: ClassVar = RequestCode.GET_ROUTES
    topics: list[str]
    auto_create: bool = False


@attrs.frozen
class GroupRoute:
    """One broker group as a client needs it. ``addresses`` is where its requests go:
    ``[its leader's address]`` (empty: the group is down or has no leader, its queues
    answer QUEUE_UNAVAILABLE). ``replicas`` are the client addresses of every broker
    registered in it (the leader and its followers; empty from a broker that predates
    the field): any of them answers GET_ROUTES, so a client whose bootstrap brokers
    are gone fetches its routes there."""

    name: str
    addresses: list[str]
    replicas: list[str] = attrs.Factory(list)


@attrs.frozen
class TopicRoute:
    """A topic and the owner group of each of its queue ids (``len(owners) == info.queues``)."""

    info: TopicInfo
    owners: list[str]


@attrs.frozen
class RouteTable:
    """GET_ROUTES' answer. ``revision`` is the etcd revision the broker's view is at (0
    standalone); ``incarnation`` the id of the cluster's etcd data ("" standalone, or
    from a broker that predates it), new when etcd lost its data and revisions started
    again. Within one incarnation a client keeps the newest table it saw; a table of
    another incarnation replaces it whatever its revision."""

    cluster: bool
    revision: int
    groups: list[GroupRoute]
    topics: list[TopicRoute]
    missing: list[str] = attrs.Factory(list)
    incarnation: str = ""


@attrs.frozen
class DescribeTopic:
    CODE: ClassVar = RequestCode.DESCRIBE_TOPIC
    name: str


@attrs.frozen
class TopicInfo:
    """A topic. Retention overrides: None = the broker's default applies, -1 = keep
    forever, > 0 = the limit (ms, bytes)."""

    name: str
    topic_id: int
    queues: int
    created_ms: int = 0
    retention_ms: int | None = None
    retention_bytes: int | None = None
    #: an operator paused its produce (PAUSE_TOPIC); in answers only, never stored with the topic
    paused: bool = False
    #: how its batches are stored (:data:`COMPRESSION_SETTINGS`); None: the broker's
    #: ``--compression``
    compression: str | None = None


@attrs.frozen
class QueueStats:
    queue_id: int
    #: lowest retained queue offset
    min_offset: int
    #: next queue offset to be written (exclusive end)
    max_offset: int
    count: int
    bytes: int = 0


@attrs.frozen
class TopicDescription:
    info: TopicInfo
    queues: list[QueueStats]
    pending_delayed: int = 0
    store_bytes: int = 0


# ----------------------------------------------------------------------------- offsets
@attrs.frozen
class QueueOffsets:
    CODE: ClassVar = RequestCode.QUEUE_OFFSETS
    topic: str
    queue_id: int


@attrs.frozen
class OffsetForTime:
    """First queue offset whose store time is >= ``timestamp_ms`` (max offset if none)."""

    CODE: ClassVar = RequestCode.OFFSET_FOR_TIME
    topic: str
    queue_id: int
    timestamp_ms: int


@attrs.frozen
class OffsetAnswer:
    offset: int


@attrs.frozen
class CommitOffset:
    """Commit ``offset`` (the next offset to consume) for (group, topic, queue).

    With a ``consumer_id`` the broker checks that member holds the queue's lease, and
    never moves the committed offset back: an offset below the committed one is a late
    commit of an earlier hold and is not written (answered OK). Without one the offset
    is written as given.
    """

    CODE: ClassVar = RequestCode.COMMIT_OFFSET
    group: str
    topic: str
    queue_id: int
    offset: int
    consumer_id: str = ""


@attrs.frozen
class QueryOffset:
    """Committed offset of (group, topic, queue); -1 when none."""

    CODE: ClassVar = RequestCode.QUERY_OFFSET
    group: str
    topic: str
    queue_id: int


class ResetTarget(StrEnum):
    """Where RESET_OFFSETS moves a group's committed offsets (on the wire: the string)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    #: the first offset stored at or after ``timestamp_ms``
    TIME = "time"


@attrs.frozen
class ResetOffsets:
    """Set a group's committed offsets of a topic to earliest, latest or a time
    (``timestamp_ms``, with :attr:`ResetTarget.TIME`)."""

    CODE: ClassVar = RequestCode.RESET_OFFSETS
    group: str
    topic: str
    to: ResetTarget = attrs.field(converter=lambda v: ResetTarget(v))
    timestamp_ms: int = 0
    force: bool = False


@attrs.frozen
class ResetAnswer:
    offsets: dict[int, int]


# ----------------------------------------------------------------------------- groups
@attrs.frozen
class DeleteGroup:
    """Delete a consumer group at this broker: its committed offsets and its state
    (membership, leases). Refused (GROUP_HAS_MEMBERS) while it has live members,
    unless ``force`` (then only its offsets go: the members stay, and their next
    commits of new positions write offsets again); GROUP_NOT_FOUND when this broker knows nothing of it."""

    CODE: ClassVar = RequestCode.DELETE_GROUP
    group: str
    force: bool = False


@attrs.frozen
class DeleteGroupAnswer:
    """What went: ``offsets`` committed offsets (one per queue); ``members`` live
    members it still has (only with ``force``)."""

    group: str
    offsets: int
    members: int = 0


@attrs.frozen
class Heartbeat:
    """Member liveness plus queue leases.

    ``acquire`` lists "topic/queue" leases this member wants (granted when free or
    held by an expired member); ``release`` lists leases it gives up (after it
    committed). Leases it holds and neither acquires nor releases are renewed.
    """

    CODE: ClassVar = RequestCode.HEARTBEAT
    group: str
    consumer_id: str
    topics: list[str]
    mode: str = "clustering"
    host: str = ""
    acquire: list[str] = attrs.Factory(list)
    release: list[str] = attrs.Factory(list)
    #: poison records this member skipped so far (stored records it could not decode;
    #: docs/consumer.md): shown per member by ``equeue group describe``
    quarantined: int = 0


@attrs.frozen
class MemberInfo:
    consumer_id: str
    host: str
    topics: list[str]
    mode: str
    since_ms: int
    last_seen_ms: int
    #: poison records this member skipped (as its last heartbeat reported)
    quarantined: int = 0


@attrs.frozen
class HeartbeatAnswer:
    members: list[MemberInfo]
    #: increases whenever membership changes
    generation: int
    #: "topic/queue" leases this member holds after this heartbeat
    held: list[str]
    #: queue count per subscribed topic
    queue_counts: dict[str, int]


@attrs.frozen
class LeaveGroup:
    CODE: ClassVar = RequestCode.LEAVE_GROUP
    group: str
    consumer_id: str


@attrs.frozen
class ReleaseQueues:
    CODE: ClassVar = RequestCode.RELEASE_QUEUES
    group: str
    consumer_id: str
    leases: list[str]


@attrs.frozen
class ListGroups:
    CODE: ClassVar = RequestCode.LIST_GROUPS


@attrs.frozen
class GroupSummary:
    group: str
    members: int
    topics: list[str]
    #: an ephemeral group (``<name>#ephemeral``): offsets in memory, gone with its last member
    ephemeral: bool = False
    #: an operator paused its consumption (PAUSE_GROUP)
    paused: bool = False


@attrs.frozen
class DescribeGroup:
    CODE: ClassVar = RequestCode.DESCRIBE_GROUP
    group: str


@attrs.frozen
class GroupQueue:
    topic: str
    queue_id: int
    owner: str | None
    committed: int
    max_offset: int
    lag: int
    #: the broker group that owns the queue and answered this row ("" standalone)
    broker_group: str = ""


@attrs.frozen
class GroupDescription:
    group: str
    members: list[MemberInfo]
    queues: list[GroupQueue]
    generation: int = 0
    #: an ephemeral group (``<name>#ephemeral``): offsets in memory, gone with its last member
    ephemeral: bool = False
    #: an operator paused its consumption (PAUSE_GROUP)
    paused: bool = False


# ----------------------------------------------------------------------------- pause
@attrs.frozen
class PauseTopic:
    """Refuse the topic's PRODUCE requests (TOPIC_PAUSED) until RESUME_TOPIC;
    answered with a :class:`PauseAnswer`. TOPIC_NOT_FOUND for an unknown topic."""

    CODE: ClassVar = RequestCode.PAUSE_TOPIC
    name: str


@attrs.frozen
class ResumeTopic:
    CODE: ClassVar = RequestCode.RESUME_TOPIC
    name: str


@attrs.frozen
class PauseGroup:
    """Hold the group's pulls (answered as a long poll that found nothing) until
    RESUME_GROUP; answered with a :class:`PauseAnswer`. Any valid group name may be
    paused, one that has not consumed yet too."""

    CODE: ClassVar = RequestCode.PAUSE_GROUP
    group: str


@attrs.frozen
class ResumeGroup:
    CODE: ClassVar = RequestCode.RESUME_GROUP
    group: str


@attrs.frozen
class PauseAnswer:
    """The state after a pause or resume: ``kind`` ("topic" or "group"), the name,
    whether it is paused now, and whether this request changed it (False: it was so already)."""

    kind: str
    name: str
    paused: bool
    changed: bool


# ----------------------------------------------------------------------------- admin
@attrs.frozen
class Stats:
    CODE: ClassVar = RequestCode.STATS


@attrs.frozen
class ClusterStatusRequest:
    """CLUSTER_STATUS: what the answering broker's view of the cluster holds."""

    CODE: ClassVar = RequestCode.CLUSTER_STATUS


@attrs.frozen
class BrokerStatus:
    broker_id: str
    group: str
    #: the client address it advertises
    address: str
    started_ms: int
    #: registered under a live etcd lease (false: known to the view but gone)
    alive: bool


@attrs.frozen
class GroupStatus:
    name: str
    brokers: list[BrokerStatus]
    #: queues this group owns, all topics together
    queues: int
    #: topic -> the queue ids this group owns
    topics: dict[str, list[int]]
    #: at least one live broker: its queues are served
    available: bool
    #: replication: the leader's broker id ("" while the group has none),
    #: its epoch, and the in-sync replicas (broker ids, leader included), as etcd has them
    leader: str = ""
    epoch: int = 0
    isr: list[str] = attrs.Factory(list)


@attrs.frozen
class ClusterStatus:
    """CLUSTER_STATUS' answer. Standalone: ``cluster`` false, one group "" holding
    every queue. ``etcd_ok`` false: the broker has lost etcd (it keeps serving the
    queues it owns with the placement it last saw)."""

    cluster: bool
    group: str
    broker_id: str
    etcd_endpoints: list[str]
    etcd_ok: bool
    revision: int
    groups: list[GroupStatus]


@attrs.frozen
class ClusterRecover:
    """CLUSTER_RECOVER (``equeue cluster recover``): after etcd lost a group's records
    (or was restored from an older state), write the group's ISR record at ``epoch``
    with ``members`` (the first one takes over, at ``epoch + 1``). ``epoch`` must be
    at least every live replica's last epoch, so no epoch number is used twice.
    Answered by any replica of ``group`` (it has no leader); the answer is its
    REPLICATION_STATUS after the write."""

    CODE: ClassVar = RequestCode.CLUSTER_RECOVER
    group: str
    epoch: int
    members: list[str]


@attrs.frozen
class ClusterHandover:
    """CLUSTER_HANDOVER (``equeue cluster handover``), to ``group``'s leader: hand the
    leadership to the in-sync follower ``to`` ("": the one furthest ahead), as Kafka's
    preferred-leader election. The answer is the leader's REPLICATION_STATUS after it
    gave the leadership up (it follows from then on)."""

    CODE: ClassVar = RequestCode.CLUSTER_HANDOVER
    group: str
    to: str = ""


@attrs.frozen
class ReplicationStatusRequest:
    """REPLICATION_STATUS: the answering broker's replication state (a leader knows
    every follower's position; a follower knows its own)."""

    CODE: ClassVar = RequestCode.REPLICATION_STATUS


@attrs.frozen
class ReplicaStatus:
    """One follower as its leader sees it."""

    broker_id: str
    address: str
    #: the next log position it asked for (everything before it is durable there)
    position: int
    #: messages (global offsets) and ms it is behind the leader's end (0: caught up)
    lag_messages: int
    lag_ms: int
    in_sync: bool
    #: seconds since its last fetch
    last_fetch_s: float


@attrs.frozen
class ReplicationStatus:
    """REPLICATION_STATUS' answer. ``role``: "leader", "follower" or "standalone".
    Positions count the group's replication log (one per committed transaction);
    ``high_watermark``: every position below it is on every in-sync replica (what
    consumers may see). ``next_global``: the store's next global offset."""

    role: str
    group: str
    broker_id: str
    epoch: int
    leader: str
    position: int
    high_watermark: int
    next_global: int
    isr: list[str]
    acks: str
    min_insync: int
    #: a leader: its followers; a follower: empty
    replicas: list[ReplicaStatus] = attrs.Factory(list)
    #: the epoch of the last entry in this replica's store (what it has seen)
    last_epoch: int = 0


@attrs.frozen
class ReplicaDigestRequest:
    """REPLICA_DIGEST: checksums of the answering replica's store, for
    ``equeue cluster verify``. ``range_size``: global offsets per message range."""

    CODE: ClassVar = RequestCode.REPLICA_DIGEST
    range_size: int = 65536


@attrs.frozen
class ReplicaDigest:
    """REPLICA_DIGEST's answer, taken in one read transaction at log ``position``:
    ``digests`` maps a part of the store ("topics", "offsets", "producers", ...,
    "messages/<first global offset>") to a hex checksum of its keys and values.
    Two replicas at the same position must answer the same digests."""

    broker_id: str
    epoch: int
    position: int
    digests: dict[str, str]


@attrs.frozen
class BrokerStats:
    version: str
    uptime_s: float
    connections: int
    topics: int
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    produce_rate: float
    pull_rate: float
    parked_pulls: int
    next_global_offset: int
    store_bytes: int
    map_size: int
    flush: str
    transactions: int = 0
    pending_delayed: int = 0
    #: connections refused past --max-connections, and closed by a limit (output
    #: buffer, frame timeout, idle timeout) since the start
    connections_refused: int = 0
    connections_dropped: int = 0
    #: of ``transactions``, those committed on the event loop (``--flush async``
    #: inline commits), and the longest of them in seconds (the loop's worst pause)
    inline_transactions: int = 0
    inline_max_seconds: float = 0.0


# ----------------------------------------------------------------------------- lookup
@attrs.frozen
class GetMessage:
    """One message by (topic, queue, queue offset) or by global offset (answer: a
    pull-response payload with one record)."""

    CODE: ClassVar = RequestCode.GET_MESSAGE
    topic: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    global_offset: int = -1


@attrs.frozen
class FindByKey:
    """Messages with ``key``, newest first (answer: a pull-response payload)."""

    CODE: ClassVar = RequestCode.FIND_BY_KEY
    topic: str
    key: str
    limit: int = 32
    #: only messages at global offsets below this (-1: all); a truncated answer's
    #: ``next_offset`` is where to go on
    before: int = -1


# ----------------------------------------------------------------------------- retry / dead letters
@attrs.frozen
class SendBack:
    """A consumer hands back a message its handler failed on. The broker reads it at
    (``topic``, ``queue_id``, ``queue_offset``) -- where the consumer read it: its
    origin topic, or the group's retry topic for a retried message -- and writes a
    copy to ``%RETRY%<group>``, delayed by ``retry_delays_ms[reconsume_times]`` (the
    last delay repeats; empty: the broker's default ladder), with
    ``reconsume_times + 1``; or, once ``reconsume_times >= max_reconsume_times``, to
    ``%DLQ%<group>``. The copy keeps (or gains) the ``%ORIGIN_*`` properties."""

    CODE: ClassVar = RequestCode.SEND_BACK
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    reconsume_times: int = 0
    max_reconsume_times: int = 16
    retry_delays_ms: list[int] = attrs.Factory(list)


@attrs.frozen
class SendBackAnswer:
    #: where the copy went: ``%RETRY%<group>`` or ``%DLQ%<group>``
    topic: str
    queue_id: int
    dead_lettered: bool
    #: when the retry is due (epoch ms); 0 for a dead letter
    deliver_at: int = 0


@attrs.frozen
class DlqList:
    """One page of a group's dead letters, from the cursor (``queue_id``,
    ``offset``) on: queue by queue, oldest first, at most ``limit`` (≤ 1000)."""

    CODE: ClassVar = RequestCode.DLQ_LIST
    group: str
    queue_id: int = 0
    offset: int = 0
    limit: int = 100


@attrs.frozen
class DeadLetter:
    #: its global offset: what DLQ_RESEND takes
    id: int
    queue_id: int
    queue_offset: int
    origin_topic: str
    origin_queue: int
    origin_offset: int
    key: str | None
    tags: str | None
    reconsume_times: int
    #: store time, epoch ms
    timestamp: int
    properties: dict[str, str]
    #: the body, base64 ("" when ``body_omitted``)
    body: str
    #: a DLQ_RESEND already sent it back
    resent: bool = False
    #: body and properties were too big for a page (its frame) and are left out:
    #: GET_MESSAGE with ``global_offset=id`` returns the whole letter
    body_omitted: bool = False


@attrs.frozen
class DlqPage:
    letters: list[DeadLetter]
    #: where the next page starts (pass them back as ``queue_id``/``offset``)
    next_queue_id: int
    next_offset: int
    #: no dead letter after this page (at the time of the call)
    done: bool


@attrs.frozen
class DlqResend:
    """Send dead letters back to their origin topic (0 attempts, no ``%`` properties):
    the letters ``ids``, or every letter of the group with ``all_letters``. Each
    letter is resent at most once: the resend and its record are written in one
    transaction, and letters already resent are skipped."""

    CODE: ClassVar = RequestCode.DLQ_RESEND
    group: str
    ids: list[int] = attrs.Factory(list)
    all_letters: bool = False


@attrs.frozen
class DlqResendAnswer:
    #: ids resent by this request
    resent: list[int]
    #: ids an earlier request resent (nothing done)
    already_resent: list[int]
    #: ids that could not be resent, with the reason (e.g. the origin topic is gone)
    failed: dict[int, str] = attrs.Factory(dict)


# ----------------------------------------------------------------------------- corruption
@attrs.frozen
class SkipMessage:
    """Admin: stop serving the record at (``topic``, ``queue_id``, ``queue_offset``)
    -- a corrupt record consumers cannot get past. The broker writes a skip marker;
    pulls then step over that offset (consumers move past it) and GET_MESSAGE answers
    MESSAGE_NOT_FOUND for it. The record itself stays on disk. Idempotent."""

    CODE: ClassVar = RequestCode.SKIP_MESSAGE
    topic: str
    queue_id: int
    queue_offset: int


@attrs.frozen
class SkipAnswer:
    topic: str
    queue_id: int
    queue_offset: int
    #: an earlier request had skipped it already (nothing done)
    already_skipped: bool
    #: what is wrong with the record ("" when it reads intact: skipped all the same)
    problem: str = ""


@attrs.frozen
class ListSkipped:
    """The queue offsets of ``topic`` that an operator skipped (SKIP_MESSAGE)."""

    CODE: ClassVar = RequestCode.LIST_SKIPPED
    topic: str


@attrs.frozen
class SkippedAnswer:
    #: queue id -> its skipped queue offsets, ascending
    skipped: dict[int, list[int]]


REQUEST_TYPES: dict[int, type] = {
    cls.CODE: cls
    for cls in (
        CreateTopic,
        DeleteTopic,
        AlterTopic,
        ListTopics,
        GetRoute,
        GetRoutes,
        DescribeTopic,
        QueueOffsets,
        OffsetForTime,
        CommitOffset,
        QueryOffset,
        ResetOffsets,
        Heartbeat,
        LeaveGroup,
        ReleaseQueues,
        ListGroups,
        DescribeGroup,
        DeleteGroup,
        Stats,
        ReplicationStatusRequest,
        ReplicaDigestRequest,
        ClusterStatusRequest,
        ClusterRecover,
        ClusterHandover,
        GetMessage,
        FindByKey,
        SendBack,
        DlqList,
        DlqResend,
        SkipMessage,
        ListSkipped,
        PauseTopic,
        ResumeTopic,
        PauseGroup,
        ResumeGroup,
    )
}
