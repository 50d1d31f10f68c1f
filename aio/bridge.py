"""The bridge every asyncio front stands on: a trio core on a private loop thread, awaited
from asyncio.

The cores stay trio. Each front owns a private trio loop thread
(:class:`equeue.client.loop_thread.LoopThread`, the one the blocking SDK runs on) with the
trio core entered on it; every call is started on that loop without blocking
(:meth:`LoopThread.start_call`) and awaited on the caller's asyncio loop through an
asyncio future settled with ``loop.call_soon_threadsafe`` (:class:`_Front`). The logic
exists once, in the trio cores: idempotent sends, ordered lanes, leases, commit on close
are theirs. :func:`_forward` makes a front's method out of a core's one; :func:`_to_asyncio`
crosses the other way (a trio caller awaiting a function run on the asyncio loop: the
consumer's handlers and listeners).

Cancellation follows asyncio's rules: cancelling a task awaiting a call raises
CancelledError in it once the call, cancelled on the trio loop, ended there; what was already handed
over stays done. ``async with`` (or ``aclose``) closes the core and ends the loop thread;
an object never closed ends its loop thread when collected or at exit, without flushing
or committing (see docs/asyncio.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

import outcome
import trio

from equeue.client.loop_thread import CallCancelled, LoopThread
from equeue.errors import ClientClosed

T = TypeVar("T")
C = TypeVar("C")
P = ParamSpec("P")


class _Front(Generic[C]):
    """A trio core entered on a private loop thread, called from one asyncio loop."""

    def __init__(self) -> None:
        self._loop: LoopThread | None = None
        self._core: C | None = None
        #: set when a close starts (a second close returns at once); calls still go
        #: through meanwhile (a rebalance listener committing during the close)
        self._closing = False
        #: set once the close ended: calls raise ClientClosed
        self._closed = False

    def _make_core(self) -> C:  # pragma: no cover - interface
        raise NotImplementedError

    async def start(self) -> Self:
        """Start the loop thread and open the core on it (``async with`` does it)."""
        await self._open()
        return self

    async def aclose(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> C:
        """Start the loop thread and enter the core on it (once)."""
        if self._closed or self._closing:
            raise ClientClosed(f"{type(self).__name__} is closed")
        if self._core is not None:
            return self._core
        loop = self._loop = LoopThread(f"equeue-aio-{type(self).__name__.lower()}")
        try:
            core: C = await self._call(loop.start_entered, self._make_core)
            self._core = core
        except BaseException:
            self._loop = None
            loop.close()
            raise
        return core

    def _ready(self) -> tuple[LoopThread, C]:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed")
        if self._loop is None or self._core is None:
            raise ClientClosed(f"{type(self).__name__} is not open: use 'async with' (or 'await x.start()')")
        return self._loop, self._core

    async def _call(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await afn(*args)`` on the trio loop, awaited here. Cancelling the awaiting
        task cancels the call on the loop; CancelledError is raised here once it ended
        there (a cancelled ``run`` is over, its handlers cancelled, when it is raised)."""
        loop = self._loop
        if loop is None:
            raise ClientClosed(f"{type(self).__name__} is not open")
        aio = asyncio.get_running_loop()
        fut: asyncio.Future[T] = aio.create_future()

        def settle(result: outcome.Outcome[T]) -> None:
            if not fut.done():
                if isinstance(result, outcome.Error):
                    fut.set_exception(result.error)
                else:
                    fut.set_result(result.unwrap())

        def on_done(result: outcome.Outcome[T]) -> None:  # on the trio loop thread
            try:
                aio.call_soon_threadsafe(settle, result)
            except RuntimeError:  # the asyncio loop is closed: nobody waits
                pass

        cancel = loop.start_call(afn, *args, on_done=on_done)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # cancel the call on the loop and let it end there before CancelledError is
            # raised here (a cancelled run is over when its task sees the cancellation)
            cancel()
            try:
                await fut
            except (CallCancelled, Exception, asyncio.CancelledError):
                pass
            raise

    async def _close(self, fn: Callable[[C], Awaitable[Any]]) -> None:
        """Run ``fn(core)`` on the loop (shielded from the caller's cancellation: a close
        runs to its end), then end the loop thread. Idempotent. The front's calls go
        through until it ended (listeners may commit during the close), then raise
        ClientClosed."""
        if self._closed or self._closing:
            return
        self._closing = True
        loop, core = self._loop, self._core
        if loop is None:
            self._closed = True
            return
        try:
            if core is not None and loop.alive:
                closing = asyncio.ensure_future(self._call(fn, core))
                try:
                    await asyncio.shield(closing)
                except asyncio.CancelledError:
                    await closing  # the close goes on; the cancellation is raised after it
                    raise
        finally:
            self._closed = True
            self._core = None
            self._loop = None
            loop.close()

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and loop.alive:
            try:
                loop.close()
            except Exception:
                pass



def _forward(
    method: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[_Front[C], P], Coroutine[Any, Any, T]]:
    """The asyncio method calling the trio core's ``method`` on the loop thread (one
    forwarded method per public method of the core: same name, parameters, docstring)."""
    name = method.__name__

    async def forward(self: _Front[C], *args: P.args, **kwargs: P.kwargs) -> T:
        _, core = self._ready()
        return await self._call(lambda: getattr(core, name)(*args, **kwargs))  # type: ignore[no-any-return]

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = method.__doc__
    forward.__wrapped__ = method  # type: ignore[attr-defined]  # inspect.signature: the trio one
    return forward


def _to_asyncio(fn: Callable[..., Any], aio: asyncio.AbstractEventLoop) -> Callable[..., Awaitable[Any]]:
    """``fn`` (a coroutine function, or a plain function) as a trio coroutine function:
    each call runs on the asyncio loop ``aio`` and is awaited on the trio side, its
    error raised there. Cancelled on the trio side (a close abandoning handlers, a
    cancelled ``run``): the asyncio task is cancelled too."""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004

    async def plain(*args: Any) -> Any:
        return fn(*args)

    target = fn if is_async else plain

    async def bridged(*args: Any) -> Any:
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_: Future[Any]) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        try:
            cf = asyncio.run_coroutine_threadsafe(target(*args), aio)
        except RuntimeError as exc:  # the asyncio loop is closed
            raise ClientClosed(f"the asyncio loop that runs the handler is closed ({exc})") from None
        cf.add_done_callback(wake)
        try:
            await done.wait()
        except trio.Cancelled:
            cf.cancel()
            raise
        try:
            return cf.result()
        except concurrent.futures.CancelledError:  # its asyncio task was cancelled (a loop shutting down)
            raise ClientClosed("the handler's asyncio task was cancelled") from None

    return bridged

