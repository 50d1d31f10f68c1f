"""Spark source throughput: drain a backlog of 1,000,000 × 100-byte messages from 4
queues with ``spark.read.format("equeue")`` into a noop sink, in local[2].

    .venv/bin/python bench/bench_spark.py [--messages 1000000] [--size 100] [--queues 4] [--spread 0]

``--spread S`` gives the bodies sizes from ``size - S`` to ``size + S`` (cycling through
them), as variable-size records such as JSON documents have.

Prints rows/s of the drain (session start-up and the first warm-up action excluded).
The broker runs embedded in this process (its own thread), like `make run`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.client import Client
from equeue.config import BrokerConfig


def fill(c: Client, topic: str, queues: int, n: int, size: int, spread: int = 0) -> float:
    """Produce ``n`` messages of ``size`` bytes (± ``spread``) round-robin over the
    queues; returns seconds."""
    per_req = 5_000
    sizes = [size - spread + i % (2 * spread + 1) for i in range(per_req)] if spread else [size] * per_req
    entries = [wire.encode_entry(Message(b"x" * k)) for k in sizes]
    t0 = time.perf_counter()
    sent = 0
    q = 0
    while sent < n:
        k = min(per_req, n - sent)
        c.produce(wire.ProduceRequest(topic, q % queues, entries[:k]))
        sent += k
        q += 1
    return time.perf_counter() - t0


def raw_pull_rate(c: Client, topic: str, queues: int, n: int) -> float:
    """The broker's serving ceiling: pull the whole backlog raw (packed, no parsing), one connection."""
    from equeue.protocol import RequestCode
    from equeue.spark.source import PULL_FLAGS

    t0 = time.perf_counter()
    got = 0
    for q in range(queues):
        off = 0
        while True:
            req = wire.PullRequest(topic, q, off, 10_000, 8 << 20, flags=PULL_FLAGS)
            raw = c.request(RequestCode.PULL, req.encode())
            head = wire.decode_pull_head(raw)
            if not head.count:  # batches: the records are up to the next offset
                break
            got += head.next_offset - off
            off = head.next_offset
    return got / (time.perf_counter() - t0)


def parse_rate(c: Client, topic: str) -> float:
    """Client-side cost: parse one 10,000-record pull answer into Arrow, repeatedly."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from equeue.protocol import RequestCode
    from equeue.spark.columns import batches_batch
    from equeue.spark.source import PULL_FLAGS, SCHEMA

    raw = c.request(RequestCode.PULL, wire.PullRequest(topic, 0, 0, 10_000, 8 << 20, flags=PULL_FLAGS).encode())
    schema = to_arrow_schema(SCHEMA, timezone="UTC")
    t0 = time.perf_counter()
    for _ in range(20):
        batches_batch(raw, topic, 0, 0, 10_000, schema)
    return 200_000 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--spread", type=int, default=0, help="body sizes vary by up to this many bytes")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()
    if not 0 <= a.spread < a.size:
        ap.error("--spread must be at least 0 and below --size")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from equeue import spark
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(
        BrokerConfig(data_dir=Path(d) / "data", port=0, flush="async")
    ) as b:
        c = Client(b.address)
        c.create_topic("bench", a.queues)
        fill_s = fill(c, "bench", a.queues, a.messages, a.size, a.spread)
        print(f"backlog: {a.messages:,} × {a.size} ± {a.spread} B in {a.queues} queues (produced in {fill_s:.1f} s)")
        print(f"broker raw pull, 1 connection, no parsing: {raw_pull_rate(c, 'bench', a.queues, a.messages):,.0f} rows/s")
        print(f"client parse to Arrow (crc checked), 1 core: {parse_rate(c, 'bench'):,.0f} rows/s")
        t0 = time.perf_counter()
        s = spark.session("equeue-bench", a.master)
        print(f"session start: {time.perf_counter() - t0:.1f} s")
        df = s.read.format("equeue").option("brokers", b.address).option("topic", "bench").load()
        t0 = time.perf_counter()
        df.where("queue_offset < 10").count()  # warm the Python workers
        print(f"warm-up action: {time.perf_counter() - t0:.1f} s")
        rates = []
        for i in range(a.runs):
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            dt = time.perf_counter() - t0
            rate = a.messages / dt
            rates.append(rate)
            print(f"run {i + 1}: {a.messages:,} rows in {dt:.2f} s = {rate:,.0f} rows/s")
        print(
            f"spark read -> noop, {a.master}: median {statistics.median(rates):,.0f}, "
            f"best {max(rates):,.0f} rows/s over {a.runs} runs (target >= 1,500,000)"
        )
        s.stop()
        c.close()


if __name__ == "__main__":
    main()
