"""Recording a write transaction's physical changes, for the replication log.

On a replicated store, :class:`~equeue.broker.storage.writes.WriteContext` hands its ops a
:class:`RecordingTxn` instead of the LMDB transaction (and :class:`RecordingCursor`
instead of its cursors). Each wrapper forwards to LMDB and appends every change that
took effect (put, putmulti, replace, delete, pop, a cursor's delete) to one
:class:`Recorder`, in order, per database index. The wrappers expose the read
methods and those write methods only: a write op cannot reach LMDB around them, and
a write to a database that is not replicated (the log's own) is refused.

A standalone store never builds any of this: its ops get the LMDB objects themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import lmdb

from equeue.wire.replog import DELETE, PUT

__all__ = ["Recorder", "RecordingCursor", "RecordingTxn"]


class Recorder:
    """The changes of one transaction, as runs ``(kind, db index, keys, values)``:
    consecutive changes of one kind to one database share a run."""

    __slots__ = ("_db", "_keys", "_kind", "_values", "runs")

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, list[bytes], list[bytes] | None]] = []
        self._kind = 0
        self._db = -1
        self._keys: list[bytes] = []
        self._values: list[bytes] = []

    def _start(self, kind: int, db: int) -> None:
        self._kind, self._db = kind, db
        self._keys = []
        if kind == PUT:
            self._values = []
            self.runs.append((kind, db, self._keys, self._values))
        else:
            self.runs.append((kind, db, self._keys, None))

    def put(self, db: int, key: bytes, value: bytes) -> None:
        if self._kind != PUT or self._db != db:
            self._start(PUT, db)
        self._keys.append(key)
        self._values.append(value)

    def puts(self, db: int, keys: Iterable[bytes], values: Iterable[bytes]) -> None:
        if self._kind != PUT or self._db != db:
            self._start(PUT, db)
        self._keys.extend(keys)
        self._values.extend(values)

    def delete(self, db: int, key: bytes) -> None:
        if self._kind != DELETE or self._db != db:
            self._start(DELETE, db)
        self._keys.append(key)


def _index(indexes: Mapping[Any, int], db: Any) -> int:
    """The replicated database index of an LMDB handle; ValueError for any other."""
    try:
        return indexes[db]
    except (KeyError, TypeError):
        raise ValueError("a write op may only write the store's replicated databases") from None


class RecordingCursor:
    """An LMDB cursor whose writes are recorded (reads pass through)."""

    __slots__ = ("_cur", "_db", "_rec")

    def __init__(self, cur: lmdb.Cursor, rec: Recorder, db: int) -> None:
        self._cur: Any = cur
        self._rec = rec
        self._db = db

    # ---- reads
    def first(self) -> bool:
        return bool(self._cur.first())

    def last(self) -> bool:
        return bool(self._cur.last())

    def next(self) -> bool:
        return bool(self._cur.next())

    def prev(self) -> bool:
        return bool(self._cur.prev())

    def set_key(self, key: bytes) -> bool:
        return bool(self._cur.set_key(key))

    def set_range(self, key: bytes) -> bool:
        return bool(self._cur.set_range(key))

    def key(self) -> Any:
        return self._cur.key()

    def value(self) -> Any:
        return self._cur.value()

    def item(self) -> Any:
        return self._cur.item()

    def get(self, key: bytes, default: Any = None) -> Any:
        return self._cur.get(key, default)

    def iternext(self, keys: bool = True, values: bool = True) -> Iterator[Any]:
        return self._cur.iternext(keys=keys, values=values)

    def iterprev(self, keys: bool = True, values: bool = True) -> Iterator[Any]:
        return self._cur.iterprev(keys=keys, values=values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    # ---- writes, recorded when they took effect
    def put(self, key: bytes, value: bytes, dupdata: bool = False, overwrite: bool = True, append: bool = False) -> bool:
        done = bool(self._cur.put(key, value, dupdata=dupdata, overwrite=overwrite, append=append))
        if done:
            self._rec.put(self._db, key, value)
        return done

    def putmulti(
        self, items: Iterable[tuple[bytes, bytes]], dupdata: bool = False, overwrite: bool = True, append: bool = False
    ) -> tuple[int, int]:
        pairs = items if isinstance(items, list) else list(items)
        consumed, added = self._cur.putmulti(pairs, dupdata=dupdata, overwrite=overwrite, append=append)
        if added == len(pairs):
            if pairs:
                keys, values = zip(*pairs, strict=True)
                self._rec.puts(self._db, keys, values)
        else:  # some did not take effect (overwrite=False, append out of order): record what did
            get = self._cur.get
            for k, v in pairs[:consumed]:
                if get(k) == v:
                    self._rec.put(self._db, k, v)
        return consumed, added

    def put_lists(self, keys: Iterable[bytes], values: Iterable[bytes], append: bool = False) -> None:
        """:meth:`putmulti` of ``zip(keys, values)`` (of equal lengths), recorded
        without unzipping: the produce path's bulk puts."""
        ks = keys if isinstance(keys, list) else list(keys)
        vs = values if isinstance(values, list) else list(values)
        consumed, added = self._cur.putmulti(zip(ks, vs, strict=True), append=append)
        if added == len(ks):
            self._rec.puts(self._db, ks, vs)
        else:  # an out-of-order append was not written: record what was
            get = self._cur.get
            for k, v in zip(ks[:consumed], vs, strict=False):
                if get(k) == v:
                    self._rec.put(self._db, k, v)

    def replace(self, key: bytes, value: bytes) -> Any:
        old = self._cur.replace(key, value)
        self._rec.put(self._db, key, value)
        return old

    def delete(self, dupdata: bool = False) -> bool:
        key = bytes(self._cur.key())
        done = bool(self._cur.delete(dupdata=dupdata))
        if done:
            self._rec.delete(self._db, key)
        return done

    def pop(self, key: bytes) -> Any:
        old = self._cur.pop(key)
        if old is not None:
            self._rec.delete(self._db, key)
        return old


