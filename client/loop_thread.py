"""The blocking front over the async core: one trio loop in a helper thread.

Every sync class (``Client``, ``Producer``, ``Consumer``) owns an async twin that
runs on a private :class:`LoopThread`; its methods call the async ones through
``trio.from_thread.run``. The logic exists once (in the async classes); the sync
classes only forward. Safe from many threads (calls are serialised onto the loop)
and across ``os.fork()``: a process that finds itself forked after the front was
created starts a fresh loop and fresh connections (nothing survives a fork unnoticed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import outcome
import trio

from equeue.errors import ClientClosed

T = TypeVar("T")
A = TypeVar("A")

__all__ = ["CallCancelled", "LoopThread", "SyncFront"]

class CallCancelled(Exception):
    """The outcome of a :meth:`LoopThread.start_call` call cancelled by its canceller."""


#: bumped in a forked child: a loop made before the fork is not running there
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class LoopThread:
    """A trio event loop running in a daemon thread until :meth:`close`.

    ``open_async(factory)`` builds an async object on the loop and enters its
    ``async with`` there; the object lives until the loop closes.
    """

    def __init__(self, name: str = "equeue-loop") -> None:
        self.pid = os.getpid()
        self._generation = _fork_generation
        self._running = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as n:
                self._nursery = n
                self._running = True
                self._ready.set()
                await self._stop.wait()
                n.cancel_scope.cancel()

        try:
            trio.run(main)
        except BaseException as exc:  # pragma: no cover - loop crash
            self._error = exc
        finally:
            self._running = False
            self._ready.set()

    @property
    def alive(self) -> bool:
        """Running, in this process (cheap: no syscall; checked on every call)."""
        return self._running and self._generation == _fork_generation

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await afn(*args)`` on the loop and return its result (blocking)."""
        if not self.alive:
            raise ClientClosed("the client's event loop is not running (closed or forked)")
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        if not self.alive:
            raise ClientClosed("the client's event loop is not running (closed or forked)")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def open_async(self, factory: Callable[[], A]) -> A:
        """Create ``factory()`` on the loop and keep it entered (``async with``) until close."""
        return self.run(self.start_entered, factory)

    async def start_entered(self, factory: Callable[[], A]) -> A:
        """On the loop: create ``factory()``, enter it (``async with``) in a task of the
        loop's nursery that keeps it entered until the loop closes, and return it once
        entered (raises what entering raised)."""

        async def opener(task_status: trio.TaskStatus[A] = trio.TASK_STATUS_IGNORED) -> None:
            obj = factory()
            async with obj:  # type: ignore[attr-defined]
                task_status.started(obj)
                await trio.sleep_forever()

        assert self._nursery is not None
        return await self._nursery.start(opener)  # type: ignore[no-any-return]

    def start_call(
        self, afn: Callable[..., Awaitable[T]], *args: Any, on_done: Callable[[outcome.Outcome[T]], object]
    ) -> Callable[[], None]:
        """Start ``await afn(*args)`` in a task of the loop without waiting (any thread);
        ``on_done(outcome)`` is called on the loop thread once it ended (its value or
        error; ClientClosed when the loop closed under it). Returns a function that
        cancels the call (from any thread; the outcome is then :class:`CallCancelled`
        unless it ended first). Raises ClientClosed when the loop is not running.

        The non-blocking twin of :meth:`run`, for fronts whose caller must not block
        (the asyncio front, :mod:`equeue.aio`)."""
        token = self._token
        if not self.alive or token is None:
            raise ClientClosed("the client's event loop is not running (closed or forked)")
        scope = trio.CancelScope()

        async def task() -> None:
            result: outcome.Outcome[T] = outcome.Error(CallCancelled("the call was cancelled"))
            try:
                with scope:
                    result = outcome.Value(await afn(*args))
            except trio.Cancelled:  # the loop closes
                on_done(outcome.Error(ClientClosed("the client's event loop closed")))
                raise
            except BaseException as exc:  # handed to on_done, raised by the caller
                result = outcome.Error(exc)
            on_done(result)

        def spawn() -> None:
            if self._nursery is None or not self._running:
                on_done(outcome.Error(ClientClosed("the client's event loop is not running")))
                return
            self._nursery.start_soon(task, name=getattr(afn, "__qualname__", "front call"))

        def cancel() -> None:
            try:
                token.run_sync_soon(scope.cancel)
            except trio.RunFinishedError:
                pass

        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            raise ClientClosed("the client's event loop is not running") from None
        return cancel

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # a forked child does not own the parent's thread
        if self._thread.is_alive() and self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join()


class SyncFront(Generic[A]):
    """Base of the blocking classes: owns a loop thread and the async core object.

    Subclasses call ``self._call(lambda core: core.method(...))``. After a fork the
    core is rebuilt lazily in the child by ``_make_core``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._core: A | None = None
        self._closed = False

    def _make_core(self) -> A:  # pragma: no cover - interface
        raise NotImplementedError

    def _ensure(self) -> tuple[LoopThread, A]:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed")
        loop = self._loop
        if loop is not None and loop.alive and self._core is not None:
            return loop, self._core
        with self._lock:
            if self._loop is None or not self._loop.alive or self._core is None:
                if self._loop is not None:
                    self._loop.close()  # an earlier loop whose core failed to open
                self._loop = LoopThread(f"equeue-{type(self).__name__.lower()}")
                try:
                    self._core = self._loop.open_async(self._make_core)
                except BaseException:
                    self._loop.close()  # no loop thread is left behind a core that failed to open
                    self._loop = None
                    raise
            return self._loop, self._core

    def _call(self, fn: Callable[[A], Awaitable[T]]) -> T:
        loop, core = self._ensure()

        async def run() -> T:
            return await fn(core)

        return loop.run(run)

    def _close_core(self, fn: Callable[[A], Awaitable[Any]] | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        loop, core = self._loop, self._core
        if loop is None or not loop.alive:
            return
        try:
            if fn is not None and core is not None:

                async def run() -> None:
                    await fn(core)

                loop.run(run)
        finally:
            loop.close()
            self._loop = None
            self._core = None

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and loop.alive:
            try:
                loop.close()
            except Exception:
                pass
