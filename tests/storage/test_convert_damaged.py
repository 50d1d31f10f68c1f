"""Converting a format-2 store whose records are damaged: a long run of damaged
records is kept record by record (no recursion per record: a run of a thousand
stopped the store from opening), the good records around them become batches."""

from __future__ import annotations

from pathlib import Path

import lmdb

from equeue import Message, wire
from equeue.broker.storage import convert, layout
from equeue.wire.batches import stored_head

DAMAGED = 1200


def test_a_long_run_of_damaged_records_converts(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), max_dbs=32, map_size=1 << 28)
    db = {name: env.open_db(name) for name in layout.DATABASES}
    def record(o: int) -> bytes:
        return wire.records.encode_record(7, 0, o, 1_700_000_000_000, wire.encode_entry(Message(b"m%d" % o)))

    with env.begin(write=True) as txn:
        for o in range(3 + DAMAGED + 3):
            rec = b"\x00" * 40 if 3 <= o < 3 + DAMAGED else record(o)
            txn.put(layout.qindex_key(7, 0, o), layout.global_key(o), db=db[b"qindex"])
            txn.put(layout.global_key(o), rec, db=db[b"messages"])
        txn.put(layout.queue_key(7, 0), layout.pack_qstats(3 + DAMAGED + 3, 0), db=db[b"qstats"])
    with env.begin(write=True) as txn:
        n, _after, done = convert._convert_chunk(txn, db, b"")
    assert done and n == 3 + DAMAGED + 3
    with env.begin() as txn:
        index = [layout.unpack_qindex_value(v) for _k, v in txn.cursor(db=db[b"qindex"])]
        first = txn.get(layout.global_key(0), db=db[b"messages"])
        assert stored_head(first).base_offset == 0
    # the good head and tail are a batch each; each damaged record stays alone
    assert index == [(0, 3)] + [(g, 1) for g in range(3, 3 + DAMAGED)] + [(3 + DAMAGED, 3)]
    env.close()
