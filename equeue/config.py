"""Configuration models (attrs, validated at construction) and the documented defaults.

:class:`BrokerConfig` is the single source of a broker's settings and their
defaults: the CLI (``equeue broker start``) derives its option defaults from it and
docs/operations.md lists them (a unit test checks both). Every check lives here, in
attrs validators and converters that raise :class:`~equeue.errors.ConfigError`; the
validators (:func:`positive`, :func:`non_negative`, :func:`port_number`, ...) and the
enum conversion (:func:`to_enum`) are shared with the SDKs' options classes.

Human-friendly sizes (``8GiB``) and durations (``72h``) used by the CLI are parsed
and printed here too (:func:`parse_size`, :func:`parse_duration_ms` and their
inverses), so a default round-trips exactly; so are retention settings, which also
take ``-1`` / ``forever`` (:func:`parse_retention_ms`, :func:`parse_retention_bytes`;
the rule is :mod:`equeue.retention`'s). Numbers are finite: NaN passes every ``<=``
check and infinity turns a limit off, so both are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Final, TypeVar

import attrs
import humanfriendly

from equeue.codec import DEFAULT_MAX_FRAME, HEADER
from equeue.errors import ConfigError
from equeue.retention import FOREVER, FOREVER_WORDS, retention_problem
from equeue.wire import PULL_BATCH_OVERHEAD, PULL_HEAD_SIZE

__all__ = [
    "DEFAULTS",
    "DEFAULT_ADDRESS",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_SCAN_RECORDS",
    "DEFAULT_SCAN_TIME",
    "HTTP_OFF",
    "BrokerConfig",
    "ConsumerDefaults",
    "FlushPolicy",
    "StartFrom",
    "TlsClientAuth",
    "boolean",
    "broker_retention",
    "format_duration_ms",
    "format_retention_bytes",
    "format_retention_ms",
    "format_size",
    "host_name",
    "non_negative",
    "optional_positive",
    "parse_address",
    "parse_duration_ms",
    "parse_http_port",
    "parse_retention_bytes",
    "parse_retention_ms",
    "parse_size",
    "port_number",
    "positive",
    "retention_setting",
    "retry_delay",
    "to_enum",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5800
DEFAULT_ADDRESS = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
#: ``http_port``'s "no HTTP endpoint" as a number, and the words for it (besides "-1")
HTTP_OFF: Final = -1
HTTP_OFF_WORDS: Final = frozenset({"off", "-1"})

E = TypeVar("E", bound=StrEnum)


class FlushPolicy(StrEnum):
    """When the broker fsyncs: ``sync`` before every ack (group commit), ``async``
    every ``flush_interval`` seconds (``env.sync()``; an OS crash may lose the last
    interval, a process crash loses nothing)."""

    SYNC = "sync"
    ASYNC = "async"


class StartFrom(StrEnum):
    """Where a consumer group with no committed offset starts reading a queue."""

    EARLIEST = "earliest"
    LATEST = "latest"


class TlsClientAuth(StrEnum):
    """Whether the broker asks TLS clients for a certificate (mutual TLS): ``none``,
    ``optional`` (checked against ``tls_ca`` when one is sent) or ``required``."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"host"``) → (host, port). Raises ConfigError."""
    host, _, port = addr.strip().rpartition(":")
    if not host:
        return addr.strip() or DEFAULT_HOST, DEFAULT_PORT
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"invalid broker address {addr!r}: port must be a number") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"invalid broker address {addr!r}: port out of range")
    return host.strip("[]"), p


# ---------------------------------------------------------------- validators (the one place)


def _number(attr: attrs.Attribute, value: object) -> float:  # type: ignore[type-arg]
    """``value`` if it is a finite number (NaN passes every ``<=`` check, infinity
    turns a limit off). Raises ConfigError naming the option."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{attr.name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{attr.name} must be a finite number, got {value!r}")
    return value


def retry_delay(delays: Sequence[float], reconsume_times: int) -> float:
    """The delay before attempt ``reconsume_times + 1`` of a failed message: the
    ``reconsume_times``-th of ``delays``, the last one repeating (none: 0). The one
    reading of the retry ladder, for the consumer (seconds) and the broker's SEND_BACK
    (milliseconds)."""
    if not delays:
        return 0
    return delays[min(max(reconsume_times, 0), len(delays) - 1)]


def positive(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: a finite number > 0. Raises ConfigError."""
    if _number(attr, value) <= 0:
        raise ConfigError(f"{attr.name} must be > 0, got {value!r}")


