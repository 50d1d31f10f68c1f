"""The one exception tree of equeue, and the wire error codes that map onto it.

Every error a user can catch derives from :class:`EQueueError`::

    EQueueError
    ├── ProtocolError                 framing / handshake problems (carry an ErrorCode)
    │   ├── LocalProtocolError        we tried to send something invalid
    │   └── RemoteProtocolError       the peer sent something invalid
    ├── BrokerError                   the broker answered a request with an error code
    │   ├── BadRequest
    │   ├── UnknownRequest
    │   ├── InvalidName
    │   ├── ReservedTopic
    │   ├── TopicNotFound
    │   ├── TopicExists
    │   ├── QueueNotFound
    │   ├── MessageTooLarge
    │   ├── DelayTooLong
    │   ├── StoreFull
    │   ├── StoreError
    │   ├── CorruptRecord
    │   ├── MessageNotFound
    │   ├── InvalidMessage
    │   ├── OffsetOutOfRange
    │   ├── NotQueueOwner
    │   ├── GroupHasMembers
    │   ├── GroupNotFound             no live member and no committed offset (DELETE_GROUP, the CLI)
    │   ├── TopicPaused               (transient) an operator paused the topic's produce
    │   ├── EphemeralGroup            an ephemeral group has no retry or dead-letter topic (SEND_BACK)
    │   ├── OutOfOrderSequence        (transient)
    │   ├── BrokerBusy                (transient)
    │   ├── BrokerShuttingDown        (transient)
    │   ├── TooManyConnections        (transient)
    │   ├── TooManyPulls              (transient)
    │   ├── AuthRequired              (also an AuthenticationError)
    │   ├── AuthFailed                (also an AuthenticationError)
    │   ├── UnsupportedMechanism      (also an AuthenticationError)
    │   ├── NotAuthorized             an ACL refuses the request (names the resource)
    │   ├── NotOwner                  (transient) another broker group owns the queue: refresh routes
    │   ├── QueueUnavailable          (transient) the queue's broker group has no live broker
    │   ├── ClusterUnavailable        (transient) etcd unreachable, or answered nonsense
    │   ├── NoLiveGroups              (transient) no broker group is alive to place queues on
    │   ├── ClusterDataInvalid        a record in etcd does not decode (skipped, never half-used)
    │   ├── NotLeader                 (transient) a follower, or a leader that lost leadership: refresh routes
    │   ├── NotEnoughReplicas         (transient) the in-sync set is below --min-insync
    │   ├── StaleEpoch                (transient) a replication request of an older leader epoch
    │   ├── NotAReplica               (transient) a replication request from no registered replica of the group
    │   ├── BrokerIdConflict          another live broker holds this broker id (also a ConfigError; at start)
    │   └── InternalBrokerError
    ├── ConnectionBroken              the peer broke the connection (transient)
    │   └── TlsError                  a certificate problem in the TLS handshake (not transient)
    ├── ClientClosed                  you closed the client and then used it
    ├── OperationTimeout              a send/request did not finish in its time budget
    ├── BufferFull                    a producer's send buffer is full (on_full="raise")
    ├── DataDirLocked                 another broker holds the data directory (at start)
    ├── StartupError                  the broker cannot start: a port taken, a data directory it cannot use
    ├── LogTrimmed                    a replication log read below the log's start (a status, no wire code)
    ├── StoreDamaged                  the store cannot be opened safely (at start; code 28)
    │   └── StoreTruncated            data.mdb is shorter than its pages (code 29)
    ├── AuthenticationError           the handshake's SCRAM exchange did not succeed
    ├── SerializationError            a producer's serializer or a consumer's deserializer failed (also a ValueError)
    └── ConfigError                   invalid configuration or argument

Expected outcomes (no new message, offset too small...) are *status values*, not
exceptions: see :class:`equeue.protocol.PullStatus`.

Clients map wire codes to exceptions through :func:`error_for_code` only, never by
message text.
"""

from __future__ import annotations

import enum

