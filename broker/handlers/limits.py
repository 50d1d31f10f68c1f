"""The configuration values handlers read, and the checks of a request's arguments
(offsets, queue ids) made before any read or write transaction.
"""

from __future__ import annotations

import attrs

from equeue import control, wire
from equeue.codec import HEADER
from equeue.config import BrokerConfig
from equeue.errors import BadRequest, QueueNotFound

__all__ = ["U64_MAX", "Limits", "check_offset", "check_queue"]


@attrs.frozen
class Limits:
    """The configuration values the handlers read."""

    auto_create_topics: bool
    default_queues: int
    max_queues: int
    max_message_bytes: int
    max_delay_ms: int
    max_frame: int
    max_pull_wait: float
    #: the broker's ``--compression`` (a topic's own setting overrides it)
    compression: str = "producer"

    @property
    def max_pull_entry(self) -> int:
        """The largest batch entry (its stored batch plus its keep mask) a pull answer
        within the frame cap can carry: the produce path refuses to store a batch
        above it (no answer could ever return it), the pull handler checks it."""
        return self.max_frame - HEADER.size - wire.PULL_HEAD_SIZE - 16

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> Limits:
        return cls(
            cfg.auto_create_topics, cfg.default_queues, cfg.max_queues, cfg.max_message_bytes,
            int(cfg.max_delay * 1000), cfg.max_frame, cfg.max_pull_wait, cfg.compression,
        )  # fmt: skip


#: the largest offset (or id) the store's keys can hold
U64_MAX = (1 << 64) - 1


def check_offset(name: str, value: int) -> None:
    """Raises BadRequest unless ``value`` fits the store's u64 keys (0 .. 2^64-1): a
    negative or oversized offset from a client is a coded refusal, never an internal
    error inside a read or a write transaction."""
    if not 0 <= value <= U64_MAX:
        raise BadRequest(f"{name} must be in 0..2^64-1, got {value}")


def check_queue(info: control.TopicInfo, queue_id: int) -> None:
    """Raises QueueNotFound unless ``queue_id`` is one of the topic's queues."""
    if not 0 <= queue_id < info.queues:
        raise QueueNotFound(f"topic {info.name!r} has {info.queues} queues; no queue {queue_id}")