def non_negative(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: a finite number >= 0. Raises ConfigError."""
    if _number(attr, value) < 0:
        raise ConfigError(f"{attr.name} must be >= 0, got {value!r}")


def port_number(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: a TCP port, 0 (pick a free one / off) to 65535. Raises ConfigError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"{attr.name} must be a port number 0..65535, got {value!r}")


def _http_port(value: object) -> object:
    """attrs converter of ``http_port``: -1 (off) → None; anything else unchanged."""
    return None if isinstance(value, int) and not isinstance(value, bool) and value == HTTP_OFF else value


def _optional_port(inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: None (off) or a port number. Raises ConfigError naming -1 and off."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(
            f"{attr.name} must be a port number 0..65535 (0: a free one), or -1 / off for none, got {value!r}"
        )


def parse_http_port(text: str) -> int | None:
    """``--http-port`` as the CLI and the config file take it: a port (``0``: a free
    one) → the port; ``'off'`` or ``'-1'`` → None (no HTTP endpoint). Raises
    ConfigError for anything else."""
    t = str(text).strip().lower()
    if t in HTTP_OFF_WORDS:
        return None
    try:
        port = int(t)
    except ValueError:
        raise ConfigError(f"invalid port {text!r}: give a port number (0: a free one) or off") from None
    return _http_port(port)  # type: ignore[return-value]  # checked by BrokerConfig


def boolean(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: True or False. Raises ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(f"{attr.name} must be true or false, got {value!r}")


def host_name(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: a non-empty host name or address. Raises ConfigError."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{attr.name} must be a host name or address, got {value!r}")


def optional_callable(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: None or a callable (a hook option). Raises ConfigError naming the option."""
    if value is not None and not callable(value):
        raise ConfigError(f"{attr.name} must be callable or None, got {value!r}")


def optional_positive(inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator: None (no limit) or a number > 0. Raises ConfigError."""
    if value is not None:
        positive(inst, attr, value)


def retention_setting(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    """attrs validator of a broker-wide retention default: None (no limit: keep
    forever) or a whole number > 0 (:func:`broker_retention` has turned -1 into
    None). Raises ConfigError naming -1, the way to say "forever"."""
    if value is not None and (why := retention_problem(attr.name, value)) is not None:
        raise ConfigError(why)


def broker_retention(value: int | None) -> int | None:
    """attrs converter of a broker-wide retention default: -1 (keep forever) → None,
    the field's "no limit"; anything else unchanged (the validator checks it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value == FOREVER:
        return None
    return value


def to_enum(cls: type[E], name: str, value: object) -> E:
    """A member of ``cls`` or its string value → the member (for attrs converters).
    Anything else raises ConfigError naming the option ``name`` and the choices."""
    try:
        return cls(value)  # type: ignore[arg-type]  # any value: ValueError below
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}") from None


def _flush_policy(value: object) -> FlushPolicy:
    return to_enum(FlushPolicy, "flush", value)


#: the per-request scan budget of tag-filtered pulls and key lookups (records, seconds)
DEFAULT_SCAN_RECORDS: Final = 2048
DEFAULT_SCAN_TIME: Final = 0.002


def _tls_client_auth(value: object) -> TlsClientAuth:
    return to_enum(TlsClientAuth, "tls_client_auth", value)


def _optional_path(value: object) -> Path | None:
    return None if value is None or value == "" else Path(value)  # type: ignore[arg-type]


#: listen hosts meaning "every interface" (not an address a client can use)
_EVERY_INTERFACE = frozenset({"0.0.0.0", "::", "", "*"})
#: a broker group's name: the alphabet of topic and consumer group names
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_ENDPOINT = re.compile(r"https?://[^/\s,]+:\d{1,5}/?")


def _endpoints(value: object) -> tuple[str, ...]:
    """etcd endpoints: a comma-separated string or a sequence of URLs → a tuple
    (each ``http(s)://host:port``). Raises ConfigError."""
    if value is None:
        return ()
    items = [u for u in value.split(",") if u.strip()] if isinstance(value, str) else value
    if not isinstance(items, Sequence):
        raise ConfigError(f"cluster must be etcd URLs, got {value!r}")
    out = []
    for item in items:
        url = item.strip() if isinstance(item, str) else item
        if not isinstance(url, str) or not _ENDPOINT.fullmatch(url):
            raise ConfigError(f"cluster: {item!r} is not an etcd client URL (http://HOST:PORT)")
        out.append(url.rstrip("/"))
    return tuple(out)


def _group_name(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if not isinstance(value, str) or (value and not _GROUP_NAME.fullmatch(value)):
        raise ConfigError(f"{attr.name} {value!r} is not a valid name: use 1-128 characters of A-Z a-z 0-9 _ . -")


def _advertise(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if value is None:
        return
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host.strip("[]") or host.strip("[]") in _EVERY_INTERFACE or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{attr.name} must be HOST:PORT that clients can reach, got {value!r}")


#: the smallest LMDB map a broker starts on: a fresh store's databases need a few pages,
#: and LMDB refuses a smaller map only when it first writes (MDB_MAP_FULL, which would
#: read as a damaged store)
MIN_MAP_SIZE: Final = 1 << 20


def _map_size(inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    positive(inst, attr, value)
    if value < MIN_MAP_SIZE:  # type: ignore[operator]  # a number: positive() checked it
        raise ConfigError(f"{attr.name} must be at least {format_size(MIN_MAP_SIZE)}, got {value!r}")


def _compression(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if value not in ("producer", "none", "zstd", "lz4"):
        raise ConfigError(f"{attr.name} must be one of 'producer', 'none', 'zstd', 'lz4', got {value!r}")


def _acks(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if value not in ("all", "leader"):
        raise ConfigError(f"{attr.name} must be one of 'all', 'leader', got {value!r}")


def _lease_ttl(_inst: object, attr: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 600:
        raise ConfigError(f"{attr.name} must be a whole number of seconds, 2..600, got {value!r}")


#: room above ``max_message_bytes`` for the properties the broker adds to a retry or
#: dead-letter copy of a message (``%ORIGIN_*``, ``%RETRY_GROUP``, ``%POISON``), so a
#: message at the limit can still be retried and dead-lettered
SYSTEM_PROPERTY_ROOM = 1024
#: bytes a pull or GET_MESSAGE answer may add around a message's content (key + tags +
#: properties + body): the frame header, the pull answer's head, a one-record batch's
#: item, headers and record framing (``wire.PULL_BATCH_OVERHEAD``), and the room for
#: system properties. A message of ``max_message_bytes`` must fit in
#: ``max_frame`` with them, or it could be stored and never served.
SERVE_OVERHEAD = HEADER.size + PULL_HEAD_SIZE + PULL_BATCH_OVERHEAD + SYSTEM_PROPERTY_ROOM


@attrs.frozen
class BrokerConfig:
    """Everything a broker needs to start, validated here (ConfigError) and nowhere
    else. See docs/operations.md for each field; ``equeue broker start`` takes its
    defaults from this class."""

    data_dir: Path = attrs.field(converter=Path)
    host: str = attrs.field(default=DEFAULT_HOST, validator=host_name)
    #: 0 = pick a free port (read it back from the started broker)
    port: int = attrs.field(default=DEFAULT_PORT, validator=port_number)
    flush: FlushPolicy = attrs.field(default=FlushPolicy.SYNC, converter=_flush_policy)
    #: port for /metrics and /stats over HTTP: 0 picks a free one (read it back from
    #: the started broker); None (or -1, turned into None) = no HTTP endpoint
    http_port: int | None = attrs.field(default=None, converter=_http_port, validator=_optional_port)
    #: seconds between fsyncs with flush "async"
    flush_interval: float = attrs.field(default=0.5, validator=positive)
    #: flush "async": a transaction of small writes up to this many bytes commits on
    #: the event loop when the writer thread is idle (0 = always in the writer thread;
    #: docs/storage.md, "Inline commits")
    inline_commit_bytes: int = attrs.field(default=256 << 10, validator=non_negative)
    #: LMDB map size: the most the store may hold
    map_size: int = attrs.field(default=8 << 30, validator=_map_size)
    #: largest frame either way; at most DEFAULT_MAX_FRAME, the cap every client
    #: (SDK, CLI, Spark) reads frames with, so no answer is ever too big for a client
    max_frame: int = attrs.field(default=DEFAULT_MAX_FRAME, validator=positive)
    #: largest message content (key + tags + properties + body); at most
    #: ``max_frame - SERVE_OVERHEAD``, so a message at the limit is always served
    max_message_bytes: int = attrs.field(default=4 << 20, validator=positive)
    #: how topics without their own ``compression`` setting store batches:
    #: ``producer`` (as sent), ``none``, ``zstd`` or ``lz4`` (docs/storage.md "Compression")
    compression: str = attrs.field(default="producer", validator=_compression)
    #: create unknown topics on produce / route lookup
    auto_create_topics: bool = attrs.field(default=True, validator=boolean)
    #: queue count of auto-created topics
    default_queues: int = attrs.field(default=4, validator=positive)
    max_queues: int = attrs.field(default=1024, validator=positive)
    #: cap (seconds) on a pull's hold
    max_pull_wait: float = attrs.field(default=60.0, validator=positive)
    #: a connection that sends no handshake within this many seconds is closed
    handshake_timeout: float = attrs.field(default=10.0, validator=positive)
    member_expiry: float = attrs.field(default=15.0, validator=positive)
    max_delay: float = attrs.field(default=40 * 86400.0, validator=positive)
    #: time retention in ms (-1 or None = keep forever, stored as None; 0 and other
    #: negative values are refused); topics may override it
    retention_ms: int | None = attrs.field(
        default=72 * 3600 * 1000, converter=broker_retention, validator=retention_setting
    )
    #: per-topic size limit in bytes (-1 or None = unlimited, stored as None; 0 and
    #: other negative values are refused); topics may override it
    retention_bytes: int | None = attrs.field(default=None, converter=broker_retention, validator=retention_setting)
    #: also delete messages every group committed past
    delete_consumed: bool = attrs.field(default=False, validator=boolean)
    retention_check_interval: float = attrs.field(default=30.0, validator=positive)
    #: most records one retention transaction deletes
    retention_batch: int = attrs.field(default=5_000, validator=positive)
    #: idempotent producers silent this long (seconds) are forgotten
    producer_state_ttl: float = attrs.field(default=7 * 86400.0, validator=positive)
    #: shutdown: how long in-flight commits may take before the store closes
    shutdown_grace: float = attrs.field(default=5.0, validator=non_negative)
    #: scan budget of one tag-filtered pull or key lookup: records (or key-index
    #: candidates) examined, and seconds of scanning; whichever runs out first ends
    #: the scan, and the answer says where to resume (docs/operations.md)
    scan_records: int = attrs.field(default=DEFAULT_SCAN_RECORDS, validator=positive)
    scan_time: float = attrs.field(default=DEFAULT_SCAN_TIME, validator=positive)
    #: most queues whose per-queue series one /metrics scrape renders (asked for with
    #: ``?queues=1`` or ``?topic=``); per-topic totals are always there
    metrics_queue_limit: int = attrs.field(default=10_000, validator=positive)
    #: connections the HTTP port serves at once; one more is refused at once (a 503
    #: over plain HTTP, closed over HTTPS)
    http_max_connections: int = attrs.field(default=256, validator=positive)
    #: PEM certificate chain of the broker: TLS on the broker and HTTP ports (None = plain TCP)
    tls_cert: Path | None = attrs.field(default=None, converter=_optional_path)
    #: PEM private key of ``tls_cert`` (None = the key is in ``tls_cert``)
    tls_key: Path | None = attrs.field(default=None, converter=_optional_path)
    #: PEM file of the CAs that sign client certificates (mutual TLS)
    tls_ca: Path | None = attrs.field(default=None, converter=_optional_path)
    #: ask TLS clients for a certificate: none, optional or required (needs ``tls_ca``)
    tls_client_auth: TlsClientAuth = attrs.field(default=TlsClientAuth.NONE, converter=_tls_client_auth)
    #: users and ACLs (docs/security.md); given: every connection authenticates
    #: (SCRAM-SHA-256) and every request is checked. None: no authentication.
    users_file: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    #: connections served at once; one more is refused (TOO_MANY_CONNECTIONS)
    max_connections: int = attrs.field(default=4096, validator=positive)
    #: answers queued for one connection past which it is no longer read
    output_buffer_soft: int = attrs.field(default=64 << 20, validator=positive)
    #: answers queued for one connection past which it is closed at once
    output_buffer_hard: int = attrs.field(default=256 << 20, validator=positive)
    #: seconds a connection may stay above output_buffer_soft before it is closed
    output_buffer_grace: float = attrs.field(default=60.0, validator=positive)
    #: seconds a frame may take to arrive whole; a connection holding one longer is closed
    frame_timeout: float = attrs.field(default=60.0, validator=positive)
    #: bytes all connections together may hold in frames still arriving (past 64 KiB each)
    max_partial_frame_bytes: int = attrs.field(default=128 << 20, validator=positive)
    #: seconds a connection may stay with no request and none in flight before it is closed
    idle_timeout: float = attrs.field(default=600.0, validator=positive)
    #: pulls one connection may have parked; one more that would park is refused (TOO_MANY_PULLS)
    max_pulls_per_connection: int = attrs.field(default=4096, validator=positive)
    #: etcd client URLs (``http://host:port``) of the cluster to join (docs/cluster.md);
    #: empty: a standalone broker. A comma-separated string is split.
    cluster: tuple[str, ...] = attrs.field(default=(), converter=_endpoints)
    #: the broker group this broker serves (required with ``cluster``; a name of
    #: 1-128 characters of A-Z a-z 0-9 _ . -)
    broker_group: str = attrs.field(default="", validator=_group_name)
    #: ``HOST:PORT`` clients reach this broker at, as published in etcd (None: the
    #: listen address, or 127.0.0.1:PORT when listening on every interface)
    advertise: str | None = attrs.field(default=None, validator=_advertise)
    #: seconds of the broker's etcd lease: a broker silent this long is down, and a
    #: dead leader is replaced after about this long (3: failover p99 <= 5 s with
    #: room for an etcd leader election; docs/operations.md, "Cluster")
    cluster_lease_ttl: int = attrs.field(default=3, validator=_lease_ttl)
    #: replication (docs/cluster.md, "Replicas, acks, failover"): ``all`` acknowledges a write once the
    #: leader and every in-sync replica committed it (flush policy applied on each);
    #: ``leader`` once the leader committed it (a leader crash can lose it)
    acks: str = attrs.field(default="all", validator=_acks)
    #: with ``acks all``: fewer in-sync replicas (leader included) than this, and a
    #: produce is refused with NOT_ENOUGH_REPLICAS (56)
    min_insync: int = attrs.field(default=1, validator=positive)
    #: seconds a follower may stay behind the leader's end before it leaves the ISR
    replica_lag_max: float = attrs.field(default=4.0, validator=positive)
    #: bytes of replication log one REPLICA_FETCH answer carries at most (it always
    #: carries at least one whole entry, however large)
    replica_fetch_bytes: int = attrs.field(default=4 << 20, validator=positive)
    #: bytes of replication log a leader keeps for followers that are behind; a
    #: follower further behind copies the store (REPLICA_SNAPSHOT) before it follows
    replica_log_bytes: int = attrs.field(default=1 << 30, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.cluster and not self.broker_group:
            raise ConfigError("cluster needs broker_group (--broker-group NAME): the group this broker serves")
        if self.broker_group and not self.cluster:
            raise ConfigError("broker_group needs cluster (--cluster http://HOST:PORT): the etcd endpoints")
        if self.default_queues > self.max_queues:
            raise ConfigError(f"default_queues ({self.default_queues}) must be <= max_queues ({self.max_queues})")
        if self.tls_cert is None and (
            self.tls_key is not None or self.tls_ca is not None or self.tls_client_auth is not TlsClientAuth.NONE
        ):
            raise ConfigError("tls_key, tls_ca and tls_client_auth need tls_cert (the broker's certificate)")
        if self.tls_client_auth is not TlsClientAuth.NONE and self.tls_ca is None:
            raise ConfigError(f"tls_client_auth {self.tls_client_auth.value} needs tls_ca (the CAs of client certificates)")
        if self.max_frame > DEFAULT_MAX_FRAME:
            raise ConfigError(
                f"max_frame ({self.max_frame}) must be <= {DEFAULT_MAX_FRAME}: clients read frames up to that size"
            )
        if self.max_message_bytes > self.max_frame - SERVE_OVERHEAD:
            raise ConfigError(
                f"max_message_bytes ({self.max_message_bytes}) must be <= max_frame - {SERVE_OVERHEAD} "
                f"({self.max_frame - SERVE_OVERHEAD}): a message at the limit must fit in a pull answer"
            )
        if self.output_buffer_soft > self.output_buffer_hard:
            raise ConfigError(
                f"output_buffer_soft ({self.output_buffer_soft}) must be <= output_buffer_hard ({self.output_buffer_hard})"
            )
        if self.max_partial_frame_bytes < self.max_frame:
            raise ConfigError(
                f"max_partial_frame_bytes ({self.max_partial_frame_bytes}) must be >= max_frame ({self.max_frame})"
            )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def advertised(self, bound_port: int) -> str:
        """The client address published in etcd for a broker listening on
        ``bound_port``: ``advertise``, else the listen address (127.0.0.1 when the
        broker listens on every interface)."""
        if self.advertise is not None:
            return self.advertise
        host = "127.0.0.1" if self.host in _EVERY_INTERFACE else self.host
        return f"[{host}]:{bound_port}" if ":" in host else f"{host}:{bound_port}"


@attrs.frozen
class ConsumerDefaults:
    """The defaults of consumers (``equeue.consumer.options.ConsumerOptions``
    and the CLI's ``equeue consume`` read them from here)."""

    start_from: StartFrom = StartFrom.LATEST
    pull_hold: float = 15.0
    pull_batch: int = 32
    heartbeat_interval: float = 5.0
    rebalance_interval: float = 5.0
    commit_interval: float = 5.0
    max_buffered_messages: int = 1000
    max_buffered_bytes: int = 100 << 20
    max_reconsume_times: int = 16
    retry_delays: tuple[float, ...] = (
        1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
    )


DEFAULTS = ConsumerDefaults()


# ---------------------------------------------------------------- sizes and durations (CLI text)

#: a size: a number and an optional unit (humanfriendly reads the unit: ``KB``/``K`` are
#: 10^3, ``KiB``/``Ki`` 2^10, up to peta); the form is checked here first, because
#: humanfriendly matches a unit by its first letter (``8Gorilla`` would be 8 GB)
_SIZE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>(?:[kmgtp](?:i?b?))|b|bytes?)?", re.IGNORECASE)
#: one term of a duration: a number and a unit (``1h30m`` is two terms)
_SPAN_TERM = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)\s*", re.IGNORECASE)
_SIZE_EXAMPLES = "e.g. 512MiB, 8GiB, 8GB or a byte count"
_DURATION_EXAMPLES = "e.g. 500ms, 30s, 1h30m, 2d; a bare number is seconds"
#: the binary units :func:`format_size` writes (exact, so a default round-trips)
_SIZE_UNITS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def parse_size(text: str) -> int:
    """A size → bytes (>= 0): ``'8GiB'`` is 8·2^30, ``'8GB'`` and ``'8G'`` 8·10^9,
    ``'512MiB'``, ``'1.5KB'``, ``'100000'`` (bytes). Units are read by humanfriendly
    (``parse_size(binary=False)``). Raises ConfigError for anything else: a negative,
    non-finite or unit-less-but-fractional size, an unknown unit, nonsense."""
    t = text.strip() if isinstance(text, str) else ""
    m = _SIZE.fullmatch(t)
    if m is None or ("." in m["n"] and (m["unit"] or "b").lower().startswith("b")):  # a fraction of a byte
        raise ConfigError(f"invalid size {text!r}: a size is a byte count >= 0 with an optional unit ({_SIZE_EXAMPLES})")
    unit = m["unit"] or ""
    if unit[-1:].lower() == "i":  # Ki, Mi, ... (as Kubernetes writes them): KiB, MiB, ...
        unit += "B"
    try:
        return int(humanfriendly.parse_size(f"{m['n']} {unit}".strip(), binary=False))
    except humanfriendly.InvalidSize:
        raise ConfigError(f"invalid size {text!r} ({_SIZE_EXAMPLES})") from None


def format_size(n: int) -> str:
    """Bytes → the shortest exact text :func:`parse_size` reads back (``8GiB``, ``0``)."""
    for suffix, mult in _SIZE_UNITS:
        if n and n % mult == 0:
            return f"{n // mult}{suffix}iB"
    return str(n)


def parse_duration_ms(text: str) -> int:
    """A duration → milliseconds (>= 0, rounded to the nearest ms): ``'500ms'``,
    ``'30s'``, ``'1h30m'``, ``'2d'``, ``'1w'``, ``'90'`` (a bare number: seconds);
    each term's unit is read by humanfriendly (``parse_timespan``: ``ms``, ``s``,
    ``m``, ``h``, ``d``, ``w`` and their long names). Raises ConfigError for anything
    else: a negative or non-finite duration (``'-1'`` is not -1000 ms), nonsense."""
    t = text.strip() if isinstance(text, str) else ""
    refused = ConfigError(f"invalid duration {text!r}: a duration is a finite time >= 0 ({_DURATION_EXAMPLES})")
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return round(float(t) * 1000)
    terms = _SPAN_TERM.findall(t)
    if not terms or "".join(_SPAN_TERM.sub(" ", t).split()):  # something besides whole terms
        raise refused
    seconds = 0.0
    for number, unit in terms:
        try:
            seconds += humanfriendly.parse_timespan(f"{number}{unit}")
        except humanfriendly.InvalidTimespan:
            raise refused from None
    if not math.isfinite(seconds):
        raise refused
    return round(seconds * 1000)


def format_duration_ms(ms: int) -> str:
    """Milliseconds → exact text :func:`parse_duration_ms` reads back; hours are
    not folded into days (``72h``)."""
    for suffix, mult in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % mult == 0:
            return f"{ms // mult}{suffix}"
    return f"{ms}ms" if ms else "0"


def _parse_retention(text: str, what: str, parse: Callable[[str], int], example: str) -> int:
    """``text`` → FOREVER or a value > 0 of ``parse``; ConfigError naming ``what``."""
    t = text.strip().lower()
    if t == "-1" or t in FOREVER_WORDS:
        return FOREVER
    refused = ConfigError(
        f"invalid {what} {text!r}: give a value > 0 (e.g. {example}), or -1 / forever to keep messages forever"
    )
    try:
        value = parse(text)
    except ConfigError:
        raise refused from None
    if value <= 0:
        raise refused
    return value


def parse_retention_ms(text: str, what: str = "--retention") -> int:
    """A time retention as the CLI takes it → ms: a duration > 0 (``'24h'``, ``'7d'``)
    or ``'-1'`` / ``'forever'`` / ``'infinite'`` / ``'unlimited'`` → FOREVER (-1).
    Raises ConfigError naming ``what`` (the flag) for anything else, 0 and every
    other negative value included."""
    return _parse_retention(text, what, parse_duration_ms, "24h or 7d")


def parse_retention_bytes(text: str, what: str = "--retention-bytes") -> int:
    """A size retention as the CLI takes it → bytes: a size > 0 (``'10GiB'``) or
    ``'-1'`` / ``'forever'`` / ``'infinite'`` / ``'unlimited'`` → FOREVER (-1).
    Raises ConfigError naming ``what`` (the flag) for anything else."""
    return _parse_retention(text, what, parse_size, "1GiB or 500MiB")


def format_retention_ms(ms: int | None) -> str:
    """A time retention as the CLI prints it: ``'forever'`` for -1 or None (a
    broker default's "no limit"), else the duration (``'72h'``)."""
    return "forever" if ms is None or ms == FOREVER else format_duration_ms(ms)


def format_retention_bytes(n: int | None) -> str:
    """A size retention as the CLI prints it: ``'forever'`` for -1 or None, else the size."""
    return "forever" if n is None or n == FOREVER else format_size(n)
