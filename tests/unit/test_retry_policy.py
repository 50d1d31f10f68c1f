"""The one retry policy (client/retry.py): what is retried, how long it waits, and that it stops."""

from __future__ import annotations

import itertools

import pytest
import stamina
import trio

from equeue.client.retry import RetryPolicy, is_transient, retry_async, retry_sync
from equeue.errors import ClientClosed, ConfigError, ConnectionBroken, MessageTooLarge

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
