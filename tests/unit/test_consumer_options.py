"""ConsumerOptions: modes are StrEnums, their strings are accepted, the rest refused."""

from __future__ import annotations

import datetime as dt

import pytest

from equeue.config import StartFrom
from equeue.consumer import ConsumeMode, ConsumerOptions, HandlerThreads
from equeue.consumer.process_queue import lease_name, parse_lease
from equeue.errors import ConfigError


def test_strings_and_members_are_the_same_option() -> None:
    a = ConsumerOptions(mode="broadcast", start_from="earliest", handler_threads="always")
    b = ConsumerOptions(mode=ConsumeMode.BROADCAST, start_from=StartFrom.EARLIEST, handler_threads=HandlerThreads.ALWAYS)
    assert a == b and a.mode is ConsumeMode.BROADCAST and a.mode == "broadcast"
    when = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    assert ConsumerOptions(start_from=when).start_from == when
    assert ConsumerOptions().handler_threads is HandlerThreads.AUTO


@pytest.mark.parametrize("bad", [dict(mode="x"), dict(start_from="yesterday"), dict(handler_threads="never")])
def test_unknown_values_are_config_errors(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ConsumerOptions(**bad)  # type: ignore[arg-type]


def test_leases_are_tuples_inside_strings_on_the_wire() -> None:
    assert lease_name(("%RETRY%g/x", 3)) == "%RETRY%g/x/3"
    assert parse_lease("%RETRY%g/x/3") == ("%RETRY%g/x", 3)
