"""The cluster's records in etcd and the placement rules (pure: no I/O, no trio).

Key layout (everything under one root, so one prefix watch sees it all)::

    /equeue/groups/<group>                GroupRecord     persistent; created once, by the
                                                          group's first broker (create txn)
    /equeue/brokers/<group>/<broker_id>   BrokerRecord    under the broker's lease: it
                                                          vanishes when the broker stops
                                                          renewing (crash) or revokes (exit)
    /equeue/topics/<topic>                TopicPlacement  persistent; the one source of truth
                                                          for queue id -> owner group

    /equeue/leaders/<group>               LeaderRecord    under the leader's lease (replicas);
                                                          created by the takeover txn
    /equeue/isr/<group>                   IsrRecord       persistent (replicas); written by a
                                                          takeover and by the leader (CAS)
    /equeue/cluster                       ClusterRecord   persistent; created if absent by the
                                                          first broker that finds it missing:
                                                          the incarnation of etcd's data

Values are compact JSON, one encoder and
one decoder per record (a dedicated cattrs converter with strict types); a value that
does not decode raises :class:`~equeue.errors.ClusterDataInvalid`, never KeyError.

Placement rules: a new topic's queues go round the live groups starting from the
least loaded (load = queues a group owns across all topics; ties by name), so 12
queues over 3 equally loaded groups give 4 each, interleaved (queue i and i+1 on
different groups). Growing a topic appends queues, each on the then least loaded
live group; existing queue ids never move. Queue ids stay global (0..N-1), so
``hash(key) mod N`` routing is unchanged until N grows (then, as in Kafka, keys may
map to other queues from that moment on; earlier messages stay where they are).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import attrs
from cattrs import BaseValidationError, transform_error

from equeue.control import check_compression
from equeue.control import converter as _wire_converter
from equeue.errors import BadRequest, ClusterDataInvalid, InvalidName, NoLiveGroups
from equeue.retention import SETTINGS as _RETENTION
from equeue.retention import from_record, retention_problem, to_record

__all__ = [
    "BROKERS_PREFIX",
    "CLUSTER_KEY",
    "GROUPS_PREFIX",
    "ISR_PREFIX",
    "LEADERS_PREFIX",
    "PAUSED_PREFIX",
    "ROOT",
    "TOPICS_PREFIX",
    "BrokerRecord",
    "ClusterRecord",
    "GroupRecord",
    "IsrRecord",
    "KeyKind",
    "LeaderRecord",
    "PauseRecord",
    "TopicPlacement",
    "broker_key",
    "decode_broker",
    "decode_cluster",
    "decode_group",
    "decode_isr",
    "decode_leader",
    "decode_pause",
    "decode_topic",
    "encode_broker",
    "encode_cluster",
    "encode_group",
    "encode_isr",
    "encode_leader",
    "encode_pause",
    "encode_topic",
    "group_key",
    "grow",
    "isr_key",
    "leader_key",
    "load",
    "parse_key",
    "pause_key",
    "spread",
    "topic_key",
]

ROOT = "/equeue/"
GROUPS_PREFIX = ROOT + "groups/"
BROKERS_PREFIX = ROOT + "brokers/"
TOPICS_PREFIX = ROOT + "topics/"
#: replication: the leader of each group (under the leader's lease) and its in-sync set
LEADERS_PREFIX = ROOT + "leaders/"
ISR_PREFIX = ROOT + "isr/"
#: paused topics and consumer groups: ``paused/topic/<name>``, ``paused/group/<name>``
PAUSED_PREFIX = ROOT + "paused/"
#: what can be paused (the second segment of a pause key)
PAUSE_KINDS = ("topic", "group")
#: the cluster's incarnation (one key, not a prefix)
CLUSTER_KEY = ROOT + "cluster"

#: longest name segment of a key (group, broker id, topic)
_MAX_SEGMENT = 255


def _segment(name: str, what: str) -> str:
    """``name`` if it can be one segment of a key: not empty, no ``/``, printable."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > _MAX_SEGMENT
        or "/" in name
        or not name.isprintable()
    ):
        raise InvalidName(f"invalid {what} {name!r}: 1-{_MAX_SEGMENT} printable characters, no '/'")
    return name


def group_key(group: str) -> str:
    return GROUPS_PREFIX + _segment(group, "broker group name")


def broker_key(group: str, broker_id: str) -> str:
    return (
        f"{BROKERS_PREFIX}{_segment(group, 'broker group name')}/{_segment(broker_id, 'broker id')}"
    )


def topic_key(topic: str) -> str:
    return TOPICS_PREFIX + _segment(topic, "topic name")


def leader_key(group: str) -> str:
    return LEADERS_PREFIX + _segment(group, "broker group name")


def isr_key(group: str) -> str:
    return ISR_PREFIX + _segment(group, "broker group name")


def pause_key(kind: str, name: str) -> str:
    """The key of the pause of topic or consumer group ``name`` (``kind``: one of
    :data:`PAUSE_KINDS`). Raises InvalidName for a name no key can hold, BadRequest
    for another kind."""
    if kind not in PAUSE_KINDS:
        raise BadRequest(f"cannot pause a {kind!r}: topics and groups only")
    return f"{PAUSED_PREFIX}{kind}/{_segment(name, kind + ' name')}"


KeyKind = Literal["group", "broker", "topic", "leader", "isr", "cluster", "paused"]


def parse_key(key: str) -> tuple[KeyKind, tuple[str, ...]] | None:
    """What a key under :data:`ROOT` names: ("group", (g,)), ("broker", (g, id)),
    ("topic", (t,)), ("leader", (g,)), ("isr", (g,)), ("paused", (kind, name)),
    ("cluster", ()) for :data:`CLUSTER_KEY`; None for any other key (a newer
    layout's, or garbage)."""
    if key == CLUSTER_KEY:
        return "cluster", ()
    for kind, prefix, parts in (
        ("group", GROUPS_PREFIX, 1),
        ("broker", BROKERS_PREFIX, 2),
        ("topic", TOPICS_PREFIX, 1),
        ("leader", LEADERS_PREFIX, 1),
        ("isr", ISR_PREFIX, 1),
        ("paused", PAUSED_PREFIX, 2),
    ):
        if key.startswith(prefix):
            names = tuple(key[len(prefix) :].split("/"))
            if len(names) == parts and all(names) and (kind != "paused" or names[0] in PAUSE_KINDS):
                return kind, names  # type: ignore[return-value]
            return None
    return None


