"""Store alone (no network): append throughput with fsync per transaction.

Workload "store-append": 100-byte messages, ProduceOps of 100 messages, 10 ops per
write transaction (1,000 messages per transaction, one fsync each), 4 queues.
Workload "store-read": read them back with read_queue (32... 1,000 per call).

    .venv/bin/python bench/bench_store.py [--messages 1000000] [--replicated]

``--replicated`` opens the store with its replication log (every transaction also
writes its log entry; the reader view is published after each transaction, as a
leader alone in its in-sync set does).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from equeue import Message, wire
from equeue.broker.storage import CreateTopicOp, ProduceOp, Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--txn", type=int, default=1000, help="messages per write transaction")
    ap.add_argument("--batch", type=int, default=100, help="messages per ProduceOp")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--keys", action="store_true", help="give every message a key (adds the key index)")
    ap.add_argument("--replicated", action="store_true", help="keep the replication log")
    args = ap.parse_args()
    body = b"x" * args.size
    entries = [wire.encode_entry(Message(body, key=f"k{i}" if args.keys else None)) for i in range(args.batch)]
    with tempfile.TemporaryDirectory(prefix="equeue-bench-") as d:
        store = Store(Path(d), map_size=8 << 30, sync=True, **({"replicated": True} if args.replicated else {}))
        (info,) = store.write([CreateTopicOp("bench", args.queues)]).settled()
        if args.replicated:
            store.replication.publish_all()
        ops_per_txn = max(1, args.txn // args.batch)
        txns = args.messages // (ops_per_txn * args.batch)
        t0, c0 = time.perf_counter(), time.process_time()
        q = 0
        for _ in range(txns):
            ops = []
            for _ in range(ops_per_txn):
                ops.append(ProduceOp(info, q % args.queues, entries))
                q += 1
            store.write(ops)
            if args.replicated:
                store.replication.publish_all()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = txns * ops_per_txn * args.batch
        print(f"store-append{' (replicated)' if args.replicated else ''}: {n:,} msgs of {args.size} B"
              f"{' with keys' if args.keys else ''}, "
              f"{args.txn} msgs/txn + fsync: {n / dt:,.0f} msg/s ({dt:.2f} s, {txns / dt:,.0f} txn/s; "
              f"CPU {cpu / n * 1e6:.2f} us/msg)")
        t0, c0 = time.perf_counter(), time.process_time()
        got = 0
        for qid in range(args.queues):
            off = 0
            while True:
                r = store.read_queue(info, qid, off, 1000, 16 << 20)
                if not r.batches:
                    break
                got += r.next_offset - off  # every record of the batches from ``off`` (no skips here)
                off = r.next_offset
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"store-read: {got:,} msgs (checksums verified, stored batches not decoded), 1000 per read: {got / dt:,.0f} msg/s "
              f"({dt:.2f} s; CPU {cpu / got * 1e6:.2f} us/msg)")
        store.close()


if __name__ == "__main__":
    main()
