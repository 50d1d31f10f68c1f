"""Producer building blocks with no networking: due times, batches and the
per-message send handle.

A :class:`_Batch` is the unit the producer sends: records for one (topic, queue),
sent as one idempotent produce request with one base sequence. Every message of a
batch gets a :class:`SendHandle` that points at (batch, index); resolving the batch
resolves all of its handles at once, and a handle builds its :class:`SendResult`
only when asked (cheap when nobody looks).

Callbacks (``send_async(on_delivery=...)``, :meth:`SendHandle.add_done_callback`) are
kept per batch, in a list made only when one is registered, and run by the lane on
the loop thread once the batch is released (:meth:`_Batch.run_callbacks`).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import trio

from equeue import wire
from equeue.errors import ConfigError, OperationTimeout
from equeue.logs import RateLimitedLog
from equeue.models import SendResult
from equeue.times import epoch_ms

__all__ = ["DeliveryCallback", "DoneCallback", "SendHandle", "deliver_at_ms"]

#: ``on_delivery(result, error)``: exactly one of the two is None (the SendResult of a
#: stored or scheduled message, or the error its send failed with)
DeliveryCallback = Callable[[SendResult | None, BaseException | None], object]
#: ``fn(handle)``, given to :meth:`SendHandle.add_done_callback`
DoneCallback = Callable[["SendHandle"], object]
#: one registered callback: (fn, index in the batch, the handle for a done callback
#: or None for a delivery callback)
_Callback = tuple[Callable[..., object], int, "SendHandle | None"]

log = logging.getLogger("equeue.producer")
#: a raising callback is logged at most once per 10 s per topic
_callback_errors = RateLimitedLog(log, 10.0, time.monotonic)

def deliver_at_ms(delay: float | dt.timedelta | None, deliver_at: dt.datetime | None) -> int:
    """A record's due time in ms since the epoch (0 = deliver now).

    ``delay`` is seconds or a timedelta; ``deliver_at`` an aware datetime or a naive
    one read as UTC (:func:`equeue.times.epoch_ms`, the one rule). A due time in the
    past means now. Raises ConfigError when both are given or a value has the wrong type.
    """
    if delay is None and deliver_at is None:
        return 0
    if delay is not None and deliver_at is not None:
        raise ConfigError("give either delay or deliver_at, not both")
    now = time.time()
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float):
            seconds = float(delay)
        else:
            raise ConfigError(f"delay must be seconds or a timedelta, not {type(delay).__name__}")
        due = now + seconds
        return int(due * 1000) if due > now else 0
    if not isinstance(deliver_at, dt.datetime):
        raise ConfigError(f"deliver_at must be a datetime, not {type(deliver_at).__name__}")
    ms = epoch_ms(deliver_at)
    return ms if ms > now * 1000 else 0


#: guards the lazy creation of a batch's thread event
_THREAD_EVENTS = threading.Lock()


class _Batch:
    """Records for one (topic, queue), sent as one produce request (one record batch).

    The submit path appends each encoded record to ``records`` (and its size to
    ``nbytes``) under the buffer lock.
    ``pid``/``seq`` are assigned when the batch is first sent and kept across
    retries (the broker deduplicates on them). ``delayed`` batches hold only
    delayed records, others only immediate ones, so the offsets in the answer map
    onto records without ambiguity.
    """

    __slots__ = (
        "answer",
        "attempts",
        "batch",
        "callbacks",
        "called",
        "deadline",
        "delayed",
        "error",
        "finished",
        "first_at",
        "lock",
        "nbytes",
        "pid",
        "queue_id",
        "records",
        "sent_behind",
        "seq",
        "tdone",
        "thdone",
        "topic",
    )  # fmt: skip

    def __init__(
        self, topic: str, queue_id: int, delayed: bool, deadline: float, now: float, lock: threading.Lock
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        #: the encoded records, in submit order (a handle's index is its position here)
        self.records: list[bytes] = []
        self.nbytes = 0
        self.delayed = delayed
        self.deadline = deadline
        self.first_at = now
        self.pid: bytes | None = None
        self.seq = -1
        #: the records as a producer batch (compressed or not), built on the first
        #: send and kept for retries
        self.batch: bytes | None = None
        self.attempts = 0
        #: sent while an earlier request of the lane was in flight (an
        #: OutOfOrderSequence answer is then expected, not a fault)
        self.sent_behind = False
        self.answer: wire.ProduceResponse | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.tdone = trio.Event()
        #: made only when a thread blocks on the batch (:meth:`thread_event`): most
        #: batches are awaited in trio, and a threading.Event costs a lock and a
        #: condition to build
        self.thdone: threading.Event | None = None
        #: the buffer lock: guards ``callbacks`` and ``called``
        self.lock = lock
        #: registered callbacks, in order (None: none); taken by the lane when it
        #: releases the finished batch, which sets ``called``
        self.callbacks: list[_Callback] | None = None
        self.called = False

    def thread_event(self) -> threading.Event:
        """The event a blocking caller waits on (any thread); set once finished."""
        ev = self.thdone
        if ev is None:
            with _THREAD_EVENTS:
                ev = self.thdone
                if ev is None:
                    ev = self.thdone = threading.Event()
            # finish() writes ``finished`` before it reads ``thdone``, and we wrote
            # ``thdone`` before reading ``finished``: one of us sets the event
            if self.finished:
                ev.set()
        return ev

    def finish(self, answer: wire.ProduceResponse | None, error: BaseException | None) -> None:
        """Resolve every handle of the batch (loop thread only)."""
        if self.finished:
            return
        self.answer, self.error, self.finished = answer, error, True
        self.tdone.set()
        ev = self.thdone
        if ev is not None:
            ev.set()

    def add_callback(self, cb: _Callback) -> bool:
        """Register ``cb`` (the caller holds ``lock``); False when the batch's callbacks
        already ran (the caller then runs it itself, with :meth:`run_callbacks`)."""
        if self.called:
            return False
        cbs = self.callbacks
        if cbs is None:
            self.callbacks = [cb]
        else:
            cbs.append(cb)
        return True

    def run_callbacks(self, callbacks: list[_Callback]) -> None:
        """Call ``callbacks`` in order with the batch's outcome (finished batch). An
        Exception a callback raises is logged (rate-limited) and swallowed: the
        producer goes on, and so do the callbacks after it."""
        for fn, index, handle in callbacks:
            try:
                if handle is not None:
                    fn(handle)
                elif self.error is not None:
                    fn(None, self.error)
                else:
                    fn(self.result(index), None)
            except Exception as exc:
                _callback_errors.log(
                    logging.ERROR, self.topic, "a send callback on %s raised (ignored): %r",
                    self.topic, exc, exc_info=exc,
                )  # fmt: skip

    def result(self, index: int) -> SendResult:
        if self.error is not None:
            raise self.error
        a = self.answer
        assert a is not None
        if a.first_global < 0:  # a duplicate whose original answer is forgotten, or all scheduled
            return SendResult(self.topic, self.queue_id, -1, -1, a.scheduled > 0, a.duplicate)
        if self.delayed and a.scheduled:  # some or all scheduled: which ones is unknown
            return SendResult(self.topic, self.queue_id, -1, -1, True, a.duplicate)
        return SendResult(
            self.topic, self.queue_id, a.first_queue + index, a.first_global + index, False, a.duplicate
        )


class SendHandle:
    """The pending result of one ``send_async``.

    Blocking code calls :meth:`result` (optionally with a timeout); trio code
    awaits the handle (``r = await handle``) or :meth:`wait`. Raises what the send
    raised: a mapped broker error, ConnectionBroken after the retries,
    OperationTimeout after ``send_timeout``, ClientClosed if the producer closed
    first.

    :meth:`add_done_callback` registers a function called once the send finished.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        """Whether the send finished (stored, or failed)."""
        return self._batch.finished

    @property
    def first_in_batch(self) -> bool:
        """Whether this message opened its batch (it is the batch's first record). The
        fronts that buffer from their own thread yield to their event loop once per new
        batch, not once per message."""
        return self._index == 0

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds (None: until then) until the send finished;
        return :meth:`done`. Never raises the send's error (:meth:`result` does), so a
        blocking front can wait in slices and check its loop between them. Not from the
        producer's own trio loop: await the handle there."""
        b = self._batch
        return b.finished or b.thread_event().wait(timeout)

    def result(self, timeout: float | None = None) -> SendResult:
        """Block until the send finished; return where the message was stored.

        Raises OperationTimeout if ``timeout`` seconds pass first (the send goes on).
        Never call it without a timeout from the producer's own trio loop: await
        the handle there.
        """
        b = self._batch
        if not b.finished and not b.thread_event().wait(timeout):
            raise OperationTimeout(f"send not finished after {timeout} s")
        return b.result(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block like :meth:`result`; return the failure (None if stored)."""
        b = self._batch
        if not b.finished and not b.thread_event().wait(timeout):
            raise OperationTimeout(f"send not finished after {timeout} s")
        return b.error

    def add_done_callback(self, fn: DoneCallback) -> None:
        """Call ``fn(handle)`` once, when the send finished (stored or failed).

        Callbacks run in registration order on the producer's trio loop thread (the
        thread of ``AsyncProducer``'s loop, or the sync ``Producer``'s loop thread),
        right after the outcome is known: before a trio task awaiting the handle
        resumes and before a ``flush`` waiting for it returns (a thread blocked in
        :meth:`result` may wake first). Keep them quick and non-blocking. If the handle's callbacks already ran, ``fn``
        is called at once, on the calling thread. An Exception ``fn`` raises is logged
        (rate-limited) and swallowed. Raises TypeError if ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"callback must be callable, not {type(fn).__name__}")
        b = self._batch
        cb: _Callback = (fn, self._index, self)
        with b.lock:
            if b.add_callback(cb):
                return
        b.run_callbacks([cb])

    async def wait(self) -> SendResult:
        """Wait (in trio) until the send finished; return or raise as :meth:`result`."""
        b = self._batch
        if not b.finished:
            await b.tdone.wait()
        return b.result(self._index)

    def __await__(self) -> Generator[Any, None, SendResult]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        b = self._batch
        state = "pending" if not b.finished else ("failed" if b.error else "done")
        return f"<SendHandle {b.topic}/{b.queue_id} #{self._index} {state}>"
