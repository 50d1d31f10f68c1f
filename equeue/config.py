"""Configuration models (attrs, validated at construction) and the documented defaults."""

from __future__ import annotations

from pathlib import Path

import attrs

from equeue.codec import DEFAULT_MAX_FRAME
from equeue.errors import ConfigError

__all__ = ["DEFAULTS", "BrokerConfig", "ConsumerDefaults", "parse_address"]

DEFAULT_PORT = 5800


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"host"``) → (host, port). Raises ConfigError."""
    host, _, port = addr.strip().rpartition(":")
    if not host:
        return addr.strip() or "127.0.0.1", DEFAULT_PORT
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"invalid broker address {addr!r}: port must be a number") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"invalid broker address {addr!r}: port out of range")
    return host.strip("[]"), p


def _positive(_inst: object, attr: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if value is not None and value <= 0:
        raise ConfigError(f"{attr.name} must be > 0, got {value}")


def _flush(_inst: object, _attr: object, value: str) -> None:
    if value not in ("sync", "async"):
        raise ConfigError(f"flush must be 'sync' or 'async', got {value!r}")


@attrs.frozen
class BrokerConfig:
    """Everything a broker needs to start. See docs/operations.md for each field."""

    data_dir: Path = attrs.field(converter=Path)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: "sync": fsync before every ack (group commit); "async": env.sync() every flush_interval
    flush: str = attrs.field(default="sync", validator=_flush)
    #: port for /metrics and /stats over HTTP (0 = off)
    http_port: int = 0
    flush_interval: float = attrs.field(default=0.5, validator=_positive)
    map_size: int = attrs.field(default=8 << 30, validator=_positive)
    max_frame: int = attrs.field(default=DEFAULT_MAX_FRAME, validator=_positive)
    max_message_bytes: int = attrs.field(default=4 << 20, validator=_positive)
    auto_create_topics: bool = True
    default_queues: int = attrs.field(default=4, validator=_positive)
    max_queues: int = 1024
    #: most messages one group-commit transaction takes before committing
    max_batch_messages: int = 20_000
    max_pull_wait: float = 60.0
    handshake_timeout: float = 10.0
    idle_timeout: float | None = None
    member_expiry: float = attrs.field(default=15.0, validator=_positive)
    max_delay: float = attrs.field(default=40 * 86400.0, validator=_positive)
    retention_ms: int | None = 72 * 3600 * 1000
    retention_bytes: int | None = None
    delete_consumed: bool = False
    retention_check_interval: float = 30.0
    retention_batch: int = 5_000
    producer_state_ttl: float = 7 * 86400.0
    shutdown_grace: float = 5.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@attrs.frozen
class ConsumerDefaults:
    """ARCHITECTURE §6 defaults for consumers."""

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