class RecordingTxn:
    """An LMDB write transaction whose writes are recorded (reads pass through).

    ``indexes`` maps each replicated database handle to its index in
    :data:`~equeue.broker.storage.layout.DATABASES`; a write to any other database raises
    ValueError (the op fails, nothing of it commits)."""

    __slots__ = ("_idx", "_rec", "_txn")

    def __init__(self, txn: lmdb.Transaction, rec: Recorder, indexes: Mapping[Any, int]) -> None:
        self._txn: Any = txn
        self._rec = rec
        self._idx = indexes

    def get(self, key: bytes | memoryview, default: Any = None, db: Any = None) -> Any:
        return self._txn.get(key, default, db=db)

    def stat(self, db: Any) -> Any:
        return self._txn.stat(db)

    def cursor(self, db: Any = None) -> RecordingCursor:
        return RecordingCursor(self._txn.cursor(db=db), self._rec, _index(self._idx, db))

    def put(
        self, key: bytes, value: bytes, dupdata: bool = False, overwrite: bool = True, append: bool = False, db: Any = None
    ) -> bool:
        i = _index(self._idx, db)
        done = bool(self._txn.put(key, value, dupdata=dupdata, overwrite=overwrite, append=append, db=db))
        if done:
            self._rec.put(i, key, value)
        return done

    def replace(self, key: bytes, value: bytes, db: Any = None) -> Any:
        i = _index(self._idx, db)
        old = self._txn.replace(key, value, db=db)
        self._rec.put(i, key, value)
        return old

    def delete(self, key: bytes | memoryview, value: bytes = b"", db: Any = None) -> bool:
        i = _index(self._idx, db)
        done = bool(self._txn.delete(key, value, db=db))
        if done:
            self._rec.delete(i, bytes(key))
        return done

    def pop(self, key: bytes, db: Any = None) -> Any:
        i = _index(self._idx, db)
        old = self._txn.pop(key, db=db)
        if old is not None:
            self._rec.delete(i, key)
        return old
