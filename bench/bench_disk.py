"""Disk per message: what a broker's store holds for what producers sent.

Produces through a real broker (an embedded one, ``--flush async``) in requests of
``--batch`` messages per queue, stops it, then measures the LMDB environment: the
pages in use (``last_pgno``) and each named database's pages (branch, leaf,
overflow), against the payload (message bodies; keys, tags and properties count as
overhead, as Kafka's figures do).

Workloads:

- ``keyed``: ``--messages`` keyed messages of ``--size`` bytes (keys ``k0000001``...,
  all distinct), the figure the storage format is judged by;
- ``orders``: the example pipeline's JSON orders (``equeue.spark.pipeline``: key =
  customer, tag = category), the figure compression is judged by.

With ``--compression zstd|lz4`` each request is one batch the producer compressed
(``encode_batch``, as ``ProducerOptions(compression=...)`` sends it) and stored as sent.

    .venv/bin/python bench/bench_disk.py [--workload keyed|orders] [--messages 1000000]
        [--compression none|zstd|lz4]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.broker.storage.layout import DATABASES
from equeue.client import Client
from equeue.config import BrokerConfig
from equeue.wire.batches import Codec, encode_batch

CATEGORIES = ("books", "games", "garden", "music", "toys")


def keyed_bodies(n: int, size: int) -> list[tuple[str, bytes, str | None]]:
    """Random bodies (incompressible: compression is judged on the orders)."""
    rnd = random.Random(1)
    return [(f"k{i:07d}", rnd.randbytes(size), None) for i in range(n)]


def order_bodies(n: int) -> list[tuple[str, bytes, str | None]]:
    rnd = random.Random(7)
    out = []
    for i in range(n):
        category = rnd.choice(CATEGORIES)
        customer = f"cust-{rnd.randint(1, 2000):04d}"
        order = {
            "order_id": f"o-{i:06d}",
            "customer": customer,
            "category": category,
            "amount_cents": rnd.randint(100, 20000),
            "event_ms": 1_790_000_000_000 + i * 6,
        }
        out.append((customer, json.dumps(order).encode(), category))
    return out


def measure(data_dir: Path) -> tuple[int, dict[str, int]]:
    """(bytes of the pages in use, bytes per named database)."""
    env = lmdb.open(str(data_dir), readonly=True, lock=False, max_dbs=32, subdir=True)
    try:
        psize = env.stat()["psize"]
        used = (env.info()["last_pgno"] + 1) * psize
        per_db: dict[str, int] = {}
        with env.begin() as txn:
            for name in DATABASES:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.NotFoundError:
                    continue
                s = txn.stat(db)
                per_db[name.decode()] = (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * psize
        return used, per_db
    finally:
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", choices=("keyed", "orders"), default="keyed")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="body bytes (keyed)")
    ap.add_argument("--batch", type=int, default=100, help="messages per produce request")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--compression", choices=("none", "zstd", "lz4"), default="none", help="batches sent compressed")
    args = ap.parse_args()
    msgs = keyed_bodies(args.messages, args.size) if args.workload == "keyed" else order_bodies(args.messages)
    payload = sum(len(b) for _k, b, _t in msgs)
    with tempfile.TemporaryDirectory(prefix="equeue-disk-") as d:
        data = Path(d)
        config = BrokerConfig(data_dir=data, port=0, flush="async", map_size=16 << 30, http_port=None)
        with EmbeddedBroker(config) as broker, Client(broker.address) as c:
            c.create_topic("bench", args.queues)
            for i in range(0, len(msgs), args.batch):
                chunk = [Message(b, key=k, tags=t) for k, b, t in msgs[i : i + args.batch]]
                batch = encode_batch(chunk, Codec.parse(args.compression))
                c.produce(wire.ProduceRequest("bench", (i // args.batch) % args.queues, [], batch=batch))
        used, per_db = measure(data)
    n = len(msgs)
    print(f"{args.workload}: {n:,} messages, payload {payload / n:.1f} B/msg, batches of {args.batch}, "
          f"compression {args.compression}")  # fmt: skip
    print(f"  store: {used / n:.1f} B/msg = {used / payload:.2f}x the payload ({used / 2**20:.1f} MiB)")
    for name, size in sorted(per_db.items(), key=lambda kv: -kv[1]):
        if size:
            print(f"    {name:<12} {size / n:7.1f} B/msg")


if __name__ == "__main__":
    main()
