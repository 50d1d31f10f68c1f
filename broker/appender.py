"""The appender: the single writer. It drains every pending write op into one LMDB
write transaction (group commit) run in one long-lived worker thread, then answers
the ops and wakes parked pulls. A transaction never spans an ``await``: it opens
and commits inside :meth:`equeue.broker.storage.Store.write`, in the worker thread.

Hand-off, for latency: the trio side appends to a list under a lock and notifies a
condition (no loop iteration, no checkpoint); the writer thread, blocked on that
condition, takes everything queued (up to ``max_batch_ops``) as one batch, writes
it, lets the hooks' :meth:`~CommitHooks.written` act on the commit in the writer
thread (the broker answers parked pulls there), and posts the answers back with
``TrioToken.run_sync_soon``: one callback per transaction that hands each op
(:class:`PendingOp`) its ``outcome`` (``outcome.Value`` or ``outcome.Error``: what
crosses from the writer thread to the loop) and sets the ops' events (and calls
their ``callback``) in the loop thread. While a transaction
is being written, new ops pile up and form the next batch: many concurrent
requests, one transaction, one fsync. A ``trio.to_thread`` call per batch would
cost two extra thread hops and a loop iteration each time (~0.1 ms here).

Two additions for replication (docs/cluster.md, "Replicas, acks, failover"):

* :meth:`Appender.call` runs a synchronous store function (the replication log's
  write steps: ``store.replication.apply_log``, ``begin_epoch``, ``trim_log``,
  ``reload``...) in the writer
  thread, in order with the ops queued before and after it: the single writer
  stays single.
* :meth:`CommitHooks.hold`: the hooks may take the ops of a committed transaction
  (loop thread) instead of letting them be answered: the replication layer answers
  them with :meth:`Appender.release` once the high watermark passed the transaction
  (acks all), or with an error (the leader stepped down).

What the broker does around a commit is one object, its :class:`CommitHooks` (four
named methods, one per moment of a transaction; :class:`NoHooks` does nothing).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import outcome
import trio

from equeue.broker.storage import Store, WriteOp, WriteOutcome, settled
from equeue.errors import BrokerShuttingDown, EQueueError, InternalBrokerError

log = logging.getLogger("equeue.appender")

__all__ = ["NO_HOOKS", "Appender", "CommitHooks", "Hold", "NoHooks", "PendingOp"]

T = TypeVar("T")


class PendingOp:
    """One op queued in the appender (what :meth:`Appender.enqueue` returns): ``done``
    is set (and ``callback(self)`` called, in the loop thread) once ``outcome`` holds
    the op's result or its exception. Loop thread only, but for ``op`` and ``fn``,
    which the writer thread reads."""

    __slots__ = ("callback", "done", "fn", "op", "outcome")

    def __init__(
        self, op: WriteOp | None, callback: Callable[[PendingOp], None] | None = None,
        fn: Callable[[], Any] | None = None,
    ) -> None:  # fmt: skip
        self.op = op
        #: a function to run alone in the writer thread (:meth:`Appender.call`); op is None
        self.fn = fn
        self.done = trio.Event()
        self.outcome: outcome.Outcome[Any] | None = None
        self.callback = callback

    @property
    def result(self) -> Any:
        """The op's result, or the exception it failed with (None until ``done``)."""
        return None if self.outcome is None else settled(self.outcome)

    def resolve(self, result: outcome.Outcome[Any]) -> None:
        """Store the outcome and wake the waiter (loop thread only; never raises)."""
        self.outcome = result
        self.done.set()
        cb = self.callback
        if cb is not None:
            try:
                cb(self)
            except Exception:
                log.exception("appender completion callback failed")


#: a holder alone (``Appender(hold=...)``): receives the ops of each committed
#: transaction instead of answering them (loop thread), ``hold(batch, committed)``;
#: it answers them later with :meth:`Appender.release` or :meth:`Appender.fail`
Hold = Callable[[list[PendingOp], WriteOutcome], None]


