"""What readers see of the store: an immutable snapshot of its committed state.

The thread contract: the writer thread (the appender's, or whoever calls
:meth:`~equeue.broker.storage.store.Store.write`) builds a new :class:`StoreView` after
each commit and publishes it with ONE reference swap (``store.view = new``).
Nothing in a published view ever changes, so a reader on the event loop (or in
any thread) that takes ``store.view`` once sees one consistent, committed state:
never a queue's next offset past its last committed message, never a topic
whose creation has not committed, never half of a transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Final, TypeVar

import attrs

from equeue import control

K = TypeVar("K")
V = TypeVar("V")


def frozen_map(d: dict[K, V]) -> MappingProxyType[K, V]:
    """A read-only view of ``d``; the caller hands ``d`` over and never changes it.
    (``.copy()`` of the proxy is a fast dict copy: how the writer derives the next map.)"""
    return MappingProxyType(d)


@attrs.frozen(slots=True)
class QueueState:
    """A queue's committed range: offsets ``[min_offset, next_offset)`` are stored,
    holding ``bytes`` record bytes."""

    next_offset: int = 0
    min_offset: int = 0
    bytes: int = 0


#: the state of a queue that has none yet
EMPTY_QUEUE: Final = QueueState()
#: a topic's queues: queue id -> committed range
TopicQueues = MappingProxyType[int, QueueState]
#: the queues of a topic the view does not know
NO_QUEUES: Final[TopicQueues] = MappingProxyType({})
#: no skipped records
NO_SKIPS: Final[MappingProxyType[tuple[int, int], frozenset[int]]] = MappingProxyType({})


@attrs.frozen(slots=True)
class StoreView:
    """The committed in-memory state of the store. Mappings are read-only proxies."""

    #: topic name -> its description
    topics: MappingProxyType[str, control.TopicInfo]
    #: topic id -> (queue id -> committed range): two levels, so that a commit copies
    #: the map of the topics it touched, not every queue of the broker
    queues: MappingProxyType[int, TopicQueues]
    #: (group, topic, queue id) -> committed consumer offset
    offsets: MappingProxyType[tuple[str, str, int], int]
    #: topic id -> delayed messages waiting in the schedule
    sched_pending: MappingProxyType[int, int]
    #: ids of deleted topics whose data retention is still removing
    deleting: tuple[int, ...] = ()
    next_global: int = 0
    next_topic_id: int = 1
    #: write transactions committed since the store was opened
    transactions: int = 0
    #: delayed messages taken from the schedule since the store was opened, and the
    #: transactions that took them (committed with the move, so a consumer that
    #: sees a moved message sees it counted)
    moved: int = 0
    move_transactions: int = 0
    #: (topic id, queue id) -> queue offsets an operator skipped (never served)
    skipped: MappingProxyType[tuple[int, int], frozenset[int]] = NO_SKIPS
    #: topics whose produce an operator paused, and consumer groups whose pulls are held
    #: (:mod:`equeue.broker.storage.pauses`)
    paused_topics: frozenset[str] = frozenset()
    paused_groups: frozenset[str] = frozenset()

    def queue(self, topic_id: int, queue_id: int) -> QueueState:
        """A queue's committed range (empty for a queue the view does not know)."""
        return self.queues.get(topic_id, NO_QUEUES).get(queue_id, EMPTY_QUEUE)

    def all_queues(self) -> Iterator[tuple[int, int, QueueState]]:
        """(topic id, queue id, committed range) of every queue the view knows."""
        for tid, qs in self.queues.items():
            for q, st in qs.items():
                yield tid, q, st

    def skips(self, topic_id: int, queue_id: int) -> frozenset[int]:
        """The queue offsets of a queue that an operator skipped (usually none)."""
        return self.skipped.get((topic_id, queue_id), frozenset())
