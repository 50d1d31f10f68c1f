"""The asyncio front (equeue.aio) against the trio SDK, in one run on one embedded broker:
P1 streaming produce (send_async + flush), C1 drain of a backlog, L1 send->handler latency
at a fixed rate, and the per-call cost of the thread bridge.

    .venv/bin/python bench/bench_aio.py [--messages 200000] [--rate 2000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from equeue import aio
from equeue.broker import EmbeddedBroker
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.models import Message
from equeue.producer import AsyncProducer
from tests.conftest import make_config

BODY = b"x" * 100
FAST: dict[str, Any] = dict(heartbeat_interval=0.5, rebalance_interval=0.5, commit_interval=1.0)


async def p1(producer: Any, addr: str, topic: str, n: int) -> float:
    """P1 with ``producer`` (the trio AsyncProducer under trio.run, or equeue.aio's
    under asyncio.run: the same calls)."""
    async with producer(addr) as p:
        t0 = time.perf_counter()
        for _ in range(n):
            await p.send_async(topic, BODY)
        await p.flush()
        return n / (time.perf_counter() - t0)


async def c1(consumer: Any, addr: str, topic: str, group: str, n: int) -> float:
    """C1 with ``consumer`` (trio's AsyncConsumer, or equeue.aio's), a no-op async handler."""
    async with consumer(addr, group, topic, start_from="earliest", **FAST) as con:
        count = 0
        t0 = time.perf_counter()

        async def handler(m: Message) -> None:
            nonlocal count
            count += 1
            if count == n:
                con.stop()

        await con.run(handler)
        return float(n / (time.perf_counter() - t0))


def pct(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"p50 {1000 * xs[len(xs) // 2]:.2f} ms, p99 {1000 * xs[int(len(xs) * 0.99)]:.2f} ms"


async def l1_trio(addr: str, topic: str, rate: int, seconds: float, group: str = "l1-trio") -> str:
    lat: list[float] = []
    n = int(rate * seconds)
    async with AsyncConsumer(addr, group, topic, start_from="earliest", **FAST) as con, AsyncProducer(addr, linger=0) as p:

        async def handler(m: Message) -> None:
            lat.append(time.perf_counter() - float(m.text))
            if len(lat) == n:
                con.stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(con.run, handler)
            await trio.sleep(1.0)
            t0 = time.perf_counter()
            for i in range(n):
                await trio.sleep_until(trio.current_time() + max(0.0, t0 + i / rate - time.perf_counter()))
                await p.send_async(topic, repr(time.perf_counter()))
    return pct(lat)


async def l1_aio(addr: str, topic: str, rate: int, seconds: float, group: str = "l1-aio") -> str:
    lat: list[float] = []
    n = int(rate * seconds)
    async with aio.AsyncConsumer(addr, group, topic, start_from="earliest", **FAST) as con, aio.AsyncProducer(addr, linger=0) as p:

        async def handler(m: Message) -> None:
            lat.append(time.perf_counter() - float(m.text))
            if len(lat) == n:
                con.stop()

        run = asyncio.create_task(con.run(handler))
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            await p.send_async(topic, repr(time.perf_counter()))
        await run
    return pct(lat)


async def bridge_aio(addr: str, calls: int) -> float:
    """Seconds per call of a do-nothing trio function called through the asyncio front."""
    async with aio.AsyncProducer(addr) as p:
        p._ready()
        t0 = time.perf_counter()
        for _ in range(calls):
            await p._call(trio.lowlevel.checkpoint)
        return (time.perf_counter() - t0) / calls


async def bridge_trio(calls: int) -> float:
    """Seconds per call of the same function awaited in trio directly."""
    t0 = time.perf_counter()
    for _ in range(calls):
        await trio.lowlevel.checkpoint()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--no-throughput", action="store_true", help="L1 and the bridge cost only")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(make_config(Path(d))) as b:
        addr = b.address

        async def topics() -> None:
            async with AsyncClient(addr) as c:
                for t in ("p1t", "p1a", "l1t", "l1a"):
                    await c.create_topic(t, 4)

        trio.run(topics)
        if a.no_throughput:
            a.messages = 0
        if a.messages:
            print(f"P1 trio : {trio.run(p1, AsyncProducer, addr, 'p1t', a.messages):,.0f} msg/s")
            print(f"P1 aio  : {asyncio.run(p1(aio.AsyncProducer, addr, 'p1a', a.messages)):,.0f} msg/s")
            print(f"C1 trio : {trio.run(c1, AsyncConsumer, addr, 'p1t', 'c1', a.messages):,.0f} msg/s")
            print(f"C1 aio  : {asyncio.run(c1(aio.AsyncConsumer, addr, 'p1a', 'c1', a.messages)):,.0f} msg/s")
        print(f"L1 trio : {trio.run(l1_trio, addr, 'l1t', a.rate, a.seconds)}")
        print(f"L1 aio  : {asyncio.run(l1_aio(addr, 'l1a', a.rate, a.seconds))}")
        print(f"call trio direct : {1e6 * trio.run(bridge_trio, 100_000):.2f} us")
        print(f"call aio bridge  : {1e6 * statistics.median(asyncio.run(bridge_aio(addr, 5_000)) for _ in range(3)):.2f} us")


if __name__ == "__main__":
    main()
