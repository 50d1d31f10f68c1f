"""One time-zone rule (equeue.times): a naive datetime, or a time string without an
offset, means UTC everywhere -- a producer's ``deliver_at``, a consumer's
``start_from``, ``equeue group reset-offsets --to`` and ``equeue consume --from`` --
whatever the local zone of the machine. Checked with the process's zone set to
Asia/Tokyo (UTC+9): the consumer and ``reset-offsets`` read a naive value as local time
before, 9 hours off the producer's reading of the same value."""

from __future__ import annotations

import calendar
import datetime as dt
import os
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.cli import app
from equeue.client import Client
from equeue.consumer import Consumer
from equeue.producer._batch import deliver_at_ms
from equeue.times import epoch_ms, parse_time, parse_time_ms
from tests.conftest import wait_until_sync, wall_ms
from tests.integration.cli_child import consume

NAIVE = dt.datetime(2030, 1, 1, 9, 0, 0, 123000)
NAIVE_MS = calendar.timegm(NAIVE.timetuple()) * 1000 + 123


@pytest.fixture
def tokyo() -> Iterator[None]:
    """The process's local time zone is Asia/Tokyo (UTC+9) for the test."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    try:
        if time.localtime(0).tm_gmtoff != 9 * 3600:
            pytest.skip("no Asia/Tokyo zone data on this machine")
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_the_rule(tokyo: None) -> None:
    assert epoch_ms(NAIVE) == NAIVE_MS
    assert epoch_ms(NAIVE.replace(tzinfo=dt.UTC)) == NAIVE_MS
    assert epoch_ms(NAIVE.replace(tzinfo=dt.timezone(dt.timedelta(hours=9)))) == NAIVE_MS - 9 * 3_600_000
    for text in ("2030-01-01T09:00:00.123", "2030-01-01T09:00:00.123Z", "2030-01-01 09:00:00.123+00:00",
                 "2030-01-01T18:00:00.123+09:00"):  # fmt: skip
        assert parse_time_ms(text) == NAIVE_MS, text
    assert parse_time("2030-01-01").tzinfo is not None
    # the producer's due time
    assert deliver_at_ms(None, NAIVE) == NAIVE_MS


def _naive_utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).replace(tzinfo=None)


def _two_messages(b: str, topic: str) -> dt.datetime:
    """``before`` and ``after`` in queue 0 of a new ``topic``; a naive UTC time between
    their store times."""
    with Client(b) as c:
        c.create_topic(topic, 1)
        c.produce(wire.ProduceRequest(topic, 0, [wire.encode_entry(Message("before"))]))
        mark = wall_ms() + 1  # every record stored from now on is stamped after "before"
        wait_until_sync(lambda: wall_ms() > mark, what="the wall clock passes the mark")
        c.produce(wire.ProduceRequest(topic, 0, [wire.encode_entry(Message("after"))]))
    return _naive_utc(mark)


def test_start_from_reads_naive_times_as_utc(tokyo: None, embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    when = _two_messages(b, "tz")
    for i, start in enumerate((when, when.isoformat())):  # a naive datetime, and the same as a string
        with Consumer(b, f"g{i}", "tz", start_from=start, heartbeat_interval=0.2) as con:
            first = next(iter(con))
            assert first.text == "after", start


def test_consume_from_reads_a_time_without_offset_as_utc(tokyo: None, embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    when = _two_messages(b, "tz")
    r = consume("tz", "-g", "c", "--from", when.isoformat(), "-e", "-b", b)  # the child's TZ is Asia/Tokyo too
    assert r.returncode == 0, r.stderr
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["after"]


def test_reset_offsets_to_reads_a_time_without_offset_as_utc(tokyo: None, embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    when = _two_messages(b, "tz")
    res = CliRunner().invoke(app, ["group", "reset-offsets", "r", "--topic", "tz", "--to", when.isoformat(), "-b", b])
    assert res.exit_code == 0, res.output
    with Client(b) as c:
        assert c.query_offset("r", "tz", 0) == 1
    res = CliRunner().invoke(app, ["group", "reset-offsets", "r", "--topic", "tz", "--to", "yesterday", "-b", b])
    assert res.exit_code == 1 and "invalid time 'yesterday'" in res.output
