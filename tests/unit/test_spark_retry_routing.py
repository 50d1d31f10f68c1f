"""The Spark driver's wait through a failover (equeue.spark.common.retry_routing): routing
errors are retried within the timeout, anything else (a certificate problem too) is
raised at once, and the last routing error is raised once the time is up."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from equeue.errors import ConnectionBroken, NotLeader, QueueUnavailable, TlsError, TopicNotFound
from equeue.spark.common import retry_routing


def failing(*errors: Exception) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return calls, fn


def test_routing_errors_are_waited_out() -> None:
    calls, fn = failing(NotLeader("follower"), ConnectionBroken("gone"), QueueUnavailable("no leader"))
    assert retry_routing(fn, 10, "test") == "ok"
    assert len(calls) == 4


@pytest.mark.parametrize("error", [TopicNotFound("t"), TlsError("bad certificate")])
def test_other_errors_are_raised_at_once(error: Exception) -> None:
    calls, fn = failing(error)
    with pytest.raises(type(error)):
        retry_routing(fn, 10, "test")
    assert len(calls) == 1


def test_the_last_routing_error_is_raised_after_the_timeout() -> None:
    calls, fn = failing(*[NotLeader(f"follower {i}") for i in range(100)])
    with pytest.raises(NotLeader):
        retry_routing(fn, 0.2, "test")
    assert 1 < len(calls) < 100
