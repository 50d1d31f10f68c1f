"""Message and result models shared by the broker, the SDKs and Spark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from equeue.protocol import PullStatus

__all__ = [
    "Message",
    "PullResult",
    "SendResult",
    "check_props",
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


def check_props(props: Mapping[Any, Any]) -> None:
    """Properties are text: every name and every value a ``str``. Raises TypeError
    naming the first property that is not (nothing is converted: ``str(1)`` and
    ``str(None)`` would store text the sender did not write)."""
    for k, v in props.items():
        if type(k) is not str and not isinstance(k, str):
            raise TypeError(f"property names must be str, not {type(k).__name__} ({k!r})")
        if type(v) is not str and not isinstance(v, str):
            raise TypeError(f"property {k!r} must be a str, not {type(v).__name__}")


def _to_props(value: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``value`` (None: empty). Raises TypeError for a name or value that is
    not a str (:func:`check_props`)."""
    if not value:
        return {}
    check_props(value)
    return dict(value)


class _Decoded:
    """Slots for what a consumer's deserializers made of a message (``Message.value``,
    ``Message.key_value``). Outside the attrs fields on purpose: the record decoder
    fills a Message through its attrs slots only, and these stay unset (no cost) unless
    deserializers are configured; equality and repr ignore them."""

    __slots__ = ("_key_value", "_value")
    _key_value: Any
    _value: Any

    def _set_value(self, value: Any) -> None:
        self._value = value

    def _set_key_value(self, value: Any) -> None:
        self._key_value = value

    def _set_failed(self, error: Exception) -> None:
        """A deserializer raised ``error``: ``value`` and ``key_value`` raise it."""
        self._value = self._key_value = _Failed(error)


class _Failed:
    """What a deserializer raised on a message handed out by iteration: kept in the
    ``_Decoded`` slots and raised again when ``value`` or ``key_value`` is read."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


@attrs.define(slots=True, eq=True)
class Message(_Decoded):
    """A message: what a producer sends and what a consumer receives.

    Produce side: ``body`` (bytes, or str encoded as UTF-8), optional ``key``
    (routes to ``hash(key) mod queues``), ``tags`` (one tag string, filtered by
    consumers) and ``properties`` (str names to str values; anything else raises
    TypeError); ``deliver_at`` (epoch ms, 0 = now) for delayed delivery. Consume side:
    the broker fills in where it is stored, and a consumer with deserializers sets
    :attr:`value` and :attr:`key_value`.
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
    def value(self) -> Any:
        """The body as the consumer's ``value_deserializer`` made it; the body bytes
        when none is configured. Raises SerializationError when the deserializer failed
        on this message (iteration hands such messages out; a handler never gets one)."""
        try:
            v = _get_value(self, Message)
        except AttributeError:
            return self.body
        if type(v) is _Failed:
            raise v.error
        return v

    @property
    def key_value(self) -> Any:
        """The key as the consumer's ``key_deserializer`` made it; the key text (or
        None) when none is configured or the message has no key. Raises
        SerializationError when a deserializer failed on this message (as :attr:`value`)."""
        try:
            v = _get_key_value(self, Message)
        except AttributeError:
            return self.key
        if type(v) is _Failed:
            raise v.error
        return v

    def __getattr__(self, name: str) -> Any:
        """Only reached for a slot that is unset: ``properties`` of a message the record
        decoder made from a record without properties is created here, empty, when
        first read. (A dict per decoded message cost the consumer's hot path an
        allocation and, measured, most of its garbage collections: docs/benchmarks.md.)
        Raises AttributeError for any other name."""
        if name == "properties":
            props: dict[str, str] = {}
            _set_properties(self, props)
            return props
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        """The fields, and the deserialized key and value when set (pickle, copy)."""
        state = {name: getattr(self, name) for name in _FIELD_NAMES}
        for name in _Decoded.__slots__:
            try:
                state[name] = getattr(self, name)
            except AttributeError:
                pass
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @property
    def origin_topic(self) -> str:
        """The topic this message was first produced to (differs for retries)."""
        return self.properties.get(PROP_ORIGIN_TOPIC, self.topic)


_FIELD_NAMES = tuple(f.name for f in attrs.fields(Message))
# the deserialized slots read without __getattr__ (an unset one raises AttributeError at once)
_get_value = _Decoded.__dict__["_value"].__get__
_get_key_value = _Decoded.__dict__["_key_value"].__get__
_set_properties = Message.__dict__["properties"].__set__


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
