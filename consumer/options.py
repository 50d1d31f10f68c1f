"""Consumer options: everything tunable, validated once at construction.

Modes are :class:`~enum.StrEnum` members; their string values are accepted too
(``mode="broadcast"`` is ``mode=ConsumeMode.BROADCAST``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs

from equeue.allocation import get_strategy
from equeue.config import (
    DEFAULTS,
    StartFrom,
    optional_callable,
    optional_positive,
    positive,
    to_enum,
)
from equeue.errors import ConfigError
from equeue.security import ClientSecurity
from equeue.serde import Deserializer, KeyDeserializer
from equeue.times import as_utc, parse_time

__all__ = ["ConsumeMode", "ConsumerOptions", "HandlerThreads", "Listener", "StartFrom"]


class ConsumeMode(StrEnum):
    """How a group shares its queues."""

    #: each queue is consumed by one member of the group (leases, rebalance)
    CLUSTERING = "clustering"
    #: every member consumes every queue (offsets kept locally)
    BROADCAST = "broadcast"


class HandlerThreads(StrEnum):
    """Where sync handlers run (docs/consumer.md, "Where handlers run")."""

    #: in worker threads, then inline on the loop thread once they prove fast
    AUTO = "auto"
    #: every call in a worker thread (for handlers that may block)
    ALWAYS = "always"


def _mode(value: Any) -> ConsumeMode:
    return to_enum(ConsumeMode, "mode", value)


def _handler_threads(value: Any) -> HandlerThreads:
    return to_enum(HandlerThreads, "handler_threads", value)


def _start_from(value: Any) -> StartFrom | dt.datetime:
    """``earliest``, ``latest``, a datetime or an ISO 8601 time string; a datetime is
    kept aware (naive, or a string without an offset: UTC, :mod:`equeue.times`)."""
    if isinstance(value, dt.datetime):
        return as_utc(value)
    try:
        return StartFrom(value)
    except ValueError:
        pass
    if isinstance(value, str):
        try:
            return parse_time(value)
        except ConfigError:
            pass
    raise ConfigError(
        f"start_from must be 'earliest', 'latest', a datetime or an ISO 8601 time "
        f"(2024-05-01T12:00:00Z; no offset means UTC), got {value!r}"
    )


def _allocation(_inst: object, _attr: Any, value: object) -> None:
    get_strategy(value)  # type: ignore[arg-type]  # raises ConfigError


def _delays(value: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"retry_delays must be a sequence of seconds, got {value!r}") from exc
    if not out or any(not math.isfinite(v) or v < 0 for v in out):
        raise ConfigError("retry_delays must be a non-empty sequence of seconds >= 0 (finite)")
    return out


#: a rebalance listener: called with a set of ``(topic, queue_id)`` tuples; a sync function
#: or an async one (docs/consumer.md, "Rebalance listeners")
Listener = Callable[[set[tuple[str, int]]], Any]


def _reconsume_times(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: a whole number >= 0 (0: a failed message goes straight to the
    dead-letter topic, with no retry). Raises ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"max_reconsume_times must be a whole number >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class ConsumerOptions:
    """Tunables of a consumer (defaults: :class:`equeue.config.ConsumerDefaults`). See docs/consumer.md, "Options"."""

    mode: ConsumeMode = attrs.field(default=ConsumeMode.CLUSTERING, converter=_mode)
    #: where a group with no committed offset starts: "earliest", "latest" or a datetime
    #: (or an ISO 8601 string); a naive one means UTC (:mod:`equeue.times`)
    start_from: StartFrom | dt.datetime = attrs.field(default=StartFrom.LATEST, converter=_start_from)
    #: broker-side tag filter, e.g. "paid || refunded" (None: everything)
    tags: str | None = None
    #: one message at a time per queue, in queue order
    orderly: bool = False
    #: handlers running at once (threads for sync handlers, tasks for async ones)
    concurrency: int = attrs.field(default=16, validator=positive)
    #: sync handlers: "auto" runs them inline on the consumer's loop thread once they
    #: prove fast (back to threads when a call is slow); "always": every call in a
    #: worker thread (for handlers that may block). See docs/consumer.md.
    handler_threads: HandlerThreads = attrs.field(default=HandlerThreads.AUTO, converter=_handler_threads)
    allocation: str | Callable[..., Any] = attrs.field(default="average", validator=_allocation)
    consumer_id: str | None = None
    #: broadcast mode: where the per-group offsets file lives
    state_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    pull_hold: float = attrs.field(default=DEFAULTS.pull_hold, validator=positive)
    #: messages per pull; while a queue has a backlog the batch doubles up to max_pull_batch
    pull_batch: int = attrs.field(default=DEFAULTS.pull_batch, validator=positive)
    max_pull_batch: int = attrs.field(default=512, validator=positive)
    heartbeat_interval: float = attrs.field(default=DEFAULTS.heartbeat_interval, validator=positive)
    #: client-side lease expiry (seconds): when no heartbeat to a broker group has
    #: succeeded for this long (counted from the sending of the last one answered), the
    #: member stops handing out what it buffered from that group's queues: the broker
    #: has dropped its leases by then and another member may hold them. Keep it at or
    #: below the brokers' ``--member-expiry`` (default 15 s).
    lease_expiry: float = attrs.field(default=15.0, validator=positive)
    rebalance_interval: float = attrs.field(default=DEFAULTS.rebalance_interval, validator=positive)
    commit_interval: float = attrs.field(default=DEFAULTS.commit_interval, validator=positive)
    max_buffered_messages: int = attrs.field(default=DEFAULTS.max_buffered_messages, validator=positive)
    max_buffered_bytes: int = attrs.field(default=DEFAULTS.max_buffered_bytes, validator=positive)
    #: failed deliveries before a message goes to the dead-letter topic (0: at once)
    max_reconsume_times: int = attrs.field(default=DEFAULTS.max_reconsume_times, validator=_reconsume_times)
    retry_delays: tuple[float, ...] = attrs.field(default=DEFAULTS.retry_delays, converter=_delays)
    #: False: never commit an offset (a throwaway reader, such as ``equeue consume``
    #: without ``--group``): every member starts at ``start_from``
    commit_offsets: bool = True
    #: stop by itself once every queue assigned to it is read to its end and handled
    #: (kcat's -e; :mod:`equeue.consumer.ending`)
    stop_at_end: bool = False
    #: stop by itself after this many seconds with no message pulled or finished
    #: (None: never; :mod:`equeue.consumer.ending`)
    idle_timeout: float | None = attrs.field(default=None, validator=optional_positive)
    #: close(): how long to wait for running handlers before abandoning them
    close_timeout: float = attrs.field(default=30.0, validator=positive)
    #: rebalance: how long a revoked queue waits for its running handlers
    revoke_timeout: float = attrs.field(default=10.0, validator=positive)
    connect_timeout: float = attrs.field(default=5.0, validator=positive)
    #: check record checksums in the consumer instead of the broker (which then skips
    #: its check on read: the pull says PULL_CLIENT_VERIFIES)
    verify_checksums: bool = False
    #: makes ``Message.value`` of each message from its body bytes (:mod:`equeue.serde`,
    #: e.g. ``json_deserializer``), before the handler is called; a failure is a
    #: handler failure (docs/consumer.md, "Serializers"). None: ``value`` is the body
    value_deserializer: Deserializer | None = attrs.field(default=None, validator=optional_callable)
    #: makes ``Message.key_value`` from the key text (a None key stays None).
    #: None: ``key_value`` is the key
    key_deserializer: KeyDeserializer | None = attrs.field(default=None, validator=optional_callable)
    #: TLS settings and credentials (None: from the ``EQUEUE_*`` environment, see
    #: :mod:`equeue.security`)
    security: ClientSecurity | None = None
    #: rebalance listeners (docs/consumer.md, "Rebalance listeners"): the queues this
    #: member was given (lease held, before their first message is handed out) ...
    on_assigned: Listener | None = attrs.field(default=None, validator=optional_callable)
    #: ... the queues it hands back (pulls stopped, handlers done, before the commit and
    #: the release; on close: every queue, before the leave) ...
    on_revoked: Listener | None = attrs.field(default=None, validator=optional_callable)
    #: ... the queues whose lease it lost (expired, or the broker gave it to another
    #: member): nothing of them is committed; another member may hold them already
    on_lost: Listener | None = attrs.field(default=None, validator=optional_callable)

    def __attrs_post_init__(self) -> None:
        if self.max_pull_batch < self.pull_batch:
            raise ConfigError("max_pull_batch must be >= pull_batch")

    @classmethod
    def build(cls, **kwargs: Any) -> ConsumerOptions:
        """Like the constructor, but an unknown option is a ConfigError."""
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"invalid consumer option: {exc}") from None
