"""The ``async with`` lifetime of an object that owns tasks (:class:`StackOwner`).

Such an object (a client connection, the route table, a broker's election, the broker
itself) opens a trio nursery for its tasks, and perhaps other resources, on entry and
closes them on exit. All of them live on one :class:`contextlib.AsyncExitStack` filled
by the object's :meth:`StackOwner._enter`; exit unwinds it in reverse order of entry.
So a cleanup step that must run before the nursery waits for its tasks (cancel them,
close a connection) is pushed after the nursery is entered, and one that must run
after the tasks ended (revoke a lease) before it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Self

import trio


class StackOwner(ABC):
    """Base of an object opened with ``async with`` whose resources live on one
    :class:`~contextlib.AsyncExitStack` (module docstring). Entering returns the object;
    exiting unwinds the stack, the body's exception passing through each resource."""

    _stack: AsyncExitStack | None = None

    @abstractmethod
    async def _enter(self, stack: AsyncExitStack) -> None:
        """Enter this object's resources on ``stack`` (its nursery first) and start its
        tasks. An exception raised here fails the entry: what was entered on ``stack``
        is closed first (as on a clean exit), then the exception propagates as it is."""

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        try:
            await self._enter(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        # (``bool | None``, not ``bool``: type checkers then do not take every
        # ``async with`` of these objects for one that may swallow the body's exception)
        stack, self._stack = self._stack, None
        if stack is None:  # never entered, or already exited
            return False
        return await stack.__aexit__(et, ev, tb)


async def enter_cancelled_nursery(stack: AsyncExitStack) -> trio.Nursery:
    """Enter a nursery on ``stack`` whose tasks are cancelled when the stack unwinds (just
    before the nursery waits for them): for tasks that run until their owner closes."""
    nursery = await stack.enter_async_context(trio.open_nursery())
    stack.callback(nursery.cancel_scope.cancel)
    return nursery
