"""The one retry policy (client/retry.py): what is retried, how long it waits, and that it stops."""

from __future__ import annotations

import itertools
import logging

import pytest
import stamina
import trio
from stamina.instrumentation import RetryDetails

from equeue.client.retry import RetryLog, RetryPolicy, is_transient, retry_async, retry_sync
from equeue.errors import ClientClosed, ConfigError, ConnectionBroken, MessageTooLarge
from equeue.logs import formatter

FAST = RetryPolicy(attempts=4, timeout=None, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0)


def test_transient_classification() -> None:
    assert is_transient(ConnectionBroken("x"))
    assert not is_transient(MessageTooLarge("x"))
    assert not is_transient(ClientClosed("x"))
    assert not is_transient(ValueError("x"))


def test_retry_sync_retries_transient_then_succeeds() -> None:
    calls = []

    def fn() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionBroken("down")
        return "ok"

    assert retry_sync(fn, FAST) == "ok"
    assert len(calls) == 3


def test_retry_sync_gives_up_after_attempts() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise ConnectionBroken("down")

    with pytest.raises(ConnectionBroken):
        retry_sync(fn, FAST)
    assert len(calls) == 4


def test_retry_sync_does_not_retry_a_coded_refusal() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise MessageTooLarge("too big")

    with pytest.raises(MessageTooLarge):
        retry_sync(fn, FAST)
    assert calls == [1]


async def test_retry_async_waits_with_trio_clock(autojump_clock: trio.abc.Clock) -> None:
    policy = RetryPolicy(attempts=3, timeout=None, wait_initial=1.0, wait_max=10.0, wait_jitter=0.0)
    stamped: list[float] = []

    async def fn() -> str:
        stamped.append(trio.current_time())
        if len(stamped) < 3:
            raise ConnectionBroken("down")
        return "ok"

    stamina.set_testing(False)
    assert await retry_async(fn, policy) == "ok"
    gaps = [b - a for a, b in itertools.pairwise(stamped)]
    assert gaps == pytest.approx([1.0, 2.0])


def test_delay_grows_and_is_capped() -> None:
    p = RetryPolicy(wait_initial=0.1, wait_max=0.5, wait_jitter=0.0)
    assert [p.delay(i) for i in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.4, 0.5])


def test_policy_validates() -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(wait_initial=-1)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def details(what: str, where: str, n: int) -> RetryDetails:
    kw: dict[str, object] = {"what": what, "where": where, "attempts": 8}
    return RetryDetails("fn", (), kw, n, 0.25, 0.0, ConnectionBroken("down"))


def _fields(record: logging.LogRecord) -> str:
    """The record as the broker's logfmt line, from ``msg`` on (``ts``, ``level`` and
    ``logger`` dropped)."""
    line = formatter().format(record)
    return line[line.index("msg="):]


def test_retry_log_is_one_line_per_label_and_address_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    hook = RetryLog(logging.getLogger("test.retry"), 10.0, lambda: now[0])
    caplog.set_level(logging.WARNING, "test.retry")
    for n in range(1, 6):
        hook(details("pull", "h:1", n))
    hook(details("pull", "h:2", 1))  # another address: its own line
    now[0] = 10.0
    hook(details("pull", "h:1", 6))
    assert [_fields(r) for r in caplog.records] == [
        'msg="retry scheduled" what=pull where=h:1 attempt=1/8 wait=0.25s error="ConnectionBroken: down"',
        'msg="retry scheduled" what=pull where=h:2 attempt=1/8 wait=0.25s error="ConnectionBroken: down"',
        'msg="retry scheduled" what=pull where=h:1 attempt=6/8 wait=0.25s error="ConnectionBroken: down"'
        " suppressed=4 suppressed_in=10s",
    ]


def test_retry_sync_names_what_and_where_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "equeue.client.retry")

    def flaky() -> None:
        raise ConnectionBroken("down")

    with pytest.raises(ConnectionBroken):
        retry_sync(flaky, FAST, what="unit.sync", where="10.0.0.1:1")
    with pytest.raises(ConnectionBroken):
        retry_sync(flaky, FAST)  # no label: the callable's name
    lines = [_fields(r) for r in caplog.records if r.name == "equeue.client.retry"]
    assert lines[0].startswith('msg="retry scheduled" what=unit.sync where=10.0.0.1:1 attempt=1/4 wait=')
    assert lines[1].startswith(
        'msg="retry scheduled" what=test_retry_sync_names_what_and_where_in_the_log.<locals>.flaky where=- '
    )
    assert len(lines) == 2


async def test_retry_async_names_what_and_where_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "equeue.client.retry")

    async def flaky() -> None:
        raise ConnectionBroken("down")

    with pytest.raises(ConnectionBroken):
        await retry_async(flaky, FAST, what="unit.async", where="10.0.0.2:1")
    lines = [_fields(r) for r in caplog.records if r.name == "equeue.client.retry"]
    assert lines == [
        'msg="retry scheduled" what=unit.async where=10.0.0.2:1 attempt=1/4 wait=0.00s error="ConnectionBroken: down"'
    ]