class CommitHooks(Protocol):
    """What the appender's owner does around each transaction, one method per moment,
    in this order. Every hook is called once per transaction (never per op); an
    exception from one is logged and the ops are still answered.

    - :meth:`written`: **writer thread** (or the loop, for an inline commit), right
      after the commit, before its answers are posted to the loop: the broker answers
      parked pulls there (:mod:`equeue.broker.writer_answers`, the one thread crossing).
    - :meth:`hold`: loop thread, with the ops of a committed transaction: True when the
      hooks took them, to answer later (:meth:`Appender.release` /
      :meth:`Appender.fail`: acks after replication); False: they are answered now.
    - :meth:`committed`: loop thread, after the ops of a committed transaction were
      answered (or held): wake pulls parked since, reschedule delayed moves.
    - :meth:`answered`: loop thread, after every batch answered -- committed, failed
      or released: the answers staged for the connections are written.
    """

    def written(self, committed: WriteOutcome) -> None: ...
    def hold(self, batch: list[PendingOp], committed: WriteOutcome) -> bool: ...
    def committed(self, committed: WriteOutcome) -> None: ...
    def answered(self) -> None: ...


class NoHooks:
    """:class:`CommitHooks` that do nothing (ops answered at commit): the default, and
    a base for hooks that need only some of the moments."""

    def written(self, committed: WriteOutcome) -> None:
        """Writer thread: nothing."""

    def hold(self, batch: list[PendingOp], committed: WriteOutcome) -> bool:
        """Hold nothing: the ops are answered at commit."""
        return False

    def committed(self, committed: WriteOutcome) -> None:
        """Nothing."""

    def answered(self) -> None:
        """Nothing."""


#: the default hooks: ops answered at commit, nothing else done
NO_HOOKS = NoHooks()


class _Holding(NoHooks):
    """``Appender(hold=...)``: hooks that only hold, with a :data:`Hold` function."""

    def __init__(self, fn: Hold) -> None:
        self.fn = fn

    def hold(self, batch: list[PendingOp], committed: WriteOutcome) -> bool:
        self.fn(batch, committed)
        return True