__all__ = [
    "AuthFailed",
    "AuthRequired",
    "AuthenticationError",
    "BadRequest",
    "BrokerBusy",
    "BrokerError",
    "BrokerIdConflict",
    "BrokerShuttingDown",
    "BufferFull",
    "ClientClosed",
    "ClusterDataInvalid",
    "ClusterUnavailable",
    "ConfigError",
    "ConnectionBroken",
    "CorruptRecord",
    "DataDirLocked",
    "DelayTooLong",
    "EQueueError",
    "EphemeralGroup",
    "ErrorCode",
    "GroupHasMembers",
    "GroupNotFound",
    "InternalBrokerError",
    "InvalidMessage",
    "InvalidName",
    "LocalProtocolError",
    "LogTrimmed",
    "MessageNotFound",
    "MessageTooLarge",
    "NoLiveGroups",
    "NotAReplica",
    "NotAuthorized",
    "NotEnoughReplicas",
    "NotLeader",
    "NotOwner",
    "NotQueueOwner",
    "OffsetOutOfRange",
    "OperationTimeout",
    "OutOfOrderSequence",
    "ProtocolError",
    "QueueNotFound",
    "QueueUnavailable",
    "RemoteProtocolError",
    "ReservedTopic",
    "SerializationError",
    "StaleEpoch",
    "StartupError",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreTruncated",
    "TlsError",
    "TooManyConnections",
    "TooManyPulls",
    "TopicExists",
    "TopicNotFound",
    "TopicPaused",
    "UnknownRequest",
    "UnsupportedMechanism",
    "error_for_code",
    "first_error",
]


class ErrorCode(enum.IntEnum):
    """Stable numeric error codes carried in response frames (u16 on the wire).

    Never renumber: other-language clients depend on these values.
    """

    OK = 0
    # framing / protocol: the connection is closed after these
    PROTOCOL_ERROR = 1
    UNSUPPORTED_VERSION = 2
    FRAME_TOO_LARGE = 3
    # request level
    UNKNOWN_REQUEST = 4
    BAD_REQUEST = 5
    INVALID_NAME = 10
    TOPIC_NOT_FOUND = 11
    TOPIC_EXISTS = 12
    QUEUE_NOT_FOUND = 13
    RESERVED_TOPIC = 14
    MESSAGE_TOO_LARGE = 20
    STORE_FULL = 21
    STORE_ERROR = 22
    CORRUPT_RECORD = 23
    DELAY_TOO_LONG = 24
    MESSAGE_NOT_FOUND = 25
    INVALID_MESSAGE = 26
    OFFSET_OUT_OF_RANGE = 27
    BROKER_BUSY = 30
    SHUTTING_DOWN = 31
    NOT_QUEUE_OWNER = 32
    GROUP_HAS_MEMBERS = 33
    OUT_OF_ORDER_SEQUENCE = 34
    TOO_MANY_CONNECTIONS = 35
    TOO_MANY_PULLS = 36
    GROUP_NOT_FOUND = 37
    TOPIC_PAUSED = 38
    EPHEMERAL_GROUP = 39
    # local start-up refusals (never sent on the wire): a damaged store
    STORE_DAMAGED = 28
    STORE_TRUNCATED = 29
    # authentication and authorization (docs/security.md)
    AUTH_REQUIRED = 40
    AUTH_FAILED = 41
    NOT_AUTHORIZED = 42
    UNSUPPORTED_MECHANISM = 43
    # cluster (docs/cluster.md): 50-59
    NOT_OWNER = 50
    QUEUE_UNAVAILABLE = 51
    CLUSTER_UNAVAILABLE = 52
    NO_LIVE_GROUPS = 53
    CLUSTER_DATA_INVALID = 54
    NOT_LEADER = 55
    NOT_ENOUGH_REPLICAS = 56
    STALE_EPOCH = 57
    NOT_A_REPLICA = 58
    BROKER_ID_CONFLICT = 59
    INTERNAL_ERROR = 99


class EQueueError(Exception):
    """Root of every equeue error."""

    #: whether retrying the same operation later may succeed
    transient: bool = False


class DataDirLocked(EQueueError):
    """Another broker holds the data directory (its lock file names the pid). Raised
    when a store opens, never sent on the wire."""


class StartupError(EQueueError):
    """The broker cannot start: its port or HTTP port is taken or cannot be bound
    (address in use, an address of no interface, an unknown host), or its data
    directory cannot be created or used. Raised by ``Broker.serve`` before it
    reports ready (one line naming the port or directory and why), never sent on
    the wire."""


