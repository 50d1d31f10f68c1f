"""The one retry policy of the clients: only named transient errors, exponential
backoff with jitter, bounded in attempts and time.

Every retry loop in the SDK, the CLI and Spark goes through :func:`retry_async`
or :func:`retry_sync` (built on `stamina <https://stamina.hynek.me>`_, which sleeps
with trio's clock under trio). What is retried is decided in one place,
:func:`is_transient`: an :class:`~equeue.errors.EQueueError` whose class says
``transient = True`` (a broken connection, a busy or stopping broker, an
out-of-order sequence), never a coded refusal such as
:class:`~equeue.errors.MessageTooLarge`, never an authentication or authorization
refusal (:class:`~equeue.errors.AuthenticationError`,
:class:`~equeue.errors.NotAuthorized`: the same credentials fail the same way), and
never :class:`~equeue.errors.ClientClosed`. The idempotent producer's in-order resend
(``producer/_lane.py``) keeps its own ordering logic and uses :meth:`RetryPolicy.delay`
for its pause.

Raises: the last error once the attempts or the time budget run out; any
non-transient error at once.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import stamina

from equeue.config import non_negative
from equeue.errors import ClientClosed, EQueueError

__all__ = ["DEFAULT_POLICY", "RetryPolicy", "is_transient", "retry_async", "retry_sync"]

T = TypeVar("T")


def is_transient(exc: Exception) -> bool:
    """True for the errors worth retrying: transient equeue errors, but a closed client."""
    return isinstance(exc, EQueueError) and exc.transient and not isinstance(exc, ClientClosed)


@attrs.frozen
class RetryPolicy:
    """How often and how patiently to retry. ``attempts`` counts the first try;
    ``timeout`` (seconds, None = unbounded) bounds the whole loop; waits grow from
    ``wait_initial`` by ``wait_exp_base`` up to ``wait_max``, plus up to
    ``wait_jitter`` of random jitter."""

    attempts: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    timeout: float | None = 30.0
    wait_initial: float = attrs.field(default=0.05, validator=non_negative)
    wait_max: float = attrs.field(default=2.0, validator=non_negative)
    wait_jitter: float = attrs.field(default=0.05, validator=non_negative)
    wait_exp_base: float = 2.0

    def delay(self, attempt: int) -> float:
        """The pause before retry number ``attempt`` (1-based), jitter included."""
        base = min(self.wait_initial * self.wait_exp_base ** max(attempt - 1, 0), self.wait_max)
        return base + random.uniform(0, self.wait_jitter)

    def _kwargs(self) -> dict[str, float | int | None]:
        return {
            "attempts": self.attempts,
            "timeout": self.timeout,
            "wait_initial": self.wait_initial,
            "wait_max": self.wait_max,
            "wait_jitter": self.wait_jitter,
            "wait_exp_base": self.wait_exp_base,
        }


DEFAULT_POLICY = RetryPolicy()


async def retry_async(fn: Callable[[], Awaitable[T]], policy: RetryPolicy = DEFAULT_POLICY) -> T:
    """Await ``fn()`` until it succeeds, retrying transient errors under ``policy``."""
    async for attempt in stamina.retry_context(on=is_transient, **policy._kwargs()):  # type: ignore[arg-type]
        with attempt:
            return await fn()
    raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover


def retry_sync(fn: Callable[[], T], policy: RetryPolicy = DEFAULT_POLICY) -> T:
    """Call ``fn()`` until it succeeds, retrying transient errors under ``policy``
    (blocking sleeps: for plain threads such as Spark's Python workers)."""
    for attempt in stamina.retry_context(on=is_transient, **policy._kwargs()):  # type: ignore[arg-type]
        with attempt:
            return fn()
    raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover
