"""Message and result models shared by the broker, the SDKs and Spark."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from equeue.protocol import PullStatus

__all__ = [
    "Message",
    "PullResult",
    "SendResult",
    "to_body",
    "to_key",
]

#: property keys starting with this prefix are reserved for the broker (retry, DLQ).
SYSTEM_PROPERTY_PREFIX = "%"
PROP_ORIGIN_TOPIC = "%ORIGIN_TOPIC"
PROP_ORIGIN_QUEUE = "%ORIGIN_QUEUE"
PROP_ORIGIN_OFFSET = "%ORIGIN_OFFSET"
PROP_ORIGIN_GLOBAL = "%ORIGIN_GLOBAL"
PROP_RETRY_GROUP = "%RETRY_GROUP"


def to_body(value: bytes | bytearray | memoryview | str) -> bytes:
    """Message bodies are bytes; ``str`` is encoded as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"message body must be bytes or str, not {type(value).__name__}")


def to_key(value: str | bytes | None) -> str | None:
    """Keys are text; ``bytes`` keys are decoded as UTF-8."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def _to_props(value: dict[str, Any] | None) -> dict[str, str]:
    if not value:
        return {}
    return {str(k): str(v) for k, v in value.items()}


@attrs.define(slots=True, eq=True)
class Message:
    """A message: what a producer sends and what a consumer receives.

    Produce side: ``body`` (bytes, or str encoded as UTF-8), optional ``key``
    (routes to ``hash(key) mod queues``), ``tags`` (one tag string, filtered by
    consumers) and ``properties``; ``deliver_at`` (epoch ms, 0 = now) for delayed
    delivery. Consume side: the broker fills in where it is stored.
    """

    body: bytes = attrs.field(converter=to_body)
    key: str | None = attrs.field(default=None, converter=to_key)
    tags: str | None = None
    properties: dict[str, str] = attrs.field(factory=dict, converter=_to_props)
    deliver_at: int = 0
    topic: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    global_offset: int = -1
    #: store time, ms since the epoch
    timestamp: int = 0
    reconsume_times: int = 0

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (replacement characters for invalid bytes)."""
        return self.body.decode("utf-8", errors="replace")

    @property
    def datetime(self) -> dt.datetime:
        """The store time as an aware UTC datetime."""
        return dt.datetime.fromtimestamp(self.timestamp / 1000, tz=dt.UTC)

    @property
    def origin_topic(self) -> str:
        """The topic this message was first produced to (differs for retries)."""
        return self.properties.get(PROP_ORIGIN_TOPIC, self.topic)


@attrs.frozen(slots=True)
class SendResult:
    """Where a sent message was stored.

    For a delayed message the offsets are -1 until it is delivered (``scheduled``).
    For a duplicate the broker recognised but no longer remembers, offsets are -1
    and ``duplicate`` is True: the message was stored once, earlier.
    """

    topic: str
    queue_id: int
    queue_offset: int
    global_offset: int
    scheduled: bool = False
    duplicate: bool = False


@attrs.frozen(slots=True)
class PullResult:
    """What a pull returned: a status, the messages, and the queue's valid range.

    ``min_offset`` is the lowest retained queue offset, ``max_offset`` the next
    offset to be written (exclusive end), ``next_offset`` where the next pull starts
    (past any messages skipped by a tag filter).
    """

    status: PullStatus
    messages: list[Message]
    min_offset: int
    max_offset: int
    next_offset: int
