"""The replication log of a replicated store: its databases, its state, reading it
(any thread) and the steps that change it inside one store write transaction
(writer thread).

``replog`` holds one entry per committed transaction under its position (dense,
from 0; :mod:`equeue.wire.replog` encodes it); ``repl_epochs`` the first position
of each leader epoch (KIP-101's leader-epoch cache); ``repl_state`` the first
position still kept (``log_start``), ``consistent_at`` and the bytes of the entries
kept (``log_bytes``, so a leader's trim by size never walks the log). Every writing method here
takes the open LMDB transaction of its caller (:class:`~equeue.broker.storage.store.Store`,
which opens and commits it) and returns the :class:`LogState` to install once that
transaction committed, so the state readers see never runs ahead of LMDB.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs
import lmdb

from equeue.broker.storage import layout
from equeue.errors import CorruptRecord, LogTrimmed
from equeue.wire.replog import PUT, EntryHeader, Run, decode_entry, encode_entry, entry_header

__all__ = ["UNREACHABLE", "LogState", "ReplicationLog"]

#: ``consistent_at`` of a store that may not lead or join the in-sync set until it
#: was repaired (a snapshot in progress)
UNREACHABLE: Final = (1 << 64) - 1


@attrs.frozen
class LogState:
    """The log's state, replaced whole after each commit that changed it."""

    #: the next position (= entries ever written)
    position: int = 0
    #: the first position still in the log
    log_start: int = 0
    #: the store may lead / join the in-sync set only when position >= consistent_at
    consistent_at: int = 0
    #: (epoch, first position), ascending
    epochs: tuple[tuple[int, int], ...] = ()
    #: the epoch of entry position - 1 (with an empty log: of the epoch holding position)
    last_epoch: int = 0
    #: bytes of the entries from log_start to the end
    log_bytes: int = 0
    #: the epoch this store's data from before its replication log is counted in (0:
    #: none, or a store converted by an earlier version)
    converted_epoch: int = 0

    @property
    def epoch(self) -> int:
        """The newest epoch: the one stamped on new entries."""
        return self.epochs[-1][0] if self.epochs else 0


