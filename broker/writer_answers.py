"""The one thread crossing: the appender's writer thread answers parked pulls.

**The rule.** Sockets are written by loop code only -- with this one exception,
and all of it is here: right after a commit, in the appender's writer thread (the
broker's :meth:`~equeue.broker.appender.CommitHooks.written` hook, the one hook that
runs there), :func:`answer_parked_pulls` claims the pulls parked on the queues the commit
touched, and each claimed pull's :class:`PullAnswer` reads the new records from the
store (an LMDB read transaction of its own) and writes the answer to the consumer's
socket through :meth:`equeue.broker.output.Output.write_from_thread` (the socket end; it
holds the output's lock, the only reason that lock exists). What the writer thread
may touch: the store's reads, the parked-pull table (under its lock), the output
(under its lock), and the loop's token to wake the pull tasks. It never touches the
counters (the woken pull task counts what was sent), the group registry, or any
trio object but through ``TrioToken.run_sync_soon``. Anything it cannot do at once
-- the output is busy, the topic changed, nothing new for this pull's filter, a
damaged record -- it leaves to the woken pull task, which reads and answers from
the loop as if the crossing did not exist. At most :data:`MAX_THREAD_ANSWERS` pulls
are answered per commit, so a crowd of long-pollers cannot delay the produce
acknowledgements.

**Inline commits.** With ``--flush async`` a small transaction may commit on the loop
(:meth:`equeue.broker.appender.Appender.kick`); the same ``written`` hook then runs this
module on the loop, where writing the socket is no crossing at all.

**Plain TCP only.** The crossing writes raw bytes to the socket's fd, which a TLS
connection cannot take (its record layer belongs to the loop's ``trio.SSLStream``):
a TLS connection's output is in *stream-only* mode (:mod:`equeue.broker.output`, "write
modes"), its :meth:`~equeue.broker.output.Output.idle` is always false, so its parked pulls
are answered by the woken pull task on the loop, through the connection's writer
task.

**Why it exists.** Without it a commit's new message reaches a long-polling consumer
through two hops of the loop (the answer posted back to the loop, then the woken pull
task reading it); the writer thread saves both. What that measured, when it came in
and when it moved here, is in docs/benchmarks.md ("L1: where the time went, and what
changed").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from equeue import control
from equeue.broker.longpoll import ParkedPulls
from equeue.broker.storage import ReadResult, StoreReader
from equeue.errors import EQueueError
from equeue.protocol import PullStatus
from equeue.wire import delivered_records

log = logging.getLogger("equeue.broker")

__all__ = ["MAX_THREAD_ANSWERS", "PullAnswer", "ThreadWritable", "answer_parked_pulls"]

#: at most this many parked pulls are answered by the writer thread per commit (the
#: rest are woken and answer from the loop), so a crowd of long-polling consumers on
#: one queue cannot hold up the produce answers and the next transaction for long
MAX_THREAD_ANSWERS = 64

#: encodes a pull answer: (status, min, max, next offset, batches) -> parts
PullEncoder = Callable[..., list[bytes]]


def delivered(got: ReadResult, offset: int) -> int:
    """How many records a read delivers from ``offset`` (the metrics' messages out)."""
    return delivered_records(got.batches, offset, got.next_offset)


class ThreadWritable(Protocol):
    """The socket end of the crossing (:class:`equeue.broker.output.Output`)."""

    def idle(self) -> bool: ...
    def write_from_thread(self, request_id: int, parts: list[bytes]) -> int: ...


class PullAnswer:
    """What a parked pull leaves for the writer thread: how to read and where to
    write its answer. Built by the pull handler on the loop; called in the writer
    thread. The pull task is parked on ``info`` and ``offset`` and does not change
    them meanwhile."""

    __slots__ = (
        "encode", "info", "max_bytes", "max_messages", "offset", "output", "queue_id", "request_id", "store",
        "tags", "verify", "whole",
    )  # fmt: skip

    def __init__(
        self, store: StoreReader, output: ThreadWritable, request_id: int, info: control.TopicInfo,
        queue_id: int, offset: int, max_messages: int, max_bytes: int, tags: frozenset[bytes] | None,
        verify: bool, encode: PullEncoder, whole: bool = False,
    ) -> None:  # fmt: skip
        self.store = store
        self.output = output
        self.request_id = request_id
        self.info = info
        self.queue_id = queue_id
        self.offset = offset
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.tags = tags
        self.verify = verify
        self.encode = encode
        self.whole = whole

    def __call__(self) -> tuple[int, int] | None:
        """Writer thread: (messages, bytes) written, or None when nothing was (the
        pull task then answers from the loop). Raises EQueueError for a damaged
        record (the pull task reports it)."""
        if not self.output.idle():
            return None  # the writer task is busy: the loop answers
        info, qid = self.info, self.queue_id
        now = self.store.topics.get(info.name)
        if now is None or now.topic_id != info.topic_id or qid >= now.queues:
            return None
        got = self.store.read_queue(
            now, qid, self.offset, self.max_messages, self.max_bytes, self.tags, self.verify, self.whole
        )
        if got.status is not PullStatus.FOUND:
            return None
        parts = self.encode(got.status, got.min_offset, got.max_offset, got.next_offset, got.batches)
        size = self.output.write_from_thread(self.request_id, parts)
        return (delivered(got, self.offset), size) if size else None


def answer_parked_pulls(parked: ParkedPulls, queues: Iterable[tuple[int, int]]) -> None:
    """Writer thread, after a commit touching ``queues``: claim their parked pulls,
    let (up to MAX_THREAD_ANSWERS of) them answer themselves, and wake every pull
    task claimed, whatever happens (never raises)."""
    claimed = parked.claim(queues)
    try:
        for p in claimed[:MAX_THREAD_ANSWERS]:
            if p.answer is None:
                continue
            try:
                p.outcome = p.answer()
            except EQueueError:  # e.g. a damaged record: the pull task reports it
                p.outcome = None
            except Exception:
                log.exception("answering a parked pull from the writer thread failed")
                p.outcome = None
    finally:
        parked.release(claimed)
