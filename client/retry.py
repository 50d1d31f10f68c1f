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

Each scheduled retry logs one line, ``retry scheduled``, on the ``equeue.client.retry`` logger
(WARNING), with these fields:
what is retried (``what``, a label the caller passes, else the callable's name), where
(``where``, the broker address(es), when the caller has them), the attempt that failed
(``attempt=2/8``), the wait before the next one and the error. A client can make
retries happen again and again, so :func:`log_retry` logs at most one line per
``what`` and ``where`` every :data:`RETRY_LOG_INTERVAL` seconds; the next line says
how many it suppressed (``suppressed=N``). Importing this module makes :func:`log_retry` stamina's only
retry hook, process-wide (stamina's own hook logs a bare ``stamina.retry_scheduled``);
an application that wants other hooks (say stamina's Prometheus counter) sets them
after importing equeue with :func:`stamina.instrumentation.set_on_retry_hooks`, and
keeps :func:`log_retry` in the list to keep these lines.

Raises: the last error once the attempts or the time budget run out; any
non-transient error at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import stamina
import stamina.instrumentation

from equeue.config import non_negative
from equeue.errors import ClientClosed, EQueueError
from equeue.logs import RateLimitedLog

__all__ = [
    "DEFAULT_POLICY",
    "RETRY_LOG_INTERVAL",
    "RetryLog",
    "RetryPolicy",
    "is_transient",
    "log_retry",
    "retry_async",
    "retry_sync",
]

T = TypeVar("T")

log = logging.getLogger("equeue.client.retry")

#: seconds between two retry lines of the same ``what`` and ``where``
RETRY_LOG_INTERVAL = 10.0


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


class RetryLog:
    """The stamina retry hook: one rate-limited line per scheduled retry (see the
    module docstring). It reads ``what``, ``where`` and ``attempts`` from the keyword
    arguments :func:`retry_async` and :func:`retry_sync` pass; a retry scheduled by
    some other stamina user is logged under its callable's name."""

    def __init__(self, logger: logging.Logger, interval: float, clock: Callable[[], float]) -> None:
        self.lines = RateLimitedLog(logger, interval, clock)

    def __call__(self, details: stamina.instrumentation.RetryDetails) -> None:
        what = str(details.kwargs.get("what") or details.name)
        where = str(details.kwargs.get("where") or "-")
        attempts = details.kwargs.get("attempts")
        attempt = f"{details.retry_num}/{attempts}" if attempts else str(details.retry_num)
        self.note(what, where, attempt, details.wait_for, details.caused_by)

    def note(self, what: str, where: str | None, attempt: str, wait: float, exc: BaseException) -> None:
        """Log one ``retry scheduled`` line (rate-limited per ``what`` and ``where``) for
        a retry loop of its own, such as the producer's in-order resend."""
        where = where or "-"
        self.lines.log(
            logging.WARNING, f"{what} {where}", "retry scheduled",
            fields={"what": what, "where": where, "attempt": attempt, "wait": f"{wait:.2f}s",
                    "error": f"{type(exc).__name__}: {exc}"},
        )  # fmt: skip


#: the hook this module installs (:func:`stamina.instrumentation.set_on_retry_hooks`)
log_retry = RetryLog(log, RETRY_LOG_INTERVAL, time.monotonic)
stamina.instrumentation.set_on_retry_hooks([log_retry])


def _name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


async def retry_async(
    fn: Callable[[], Awaitable[T]], policy: RetryPolicy = DEFAULT_POLICY, *, what: str | None = None,
    where: str | None = None,
) -> T:  # fmt: skip
    """Await ``fn()`` until it succeeds, retrying transient errors under ``policy``.
    ``what`` (default: ``fn``'s name) and ``where`` (an address) name it in the
    retry log lines."""

    @stamina.retry(on=is_transient, **policy._kwargs())  # type: ignore[arg-type]
    async def attempt(*, what: str, where: str | None, attempts: int) -> T:
        return await fn()

    return await attempt(what=what or _name(fn), where=where, attempts=policy.attempts)


def retry_sync(
    fn: Callable[[], T], policy: RetryPolicy = DEFAULT_POLICY, *, what: str | None = None, where: str | None = None
) -> T:
    """Call ``fn()`` until it succeeds, retrying transient errors under ``policy``
    (blocking sleeps: for plain threads such as Spark's Python workers). ``what``
    and ``where`` as for :func:`retry_async`."""

    @stamina.retry(on=is_transient, **policy._kwargs())  # type: ignore[arg-type]
    def attempt(*, what: str, where: str | None, attempts: int) -> T:
        return fn()

    return attempt(what=what or _name(fn), where=where, attempts=policy.attempts)