# ----------------------------------------------------------------------------- records
def _non_empty(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


def _non_negative(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, not {value}")


def _retention(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (why := retention_problem(attribute.name, value)) is not None:
        raise ValueError(why)


@attrs.frozen
class ClusterRecord:
    """The incarnation of the cluster's etcd data: a random ``id`` made by the broker
    that created the record (create-if-absent, never changed). An etcd that lost its
    data has none; the first broker to see that creates a new one, so clients can
    tell a table of the new data (whose revisions start low again) from a stale one."""

    id: str = attrs.field(validator=_non_empty)
    created_ms: int = attrs.field(validator=_non_negative)


@attrs.frozen
class GroupRecord:
    """A broker group: a named set of brokers holding the same store. Persistent:
    a group with no registered broker is *down* (its queues unavailable), not gone."""

    name: str = attrs.field(validator=_non_empty)
    created_ms: int = attrs.field(validator=_non_negative)


@attrs.frozen
class BrokerRecord:
    """A live broker of ``group``, at ``address`` ("host:port" clients connect to).
    ``proof_sha256`` is the hex SHA-256 of the secret this broker process made when
    it started: as a follower it sends the secret with every replication request,
    and its leader counts the request only if it hashes to this ("": a broker from
    before the field, whose replication requests are refused). Only the digest is
    stored, so reading etcd does not let anyone act as this replica."""

    group: str = attrs.field(validator=_non_empty)
    broker_id: str = attrs.field(validator=_non_empty)
    address: str = attrs.field(validator=_non_empty)
    started_ms: int = attrs.field(validator=_non_negative)
    pid: int = attrs.field(validator=_non_negative)
    version: str = ""
    proof_sha256: str = ""


@attrs.frozen
class LeaderRecord:
    """The leader of ``group`` (replication), held under the leader's etcd lease: created
    only by create-if-absent, gone when the lease ends. ``epoch`` is bumped at each
    takeover and equals the ISR record's epoch written in the same transaction."""

    group: str = attrs.field(validator=_non_empty)
    broker_id: str = attrs.field(validator=_non_empty)
    address: str = attrs.field(validator=_non_empty)
    epoch: int = attrs.field(validator=_non_negative)
    since_ms: int = attrs.field(validator=_non_negative)


def _as_tuple(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(names)


def _members(
    _: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    if not value or any(not m for m in value) or len(set(value)) != len(value):
        raise ValueError(f"{attribute.name} must be distinct non-empty broker ids, at least one")


@attrs.frozen
class IsrRecord:
    """The in-sync replicas of ``group`` (replication), persistent (no lease): broker ids,
    the leader included. Written by a takeover (epoch + 1) and by the leader of
    ``epoch`` only, in a transaction comparing the record's mod revision. Only a
    member may take over: each member holds every acknowledged write. ``handover``
    (not empty): the leader handed the group over to that member and gave its key
    up; the other members leave it the first try (one lease TTL). ``restored``: a
    broker found etcd gone back to an older state (restored from a backup) with this
    record in it: the record may be older than the group, so no replica takes over
    from it until an operator's recovery writes a new one."""

    group: str = attrs.field(validator=_non_empty)
    epoch: int = attrs.field(validator=_non_negative)
    leader: str = attrs.field(validator=_non_empty)
    members: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_members)
    handover: str = ""
    restored: bool = False


def _pause_kind(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in PAUSE_KINDS:
        raise ValueError(f"{attribute.name} must be one of {', '.join(PAUSE_KINDS)}, not {value!r}")


@attrs.frozen
class PauseRecord:
    """An operator's pause of a topic's produce (``kind`` "topic") or of a consumer
    group's pulls ("group"), since ``since_ms``. Persistent (no lease): it holds until
    the operator resumes (the key is deleted), across restarts and failovers."""

    kind: str = attrs.field(validator=_pause_kind)
    name: str = attrs.field(validator=_non_empty)
    since_ms: int = attrs.field(validator=_non_negative)


def _owners_match(
    instance: TopicPlacement, _: attrs.Attribute[tuple[str, ...]], owners: tuple[str, ...]
) -> None:
    if len(owners) != instance.queues:
        raise ValueError(f"{len(owners)} owners for {instance.queues} queues")
    if not all(owners):
        raise ValueError("an owner group name is empty")


def _compression(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    check_compression(value, ValueError)


@attrs.frozen
class TopicPlacement:
    """A topic's queues and where they live: ``owners[i]`` is the broker group that
    owns queue id ``i`` (so ``len(owners) == queues``). Retention overrides
    (:mod:`equeue.retention`): None for the broker's defaults, -1 keep forever, > 0
    the limit. The record in etcd writes -1 as 0 (what earlier versions read as "no
    limit"); 0 or a negative value read from etcd is -1. ``compression``: the topic's
    compression setting, or None."""

    name: str = attrs.field(validator=_non_empty)
    queues: int = attrs.field(validator=attrs.validators.ge(1))
    owners: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_owners_match)
    created_ms: int = attrs.field(validator=_non_negative)
    retention_ms: int | None = attrs.field(default=None, converter=from_record, validator=_retention)
    retention_bytes: int | None = attrs.field(default=None, converter=from_record, validator=_retention)
    #: how the topic stores batches (:data:`equeue.control.COMPRESSION_SETTINGS`), applied
    #: by every broker group; None: each broker's ``--compression`` (and what a record
    #: written before the setting existed reads as)
    compression: str | None = attrs.field(default=None, validator=_compression)

    def queues_of(self, group: str) -> list[int]:
        """The queue ids ``group`` owns, ascending."""
        return [q for q, owner in enumerate(self.owners) if owner == group]


# ----------------------------------------------------------------------------- JSON
# A copy of the wire converter: the same strict str/int/bool hooks (a wrong JSON type
# is an error, not a silently coerced value), unknown keys ignored (a newer broker's
# extra fields do not break an older one), but its own instance.
_converter = _wire_converter.copy()
T = TypeVar("T")


def _encode(record: Any) -> bytes:
    return json.dumps(_converter.unstructure(record), separators=(",", ":")).encode()


def _why(exc: BaseException, _: type | None) -> str:
    return "required field missing" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__


def _decode(data: bytes, cls: type[T]) -> T:
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise TypeError(f"a JSON {type(obj).__name__}, not an object")
        return _converter.structure(obj, cls)
    except Exception as exc:  # json, cattrs and the validators raise several kinds
        why = (
            "; ".join(transform_error(exc, format_exception=_why))
            if isinstance(exc, BaseValidationError)
            else str(exc)
        )
        raise ClusterDataInvalid(f"malformed {cls.__name__} record in etcd: {why}") from exc


def encode_cluster(record: ClusterRecord) -> bytes:
    return _encode(record)


def decode_cluster(data: bytes) -> ClusterRecord:
    """Raises ClusterDataInvalid when ``data`` is not a ClusterRecord."""
    return _decode(data, ClusterRecord)


def encode_group(record: GroupRecord) -> bytes:
    return _encode(record)


def decode_group(data: bytes) -> GroupRecord:
    """Raises ClusterDataInvalid when ``data`` is not a GroupRecord."""
    return _decode(data, GroupRecord)


def encode_broker(record: BrokerRecord) -> bytes:
    return _encode(record)


def decode_broker(data: bytes) -> BrokerRecord:
    """Raises ClusterDataInvalid when ``data`` is not a BrokerRecord."""
    return _decode(data, BrokerRecord)


def encode_topic(record: TopicPlacement) -> bytes:
    """The etcd value of ``record``; a retention of -1 (keep forever) is written as 0."""
    obj = _converter.unstructure(record)
    for name in _RETENTION:
        obj[name] = to_record(obj[name])
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_topic(data: bytes) -> TopicPlacement:
    """Raises ClusterDataInvalid when ``data`` is not a TopicPlacement."""
    return _decode(data, TopicPlacement)


def encode_leader(record: LeaderRecord) -> bytes:
    return _encode(record)


def decode_leader(data: bytes) -> LeaderRecord:
    """Raises ClusterDataInvalid when ``data`` is not a LeaderRecord."""
    return _decode(data, LeaderRecord)


def encode_isr(record: IsrRecord) -> bytes:
    return _encode(record)


def decode_isr(data: bytes) -> IsrRecord:
    """Raises ClusterDataInvalid when ``data`` is not an IsrRecord (members empty or
    repeated included)."""
    return _decode(data, IsrRecord)


def encode_pause(record: PauseRecord) -> bytes:
    return _encode(record)


def decode_pause(data: bytes) -> PauseRecord:
    """Raises ClusterDataInvalid when ``data`` is not a PauseRecord."""
    return _decode(data, PauseRecord)


# ----------------------------------------------------------------------------- rules
def load(placements: Iterable[TopicPlacement]) -> dict[str, int]:
    """Queues owned per group across ``placements`` (groups owning none are absent)."""
    counts: dict[str, int] = {}
    for placement in placements:
        for owner in placement.owners:
            counts[owner] = counts.get(owner, 0) + 1
    return counts


def _assign(n: int, live_groups: Sequence[str], load: Mapping[str, int]) -> list[str]:
    """``n`` owners, each the least loaded live group at its turn (ties by name),
    counting the ones just assigned. Raises NoLiveGroups when there is none."""
    if n <= 0:
        return []
    groups = sorted(set(live_groups))
    if not groups:
        raise NoLiveGroups(f"no live broker group to place {n} queue(s) on: start a broker")
    counts = {g: load.get(g, 0) for g in groups}
    owners = []
    for _ in range(n):
        best = min(groups, key=lambda g: (counts[g], g))
        owners.append(best)
        counts[best] += 1
    return owners


def spread(queues: int, live_groups: Sequence[str], load: Mapping[str, int]) -> tuple[str, ...]:
    """Owners of a new topic's ``queues`` queues: spread evenly over ``live_groups``
    starting from the least loaded (``load``: queues owned per group, all topics).

    Raises BadRequest when ``queues`` < 1, NoLiveGroups when ``live_groups`` is empty."""
    if queues < 1:
        raise BadRequest(f"a topic needs at least one queue, not {queues}")
    return tuple(_assign(queues, live_groups, load))


def grow(
    placement: TopicPlacement, new_queues: int, live_groups: Sequence[str], load: Mapping[str, int]
) -> TopicPlacement:
    """``placement`` with ``new_queues`` more queues appended (ids ``queues..``), each
    on the least loaded live group at its turn. Existing queue ids never move.

    Raises BadRequest when ``new_queues`` < 0, NoLiveGroups when queues must be
    placed and ``live_groups`` is empty."""
    if new_queues < 0:
        raise BadRequest(f"a topic's queues can only grow (asked to remove {-new_queues})")
    if new_queues == 0:
        return placement
    added = _assign(new_queues, live_groups, load)
    return attrs.evolve(
        placement, queues=placement.queues + new_queues, owners=(*placement.owners, *added)
    )
