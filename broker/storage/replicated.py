"""The replication side of a replicated :class:`~equeue.broker.storage.store.Store`:
``store.replication`` (None for a store that is not replicated).

:class:`StoreReplication` owns what the store keeps for replication: its
:class:`~equeue.broker.storage.replication.ReplicationLog` and the log's state, the
committed transactions not visible yet (readers see only what is below the high
watermark: :meth:`StoreReplication.publish_upto`), the reads a leader and its
followers make of the log (any thread), and the write steps a follower or a leader
runs on the writer thread through ``Appender.call`` (applying entries, truncating,
a snapshot copy, an epoch marker, a trim, :meth:`StoreReplication.reload`). Each
write step opens and commits its LMDB write transaction inside that one
synchronous call. The store's own write path (:meth:`Store.write`) records each
commit here (:meth:`StoreReplication.committed`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import lmdb

from equeue.broker.storage import layout
from equeue.broker.storage.replication import LogState, ReplicationLog
from equeue.broker.storage.view import StoreView
from equeue.broker.storage.writes import WriteOutcome, store_error
from equeue.errors import StoreError
from equeue.wire.replog import EntryHeader

__all__ = ["StoreReplication"]


class ReplicatedHost(Protocol):
    """What :class:`StoreReplication` uses of its :class:`Store`."""

    path: Path
    env: lmdb.Environment
    db: dict[bytes, Any]
    clock: Callable[[], int]
    #: the last committed state
    head: StoreView
    #: what readers see
    view: StoreView

    def recover_view(self) -> StoreView: ...


class StoreReplication:
    """The replication log of one replicated store, its views below the high
    watermark and the replication writes (see the module docstring)."""

    def __init__(self, store: ReplicatedHost, log: ReplicationLog) -> None:
        """``log``: the store's log databases, opened in its opening transaction and
        loaded."""
        self._store = store
        #: the log databases and their state (the store's write path appends to it)
        self.log = log
        #: committed transactions not yet visible, (end position, view, outcome)
        self._pending: deque[tuple[int, StoreView, WriteOutcome]] = deque()
        self._publish_lock = threading.Lock()
        #: apply_log / truncate / a snapshot changed LMDB under the views: no write until reload()
        self.stale = False

    # ------------------------------------------------------------------ state
    @property
    def position(self) -> int:
        """The next log position (= entries ever written)."""
        return self.log.state.position

    @property
    def log_start(self) -> int:
        """The first position still in the log."""
        return self.log.state.log_start

    @property
    def epoch(self) -> int:
        """The epoch stamped on new entries: the newest epoch of the log."""
        return self.log.state.epoch

    @property
    def last_epoch(self) -> int:
        """The epoch of entry ``position - 1`` (0 if none)."""
        return self.log.state.last_epoch

    @property
    def led_epoch(self) -> int:
        """The last epoch this store got from a group's leader (or led): ``last_epoch``,
        except 0 while it is the random epoch its data from before replication is
        counted in (a converted store has not been part of a group yet)."""
        st = self.log.state
        return 0 if st.last_epoch == st.converted_epoch else st.last_epoch

    @property
    def converted_epoch(self) -> int:
        """The epoch this store's data from before its replication log is counted in
        (0: none)."""
        return self.log.state.converted_epoch

    @property
    def consistent_at(self) -> int:
        """The store may lead or join the in-sync set only once ``position >= consistent_at``."""
        return self.log.state.consistent_at

    def epochs(self) -> list[tuple[int, int]]:
        """(epoch, first position) of every epoch the log knows, ascending."""
        return list(self.log.state.epochs)

    # ------------------------------------------------------------------ views (loop)
    def committed(self, state: LogState, view: StoreView, out: WriteOutcome) -> None:
        """The store's write path (writer thread): a transaction that appended an entry
        committed; ``state`` is the log's state after it, ``view`` the store's new
        head, visible once :meth:`publish_upto` passes ``state.position``."""
        self.log.state = state
        with self._publish_lock:
            self._pending.append((state.position, view, out))

    def publish_upto(self, hw: int) -> list[WriteOutcome]:
        """Make visible the newest committed view whose end position is at most
        ``hw``; returns the outcomes of the transactions that just became visible, in
        order (their touched queues wake parked pulls). Safe against the writer
        appending."""
        out: list[WriteOutcome] = []
        with self._publish_lock:
            pending = self._pending
            view = None
            while pending and pending[0][0] <= hw:
                _, view, o = pending.popleft()
                out.append(o)
            if view is not None:
                self._store.view = view
        return out

    def publish_all(self) -> list[WriteOutcome]:
        """:meth:`publish_upto` the log's end."""
        return self.publish_upto(self.position)

    # ------------------------------------------------------------------ reads (any thread)
    def read_log(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Log entries from ``start`` on, ``(position, entry)``: at most ``max_bytes``
        in all but at least one whole entry when ``start < position``; [] at the end.
        Raises LogTrimmed when ``start < log_start``, ValueError past the end."""
        return self.log.read_log(start, max_bytes)

    def entry_info(self, position: int) -> EntryHeader | None:
        """The header of the entry at ``position`` (None: trimmed or absent)."""
        return self.log.entry_info(position)

    def end_of_epoch(self, epoch: int) -> int:
        """KIP-101: the first position of the first epoch after ``epoch``, or the log's end."""
        return self.log.end_of_epoch(epoch)

    def log_bytes(self, start: int) -> int:
        """Bytes of the log entries from ``start`` to the end."""
        return self.log.log_bytes(start)

    def divergent_keys(self, start: int) -> list[tuple[int, bytes]]:
        """Every distinct (database index, key) changed by the entries from ``start``
        on. Raises LogTrimmed when ``start < log_start``."""
        return self.log.divergent_keys(start)

    def read_keys(self, keys: Sequence[tuple[int, bytes]]) -> tuple[int, list[bytes | None]]:
        """One read transaction: its position and each key's value (None: absent)."""
        return self.log.read_keys(keys)

    def snapshot_chunk(
        self, db: int, after: bytes | None, max_bytes: int
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes | None]:
        """One read transaction: its position, items of database index ``db`` after
        key ``after`` (None: from the first), and the last key returned (None: the
        database is done). ``db`` is one of ``layout.REPLICATED_DATABASES``."""
        return self.log.snapshot_chunk(db, after, max_bytes)

    def digests(self, range_size: int) -> tuple[int, dict[str, str]]:
        """One read transaction: its position and a checksum per replicated database
        (``messages`` per range of ``range_size`` global offsets)."""
        return self.log.digests(range_size)

    # ------------------------------------------------------------------ writes (writer thread)
    def check_writable(self) -> None:
        """Raise StoreError when replicated changes were applied under the views and
        :meth:`reload` has not run since (the store's write path asks first)."""
        if self.stale:
            raise StoreError(f"the store at {self._store.path} applied replicated changes: reload() before writing")

    def _log_write(self, step: Callable[[Any], LogState], *, stale: bool) -> LogState:
        """Run one log ``step`` in its own write transaction and install the state it
        returns once committed. ``stale``: it changed data under the views. Raises
        StoreFull / StoreError when LMDB fails (nothing written)."""
        path = self._store.path
        try:
            txn = self._store.env.begin(write=True)
        except lmdb.Error as exc:
            raise store_error(exc, path) from exc
        try:
            state = step(txn)
            txn.commit()
        except lmdb.Error as exc:
            txn.abort()
            raise store_error(exc, path) from exc
        except BaseException:
            txn.abort()
            raise
        self.log.state = state
        if stale:
            self.stale = True
        return state

    def begin_epoch(self, epoch: int) -> int:
        """Write the empty entry that starts ``epoch`` (one transaction) and stamp new
        entries with it; returns its position. Reloads the views first if replicated
        changes were applied. Raises ValueError unless ``epoch > last_epoch``."""
        log, store = self.log, self._store
        if self.stale:
            self.reload()
        state = self._log_write(lambda txn: log.begin_epoch(txn, epoch, store.clock(), store.head.next_global), stale=False)
        out = WriteOutcome([], set(), position=state.position)
        with self._publish_lock:
            self._pending.append((state.position, store.head, out))
        return state.position - 1

    def apply_log(self, entries: Sequence[tuple[int, bytes]]) -> int:
        """Apply ``entries`` (from :meth:`read_log` of the leader) in one transaction:
        their changes, and a copy into this log; returns the new position. The views
        are not updated (:meth:`reload` before serving). Raises ValueError unless
        ``entries[0][0] == position`` and they are consecutive; CorruptRecord for an
        undecodable entry (then nothing is applied)."""
        log = self.log
        if not entries:
            return log.state.position
        return self._log_write(lambda txn: log.apply(txn, entries), stale=True).position

    def truncate(self, start: int, repairs: Sequence[tuple[int, bytes, bytes | None]], consistent_at: int) -> None:
        """One transaction: delete the log from ``start`` on and the epochs starting
        there, write each repaired key (value None: delete), record
        ``consistent_at``; the position becomes ``start``. ValueError when ``start``
        is outside [log_start, position]."""
        log = self.log
        self._log_write(lambda txn: log.truncate(txn, start, repairs, consistent_at), stale=True)

    def trim_log(self, before: int) -> int:
        """Delete the entries below ``before`` (never at or past the end); returns
        the new log_start."""
        log = self.log
        if min(before, log.state.position) <= log.state.log_start:
            return log.state.log_start
        return self._log_write(lambda txn: log.trim(txn, before), stale=False).log_start

    def reset_for_snapshot(self) -> None:
        """One transaction: empty every replicated database and the log; the store
        may not lead until :meth:`finish_snapshot`."""
        log, meta = self.log, self._store.db[b"meta"]

        def step(txn: Any) -> LogState:
            state = log.reset(txn)
            txn.put(b"format", layout.pack_u32(layout.FORMAT_VERSION), db=meta)
            return state

        self._log_write(step, stale=True)

    def apply_snapshot_chunk(self, db: int, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Write one snapshot chunk's items into database index ``db`` (one transaction)."""
        log = self.log

        def step(txn: Any) -> LogState:
            log.put_chunk(txn, db, items)
            return log.state

        self._log_write(step, stale=True)

    def finish_snapshot(self, start_position: int, consistent_at: int, epoch: int) -> None:
        """End a snapshot: an empty log at ``start_position`` (= position = log_start),
        ``repl_epochs = {epoch: start_position}``, ``consistent_at`` recorded."""
        log = self.log
        self._log_write(lambda txn: log.finish_snapshot(txn, start_position, consistent_at, epoch), stale=True)

    def reload(self) -> None:
        """Rebuild the store's views from LMDB (as at open) and publish them both:
        after apply_log / truncate / a snapshot, before serving (writer thread)."""
        store = self._store
        view = store.recover_view()
        with self._publish_lock:
            self._pending.clear()
            store.head = store.view = view
        self.stale = False