class Appender:
    """Owns the write path. Run :meth:`run` in a nursery; :meth:`submit` from handlers."""

    def __init__(
        self,
        store: Store,
        hooks: CommitHooks = NO_HOOKS,
        *,
        max_batch_ops: int = 2048,
        hold: Hold | None = None,
        inline_bytes: int = 0,
    ) -> None:
        """``hooks``: what the owner does around each transaction (:class:`CommitHooks`);
        ``hold``: the short form of hooks that only hold (not with ``hooks``).
        Raises TypeError when both are given."""
        if hold is not None:
            if hooks is not NO_HOOKS:
                raise TypeError("Appender: give hooks or hold, not both")
            hooks = _Holding(hold)
        self.store = store
        #: :meth:`kick` commits a batch on the loop when the writer thread is idle and
        #: the batch's ops are small (``WriteOp.inline_size``) and add up to at most
        #: this many bytes (0: never; ``--flush async`` only, see docs/storage.md)
        self.inline_bytes = inline_bytes
        self.max_batch_ops = max_batch_ops
        #: what is done around each transaction (read once per transaction)
        self.hooks = hooks
        #: queued ops, FIFO; guarded by ``_cond`` (the loop appends, the writer takes)
        self._pending: list[PendingOp] = []
        #: how many of ``_pending`` are :meth:`call` functions (0: batches need no scan)
        self._calls = 0
        #: set by :meth:`refuse`: the writer fails the ops it takes with it, unwritten
        self._refusal: BaseException | None = None
        #: batches the writer thread took whose answers it has not posted to the loop
        #: and the loop has not run yet (guarded by ``_cond``): :meth:`kick` commits
        #: inline only at 0, so an inline batch is never answered before them
        self._unanswered = 0
        self._cond = threading.Condition(threading.Lock())
        #: the writer thread exits once the queue is empty (close) ...
        self._drain_and_stop = False
        #: ... or right after its current transaction (cancelled run)
        self._stop_now = False
        self._writer_waiting = False
        self._closing = False
        self._running = False
        self._fatal: BaseException | None = None
        self.transactions = 0
        #: transactions committed on the loop by :meth:`kick`, and the longest one (s):
        #: the loop's worst pause from inline commits
        self.inline_transactions = 0
        self.inline_max_seconds = 0.0

    @property
    def hold(self) -> Hold | None:
        """The holder given as ``hold`` (None: none, or full ``hooks``)."""
        hooks = self.hooks
        return hooks.fn if isinstance(hooks, _Holding) else None

    @hold.setter
    def hold(self, fn: Hold | None) -> None:
        """Hold with ``fn`` from now on (None: answer at commit). Raises TypeError when
        the appender has full ``hooks`` (they would be lost)."""
        if self.hooks is not NO_HOOKS and not isinstance(self.hooks, _Holding):
            raise TypeError("Appender.hold: the appender has hooks; set them instead")
        self.hooks = NO_HOOKS if fn is None else _Holding(fn)

    async def submit(self, op: WriteOp) -> Any:
        """Queue ``op`` for the next transaction and wait until it committed.

        Returns the op's result; raises the EQueueError the op (or the whole
        transaction) failed with, or BrokerShuttingDown once closing.
        """
        return await self.wait(self.enqueue(op))

    def enqueue(
        self, op: WriteOp, callback: Callable[[PendingOp], None] | None = None, *, defer: bool = False
    ) -> PendingOp:
        """Queue ``op`` now (no checkpoint), so ops enqueued one after another are
        committed in that order; :meth:`wait` for its outcome, or pass ``callback``
        to be called with the pending op once it is answered (in the loop thread).

        ``defer``: do not wake the writer yet; the caller queues more ops and calls
        :meth:`kick` before its next checkpoint, so the requests of one received
        chunk share a transaction (and, with ``inline_bytes``, commit on the loop).
        """
        if self._closing:
            raise BrokerShuttingDown("the broker is shutting down")
        p = PendingOp(op, callback)
        with self._cond:
            self._pending.append(p)
            if self._writer_waiting and not defer:
                self._cond.notify()
        return p

    def kick(self) -> None:
        """Loop thread: commit the ops queued with ``defer``. When the writer thread is
        idle, nothing else is queued, no answer of the writer's is still on its way to
        the loop (answers stay in commit order) and the batch is small (``inline_bytes``), the
        transaction is written here, on the loop, and its ops answered before this
        returns (no thread hop: docs/storage.md, "Inline commits"); otherwise the writer
        thread is woken. Never raises, but a KeyboardInterrupt or SystemExit raised
        in the loop thread during an inline commit goes on up once its ops are answered."""
        if not self._pending:
            return
        batch: list[PendingOp] | None = None
        with self._cond:
            pending = self._pending
            if not pending:
                return
            if (
                self.inline_bytes
                and self._writer_waiting
                and not self._calls
                and self._refusal is None
                and not self._unanswered
                and len(pending) <= self.max_batch_ops
                and _inline_size(pending) <= self.inline_bytes
            ):
                # the writer is parked on the condition and only the loop queues ops:
                # nothing else can write the store until this returns
                batch, self._pending = pending, []
            else:
                self._cond.notify()
        if batch is not None:
            self._write_inline(batch)

    def _write_inline(self, batch: list[PendingOp]) -> None:
        """Loop thread: one transaction for ``batch``, answered at once (see :meth:`kick`)."""
        started = time.perf_counter()
        done = outcome.capture(self.store.write, cast("list[WriteOp]", [p.op for p in batch]))
        took = time.perf_counter() - started
        self.inline_transactions += 1
        if took > self.inline_max_seconds:
            self.inline_max_seconds = took
        if isinstance(done, outcome.Error):
            exc = done.error
            if not isinstance(exc, Exception):
                # KeyboardInterrupt or SystemExit landed in the loop thread (an embedded
                # broker): the ops are answered (whether the transaction committed is
                # unknown: a retry of an idempotent producer is deduplicated), then it
                # goes on up, as it would anywhere else on the loop
                self._fail(batch, BrokerShuttingDown(f"the broker is stopping ({type(exc).__name__}); resend"))
                raise exc
            if not isinstance(exc, EQueueError):
                log.error("store write failed unexpectedly", exc_info=exc)
                exc = InternalBrokerError(f"store write failed: {exc!r}")
            self._fail(batch, exc)
            return
        committed = done.unwrap()
        try:
            self.hooks.written(committed)
        except Exception:
            log.exception("the written hook failed")
        self._answer(batch, committed)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` alone in the writer thread, after the ops queued before it and
        before those queued after; return its result or raise its exception.

        For the store's synchronous replication writes (each one transaction). The
        wait is shielded like :meth:`wait`: once queued, ``fn`` may run. Raises
        BrokerShuttingDown once closing.
        """
        if self._closing:
            raise BrokerShuttingDown("the broker is shutting down")
        p = PendingOp(None, None, fn)
        with self._cond:
            self._pending.append(p)
            self._calls += 1
            if self._writer_waiting:
                self._cond.notify()
        result: T = await self.wait(p)
        return result

    def refuse(self, exc: BaseException | None) -> None:
        """From now on the writer thread answers every op it takes with ``exc``
        instead of writing it (None: write again). A replica that stops leading
        refuses the client writes still queued: only the new leader's log may grow
        its store (``await call(...)`` after this returns once the transaction in
        progress, if any, is over). :meth:`call` functions still run."""
        self._refusal = exc

    async def wait(self, p: PendingOp) -> Any:
        """Wait until an enqueued op committed; return its result or raise its error."""
        # shielded: once queued, the op may commit; we must not drop its outcome
        if not p.done.is_set():
            with trio.CancelScope(shield=True):
                await p.done.wait()
        assert p.outcome is not None
        return p.outcome.unwrap()

    async def run(self) -> None:
        """Start the writer thread; return after :meth:`close` once every queued op
        is answered.

        If cancelled, the transaction in progress still completes and is answered
        (the wait for it is shielded); ops still queued are failed with
        BrokerShuttingDown.
        """
        if self._running:
            raise RuntimeError("Appender.run is already running")
        self._running = True
        stopped = trio.Event()
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._writer, args=(token, stopped), name="equeue-appender", daemon=True)
        thread.start()
        try:
            await stopped.wait()
        finally:
            self._closing = True
            with self._cond:
                leftover, self._pending = self._pending, []
                self._calls = 0
                self._stop_now = True
                self._cond.notify()
            err = BrokerShuttingDown("the broker stopped before this request was written")
            for p in leftover:
                p.resolve(outcome.Error(err))
            if leftover:
                self._answered()
            with trio.CancelScope(shield=True):
                # the writer posts its last answers, then ``stopped.set`` (FIFO)
                await stopped.wait()
            # the thread has posted its final callback; it ends right after
            thread.join()
            self._running = False
        if self._fatal is not None:
            raise self._fatal

    def close(self) -> None:
        """Refuse new ops; :meth:`run` returns after answering the queued ones."""
        self._closing = True
        with self._cond:
            self._drain_and_stop = True
            self._cond.notify()

    # ------------------------------------------------------------------ writer thread
    def _writer(self, token: trio.lowlevel.TrioToken, stopped: trio.Event) -> None:
        """The writer thread: one transaction per batch, answers posted to the loop."""
        cond = self._cond
        write = self.store.write
        post = token.run_sync_soon
        try:
            while True:
                with cond:
                    while not self._pending and not self._stop_now and not self._drain_and_stop:
                        self._writer_waiting = True
                        cond.wait()
                        self._writer_waiting = False
                    if self._stop_now or not self._pending:
                        return
                    pending = self._pending
                    call: PendingOp | None = None
                    if self._calls and (cut := _first_call(pending, self.max_batch_ops)) is not None:
                        if cut == 0:  # a call runs alone
                            call = pending.pop(0)
                            self._calls -= 1
                            batch = []
                        else:
                            batch = pending[:cut]
                    else:
                        batch = pending[: self.max_batch_ops]
                    del pending[: len(batch)]
                    if call is None:
                        self._unanswered += 1  # until its posted answers ran (_posted)
                if call is not None:
                    post(_resolve_call, call, outcome.capture(cast(Callable[[], Any], call.fn)))
                    continue
                refusal = self._refusal
                if refusal is not None:
                    post(self._posted, self._fail, batch, refusal)
                    continue
                done = outcome.capture(write, cast("list[WriteOp]", [p.op for p in batch]))
                if isinstance(done, outcome.Error):
                    exc = done.error
                    if isinstance(exc, EQueueError):  # the whole transaction failed
                        post(self._posted, self._fail, batch, exc)
                        continue
                    # an unexpected bug must not strand waiters
                    log.error("store write failed unexpectedly", exc_info=exc)
                    post(self._posted, self._fail, batch, InternalBrokerError(f"store write failed: {exc!r}"))
                    if not isinstance(exc, Exception):
                        self._fatal = exc
                        return
                    continue
                committed = done.unwrap()
                try:
                    self.hooks.written(committed)
                except Exception:
                    log.exception("the written hook failed")
                finally:  # committed: its ops are answered whatever the hook did
                    post(self._posted, self._answer, batch, committed)
        except BaseException as exc:  # pragma: no cover - a bug in this loop itself
            log.exception("appender writer thread failed")
            self._fatal = exc
        finally:
            post(stopped.set)

    # ------------------------------------------------------------------ loop-thread callbacks
    def _posted(self, answer: Callable[[list[PendingOp], Any], None], batch: list[PendingOp], arg: Any) -> None:
        """A batch of the writer thread is answered (``_answer`` or ``_fail``)."""
        with self._cond:
            self._unanswered -= 1
        answer(batch, arg)

    def _answer(self, batch: list[PendingOp], committed: WriteOutcome) -> None:
        self.transactions += 1
        hooks = self.hooks
        try:
            held = hooks.hold(batch, committed)
        except Exception as exc:  # a bug in the holder must not strand the waiters
            log.exception("holding a transaction's answers failed")
            # the ones it answered before failing keep their answer (each op is
            # answered exactly once: a second answer would reach the client too)
            _fail_unanswered(batch, InternalBrokerError(f"holding the answers failed: {exc!r}"))
            held = True
        if not held:
            self._resolve(batch, committed.results)
        try:
            hooks.committed(committed)
        except Exception:
            log.exception("the committed hook failed")
        self._answered()

    @staticmethod
    def _resolve(batch: Sequence[PendingOp], results: Sequence[outcome.Outcome[Any]]) -> None:
        try:
            for p, r in zip(batch, results, strict=True):
                p.resolve(r)
        except Exception as exc:  # a store bug (results do not match the ops): answer anyway
            log.exception("answering a transaction failed")
            _fail_unanswered(batch, InternalBrokerError(f"answering the write failed: {exc!r}"))

    def release(self, batch: Sequence[PendingOp], results: Sequence[outcome.Outcome[Any]]) -> None:
        """Loop thread: answer held ops (:meth:`CommitHooks.hold`) with their results,
        then flush the answers (:meth:`CommitHooks.answered`). Never raises."""
        self._resolve(batch, results)
        self._answered()

    def fail(self, batch: Sequence[PendingOp], exc: BaseException) -> None:
        """Loop thread: answer ops with ``exc`` (every op gets its own
        ``outcome.Error``), then flush the answers. Never raises."""
        _fail_unanswered(batch, exc)
        self._answered()

    def _fail(self, batch: list[PendingOp], exc: BaseException) -> None:
        """The whole transaction failed: every op gets its own ``outcome.Error``."""
        self.fail(batch, exc)

    def _answered(self) -> None:
        try:
            self.hooks.answered()
        except Exception:
            log.exception("the answered hook failed")


def _fail_unanswered(batch: Sequence[PendingOp], exc: BaseException) -> None:
    """Answer the ops of ``batch`` not answered yet with ``exc`` (each op is answered
    once: its callback stages the client's response)."""
    for p in batch:
        if not p.done.is_set():
            p.resolve(outcome.Error(exc))


def _inline_size(pending: list[PendingOp]) -> float:
    """The bytes a batch writes, or infinity when one of its ops is not for the loop."""
    total = 0
    for p in pending:
        size = None if p.op is None else p.op.inline_size()
        if size is None:
            return math.inf
        total += size
    return total


def _first_call(pending: list[PendingOp], limit: int) -> int | None:
    """The index of the first :meth:`Appender.call` among the first ``limit`` queued
    items (None: none there)."""
    for i, p in enumerate(pending[:limit]):
        if p.fn is not None:
            return i
    return None


def _resolve_call(p: PendingOp, result: outcome.Outcome[Any]) -> None:
    """Loop thread: answer a :meth:`Appender.call`."""
    p.resolve(result)
