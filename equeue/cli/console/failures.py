"""What went wrong with a request to the cluster, as one line a page can show.

The admin functions fan out in nurseries, so a refusal may arrive wrapped in an
exception group; :func:`equeue_errors` takes the leaves out."""

from __future__ import annotations

from equeue.errors import BrokerError, ConfigError, EQueueError

__all__ = ["BadInput", "describe", "equeue_errors"]


class BadInput(ConfigError):
    """A form or query value the console cannot use (shown to the user, nothing sent)."""


def equeue_errors(exc: BaseException) -> list[EQueueError] | None:
    """The EQueueErrors ``exc`` is or holds (a group of them, nested or not), or
    None when it is or holds anything else."""
    if isinstance(exc, EQueueError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        out: list[EQueueError] = []
        for e in exc.exceptions:
            inner = equeue_errors(e)
            if inner is None:
                return None
            out.extend(inner)
        return out or None
    return None


def describe(errors: list[EQueueError]) -> str:
    """One line: each distinct message, a broker's refusal with its code's name
    (``NOT_AUTHORIZED: user 'bob' may not ...``)."""
    lines = []
    for e in errors:
        if isinstance(e, BrokerError):
            lines.append(f"{e.code.name}: {e}")
        else:
            lines.append(str(e) or type(e).__name__)
    return "; ".join(dict.fromkeys(lines))
