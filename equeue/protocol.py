"""Request codes, push codes and status values shared by broker and clients.

Numbers are part of the wire contract (see docs/protocol.md): never renumber.
"""

from __future__ import annotations

import enum

__all__ = ["PullStatus", "PushCode", "RequestCode"]


class RequestCode(enum.IntEnum):
    """What a request frame asks for (u16 ``code`` of a request frame)."""

    # hot paths: packed binary payloads (equeue.wire)
    PRODUCE = 10
    PULL = 11
    # topics: JSON payloads (equeue.control)
    CREATE_TOPIC = 20
    DELETE_TOPIC = 21
    LIST_TOPICS = 22
    DESCRIBE_TOPIC = 23
    ALTER_TOPIC = 24
    GET_ROUTE = 25
    GET_ROUTES = 26
    #: refuse (TOPIC_PAUSED) and allow again a topic's produce (admin; docs/operations.md)
    PAUSE_TOPIC = 27
    RESUME_TOPIC = 28
    # queue offsets
    QUEUE_OFFSETS = 30
    OFFSET_FOR_TIME = 31
    # consumer offsets
    COMMIT_OFFSET = 40
    QUERY_OFFSET = 41
    RESET_OFFSETS = 42
    # groups
    HEARTBEAT = 50
    LEAVE_GROUP = 51
    LIST_GROUPS = 52
    DESCRIBE_GROUP = 53
    RELEASE_QUEUES = 54
    #: delete a group's committed offsets and state (admin; refused while it has live members)
    DELETE_GROUP = 55
    #: hold and deliver again a consumer group's pulls (docs/operations.md)
    PAUSE_GROUP = 56
    RESUME_GROUP = 57
    # admin
    STATS = 60
    CLUSTER_STATUS = 61
    #: an operator's recovery of a group whose records etcd lost (admin)
    CLUSTER_RECOVER = 62
    #: hand a group's leadership to an in-sync follower (admin; answered by the leader)
    CLUSTER_HANDOVER = 63
    # lookup
    GET_MESSAGE = 70
    FIND_BY_KEY = 71
    # corruption (admin)
    SKIP_MESSAGE = 72
    LIST_SKIPPED = 73
    # retry / dead letters
    SEND_BACK = 80
    DLQ_LIST = 81
    DLQ_RESEND = 82
    # replication inside a broker group (docs/cluster.md, "Replicas, acks, failover"): broker to broker,
    # except REPLICATION_STATUS and REPLICA_DIGEST, which the CLI sends too
    REPLICA_FETCH = 90
    REPLICA_KEYS = 91
    REPLICA_SNAPSHOT = 92
    REPLICA_DIGEST = 93
    REPLICATION_STATUS = 94


class PushCode(enum.IntEnum):
    """Server-initiated notifications (u16 ``code`` of a push frame)."""

    #: a group this connection's member belongs to changed membership: rebalance now.
    GROUP_CHANGED = 1


class PullStatus(enum.IntEnum):
    """Outcome of a pull. Expected outcomes are statuses, never exceptions."""

    FOUND = 0
    #: nothing at or after the offset (after the long-poll hold, if any)
    NO_NEW_MESSAGE = 1
    #: the offset is below the lowest retained offset; see ``min_offset``
    OFFSET_TOO_SMALL = 2
    #: the offset is past the next offset to be written; see ``max_offset``
    OFFSET_OVERFLOW = 3
    #: a tag-filtered scan used its budget without a match (RocketMQ's NO_MATCHED_MSG):
    #: pull again at once from ``next_offset``, where the scan stopped
    NO_MATCHED_MSG = 4
