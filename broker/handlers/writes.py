"""The appender's write side as handlers other than produce see it: the submit every
write goes through (the produce paths use their own narrow queue,
:class:`equeue.broker.handlers.produce.ProduceQueue`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from equeue.broker.storage import WriteOp

__all__ = ["Submit"]

#: the appender's submit: queue a write op, wait until it committed, its result
Submit = Callable[[WriteOp], Awaitable[Any]]

