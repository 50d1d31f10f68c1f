"""Points in time as epoch milliseconds: the one rule for datetimes and time strings.

Every place that turns a time given by a user into the epoch milliseconds the broker
works in (a producer's ``deliver_at``, a consumer's ``start_from``, ``equeue group
reset-offsets --to``, ``equeue consume --from``) goes through :func:`epoch_ms` or
:func:`parse_time`, so one value means one instant everywhere:

- an aware datetime, or a string with ``Z`` or an offset (``+09:00``), is used as given;
- a naive datetime, or a string without an offset, means **UTC** (never the local time
  zone of the machine that happens to run the code).

Raises :class:`~equeue.errors.ConfigError` for a string that is not an ISO 8601 time.
"""

from __future__ import annotations

import datetime as dt

from equeue.errors import ConfigError

__all__ = ["EPOCH", "as_utc", "epoch_ms", "parse_time", "parse_time_ms"]


def as_utc(when: dt.datetime) -> dt.datetime:
    """``when`` as an aware datetime: a naive one is read as UTC, an aware one kept."""
    if not isinstance(when, dt.datetime):
        raise ConfigError(f"expected a datetime, not {type(when).__name__}")
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when


#: the epoch, aware
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


def epoch_ms(when: dt.datetime) -> int:
    """Milliseconds since the epoch of ``when`` (naive: UTC), exactly (integer
    arithmetic: no float rounding), rounded down. Raises ConfigError for something
    that is not a datetime."""
    return (as_utc(when) - EPOCH) // _MS


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 time (``2024-05-01T12:00:00Z``, ``2024-05-01 12:00``,
    ``2024-05-01T21:00:00+09:00``, ``2024-05-01``) as an aware datetime; without an
    offset it is UTC. Raises ConfigError for anything else."""
    t = text.strip()
    try:
        when = dt.datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in ("Z", "z") else t)
    except ValueError:
        raise ConfigError(
            f"invalid time {text!r}: use ISO 8601, e.g. 2024-05-01T12:00:00Z (no offset means UTC)"
        ) from None
    return as_utc(when)


def parse_time_ms(text: str) -> int:
    """:func:`parse_time` as epoch milliseconds. Raises ConfigError."""
    return epoch_ms(parse_time(text))
