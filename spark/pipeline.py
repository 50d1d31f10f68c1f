"""The example pipeline behind ``make run`` — a template for your own equeue + Spark job.

1. start an embedded broker on a local data directory;
2. produce a realistic order stream with the producer SDK (customer keys, amounts,
   categories; a few orders delayed with ``delay=``);
3. a Spark Structured Streaming job reads ``orders`` with the ``equeue`` source and
   computes revenue per category per 10-second event-time window with a watermark;
   it writes the windows to Parquet and, exactly once, back to the ``revenue`` topic
   through the ``equeue`` sink (two queries, each with its own checkpoint);
4. a consumer group reads ``revenue`` with the consumer SDK;
5. prints a summary (rows in, windows out, lag 0, elapsed) and checks the totals.

    python -m equeue.spark.pipeline [--orders 20000] [--data-dir ./data/pipeline]

Exit status 0 when every order was counted once and every group has lag 0.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from equeue.broker import EmbeddedBroker
from equeue.client import Client
from equeue.config import BrokerConfig
from equeue.consumer import Consumer
from equeue.errors import OperationTimeout
from equeue.producer import Producer

console = Console(stderr=False)

CATEGORIES = {"books": 18.0, "games": 45.0, "garden": 30.0, "grocery": 12.0, "toys": 22.0}
WINDOW = "10 seconds"
WATERMARK = "2 minutes"  # orders up to 2 minutes late (e.g. the delayed ones) still count
SPARK_GROUP = "spark-revenue"  # the job's progress, visible with: equeue group describe spark-revenue
DASHBOARD_GROUP = "dashboard"
START_MS = 1_767_225_600_000  # event time of the first order: 2026-01-01T00:00:00Z
SPAN_MS = 120_000  # orders cover two minutes of event time


def produce_orders(brokers: str, n: int, seed: int = 7) -> tuple[int, int, int]:
    """Send ``n`` orders spread over ~2 minutes of event time, slightly out of order;
    every 25th order is delayed by 2 s. Returns (orders, total amount in cents, delayed)."""
    rnd = random.Random(seed)
    total = 0
    delayed = 0
    # delayed orders go through a second producer: mixing delayed blocking sends and
    # buffered sends on one Producer lost messages in the SDK version this was written against
    with Producer(brokers) as p, Producer(brokers) as late:
        for i in range(n):
            category = rnd.choice(list(CATEGORIES))
            cents = max(1, int(rnd.gauss(CATEGORIES[category], CATEGORIES[category] / 3) * 100))
            event_ms = START_MS + i * SPAN_MS // n - rnd.randint(0, 3000)  # a little disorder
            customer = f"cust-{rnd.randint(1, 2000):04d}"
            order = {
                "order_id": f"o-{i:06d}",
                "customer": customer,
                "category": category,
                "amount_cents": cents,
                "event_ms": event_ms,
            }
            total += cents
            body = json.dumps(order).encode()
            if i % 25 == 0:  # delivered by the broker 2 s from now
                late.send("orders", body, key=customer, tags=category, delay=2.0)
                delayed += 1
            else:
                p.send_async("orders", body, key=customer, tags=category)
        left = p.flush(60)
        if left:
            raise OperationTimeout(f"{left} orders still unanswered after 60 s")
    return n, total, delayed


def send_tick(brokers: str, n: int) -> None:
    """A marker event far past the last order: it moves the watermark on, so the
    windows before it become final and are emitted (append mode)."""
    tick = {"order_id": f"tick-{n}", "customer": "-", "category": "_tick", "amount_cents": 0,
            "event_ms": START_MS + SPAN_MS + 180_000 * n}  # fmt: skip
    with Producer(brokers) as p:
        p.send("orders", json.dumps(tick).encode(), tags="_tick")


def run_queries(windows: Any, brokers: str, data_dir: Path) -> list[dict[str, Any]]:
    """Run both sinks as availableNow queries (resuming from their checkpoints);
    returns the progress reports of the Parquet query."""
    q_parquet = (
        windows.writeStream.format("parquet")
        .option("path", str(data_dir / "revenue.parquet"))
        .option("checkpointLocation", str(data_dir / "ck-parquet"))
        .trigger(availableNow=True)
        .start()
    )
    q_topic = (
        windows.selectExpr("category AS key", "to_json(struct(*)) AS body", "'window' AS tags")
        .writeStream.format("equeue")
        .option("brokers", brokers)
        .option("topic", "revenue")
        .option("checkpointLocation", str(data_dir / "ck-topic"))
        .trigger(availableNow=True)
        .start()
    )
    q_parquet.awaitTermination()
    q_topic.awaitTermination()
    return list(q_parquet.recentProgress)


def wait_delayed(c: Client, topic: str, timeout: float = 30.0) -> None:
    """Block until the broker has delivered every delayed message of ``topic``."""
    deadline = time.monotonic() + timeout
    while c.describe_topic(topic).pending_delayed:
        if time.monotonic() > deadline:
            raise TimeoutError(f"delayed messages of {topic} were not delivered in {timeout} s")
        time.sleep(0.2)


def build_job(s: Any, brokers: str) -> Any:
    """orders (equeue) -> revenue per category per 10 s window (with a watermark)."""
    from pyspark.sql import functions as F

    order = "struct<order_id:string,customer:string,category:string,amount_cents:bigint,event_ms:bigint>"
    orders = (
        s.readStream.format("equeue")
        .option("brokers", brokers)
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 8000)  # several micro-batches, like a live stream
        .option("group", SPARK_GROUP)
        .load()
        .select(F.from_json(F.col("body").cast("string"), order).alias("o"))
        .select("o.*")
        .withColumn("event_time", F.timestamp_millis("event_ms"))
    )
    return (
        orders.withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", WINDOW), "category")
        .agg(
            F.sum("amount_cents").alias("revenue_cents"),
            F.count_if(F.col("category") != "_tick").alias("orders"),
        )
        # drop the ticks' own windows; a filter on the aggregate (unlike one on
        # ``category``) is not pushed below the watermark, so ticks still move it
        .where("orders > 0")
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "category",
            "revenue_cents",
            "orders",
        )
    )


def run(n_orders: int, data_dir: Path) -> int:
    t0 = time.monotonic()
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    with console.status("starting the broker and Spark..."), EmbeddedBroker(
        BrokerConfig(data_dir=data_dir / "broker", port=0, flush="async")
    ) as broker, Client(broker.address) as c:
        brokers = broker.address
        c.create_topic("orders", 4)
        c.create_topic("revenue", 2)
        from equeue import spark
        s = spark.session("equeue-pipeline", "local[2]", shuffle_partitions=2)
        console.print(f"broker on [bold]{brokers}[/], data in {data_dir}, Spark {s.version} ready")

        with console.status(f"producing {n_orders:,} orders..."):
            sent, total_cents, delayed = produce_orders(brokers, n_orders)
            wait_delayed(c, "orders")
        console.print(f"produced {sent:,} orders ({delayed} delayed by 2 s), total {total_cents / 100:,.2f}")

        windows = build_job(s, brokers)
        progress: list[dict[str, Any]] = []
        # Two runs, as a scheduled job would do: the first reads the backlog in several
        # micro-batches (maxOffsetsPerTrigger); the second resumes from the checkpoints,
        # reads only what is new (one more tick), and emits the windows that the
        # watermark closed at the end of the first run.
        for n in (1, 2):
            send_tick(brokers, n)
            with console.status(f"streaming run {n}: orders -> revenue windows (Parquet + equeue topic)..."):
                progress += run_queries(windows, brokers, data_dir)
        parquet = data_dir / "revenue.parquet"
        batches = sum(1 for p in progress if p["numInputRows"])
        rows_in = sum(p["numInputRows"] for p in progress if p["numInputRows"])
        result = s.read.parquet(str(parquet))
        n_windows = result.count()
        agg = result.selectExpr("sum(revenue_cents) AS cents", "sum(orders) AS n").collect()[0]
        counted_orders, counted_cents = int(agg.n), int(agg.cents)

        with console.status("consumer group reads the revenue topic..."):
            got = read_results(brokers, n_windows)
        top = result.groupBy("category").sum("revenue_cents").orderBy("category").collect()
        s.stop()

        spark_lag = sum(q.lag for q in c.describe_group(SPARK_GROUP).queues)
        dash_lag = sum(q.lag for q in c.describe_group(DASHBOARD_GROUP).queues)
        topic_msgs = sum(q.max_offset - q.min_offset for q in c.describe_topic("revenue").queues)

    ok = (
        counted_orders == sent
        and rows_in == sent + 2
        and counted_cents == total_cents
        and got == n_windows == topic_msgs
        and spark_lag == 0
        and dash_lag == 0
    )
    summary(
        sent, rows_in, batches, n_windows, topic_msgs, got, counted_cents, total_cents,
        spark_lag, dash_lag, top, time.monotonic() - t0, ok,
    )  # fmt: skip
    return 0 if ok else 1


def read_results(brokers: str, expect: int, timeout: float = 60.0) -> int:
    """Read the revenue topic with a consumer group until ``expect`` windows arrived."""
    seen: set[tuple[str, str]] = set()
    cons = Consumer(brokers, DASHBOARD_GROUP, ["revenue"], start_from="earliest")

    def handle(msg: Any) -> None:  # returning = done (its offset gets committed)
        w = json.loads(msg.body)
        seen.add((w["window_start"], w["category"]))
        if len(seen) >= expect:
            cons.stop()

    timer = threading.Timer(timeout, cons.stop)
    timer.start()
    try:
        cons.run(handle)
    finally:
        timer.cancel()
        cons.close()  # commits the offsets of handled messages and leaves the group
    return len(seen)


def summary(
    sent: int, rows_in: int, batches: int, n_windows: int, topic_msgs: int, got: int,
    cents: int, total_cents: int, spark_lag: int, dash_lag: int, top: list[Any], elapsed: float, ok: bool,
) -> None:  # fmt: skip
    t = Table(title="equeue × Spark pipeline", show_header=False, title_style="bold")
    t.add_column(style="cyan")
    t.add_column(justify="right")
    t.add_row("orders produced", f"{sent:,}")
    t.add_row("rows in (orders + 2 ticks)", f"{rows_in:,} in {batches} micro-batches")
    t.add_row("windows out (Parquet)", f"{n_windows:,}")
    t.add_row("windows in topic 'revenue'", f"{topic_msgs:,} (exactly once)")
    t.add_row("windows read by group 'dashboard'", f"{got:,}")
    t.add_row("revenue counted / produced", f"{cents / 100:,.2f} / {total_cents / 100:,.2f}")
    t.add_row(f"lag of '{SPARK_GROUP}' / '{DASHBOARD_GROUP}'", f"{spark_lag} / {dash_lag}")
    for r in top:
        t.add_row(f"  revenue {r['category']}", f"{r['sum(revenue_cents)'] / 100:,.2f}")
    t.add_row("elapsed", f"{elapsed:.1f} s")
    t.add_row("result", "[green]OK[/]" if ok else "[red]MISMATCH[/]")
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="equeue + Spark example pipeline")
    ap.add_argument("--orders", type=int, default=20_000)
    ap.add_argument("--data-dir", type=Path, default=Path("data/pipeline"))
    a = ap.parse_args(argv)
    return run(a.orders, a.data_dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