class ReplicationLog:
    """The log databases of one store and their state (:attr:`state`)."""

    def __init__(self, env: lmdb.Environment, handles: Sequence[Any], txn: lmdb.Transaction) -> None:
        """Open (create) the log databases inside ``txn``, the store's opening write
        transaction; ``handles`` are the data databases, in ``layout.DATABASES`` order.
        Call :meth:`load` once it committed."""
        self.env = env
        #: data database handles by index, and the index of each handle
        self.handles: tuple[Any, ...] = tuple(handles)
        self.indexes: dict[Any, int] = {h: i for i, h in enumerate(self.handles)}
        self.log, self.epoch_db, self.state_db = (env.open_db(n, txn=txn) for n in layout.REPL_DATABASES)
        self.state = LogState()

    # ------------------------------------------------------------------ state
    def load(self) -> None:
        """Read the state back from LMDB (at open)."""
        with self.env.begin() as txn:
            self.state = self._read_state(txn)

    def _read_state(self, txn: lmdb.Transaction) -> LogState:
        log_start = self._u64(txn, layout.REPL_LOG_START)
        consistent_at = self._u64(txn, layout.REPL_CONSISTENT_AT)
        epochs = tuple(
            (layout.unpack_u32(k), layout.unpack_u64(v)) for k, v in txn.cursor(db=self.epoch_db)
        )  # fmt: skip
        cur = txn.cursor(db=self.log)
        if cur.last():
            position = layout.global_of(cur.key()) + 1
            last_epoch = entry_header(cur.value()).epoch
        else:
            position = log_start
            last_epoch = _epoch_at(epochs, position)
        return LogState(
            position, log_start, consistent_at, epochs, last_epoch, self._u64(txn, layout.REPL_LOG_BYTES),
            self._u64(txn, layout.REPL_CONVERTED_EPOCH),
        )  # fmt: skip

    def start_after_existing_data(self, txn: lmdb.Transaction) -> None:
        """A new log over data written without one (a standalone store, or one
        opened standalone after it was replicated): it starts at position 1, as if
        that data were entry 0 (never in the log), so a follower at 0 is told the log
        was trimmed and copies the store. That entry's epoch is drawn at random
        (1..2**30), not 0: two stores converted apart hold different data, and with
        one epoch number each the leader's fetch checks tell them apart (KIP-279: an
        epoch the leader never had), so the follower copies the leader's store instead
        of applying the leader's log on top of its own data."""
        epoch = secrets.randbelow(1 << 30) + 1
        txn.put(layout.REPL_LOG_START, layout.pack_u64(1), db=self.state_db)
        txn.put(layout.REPL_CONVERTED_EPOCH, layout.pack_u64(epoch), db=self.state_db)
        self._put_epoch(txn, (), epoch, 0)

    def _u64(self, txn: lmdb.Transaction, key: bytes) -> int:
        v = txn.get(key, db=self.state_db)
        return layout.unpack_u64(v) if v is not None else 0

    def _end(self, txn: lmdb.Transaction) -> tuple[int, int]:
        """(log_start, position) as ``txn`` sees them."""
        start = self._u64(txn, layout.REPL_LOG_START)
        cur = txn.cursor(db=self.log)
        return start, (layout.global_of(cur.key()) + 1 if cur.last() else start)

    # ------------------------------------------------------------------ reads (any thread)
    def read_log(self, start: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Entries from ``start`` on: at most ``max_bytes`` in all, but at least one
        whole entry when there is one. Raises LogTrimmed below the log's start,
        ValueError past its end."""
        with self.env.begin() as txn:
            log_start, end = self._end(txn)
            if start < log_start:
                raise LogTrimmed(f"log position {start} was trimmed: the log starts at {log_start}")
            if start >= end:
                if start > max(end, self.state.position):
                    raise ValueError(f"log position {start} is past the log's end {end}")
                return []
            out: list[tuple[int, bytes]] = []
            size = 0
            cur = txn.cursor(db=self.log)
            cur.set_key(layout.position_key(start))
            for k, v in cur.iternext():
                if out and size + len(v) > max_bytes:
                    break
                out.append((layout.global_of(k), v))
                size += len(v)
            return out

    def entry_info(self, position: int) -> EntryHeader | None:
        """The header of the entry at ``position`` (None: trimmed or not written)."""
        if not 0 <= position < 1 << 64:
            return None
        with self.env.begin() as txn:
            v = txn.get(layout.position_key(position), db=self.log)
            return entry_header(v) if v is not None else None

    def end_of_epoch(self, epoch: int) -> int:
        """The first position of the first epoch after ``epoch``, or the log's end."""
        st = self.state
        for e, first in st.epochs:
            if e > epoch:
                return first
        return st.position

    def log_bytes(self, start: int) -> int:
        """Bytes of the entries from ``start`` to the end: kept as a total for the
        whole log, walked (lengths only) from a later ``start``."""
        st = self.state
        if start <= st.log_start:
            return st.log_bytes
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=self.log)
            if not cur.set_range(layout.position_key(max(0, start))):
                return 0
            return sum(map(len, cur.iternext(keys=False)))

    def divergent_keys(self, start: int) -> list[tuple[int, bytes]]:
        """Every distinct (database index, key) the entries from ``start`` on change,
        in the order first changed. Raises LogTrimmed when ``start`` is below the log
        (what the trimmed entries changed is unknown: copy the store instead),
        CorruptRecord for an undecodable entry."""
        seen: dict[tuple[int, bytes], None] = {}
        with self.env.begin() as txn:
            log_start, _ = self._end(txn)
            if start < log_start:
                raise LogTrimmed(f"log position {start} was trimmed: the log starts at {log_start}")
            cur = txn.cursor(db=self.log)
            if cur.set_range(layout.position_key(max(0, start))):
                for v in cur.iternext(keys=False):
                    for _kind, db, keys, _values in decode_entry(v)[1]:
                        seen.update(dict.fromkeys(zip([db] * len(keys), keys, strict=True)))
        return list(seen)

    def read_keys(self, keys: Sequence[tuple[int, bytes]]) -> tuple[int, list[bytes | None]]:
        """In one read transaction: its position and the value of each key (None:
        absent). Raises ValueError for a database index that is not replicated."""
        handles = self.handles
        with self.env.begin() as txn:
            _, position = self._end(txn)
            values: list[bytes | None] = []
            for db, key in keys:
                if not 0 <= db < len(handles):
                    raise ValueError(f"no replicated database {db}")
                values.append(txn.get(key, db=handles[db]))
            return position, values

    def snapshot_chunk(self, db: int, after: bytes | None, max_bytes: int) -> tuple[int, list[tuple[bytes, bytes]], bytes | None]:
        """In one read transaction: its position, the items of database ``db`` after
        key ``after`` (None: from the first; at most ``max_bytes`` but at least one),
        and the last key returned, or None when the database has no more items.
        Raises ValueError for a database that is not replicated."""
        if db not in layout.REPLICATED_DATABASES:
            raise ValueError(f"no replicated database {db}")
        with self.env.begin() as txn:
            _, position = self._end(txn)
            cur = txn.cursor(db=self.handles[db])
            ok = cur.first() if after is None else cur.set_range(after)
            if ok and after is not None and cur.key() == after:
                ok = cur.next()
            items: list[tuple[bytes, bytes]] = []
            size = 0
            while ok:
                k, v = cur.item()
                if items and size + len(k) + len(v) > max_bytes:
                    return position, items, items[-1][0]
                items.append((k, v))
                size += len(k) + len(v)
                ok = cur.next()
            return position, items, None

    def digests(self, range_size: int) -> tuple[int, dict[str, str]]:
        """In one read transaction: its position and a blake2b of every replicated
        database's keys and values in key order (``messages`` per range of
        ``range_size`` global offsets: ``"messages/<first global>"``)."""
        if range_size <= 0:
            raise ValueError("range_size must be positive")
        out: dict[str, str] = {}
        messages = layout.DATABASES.index(b"messages")
        with self.env.begin(buffers=True) as txn:
            _, position = self._end(txn)
            for i in layout.REPLICATED_DATABASES:
                name = layout.DATABASES[i].decode()
                h = None
                first = -1
                for k, v in txn.cursor(db=self.handles[i]):
                    if i == messages:
                        r = layout.global_of(k) // range_size * range_size
                        if r != first:
                            if h is not None:
                                out[f"{name}/{first}"] = h.hexdigest()
                            h, first = hashlib.blake2b(digest_size=16), r
                    elif h is None:
                        h = hashlib.blake2b(digest_size=16)
                    assert h is not None
                    h.update(len(k).to_bytes(4, "big"))
                    h.update(k)
                    h.update(len(v).to_bytes(4, "big"))
                    h.update(v)
                if i == messages:
                    if h is not None:
                        out[f"{name}/{first}"] = h.hexdigest()
                else:
                    out[name] = (h or hashlib.blake2b(digest_size=16)).hexdigest()
        return position, out

    # ------------------------------------------------------------------ writes (writer thread, in the caller's txn)
    def append(self, txn: lmdb.Transaction, runs: Sequence[Run], time_ms: int, next_global: int) -> LogState:
        """Write one entry of the current epoch at the log's end."""
        st = self.state
        epoch = st.epoch
        entry = encode_entry(EntryHeader(epoch, time_ms, next_global), runs)
        txn.put(layout.position_key(st.position), entry, db=self.log, append=True)
        epochs = st.epochs
        if not epochs:
            epochs = self._put_epoch(txn, epochs, epoch, st.position)
        size = self._put_bytes(txn, st.log_bytes + len(entry))
        return attrs.evolve(st, position=st.position + 1, epochs=epochs, last_epoch=epoch, log_bytes=size)

    def begin_epoch(self, txn: lmdb.Transaction, epoch: int, time_ms: int, next_global: int) -> LogState:
        """Write the empty entry that starts ``epoch``. ValueError unless ``epoch`` is
        newer than every epoch of the log."""
        st = self.state
        if epoch <= st.last_epoch or epoch <= st.epoch or epoch >= 1 << 32:
            raise ValueError(f"epoch {epoch} is not newer than the log's epoch {max(st.epoch, st.last_epoch)}")
        epochs = self._put_epoch(txn, st.epochs, epoch, st.position)
        entry = encode_entry(EntryHeader(epoch, time_ms, next_global), ())
        txn.put(layout.position_key(st.position), entry, db=self.log, append=True)
        size = self._put_bytes(txn, st.log_bytes + len(entry))
        return attrs.evolve(st, position=st.position + 1, epochs=epochs, last_epoch=epoch, log_bytes=size)

    def _put_bytes(self, txn: lmdb.Transaction, size: int) -> int:
        txn.put(layout.REPL_LOG_BYTES, layout.pack_u64(size), db=self.state_db)
        return size

    def _put_epoch(
        self, txn: lmdb.Transaction, epochs: tuple[tuple[int, int], ...], epoch: int, first: int
    ) -> tuple[tuple[int, int], ...]:
        txn.put(layout.epoch_key(epoch), layout.pack_u64(first), db=self.epoch_db)
        return (*epochs, (epoch, first))

    def apply(self, txn: lmdb.Transaction, entries: Sequence[tuple[int, bytes]]) -> LogState:
        """Apply each entry's changes and copy it into the log. ValueError when the
        entries do not start at the log's end or are not consecutive, or an epoch goes
        backwards; CorruptRecord for an entry that does not decode or names a database
        that is not replicated."""
        st = self.state
        position, epochs, last_epoch, size = st.position, st.epochs, st.last_epoch, st.log_bytes
        handles = self.handles
        for pos, data in entries:
            if pos != position:
                raise ValueError(f"log entry at position {pos}, expected {position}")
            header, runs = decode_entry(data)
            newest = epochs[-1][0] if epochs else -1
            if header.epoch < newest:
                raise ValueError(f"log entry {pos} of epoch {header.epoch} after epoch {newest}")
            for kind, db, keys, values in runs:
                if db >= len(handles):
                    raise CorruptRecord(f"log entry {pos} changes database {db}, which does not exist")
                h = handles[db]
                if kind == PUT:
                    assert values is not None
                    txn.cursor(db=h).putmulti(zip(keys, values, strict=True))
                else:
                    delete = txn.delete
                    for k in keys:
                        delete(k, db=h)
            txn.put(layout.position_key(pos), data, db=self.log, append=True)
            if header.epoch > newest:
                epochs = self._put_epoch(txn, epochs, header.epoch, pos)
            last_epoch = header.epoch
            position += 1
            size += len(data)
        size = self._put_bytes(txn, size)
        return attrs.evolve(st, position=position, epochs=epochs, last_epoch=last_epoch, log_bytes=size)

    def truncate(
        self, txn: lmdb.Transaction, start: int, repairs: Sequence[tuple[int, bytes, bytes | None]], consistent_at: int
    ) -> LogState:
        """Drop the entries from ``start`` on and the epochs starting there, write the
        repaired values (None: delete), record ``consistent_at``. ValueError when
        ``start`` is outside [log_start, position] or a database is not replicated."""
        st = self.state
        if not st.log_start <= start <= st.position:
            raise ValueError(f"cannot truncate the log at {start}: it holds [{st.log_start}, {st.position})")
        size = st.log_bytes - _delete_from(txn.cursor(db=self.log), layout.position_key(start))
        self._put_bytes(txn, size)
        epochs = tuple((e, first) for e, first in st.epochs if first < start)
        for e, first in st.epochs:
            if first >= start:
                txn.delete(layout.epoch_key(e), db=self.epoch_db)
        handles = self.handles
        for db, key, value in repairs:
            if not 0 <= db < len(handles):
                raise ValueError(f"no replicated database {db}")
            if value is None:
                txn.delete(key, db=handles[db])
            else:
                txn.put(key, value, db=handles[db])
        txn.put(layout.REPL_CONSISTENT_AT, layout.pack_u64(consistent_at), db=self.state_db)
        last = txn.get(layout.position_key(start - 1), db=self.log) if start > st.log_start else None
        last_epoch = entry_header(last).epoch if last is not None else _epoch_at(epochs, start)
        return LogState(start, st.log_start, consistent_at, epochs, last_epoch, size, st.converted_epoch)

    def trim(self, txn: lmdb.Transaction, before: int) -> LogState:
        """Delete the entries below ``before`` (never the log's end)."""
        st = self.state
        upto = min(before, st.position)
        if upto <= st.log_start:
            return st
        cur = txn.cursor(db=self.log)
        end = layout.position_key(upto)
        freed = 0
        if cur.first():
            while bytes(cur.key()) < end:
                freed += len(cur.value())
                if not cur.delete():
                    break
        txn.put(layout.REPL_LOG_START, layout.pack_u64(upto), db=self.state_db)
        return attrs.evolve(st, log_start=upto, log_bytes=self._put_bytes(txn, st.log_bytes - freed))

    def reset(self, txn: lmdb.Transaction) -> LogState:
        """Empty every replicated database and the log; the store may not lead until
        a snapshot finished (``consistent_at`` unreachable)."""
        for h in self.handles:
            txn.drop(h, delete=False)
        txn.drop(self.log, delete=False)
        txn.drop(self.epoch_db, delete=False)
        txn.drop(self.state_db, delete=False)
        txn.put(layout.REPL_CONSISTENT_AT, layout.pack_u64(UNREACHABLE), db=self.state_db)
        return LogState(consistent_at=UNREACHABLE)

    def put_chunk(self, txn: lmdb.Transaction, db: int, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Write snapshot items into database ``db`` (ValueError: not replicated)."""
        if db not in layout.REPLICATED_DATABASES:
            raise ValueError(f"no replicated database {db}")
        txn.cursor(db=self.handles[db]).putmulti(items)

    def finish_snapshot(self, txn: lmdb.Transaction, start: int, consistent_at: int, epoch: int) -> LogState:
        """An empty log starting at ``start``, in ``epoch``, consistent at ``consistent_at``."""
        txn.drop(self.log, delete=False)
        txn.drop(self.epoch_db, delete=False)
        epochs = self._put_epoch(txn, (), epoch, start)
        txn.put(layout.REPL_LOG_START, layout.pack_u64(start), db=self.state_db)
        txn.put(layout.REPL_CONSISTENT_AT, layout.pack_u64(consistent_at), db=self.state_db)
        self._put_bytes(txn, 0)
        return LogState(start, start, consistent_at, epochs, epoch)


def _epoch_at(epochs: Sequence[tuple[int, int]], position: int) -> int:
    """The newest epoch whose first position is at most ``position`` (0: none)."""
    found = 0
    for e, first in epochs:
        if first <= position:
            found = e
    return found


def _delete_from(cur: lmdb.Cursor, key: bytes) -> int:
    """Delete every item of the cursor's database from ``key`` on; returns the bytes
    of the values deleted."""
    freed = 0
    if cur.set_range(key):
        while True:
            freed += len(cur.value())
            if not cur.delete() or not cur.key():
                break
    return freed