class LogTrimmed(EQueueError):
    """A read of a replicated store's log asked for positions the log no longer
    holds (trimmed): the reader must copy the store instead (a snapshot). A status
    for the caller, never sent on the wire."""


class StoreDamaged(EQueueError):
    """The store's files are damaged: a bad LMDB header, an unreadable format or
    meta record, undecodable topic metadata. Raised when a store opens (one line
    naming the file, what is wrong and how to recover), never sent on the wire."""

    code = ErrorCode.STORE_DAMAGED


class StoreTruncated(StoreDamaged):
    """``data.mdb`` is shorter than the pages its meta page says it holds: mapping
    it would crash the broker with SIGBUS. Raised when a store opens."""

    code = ErrorCode.STORE_TRUNCATED


class ConfigError(EQueueError, ValueError):
    """An invalid configuration value or argument (raised before anything is sent)."""


class SerializationError(EQueueError, ValueError):
    """A serializer or deserializer (:mod:`equeue.serde`) raised, or returned the wrong
    type. The message names it (and, consuming, the message's position); the original
    error is its ``__cause__``. Producing, it is raised by the send call before anything
    is buffered; consuming, it counts as a handler failure (retry, then dead letter)."""


class ClientClosed(EQueueError):
    """The producer/consumer/connection was closed by its owner and then used."""


class ConnectionBroken(EQueueError):
    """The peer closed or broke the connection, or it could not be established."""

    transient = True


class TlsError(ConnectionBroken):
    """The TLS handshake with the broker failed over a certificate: the broker's is
    not trusted (unknown CA), expired, or names another host; or the broker refused
    the client's (none sent, unknown CA, expired). Not transient: retrying cannot
    help until the certificates or the settings change. A local error, never sent
    on the wire."""

    transient = False


class OperationTimeout(EQueueError):
    """An operation did not complete within its time budget (e.g. ``send_timeout``)."""

    transient = True


class BufferFull(EQueueError):
    """A producer's buffer holds ``max_buffered_bytes`` already and it was told not
    to wait (``on_full="raise"``); retry later or flush."""

    transient = True


class ProtocolError(EQueueError):
    """A framing or handshake violation. Carries the :class:`ErrorCode` to report."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol forbids (a bug in the caller)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that violate the protocol; the connection must be closed."""


class BrokerError(EQueueError):
    """The broker answered with an error code. ``code`` is the :class:`ErrorCode`."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code

    def __reduce__(self) -> tuple[type, tuple[str, ErrorCode]]:
        return (self.__class__, (str(self), self.code))


class BadRequest(BrokerError):
    code = ErrorCode.BAD_REQUEST


class UnknownRequest(BrokerError):
    code = ErrorCode.UNKNOWN_REQUEST


class InvalidName(BrokerError, ConfigError):
    code = ErrorCode.INVALID_NAME


class ReservedTopic(BrokerError):
    code = ErrorCode.RESERVED_TOPIC


class TopicNotFound(BrokerError):
    code = ErrorCode.TOPIC_NOT_FOUND


class TopicExists(BrokerError):
    code = ErrorCode.TOPIC_EXISTS


class QueueNotFound(BrokerError):
    code = ErrorCode.QUEUE_NOT_FOUND


class MessageTooLarge(BrokerError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class DelayTooLong(BrokerError):
    code = ErrorCode.DELAY_TOO_LONG


class StoreFull(BrokerError):
    """The LMDB map or the disk is full: nothing of the request was stored."""

    code = ErrorCode.STORE_FULL


class StoreError(BrokerError):
    code = ErrorCode.STORE_ERROR




class CorruptRecord(BrokerError):
    """A stored record failed its checksum."""

    code = ErrorCode.CORRUPT_RECORD


class MessageNotFound(BrokerError):
    code = ErrorCode.MESSAGE_NOT_FOUND


class InvalidMessage(BrokerError):
    """A produced entry is malformed (its property block, key or tags lengths): the
    whole batch was refused and nothing of it stored. The message names the entry."""

    code = ErrorCode.INVALID_MESSAGE


class OffsetOutOfRange(BrokerError):
    """An offset to commit lies past the queue's end (the message names the end)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class NotQueueOwner(BrokerError):
    """A pull/commit for a queue whose lease this consumer does not hold."""

    code = ErrorCode.NOT_QUEUE_OWNER


class GroupHasMembers(BrokerError):
    code = ErrorCode.GROUP_HAS_MEMBERS


class GroupNotFound(BrokerError):
    """No consumer group of that name: no live member and no committed offset (at
    this broker: DELETE_GROUP; at any broker group: ``equeue group describe/delete``)."""

    code = ErrorCode.GROUP_NOT_FOUND


class TopicPaused(BrokerError):
    """An operator paused the topic (``equeue topic pause``): its PRODUCE requests are
    refused, nothing is written. Transient: the producer resends the batch (same id and
    sequence) until ``send_timeout``, and it goes through once the topic is resumed."""

    code = ErrorCode.TOPIC_PAUSED
    transient = True
class EphemeralGroup(BrokerError):
    """A request that needs durable state of the group, refused for an ephemeral group
    (``<name>#ephemeral``, docs/consumer.md "Ephemeral groups"): SEND_BACK, whose
    ``%RETRY%``/``%DLQ%`` topics would outlive the group. Not transient: the consumer
    retries such a message in place, then drops it."""

    code = ErrorCode.EPHEMERAL_GROUP


class OutOfOrderSequence(BrokerError):
    """An idempotent produce arrived before an earlier one of the same producer and
    queue was stored; the producer resends its in-flight requests in order."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE
    transient = True


class BrokerBusy(BrokerError):
    code = ErrorCode.BROKER_BUSY
    transient = True


class BrokerShuttingDown(BrokerError):
    code = ErrorCode.SHUTTING_DOWN
    transient = True


class AuthenticationError(EQueueError):
    """The connection could not authenticate (never retried: the same credentials
    fail the same way); the broker closes the connection after it."""


class AuthRequired(BrokerError, AuthenticationError):
    """The broker authenticates every connection and none was attempted (no
    credentials), or a request came before the exchange succeeded."""

    code = ErrorCode.AUTH_REQUIRED


class AuthFailed(BrokerError, AuthenticationError):
    """Wrong user name or password (the broker does not say which), or a broker
    that could not prove it knows the password."""

    code = ErrorCode.AUTH_FAILED


class UnsupportedMechanism(BrokerError, AuthenticationError):
    """The client asked for a SASL mechanism the broker does not offer."""

    code = ErrorCode.UNSUPPORTED_MECHANISM


class NotAuthorized(BrokerError):
    """An ACL refuses this request; the message names the user, the operation and
    the resource."""

    code = ErrorCode.NOT_AUTHORIZED


class TooManyConnections(BrokerError):
    """The broker holds ``--max-connections`` connections already (or is out of file
    descriptors): it refused this one in the handshake answer and closed it."""

    code = ErrorCode.TOO_MANY_CONNECTIONS
    transient = True


class TooManyPulls(BrokerError):
    """This connection has ``--max-pulls-per-connection`` pulls parked already and
    this one found nothing: it was answered at once instead of parking. Pull again
    after a back-off."""

    code = ErrorCode.TOO_MANY_PULLS
    transient = True


class NotOwner(BrokerError):
    """This broker's group does not own the queue (cluster mode): the client's route
    table is stale. Refresh routes (GET_ROUTES) and send to the owner; the message text
    names the owner group. Transient: a retry after a refresh succeeds."""

    code = ErrorCode.NOT_OWNER
    transient = True


class QueueUnavailable(BrokerError):
    """The queue's owner broker group has no live broker (it left the cluster, or is
    restarting). Nothing is lost: the queue is served again when its group returns.
    Transient: retried within the caller's time budget."""

    code = ErrorCode.QUEUE_UNAVAILABLE
    transient = True


class ClusterUnavailable(BrokerError):
    """The cluster's coordination layer (etcd) did not answer in time, or answered
    something unusable: placement, membership or routes cannot be read or changed now.
    Transient: brokers keep reconnecting to etcd on their own; retry after a back-off."""

    code = ErrorCode.CLUSTER_UNAVAILABLE
    transient = True


class NoLiveGroups(BrokerError):
    """Queues must be placed (a topic created or grown) but no broker group has a
    registered broker. Its own code so a client can say so; transient: a group may
    come back."""

    code = ErrorCode.NO_LIVE_GROUPS
    transient = True


