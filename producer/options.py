"""Producer options: everything tunable, validated once at construction.

:class:`ProducerOptions` is what :class:`~equeue.producer.AsyncProducer` and
:class:`~equeue.producer.Producer` run with; their keyword arguments build one. Every
invalid value raises :class:`~equeue.errors.ConfigError` here, before anything
connects. The CLI takes its defaults from this class.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from equeue.client.retry import RetryPolicy
from equeue.config import optional_callable
from equeue.errors import ConfigError
from equeue.models import Message
from equeue.security import ClientSecurity
from equeue.serde import KeySerializer, Serializer
from equeue.wire.batches import Codec

__all__ = ["OnFull", "ProducerOptions", "QueueSelector", "new_producer_id"]

#: ``queue_selector(queue_count, message) -> queue_id``
QueueSelector = Callable[[int, Message], int]

#: the broker remembers the answers of this many batches per (producer, queue)
MAX_IN_FLIGHT = 16
#: the largest produce request a producer builds
MAX_BATCH_BYTES = 8 << 20
#: the cap of the exponential backoff between resends, seconds
MAX_BACKOFF = 5.0


class OnFull(enum.StrEnum):
    """What ``send_async`` does when ``max_buffered_bytes`` are pending."""

    #: wait until answers free space
    BLOCK = "block"
    #: raise :class:`~equeue.errors.BufferFull`
    RAISE = "raise"


def new_producer_id() -> bytes:
    """16 random bytes (a uuid4)."""
    return uuid.uuid4().bytes


def _to_producer_id(value: bytes | str | uuid.UUID | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, str):
        try:
            return uuid.UUID(value).bytes
        except ValueError:
            raise ConfigError(f"producer_id {value!r} is not a UUID string") from None
    if isinstance(value, bytes | bytearray) and len(value) == 16:
        return bytes(value)
    raise ConfigError("producer_id must be 16 bytes, a UUID or a UUID string")


def _to_codec(value: Codec | str) -> Codec:
    if isinstance(value, Codec):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"compression must be 'none', 'zstd' or 'lz4', not {type(value).__name__}")
    try:
        return Codec.parse(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _to_on_full(value: OnFull | str) -> OnFull:
    try:
        return OnFull(value)
    except ValueError:
        raise ConfigError(f"on_full must be 'block' or 'raise', got {value!r}") from None


def _range(
    low: float, high: float | None = None, *, above: bool = False, infinite: bool = False
) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: ``low <= value`` (``low < value`` with ``above``) and
    ``value <= high``, a finite number (NaN passes every comparison; infinity only
    where documented: ``infinite``); raises ConfigError naming the option."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{attr.name} must be a number, got {value!r}")
        if math.isnan(value) or (math.isinf(value) and not (infinite and value > 0)):
            raise ConfigError(f"{attr.name} must be a finite number, got {value!r}")
        if (value <= low if above else value < low) or (high is not None and value > high):
            bound = f"> {low:g}" if above else f">= {low:g}"
            if high is not None:
                bound += f" and <= {high:g}"
            raise ConfigError(f"{attr.name} must be {bound}, got {value!r}")

    return check


def _selector(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise ConfigError(f"queue_selector must be callable(queue_count, message), got {value!r}")


@attrs.frozen(kw_only=True)
class ProducerOptions:
    """How a producer sends (every field is also a keyword argument of the producers).

    Raises ConfigError for an invalid value (see each field).
    """

    #: 16 bytes / UUID / UUID string identifying the producer for deduplication;
    #: None = a random one per producer (and per forked child)
    producer_id: bytes | None = attrs.field(default=None, converter=_to_producer_id)
    #: resends of a batch after a transient failure
    retries: int = attrs.field(default=3, validator=_range(0))
    #: first pause before a resend, seconds; doubles per attempt up to 5 s
    retry_backoff: float = attrs.field(default=0.2, validator=_range(0))
    #: from the call to the answer, retries included, seconds
    send_timeout: float = attrs.field(default=30.0, validator=_range(0, above=True))
    #: how long a batch waits for more messages, seconds. ``inf``: until full or
    #: asked (``send``, ``send_batch``, ``flush``); then a ``send_async`` waiting
    #: for buffer space held only by open batches waits for good, so keep
    #: ``max_buffered_bytes`` above (queues x ``max_batch_bytes``)
    linger: float = attrs.field(default=0.005, validator=_range(0, infinite=True))
    #: the largest produce request (one bigger message goes alone)
    max_batch_bytes: int = attrs.field(default=1 << 20, validator=_range(1, MAX_BATCH_BYTES))
    #: unacknowledged bytes held by the producer (>= max_batch_bytes)
    max_buffered_bytes: int = attrs.field(default=64 << 20)
    #: what ``send_async`` does when the buffer is full
    on_full: OnFull = attrs.field(default=OnFull.BLOCK, converter=_to_on_full)
    #: pipelined requests per queue (the broker remembers 16 answers)
    max_in_flight: int = attrs.field(default=8, validator=_range(1, MAX_IN_FLIGHT))
    #: custom routing: ``queue_selector(queue_count, message) -> queue_id``
    queue_selector: QueueSelector | None = attrs.field(default=None, validator=_selector)
    #: body limit checked before sending
    max_message_bytes: int = attrs.field(default=4 << 20, validator=_range(1))
    #: let the broker create a missing topic (if its own config allows)
    auto_create: bool = True
    #: seconds between refreshes of the cached routes (queue counts and owner groups)
    route_refresh: float = attrs.field(default=5.0, validator=_range(0, above=True))
    #: seconds per connection attempt
    connect_timeout: float = attrs.field(default=5.0, validator=_range(0, above=True))
    #: keep ``producer_id`` after a batch failed for good (its queue's later batches
    #: then fail too, instead of going on under a fresh id): for writers that replay
    #: the same batches under the same id, such as the Spark sink
    stable_id: bool = False
    #: how each request's batch of records is compressed: ``"none"``, ``"zstd"``
    #: (level 1: smallest) or ``"lz4"`` (fastest); the broker stores it as sent
    #: unless the topic's ``compression`` setting names another codec
    #: (docs/producer.md "Compression")
    compression: Codec = attrs.field(default=Codec.NONE, converter=_to_codec)
    #: turns each sent value into the body bytes (:mod:`equeue.serde`, e.g.
    #: ``json_serializer``); None: bodies are bytes or str, sent as they are
    value_serializer: Serializer | None = attrs.field(default=None, validator=optional_callable)
    #: turns each sent key into the key *text* (keys are str on the wire, e.g.
    #: ``json_key_serializer``); None: keys are str or UTF-8 bytes. A None key stays None
    key_serializer: KeySerializer | None = attrs.field(default=None, validator=optional_callable)
    #: TLS settings and credentials (None: from the ``EQUEUE_*`` environment, see
    #: :mod:`equeue.security`)
    security: ClientSecurity | None = None

    @max_buffered_bytes.validator
    def _check_buffered(self, attr: attrs.Attribute[int], value: int) -> None:
        _range(1)(self, attr, value)
        if value < self.max_batch_bytes:
            raise ConfigError(f"max_buffered_bytes must be >= max_batch_bytes ({self.max_batch_bytes}), got {value}")

    @property
    def retry_policy(self) -> RetryPolicy:
        """The producer's retry policy: ``retries`` resends within ``send_timeout``,
        waiting ``retry_backoff`` doubling per attempt up to 5 s, plus up to a
        quarter of ``retry_backoff`` of jitter."""
        return RetryPolicy(
            attempts=self.retries + 1,
            timeout=self.send_timeout,
            wait_initial=self.retry_backoff,
            wait_max=MAX_BACKOFF,
            wait_jitter=self.retry_backoff / 4,
        )
