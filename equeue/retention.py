"""Retention settings: the one reading of their values, as Kafka reads them.

A retention setting (``retention_ms``, ``retention_bytes``; a topic's override or the
broker's default) is one of:

- a positive integer: the limit;
- :data:`FOREVER` (-1): no limit of that kind, whatever the broker's default (keep
  messages forever);
- for a topic only, ``None``: no override, the broker's default applies.

Any other value (0, -5, -1000...) is refused where it comes in: the CLI, the SDK's
admin calls, the broker's CREATE_TOPIC / ALTER_TOPIC handlers (BAD_REQUEST) and
``BrokerConfig`` (ConfigError). ALTER_TOPIC puts a setting back to the broker's
default with an explicit ``reset`` list (:data:`SETTINGS`), never with a number.

Stored records (the ``topics`` database, etcd's topic placements) write FOREVER as
:data:`RECORD_FOREVER` (0), which every earlier version reads as "no limit", so an
older broker (a downgrade, a not-yet-upgraded replica) never deletes on it.
:func:`from_record` reads a record back: 0 and any negative value (earlier versions
stored ``--retention -1`` as -1000 and then deleted everything) read as FOREVER:
a doubtful value never deletes. :func:`retention_limit`, the value retention
enforces, is None (no limit) for anything that is not a positive number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from equeue.errors import ConfigError, EQueueError

__all__ = [
    "FOREVER",
    "FOREVER_WORDS",
    "RECORD_FOREVER",
    "SETTINGS",
    "check_retention",
    "check_topic_settings",
    "from_record",
    "is_legacy_record",
    "retention_limit",
    "retention_problem",
    "to_record",
]

#: a retention setting meaning "no limit of that kind": keep messages forever
FOREVER: Final = -1
#: how a stored record writes FOREVER (what earlier versions read as "no limit")
RECORD_FOREVER: Final = 0
#: the CLI's words for FOREVER (besides "-1")
FOREVER_WORDS: Final = frozenset({"forever", "infinite", "unlimited"})
#: the topic settings ALTER_TOPIC's ``reset`` may name
SETTINGS: Final = ("retention_ms", "retention_bytes")


def retention_problem(name: str, value: object) -> str | None:
    """Why ``value`` is not a retention setting named ``name`` (None: it is one:
    FOREVER or a positive integer). The text names the option and FOREVER."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be a whole number (> 0, or -1 to keep messages forever), got {value!r}"
    if value <= 0 and value != FOREVER:
        return f"{name} must be > 0, or -1 to keep messages forever, got {value!r}"
    return None


def check_retention(name: str, value: int | None, error: type[EQueueError] = ConfigError) -> None:
    """Raise ``error`` (ConfigError by default; the broker passes BadRequest) unless
    ``value`` is None (not given) or a retention setting."""
    if value is not None and (why := retention_problem(name, value)) is not None:
        raise error(why)


def check_topic_settings(
    retention_ms: int | None,
    retention_bytes: int | None,
    reset: Iterable[str] = (),
    *,
    error: type[EQueueError] = ConfigError,
) -> None:
    """Check a CREATE_TOPIC's or ALTER_TOPIC's retention settings and ``reset`` list:
    each value None or a retention setting, each reset name one of :data:`SETTINGS`
    and not also given a value. Raises ``error`` naming the first problem."""
    check_retention("retention_ms", retention_ms, error)
    check_retention("retention_bytes", retention_bytes, error)
    given = {"retention_ms": retention_ms, "retention_bytes": retention_bytes}
    for name in reset:
        if name not in SETTINGS:
            raise error(f"reset: {name!r} is not a setting that can be reset (one of {', '.join(SETTINGS)})")
        if given[name] is not None:
            raise error(f"{name} is both set and reset: give one or the other")


def retention_limit(override: int | None, default: int | None) -> int | None:
    """The limit retention enforces for a topic: its ``override``, else the broker's
    ``default``; None (no limit) for FOREVER and for anything else that is not a
    positive number, so a bad value never deletes."""
    value = default if override is None else override
    return value if isinstance(value, int) and value > 0 else None


def to_record(value: int | None) -> int | None:
    """A setting as a stored record writes it (FOREVER → :data:`RECORD_FOREVER`)."""
    return RECORD_FOREVER if value == FOREVER else value


def from_record(value: int | None) -> int | None:
    """A stored setting read back: None stays None (no override), a positive value
    stays, anything else (0, negative) is FOREVER."""
    if value is None or value > 0:
        return value
    return FOREVER


def is_legacy_record(value: int | None) -> bool:
    """A stored setting no version of this rule writes (a negative number: an earlier
    version took it from a client, and deleted every message on it). It reads as
    FOREVER; the store warns about it."""
    return value is not None and value < 0