class ClusterDataInvalid(BrokerError):
    """A record stored in etcd under ``/equeue/`` does not decode (not JSON, wrong
    types, broken invariants such as an owner list of the wrong length). Brokers skip
    such a record (logged) and refuse to change it. Not transient: the same bytes
    fail again until someone rewrites them."""

    code = ErrorCode.CLUSTER_DATA_INVALID


class NotLeader(BrokerError):
    """This broker is a follower of its group (or a leader that lost its leadership):
    it serves no client data. Refresh routes (GET_ROUTES names each group's leader)
    and retry at the leader; nothing was written. Transient: during a failover the
    group has no leader for up to one lease TTL."""

    code = ErrorCode.NOT_LEADER
    transient = True


class NotEnoughReplicas(BrokerError):
    """The group's in-sync set is smaller than ``--min-insync``. Refused before the
    write: nothing was stored. Answered after the write (the set shrank while the
    batch waited for it): the batch may be stored; a retry with the same producer id
    and sequence is stored once. Transient: followers rejoin once caught up."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS
    transient = True


class StaleEpoch(BrokerError):
    """A replication request named a leader epoch other than the current one: the
    sender follows (or leads) an older term. It reloads the group's leader from etcd.
    Transient."""

    code = ErrorCode.STALE_EPOCH
    transient = True


class NotAReplica(BrokerError):
    """A replication request (REPLICA_FETCH, REPLICA_KEYS, REPLICA_SNAPSHOT) named a
    broker that is not a replica of this group registered under a live etcd lease,
    or its proof does not match that registration: nothing was read or counted.
    Transient: a replica that just registered may not be in the leader's view yet;
    a forged request fails the same way every time."""

    code = ErrorCode.NOT_A_REPLICA
    transient = True


class BrokerIdConflict(BrokerError, ConfigError):
    """Another live broker is registered in etcd under this broker's id (its
    ``<data-dir>/broker.id``): two brokers share one identity, typically a copied
    data directory. The broker refuses to start rather than let two stores answer
    for one replica (acknowledged writes would be lost). Not transient."""

    code = ErrorCode.BROKER_ID_CONFLICT


class InternalBrokerError(BrokerError):
    code = ErrorCode.INTERNAL_ERROR


_BY_CODE: dict[ErrorCode, type[BrokerError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        UnknownRequest,
        InvalidName,
        ReservedTopic,
        TopicNotFound,
        TopicExists,
        QueueNotFound,
        MessageTooLarge,
        DelayTooLong,
        StoreFull,
        StoreError,
        CorruptRecord,
        MessageNotFound,
        InvalidMessage,
        OffsetOutOfRange,
        NotQueueOwner,
        GroupHasMembers,
        GroupNotFound,
        TopicPaused,
        EphemeralGroup,
        OutOfOrderSequence,
        BrokerBusy,
        BrokerShuttingDown,
        AuthRequired,
        AuthFailed,
        UnsupportedMechanism,
        NotAuthorized,
        TooManyConnections,
        TooManyPulls,
        NotOwner,
        QueueUnavailable,
        ClusterUnavailable,
        NoLiveGroups,
        ClusterDataInvalid,
        NotLeader,
        NotEnoughReplicas,
        StaleEpoch,
        NotAReplica,
        BrokerIdConflict,
        InternalBrokerError,
    )
}


def error_for_code(code: int, message: str) -> EQueueError:
    """Build the exception for a wire error ``code`` (the one mapping table)."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return InternalBrokerError(f"unknown error code {code}: {message}")
    if ec in (ErrorCode.PROTOCOL_ERROR, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.FRAME_TOO_LARGE):
        return RemoteProtocolError(message, ec)
    cls = _BY_CODE.get(ec, InternalBrokerError)
    return cls(message, ec)


def first_error(exc: BaseException) -> EQueueError | None:
    """The first EQueueError in ``exc``: ``exc`` itself, or the first one inside its
    (nested) exception groups, where a nursery puts what its tasks raised; None when
    there is none."""
    if isinstance(exc, BaseExceptionGroup):
        refused, _ = exc.split(EQueueError)
        if refused is None:
            return None
        found: BaseException = refused
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        exc = found
    return exc if isinstance(exc, EQueueError) else None
