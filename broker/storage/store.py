"""The store: open the LMDB environment, recover the committed state, run write
transactions and publish what they changed.

Writes: :meth:`Store.write` runs a list of :class:`~equeue.broker.storage.writes.WriteOp`
in ONE write transaction (group commit), opened and committed inside that one
synchronous call, and must be called from one thread at a time (the appender's
writer thread). Each op checks its preconditions before it writes anything and may
raise an :class:`~equeue.errors.EQueueError` then (only that op fails); a failure
after writes began (map full, disk full, I/O) aborts the whole transaction and
fails every op in it -- nothing is half-written.

Publishing: after the commit, the writer builds a new immutable
:class:`~equeue.broker.storage.view.StoreView` and swaps it in with one assignment
(``self.view = ...``); readers never see an uncommitted message or a half-applied
transaction. The writer touches only LMDB and the view it publishes.

Replicated (``Store(..., replicated=True)``): every committed transaction also
writes one replication log entry, its physical changes, in the same LMDB
transaction (:mod:`equeue.broker.storage.recorder` records them,
:mod:`equeue.broker.storage.replication` keeps the log). The store then keeps two views:
:attr:`Store.head`, the last commit (what the next transaction starts from), and
:attr:`Store.view`, what readers see, advanced only by
``store.replication.publish_upto`` (the high watermark). :attr:`Store.replication`
(:mod:`equeue.broker.storage.replicated`) owns the log's state, those views' queue,
the log reads and the replication writes; it is None when not replicated, and then
``view is head`` always.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import lmdb
import outcome

from equeue import control
from equeue.broker.storage import layout
from equeue.broker.storage.convert import convert_to_batches
from equeue.broker.storage.dirlock import DirLock
from equeue.broker.storage.filecheck import RECOVERY_HINT, check_data_file
from equeue.broker.storage.reader import MAX_RECORDS_LEN, StoreReader
from equeue.broker.storage.recorder import Recorder, RecordingTxn
from equeue.broker.storage.replicated import StoreReplication
from equeue.broker.storage.replication import ReplicationLog
from equeue.broker.storage.topics import decode_topic_record
from equeue.broker.storage.view import QueueState, StoreView, frozen_map
from equeue.broker.storage.writes import WriteContext, WriteOp, WriteOutcome, now_ms, store_error
from equeue.errors import (
    CorruptRecord,
    EQueueError,
    InternalBrokerError,
    StoreDamaged,
    StoreError,
    StoreFull,
)
from equeue.logs import RateLimitedLog
from equeue.wire import batches

log = logging.getLogger("equeue.store")
#: one traceback per op type per 10 s for ops that fail unexpectedly in a transaction
_op_failures = RateLimitedLog(log, 10.0, time.monotonic)


class Store(StoreReader):
    """The LMDB environment, its write path and its published view (and, when
    replicated, its replication log and the view below the high watermark)."""

    #: the last committed state: what the next transaction starts from
    head: StoreView
    #: what readers see (``head`` itself unless replicated)
    view: StoreView

    def __init__(
        self,
        path: str | Path,
        *,
        map_size: int = 8 << 30,
        sync: bool = True,
        clock: Callable[[], int] = now_ms,
        replicated: bool = False,
    ) -> None:
        """Open (or create) the store at ``path`` and recover its state. ``clock``
        (wall-clock ms) stamps each transaction: store times, due checks, producer
        last-seen times. ``replicated``: keep the replication log (see the module
        docstring); a store is opened replicated every time or never.

        Raises DataDirLocked when another store holds the directory (see
        :mod:`equeue.broker.storage.dirlock`); StoreTruncated when ``data.mdb`` is shorter
        than its pages (checked before LMDB maps it, :mod:`equeue.broker.storage.filecheck`);
        StoreDamaged when a header, meta record or topic description is damaged;
        StoreError when LMDB cannot open it otherwise or its format is unknown. Each
        is one line naming the file and how to recover.
        """
        self.path = Path(path)
        self.clock = clock
        self.path.mkdir(parents=True, exist_ok=True)
        self.sync_commits = sync
        self.map_size = map_size
        self.replicated = replicated
        #: the replication log, its views below the high watermark and the
        #: replication writes (:mod:`equeue.broker.storage.replicated`); None when
        #: not replicated
        self.replication: StoreReplication | None = None
        #: (topic, field, value) of stored retention values already warned about
        self._warned_legacy: set[tuple[str, str, int]] = set()
        self._lock = DirLock(self.path)
        self._lock.acquire()
        try:
            self._open(map_size, sync)
        except BaseException:
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self._lock.release()
            raise

    def _open(self, map_size: int, sync: bool) -> None:
        check_data_file(self.path)  # before LMDB maps it: a truncated file is a SIGBUS
        try:
            self.env = lmdb.open(
                str(self.path), map_size=map_size, sync=sync,
                max_dbs=len(layout.DATABASES) + len(layout.REPL_DATABASES) + 2,
                metasync=sync, readahead=False, max_readers=512, writemap=False,
            )  # fmt: skip
        except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError, lmdb.PageNotFoundError) as exc:
            raise self._damaged("LMDB header", exc) from exc
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc
        with self._reading("database catalogue and format record"), self.env.begin(write=True) as txn:
            self.db = {name: self.env.open_db(name, txn=txn) for name in layout.DATABASES}
            fmt = txn.get(b"format", db=self.db[b"meta"])
            old_format = layout.unpack_u32(fmt) if fmt is not None else layout.FORMAT_VERSION
            if old_format not in layout.FORMATS_CONVERTED:
                old_format = 0
            if fmt is None:
                txn.put(b"format", layout.pack_u32(layout.FORMAT_VERSION), db=self.db[b"meta"])
            elif layout.unpack_u32(fmt) != layout.FORMAT_VERSION and not old_format:
                raise StoreError(
                    f"store at {self.path} has format {layout.unpack_u32(fmt)}, this broker reads "
                    f"{layout.FORMAT_VERSION}: run the broker version that wrote it"
                )
            had_log = txn.get(layout.REPL_DATABASES[0]) is not None
            rlog = None
            if self.replicated:
                rlog = ReplicationLog(self.env, [self.db[n] for n in layout.DATABASES], txn)
                if not had_log and self._has_data(txn):
                    rlog.start_after_existing_data(txn)
                    log.warning("the store at %s holds data written without a replication log: its log "
                                "starts at position 1, so a replica following it copies the store first",
                                self.path)  # fmt: skip
            elif had_log:
                for name in layout.REPL_DATABASES:
                    txn.drop(self.env.open_db(name, txn=txn), delete=True)
                log.warning("the store at %s was replicated and is opened standalone: its replication log "
                            "is dropped (writes from now on are not in it; as a replica again it starts a new "
                            "log at position 1)", self.path)  # fmt: skip
        if rlog is not None:
            with self._reading("replication log"):
                rlog.load()
            self.replication = StoreReplication(self, rlog)
        if old_format:
            convert_to_batches(self.env, self.db, self.path, old_format, self.replication)
        #: writer thread only: the last schedule sequence handed out
        self._sched_seq = time.time_ns()
        self.head = self.view = self.recover_view()

    def _has_data(self, txn: lmdb.Transaction) -> bool:
        """Anything stored besides the format record."""
        return any(
            txn.stat(self.db[name])["entries"] > (1 if name == b"meta" else 0) for name in layout.DATABASES
        )  # fmt: skip

    def _damaged(self, what: str, exc: BaseException) -> StoreDamaged:
        """The one-line refusal for damaged store contents: where, what, how to recover."""
        text = str(exc) or type(exc).__name__
        return StoreDamaged(f"the store at {self.path} is damaged ({what}: {text}); {RECOVERY_HINT}")

    @contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn what a damaged record raises while the store opens (a short value, bad
        JSON, an LMDB page error) into :meth:`_damaged`, naming ``what`` was read."""
        try:
            yield
        except EQueueError as exc:
            if isinstance(exc, StoreError | StoreDamaged):
                raise
            raise self._damaged(what, exc) from exc
        except (lmdb.Error, struct.error, ValueError, TypeError, KeyError) as exc:
            raise self._damaged(what, exc) from exc

    # ------------------------------------------------------------------ recovery
    def _warn_legacy_retention(self, topic: str, legacy: dict[str, int]) -> None:
        """Warn, once per store, about each stored retention value no current version
        writes (:func:`~equeue.broker.storage.topics.decode_topic_record`): it reads as
        keep forever, which may not be what was meant."""
        for name, value in legacy.items():
            if (topic, name, value) in self._warned_legacy:
                continue
            self._warned_legacy.add((topic, name, value))
            log.warning(
                "topic %r: its stored %s is %d, not a valid setting (an earlier version took it and "
                "deleted every message on it); it is read as -1, keep forever. Set the retention "
                "you want: equeue topic alter %s --%s VALUE (or 'default')",
                topic, name, value, topic, "retention" if name == "retention_ms" else "retention-bytes",
            )  # fmt: skip

    def recover_view(self) -> StoreView:
        """The committed state, from last keys and the small tables (no full scan): at
        open, and when ``replication.reload`` rebuilds the views after replicated
        changes. Raises StoreDamaged for a damaged record."""
        db = self.db
        topics: dict[str, control.TopicInfo] = {}
        queues: dict[int, dict[int, QueueState]] = {}
        pending: dict[int, int] = {}
        offsets: dict[tuple[str, str, int], int] = {}
        reading = self._reading
        with reading("store"), self.env.begin() as txn:
            meta = db[b"meta"]
            with reading('meta record "next_global"'):
                ng = txn.get(b"next_global", db=meta)
                next_global = layout.unpack_u64(ng) if ng else 0
            with reading("message log"):
                cur = txn.cursor(db=db[b"messages"])
                if cur.last():
                    try:
                        count = batches.batch_head(batches.stored_batch(cur.value()), MAX_RECORDS_LEN,
                                                   verify=False).count  # fmt: skip
                    except CorruptRecord:
                        count = 1  # a damaged last batch: its reads say so; "next_global" covers it
                    next_global = max(next_global, layout.global_of(cur.key()) + count)
            with reading('meta record "next_topic_id"'):
                nt = txn.get(b"next_topic_id", db=meta)
                next_topic_id = layout.unpack_u32(nt) if nt else 1
            with reading('meta record "deleting"'):
                dl = txn.get(b"deleting", db=meta)
                deleting = tuple(int(t) for t in json.loads(dl)) if dl else ()
            for k, v in txn.cursor(db=db[b"topics"]):
                with reading(f"topic metadata of {bytes(k)!r}"):
                    info, legacy = decode_topic_record(v)
                    topics[bytes(k).decode()] = info
                self._warn_legacy_retention(info.name, legacy)
            with reading("queue index and stats (qindex, qstats)"):
                qidx = txn.cursor(db=db[b"qindex"])
                for info in topics.values():
                    for q in range(info.queues):
                        next_offset = size = 0
                        sv = txn.get(layout.queue_key(info.topic_id, q), db=db[b"qstats"])
                        if sv:
                            next_offset, size = layout.unpack_qstats(sv)
                        # last key of the queue: set_range past it, step back
                        if qidx.set_range(layout.qindex_key(info.topic_id, q + 1, 0)):
                            ok = qidx.prev()
                        else:
                            ok = qidx.last()
                        if ok:
                            t, qq, off = layout.unpack_qindex_key(qidx.key())
                            if (t, qq) == (info.topic_id, q):
                                qv = qidx.value()
                                count = layout.unpack_qindex_value(qv)[1] if len(qv) == layout.QINDEX_VALUE_SIZE else 1
                                next_offset = max(next_offset, off + count)
                        min_offset = next_offset
                        if qidx.set_range(layout.qindex_key(info.topic_id, q, 0)):
                            t, qq, off = layout.unpack_qindex_key(qidx.key())
                            if (t, qq) == (info.topic_id, q):
                                min_offset = off
                        queues.setdefault(info.topic_id, {})[q] = QueueState(next_offset, min_offset, size)
            with reading("delayed-message counts (sched_count)"):
                for k, v in txn.cursor(db=db[b"sched_count"]):
                    pending[layout.unpack_sched_count_key(k)] = layout.unpack_u64(v)
            with reading("consumer offsets"):
                for k, v in txn.cursor(db=db[b"offsets"]):
                    offsets[layout.unpack_offset_key(k)] = layout.unpack_u64(v)
            with reading("skip markers"):
                skipped = self._recover_skips(txn, topics, queues)
            with reading("pause markers"):
                paused = self._recover_pauses(txn)
        return StoreView(
            frozen_map(topics), frozen_map({t: frozen_map(qs) for t, qs in queues.items()}),
            frozen_map(offsets), frozen_map(pending),
            deleting, next_global, next_topic_id, skipped=frozen_map(skipped),
            paused_topics=frozenset(paused["topic"]), paused_groups=frozenset(paused["group"]),
        )  # fmt: skip

    def _recover_pauses(self, txn: lmdb.Transaction) -> dict[str, set[str]]:
        """The paused topics and groups, by kind (:mod:`equeue.broker.storage.pauses`)."""
        found: dict[str, set[str]] = {kind: set() for kind in layout.PAUSE_KINDS}
        cur = txn.cursor(db=self.db[b"meta"])
        if cur.set_range(layout.PAUSE_PREFIX):
            for k in cur.iternext(values=False):
                if not bytes(k).startswith(layout.PAUSE_PREFIX):
                    break
                kind, name = layout.unpack_pause_key(k)
                if kind in found:
                    found[kind].add(name)
        return found

    def _recover_skips(
        self, txn: lmdb.Transaction, topics: dict[str, control.TopicInfo], queues: dict[int, dict[int, QueueState]]
    ) -> dict[tuple[int, int], frozenset[int]]:
        """The skip markers of live topics within their queues' retained ranges (the
        others are left behind by retention or a topic deletion: ignored)."""
        live = {t.topic_id for t in topics.values()}
        found: dict[tuple[int, int], set[int]] = {}
        cur = txn.cursor(db=self.db[b"meta"])
        if cur.set_range(layout.SKIP_PREFIX):
            for k in cur.iternext(values=False):
                if not bytes(k).startswith(layout.SKIP_PREFIX):
                    break
                t, q, o = layout.unpack_skip_key(k)
                st = queues.get(t, {}).get(q)
                if t in live and st is not None and st.min_offset <= o < st.next_offset:
                    found.setdefault((t, q), set()).add(o)
        return {key: frozenset(offs) for key, offs in found.items()}

    def _next_sched_seq(self) -> int:
        self._sched_seq += 1
        return self._sched_seq

    # ------------------------------------------------------------------ writes
    def write(self, ops: Sequence[WriteOp]) -> WriteOutcome:
        """Run ``ops`` in one write transaction and publish the new view (call from
        one thread at a time).

        Returns each op's result as an ``outcome.Value``, or ``outcome.Error`` with
        the EQueueError that op raised. One op's failure never fails the others: an
        op that fails after it started writing, or with anything but an EQueueError,
        is answered InternalBrokerError and the transaction is run again without it
        (the ops before it commit on their own, then the ops after it), so its
        partial writes never commit and the others are not lost. A replicated store
        also commits a batch whose ops append more than :data:`MAX_ENTRY_RECORDS` of
        records in several transactions (one log entry each). Raises StoreFull /
        StoreError when the (first) transaction as a whole failed: then no op took
        effect; when a later one fails, the ops committed before keep their results
        and the others are answered that error.
        """
        parts: list[WriteOutcome] = []
        rest = ops
        while True:
            try:
                done = self._transaction(rest)
                if isinstance(done, WriteOutcome):
                    parts.append(done)
                    if len(done.results) < len(rest):  # replicated: the entry was full
                        rest = rest[len(done.results) :]
                        continue
                    break
                k, err = done
                if k:
                    parts.append(self.write(rest[:k]))  # they succeeded once: rarely split again
            except (StoreFull, StoreError) as exc:
                if not parts:
                    raise
                parts.append(WriteOutcome([outcome.Error(exc)] * len(rest), set(), position=self._position()))
                break
            parts.append(WriteOutcome([outcome.Error(err)], set(), position=self._position()))
            rest = rest[k + 1 :]
            if not rest:
                break
        return parts[0] if len(parts) == 1 else WriteOutcome.merge(parts)

    def _transaction(self, ops: Sequence[WriteOp]) -> WriteOutcome | tuple[int, EQueueError]:
        """One write transaction over ``ops``: committed (its outcome), or aborted
        because op ``k`` failed in a way that may have left partial writes: then
        ``(k, the error to answer it with)``."""
        repl = self.replication
        rlog = None
        if repl is not None:
            repl.check_writable()
            rlog = repl.log
        try:
            txn = self.env.begin(write=True)
        except lmdb.Error as exc:
            raise store_error(exc, self.path) from exc
        if rlog is None:
            w = WriteContext(self.head, txn, self.db, self.clock(), self._next_sched_seq)
        else:
            rec = Recorder()
            w = WriteContext(self.head, RecordingTxn(txn, rec, rlog.indexes), self.db, self.clock(), self._next_sched_seq)
        results: list[outcome.Outcome[Any]] = []
        try:
            for k, op in enumerate(ops):
                wrote, w.wrote = w.wrote, False
                try:
                    results.append(outcome.Value(op.apply(w)))
                except EQueueError as exc:
                    if w.wrote:  # it failed after writing: drop its partial writes
                        txn.abort()
                        return k, exc
                    results.append(outcome.Error(exc))
                except lmdb.Error as exc:
                    err = store_error(exc, self.path)
                    if isinstance(err, StoreFull):
                        raise  # the transaction as a whole: handled below
                    txn.abort()
                    return k, _op_failed(op, exc)
                except Exception as exc:
                    txn.abort()
                    return k, _op_failed(op, exc)
                w.wrote = w.wrote or wrote
                if rlog is not None and w.stored > MAX_ENTRY_RECORDS and k + 1 < len(ops):
                    break  # the other ops go in the next transaction: its entry stays fetchable
            if not w.wrote:
                txn.abort()
                return WriteOutcome(results, set(), position=self._position())
            w.stage_counters()
            state = None if rlog is None else rlog.append(txn, rec.runs, w.now, w.next_global)
            txn.commit()
        except lmdb.Error as exc:
            txn.abort()
            err = store_error(exc, self.path)
            log.error("%s", err)
            raise err from exc
        except BaseException:
            txn.abort()
            raise
        view = self.head = w.next_view()
        if rlog is None:
            self.view = view  # committed: publish, one reference swap
            return WriteOutcome(results, w.touched, any(d > 0 for d in w.sched_delta.values()))
        assert state is not None and repl is not None
        out = WriteOutcome(results, w.touched, any(d > 0 for d in w.sched_delta.values()), state.position)
        repl.committed(state, view, out)
        return out

    def _position(self) -> int:
        """The replication log's next position (0 when not replicated): what a
        :class:`WriteOutcome` carries."""
        return 0 if self.replication is None else self.replication.position

    def sync(self) -> None:
        """Force committed data to disk (the ``async`` flush policy calls this)."""
        self.env.sync(True)

    def close(self) -> None:
        """Flush, close LMDB and release the data directory (last)."""
        try:
            self.env.sync(True)
        finally:
            try:
                self.env.close()
            finally:
                self._lock.release()


#: a replicated store commits a transaction once its ops appended this many record
#: bytes and runs the rest in the next one, so one log entry (fetched whole by a
#: follower, in one frame of at most 256 MiB) stays far below a frame whatever the batch
MAX_ENTRY_RECORDS: Final = 32 << 20


def _op_failed(op: WriteOp, exc: BaseException) -> EQueueError:
    """The error one op that failed unexpectedly inside a transaction is answered with
    (the others of its transaction are unaffected); its traceback is logged,
    rate-limited (a client may trigger it again and again)."""
    _op_failures.log(
        logging.ERROR, type(op).__name__, "write op %s failed; only its own request fails",
        type(op).__name__, exc_info=exc,
    )  # fmt: skip
    return InternalBrokerError(f"the write failed: {exc!r}")
