"""Converting a store of one record per message (formats 1 and 2) to record batches
(format 3) when it is opened: every reader then knows one layout.

Each queue's records, in queue-index order, become batches: a batch is a run of
records of one queue with consecutive queue offsets *and* consecutive global
offsets, at most :data:`RUN_RECORDS` records or :data:`RUN_BYTES` of records; its
``first ms`` is the run's smallest store time and each record's ``ts delta`` its store
time minus that. The key index is rebuilt into buckets. It runs in transactions of
about :data:`CHUNK` records and logs a warning line when it starts, its progress
every :data:`PROGRESS_EVERY` seconds and the count and time when done. The format
record changes in the last transaction, so a conversion cut short resumes at the
next open; a replicated store's log is emptied in that transaction too (its entries
carry old values: a follower behind it copies the store).

A record that does not decode (damaged) is kept as it is, as a batch of one: every
reader then answers CORRUPT_RECORD for it, and ``equeue message skip`` steps over it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import lmdb

from equeue.broker.storage import layout
from equeue.broker.storage.writes import store_error
from equeue.errors import EQueueError
from equeue.models import Message
from equeue.wire import batches
from equeue.wire.records import decode_record

if TYPE_CHECKING:
    from equeue.broker.storage.replicated import StoreReplication

log = logging.getLogger("equeue.store")

#: records converted per transaction
CHUNK: Final = 50_000
#: the most records, and bytes of records, one converted batch holds
RUN_RECORDS: Final = 1000
RUN_BYTES: Final = 1 << 20
#: a long conversion logs its progress this often (seconds)
PROGRESS_EVERY: Final = 10.0


def convert_to_batches(
    env: lmdb.Environment, db: dict[bytes, Any], path: Path, old_format: int, replication: StoreReplication | None
) -> None:
    """Convert the store at ``path`` (format ``old_format``) to record batches; see
    the module docstring. Raises StoreFull / StoreError."""
    qdb, kdb = db[b"qindex"], db[b"kindex"]
    t0 = noted = time.monotonic()
    with env.begin() as txn:
        total = txn.stat(qdb)["entries"]  # an upper bound: a resumed conversion did some
    log.warning("the store at %s has format %d: converting its records (up to %d) to record batches "
                "(format %d) before the broker starts", path, old_format, total,
                layout.FORMAT_VERSION)  # fmt: skip
    try:
        while _drop_old_key_index(env, kdb):  # the old key index, in chunks
            pass
        after = b""
        converted = 0
        while True:
            with env.begin(write=True) as txn:
                n, after, last = _convert_chunk(txn, db, after)
                state = None
                if last:
                    if replication is not None:
                        rlog = replication.log
                        state = rlog.trim(txn, rlog.state.position)
                    txn.put(b"format", layout.pack_u32(layout.FORMAT_VERSION), db=db[b"meta"])
            converted += n
            if last:
                if state is not None and replication is not None:
                    replication.log.state = state
                break
            if time.monotonic() - noted >= PROGRESS_EVERY:
                noted = time.monotonic()
                log.warning("the store at %s: %d of up to %d records converted to batches (%.0f s)",
                            path, converted, total, noted - t0)  # fmt: skip
    except lmdb.Error as exc:
        raise store_error(exc, path) from exc
    log.warning("the store at %s had format %d: its %d records were converted to record batches "
                "(format %d) in %.1f s", path, old_format, converted, layout.FORMAT_VERSION,
                time.monotonic() - t0)  # fmt: skip


def _drop_old_key_index(env: lmdb.Environment, kdb: Any) -> bool:
    """Delete up to :data:`CHUNK` keys of the old key index (any key that is not a
    bucket's); True when there may be more."""
    with env.begin(write=True) as txn:
        cur = txn.cursor(db=kdb)
        n = 0
        ok = cur.first()
        while ok and n < CHUNK:
            if len(cur.key()) != 8:
                ok = cur.delete()
                n += 1
            else:
                ok = cur.next()
    return n >= CHUNK


def _convert_chunk(txn: lmdb.Transaction, db: dict[bytes, Any], after: bytes) -> tuple[int, bytes, bool]:
    """Convert the next runs of old queue-index entries from key ``after`` on, about
    :data:`CHUNK` records; returns (records converted, where to go on, done)."""
    qdb, mdb, kdb = db[b"qindex"], db[b"messages"], db[b"kindex"]
    old: list[tuple[bytes, int]] = []
    cur = txn.cursor(db=qdb)
    done = True
    if cur.set_range(after):
        for k, v in cur:
            if len(v) != 8:
                continue  # a batch already
            if len(old) >= CHUNK:  # (a run cut here goes on as another batch)
                done = False
                break
            old.append((bytes(k), layout.global_of(v)))
    runs: list[list[tuple[bytes, int]]] = []
    for entry in old:
        if runs and _continues(runs[-1][-1], entry[0], entry[1]) and len(runs[-1]) < RUN_RECORDS:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for run in runs:
        for part in _split_by_bytes(txn, qdb, mdb, run):
            _store_run(txn, db, part, pairs, delta)
    for (tid, bucket), new in pairs.items():
        kk = layout.kindex_key(tid, bucket)
        kv = txn.get(kk, db=kdb)
        if kv is not None:
            hs, offs = layout.unpack_kindex_value(kv)
            new += zip(offs, hs, strict=True)
        new.sort()
        txn.put(kk, layout.pack_kindex_value([h for _o, h in new], [o for o, _h in new]), db=kdb)
    for (tid, q), d in delta.items():
        sk = layout.queue_key(tid, q)
        sv = txn.get(sk, db=db[b"qstats"])
        if sv is not None:
            nxt, size = layout.unpack_qstats(sv)
            txn.put(sk, layout.pack_qstats(nxt, max(0, size + d)), db=db[b"qstats"])
    return len(old), (old[-1][0] + b"\0") if old else after, done


def _continues(prev: tuple[bytes, int], key: bytes, g: int) -> bool:
    """Whether the entry (``key`` -> ``g``) follows ``prev`` in the same run."""
    pk, pg = prev
    return key[: layout.QUEUE_PREFIX] == pk[: layout.QUEUE_PREFIX] and (
        layout.qindex_offset(key) == layout.qindex_offset(pk) + 1 and g == pg + 1
    )


def _split_by_bytes(
    txn: lmdb.Transaction, qdb: Any, mdb: Any, run: list[tuple[bytes, int]]
) -> list[list[tuple[bytes, int, bytes]]]:
    """A run's (qindex key, global offset, old record) parts of at most :data:`RUN_BYTES` of records.
    A record missing from the log ends a part; its index entry becomes a batch of one
    that holds nothing (readers stop there, as before; ``equeue message skip`` passes it)."""
    parts: list[list[tuple[bytes, int, bytes]]] = [[]]
    size = 0
    for k, g in run:
        rec = txn.get(layout.global_key(g), db=mdb)
        if rec is None:
            txn.put(k, layout.pack_qindex_value(g, 1), db=qdb)
            parts.append([])
            size = 0
            continue
        if parts[-1] and size + len(rec) > RUN_BYTES:
            parts.append([])
            size = 0
        parts[-1].append((k, g, bytes(rec)))
        size += len(rec)
    return [p for p in parts if p]


def _store_run(
    txn: lmdb.Transaction, db: dict[bytes, Any], part: list[tuple[bytes, int, bytes]],
    pairs: dict[tuple[int, int], list[tuple[int, int]]], delta: dict[tuple[int, int], int],
) -> None:  # fmt: skip
    """Replace a run's old records and index entries by batches: the records between
    damaged ones make one batch each; a damaged record is kept as it is, alone (its
    reads answer CORRUPT_RECORD). Iterative: a long run of damaged records costs no
    recursion."""
    qdb = db[b"qindex"]
    good: list[tuple[tuple[bytes, int, bytes], Message]] = []
    for item in part:
        k, g, rec = item
        try:
            good.append((item, decode_record("", g, rec)))
        except EQueueError:
            if good:
                _store_batch(txn, db, good, pairs, delta)
                good = []
            txn.put(k, layout.pack_qindex_value(g, 1), db=qdb)
    if good:
        _store_batch(txn, db, good, pairs, delta)


def _store_batch(
    txn: lmdb.Transaction, db: dict[bytes, Any], run: list[tuple[tuple[bytes, int, bytes], Message]],
    pairs: dict[tuple[int, int], list[tuple[int, int]]], delta: dict[tuple[int, int], int],
) -> None:  # fmt: skip
    """One batch of decoded records at consecutive offsets, under the first's keys."""
    qdb, mdb = db[b"qindex"], db[b"messages"]
    tid, q, base = layout.unpack_qindex_key(run[0][0][0])
    g0 = run[0][0][1]
    msgs = [m for _item, m in run]
    first = min(m.timestamp for m in msgs)
    last = max(m.timestamp for m in msgs)
    records = b"".join(batches.encode_record(m, m.timestamp - first) for m in msgs)
    value = batches.encode_stored(tid, q, base, first, last, None, 0, batches.seal_records(records, len(msgs)))
    for i, ((k, _g, _rec), _m) in enumerate(run):
        if i:
            txn.delete(k, db=qdb)
            txn.delete(layout.global_key(g0 + i), db=mdb)
    txn.put(run[0][0][0], layout.pack_qindex_value(g0, len(msgs)), db=qdb)
    txn.put(layout.global_key(g0), value, db=mdb)
    b = layout.KINDEX_BUCKET
    for i, m in enumerate(msgs):
        if m.key is not None:
            g = g0 + i
            pairs[(tid, g // b)].append((g % b, layout.kindex_hash(m.key.encode())))
    delta[(tid, q)] += len(value) - sum(len(r) for (_k, _g, r), _m in run)
