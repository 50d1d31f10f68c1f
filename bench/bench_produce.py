"""Producer throughput and latency against a broker in a separate process.

The broker runs as ``python -m equeue broker start --port 0 --flush sync|async``
(loopback); the producer runs here and is used exactly as a user would. Topic with
4 queues, every message keyed (``key=f"k{i}"``, so crc32-routed over the queues).

- P1: 200,000 x 100-byte messages, ``send_async`` + ``flush`` (batched by linger,
  pipelined per queue), target >= 200,000 msg/s with ``--flush sync``;
  ``--p1-mode batch`` uses ``send_batch`` of 100 messages instead (one at a time).
- P2: 100,000 x 1,024-byte messages, same path, target >= 100 MB/s.
- P3: 20,000 x 100-byte messages, ``send`` waiting for each ack: msg/s, p50/p99
  (targets >= 4,000 msg/s with ``--flush sync``, >= 20,000 msg/s with ``async``).

The ``cpu/msg`` column is the producer process's CPU time (all its threads, loop
included) per message, and ``broker`` the broker process's (user + system, from
``/proc/PID/stat``): on a shared, loaded machine they move far less than the
wall-clock rate, so compare them when checking that the produce path did not slow down.

    .venv/bin/python bench/bench_produce.py [--flush sync,async] [--front sync,async]
        [--workloads P1,P2,P3] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.models import Message  # noqa: E402
from equeue.producer import AsyncProducer, Producer  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def broker_cpu(pid: int) -> float:
    """utime + stime of the broker process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class BrokerProc(BrokerProcess):
    """The broker under test, in its own process, on a temporary data dir."""

    def __init__(self, flush: str) -> None:
        super().__init__(None, "--flush", flush)
        self.start()

def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


# ---------------------------------------------------------------------- sync front
def sync_stream(address: str, topic: str, n: int, size: int, mode: str) -> float:
    body = b"x" * size
    with Producer(address) as p:
        p.send(topic, b"warm-up", key="w")
        t0 = time.perf_counter()
        if mode == "batch":
            for start in range(0, n, 100):
                p.send_batch(topic, [Message(body, key=f"k{i}") for i in range(start, min(n, start + 100))])
        else:
            handles = [p.send_async(topic, body, key=f"k{i}") for i in range(n)]
            p.flush()
            for h in (handles[0], handles[-1]):
                h.result(0)
        return time.perf_counter() - t0


def sync_each(address: str, topic: str, n: int, size: int) -> tuple[float, list[float]]:
    body = b"x" * size
    lat: list[float] = []
    with Producer(address) as p:
        p.send(topic, b"warm-up", key="w")
        t0 = time.perf_counter()
        for i in range(n):
            s = time.perf_counter()
            p.send(topic, body, key=f"k{i}")
            lat.append(time.perf_counter() - s)
        return time.perf_counter() - t0, lat


# ---------------------------------------------------------------------- async front
def async_stream(address: str, topic: str, n: int, size: int, mode: str) -> float:
    body = b"x" * size

    async def main() -> float:
        async with AsyncProducer(address) as p:
            await p.send(topic, b"warm-up", key="w")
            t0 = time.perf_counter()
            if mode == "batch":
                for start in range(0, n, 100):
                    await p.send_batch(topic, [Message(body, key=f"k{i}") for i in range(start, min(n, start + 100))])
            else:
                for i in range(n):
                    await p.send_async(topic, body, key=f"k{i}")
                await p.flush()
            return time.perf_counter() - t0

    return trio.run(main)


def async_each(address: str, topic: str, n: int, size: int) -> tuple[float, list[float]]:
    body = b"x" * size

    async def main() -> tuple[float, list[float]]:
        lat: list[float] = []
        async with AsyncProducer(address) as p:
            await p.send(topic, b"warm-up", key="w")
            t0 = time.perf_counter()
            for i in range(n):
                s = time.perf_counter()
                await p.send(topic, body, key=f"k{i}")
                lat.append(time.perf_counter() - s)
            return time.perf_counter() - t0, lat

    return trio.run(main)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flush", default="sync,async")
    ap.add_argument("--front", default="sync,async")
    ap.add_argument("--workloads", default="P1,P2,P3")
    ap.add_argument("--p1-mode", default="async", choices=["async", "batch"])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    args = ap.parse_args()
    work = args.workloads.upper().split(",")
    print(
        f"{'flush':6} {'front':6} {'workload':9} {'msgs':>8} {'secs':>7} {'msg/s':>10} {'MB/s':>7} "
        f"{'cpu/msg':>9} {'broker':>9}  latency"
    )
    for flush in args.flush.split(","):
        broker = BrokerProc(flush)
        try:
            with Client(broker.address) as c:
                for w in ("P1", "P2", "P3"):
                    for front in ("sync", "async"):
                        c.create_topic(f"{w}-{front}", 4)
            for front in args.front.split(","):
                stream: Callable[..., float] = sync_stream if front == "sync" else async_stream
                each: Callable[..., Any] = sync_each if front == "sync" else async_each
                for w in work:
                    topic = f"{w}-{front}"
                    lat_s = ""
                    cpu0, bcpu0 = time.process_time(), broker_cpu(broker.pid)
                    if w == "P1":
                        n, size = int(200_000 * args.scale), 100
                        secs = stream(broker.address, topic, n, size, args.p1_mode)
                    elif w == "P2":
                        n, size = int(100_000 * args.scale), 1024
                        secs = stream(broker.address, topic, n, size, "async")
                    else:
                        n, size = int(20_000 * args.scale), 100
                        if flush == "sync":
                            n = max(200, n // 10)  # one fsync per message: keep the run short
                        secs, lat = each(broker.address, topic, n, size)
                        lat_s = f"p50 {pct(lat, 0.5) * 1e3:.2f} ms  p99 {pct(lat, 0.99) * 1e3:.2f} ms"
                    cpu_us = (time.process_time() - cpu0) / n * 1e6
                    bcpu_us = (broker_cpu(broker.pid) - bcpu0) / n * 1e6
                    rate = n / secs
                    print(
                        f"{flush:6} {front:6} {w:9} {n:>8} {secs:>7.2f} {rate:>10,.0f} "
                        f"{rate * size / 1e6:>7.1f} {cpu_us:>6.2f} us {bcpu_us:>6.2f} us  {lat_s}",
                        flush=True,
                    )
        finally:
            broker.close()


if __name__ == "__main__":
    main()
