"""The appender's write side as handlers see it: the narrow queue the produce fast
path uses, and the submit every other write goes through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from equeue.broker.storage import WriteOp

__all__ = ["OpQueue", "Submit"]

#: the appender's submit: queue a write op, wait until it committed, its result
Submit = Callable[[WriteOp], Awaitable[Any]]


class OpQueue(Protocol):
    """The appender's write side as the produce fast path uses it."""

    def enqueue(self, op: WriteOp, callback: Any = None, *, defer: bool = False) -> Any: ...
    def kick(self) -> None: ...
    async def wait(self, p: Any) -> Any: ...
