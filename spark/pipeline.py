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

    python -m spark.pipeline [--orders 20000] [--data-dir ./pipeline-data]

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

from broker import BrokerConfig, EmbeddedBroker
from consumer import Consumer
from producer import Client, Producer

console = Console(stderr=False)

CATEGORIES = {"books": 18.0, "games": 45.0, "garden": 30.0, "grocery": 12.0, "toys": 22.0}
WINDOW = "10 seconds"
WATERMARK = "30 seconds"
SPARK_GROUP = "spark-revenue"  # the job's progress, visible with: equeue group describe spark-revenue
DASHBOARD_GROUP = "dashboard"


def produce_orders(brokers: str, n: int, seed: int = 7) -> tuple[int, float, int]:
    """Send ``n`` orders spread over ~2 minutes of event time, slightly out of order;
    every 25th order is delayed by 2 s. Returns (orders, total amount in cents, delayed)."""
    rnd = random.Random(seed)
    start_ms = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event time, independent of now
    span_ms = 120_000
    total = 0
    delayed = 0
    # delayed orders go through a second producer: mixing delayed blocking sends and
    # buffered sends on one Producer lost messages in the SDK version this was written against
    with Producer(brokers) as p, Producer(brokers) as late:
        for i in range(n):
            category = rnd.choice(list(CATEGORIES))
            cents = max(1, int(rnd.gauss(CATEGORIES[category], CATEGORIES[category] / 3) * 100))
            event_ms = start_ms + i * span_ms // n - rnd.randint(0, 3000)  # a little disorder
            order = {
                "order_id": f"o-{i:06d}",
                "customer": f"cust-{rnd.randint(1, 2000):04d}",
                "category": category,
                "amount_cents": cents,
                "event_ms": event_ms,
            }
            total += cents
            body = json.dumps(order).encode()
            if i % 25 == 0:  # delivered by the broker 2 s from now
                late.send("orders", body, key=order["customer"], tags=category, delay=2.0)
                delayed += 1
            else:
                p.send_async("orders", body, key=order["customer"], tags=category)
        # a last tick far past the end moves the watermark so every real window is final
        tick = {"order_id": "tick", "customer": "-", "category": "_tick", "amount_cents": 0,
                "event_ms": start_ms + span_ms + 120_000}  # fmt: skip
        p.send_async("orders", json.dumps(tick).encode(), tags="_tick")
        p.flush(60)
    return n, total, delayed


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
        .agg(F.sum("amount_cents").alias("revenue_cents"), F.count("*").alias("orders"))
        .where("category != '_tick'")
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
        import spark

        s = spark.session("equeue-pipeline", "local[2]", shuffle_partitions=2)
        console.print(f"broker on [bold]{brokers}[/], data in {data_dir}, Spark {s.version} ready")

        with console.status(f"producing {n_orders:,} orders..."):
            sent, total_cents, delayed = produce_orders(brokers, n_orders)
            wait_delayed(c, "orders")
        console.print(f"produced {sent:,} orders ({delayed} delayed by 2 s), total {total_cents / 100:,.2f}")

        with console.status("streaming: orders -> revenue windows (Parquet + equeue topic)..."):
            windows = build_job(s, brokers)
            parquet = data_dir / "revenue.parquet"
            q_parquet = (
                windows.writeStream.format("parquet")
                .option("path", str(parquet))
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
        batches = sum(1 for p in q_parquet.recentProgress if p["numInputRows"])
        rows_in = sum(p["numInputRows"] for p in q_parquet.recentProgress)
        result = s.read.parquet(str(parquet))
        n_windows = result.count()
        agg = result.selectExpr("sum(revenue_cents) AS cents", "sum(orders) AS n").first()

        with console.status("consumer group reads the revenue topic..."):
            got = read_results(brokers, n_windows)
        top = result.groupBy("category").sum("revenue_cents").orderBy("category").collect()
        s.stop()

        spark_lag = sum(q.lag for q in c.describe_group(SPARK_GROUP).queues)
        dash_lag = sum(q.lag for q in c.describe_group(DASHBOARD_GROUP).queues)
        topic_msgs = sum(q.max_offset - q.min_offset for q in c.describe_topic("revenue").queues)

    ok = (
        agg.n == sent
        and agg.cents == total_cents
        and got == n_windows == topic_msgs
        and spark_lag == 0
        and dash_lag == 0
    )
    summary(
        sent, rows_in, batches, n_windows, topic_msgs, got, agg.cents, total_cents,
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
    t.add_row("rows in (Spark source)", f"{rows_in:,} in {batches} micro-batches")
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
    ap.add_argument("--data-dir", type=Path, default=Path("pipeline-data"))
    a = ap.parse_args(argv)
    return run(a.orders, a.data_dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
