"""Cheap requests that scan: a healthy client's latency while
one attacker repeats a scanning request back to back.

Attacks, each against a broker in a child process (``--flush async``) whose data
set is written through the store API first, with the sizes of the issue:

- ``tags``: a tag-filtered pull (no match) over a queue of 200,000 records;
- ``find``: FIND_BY_KEY of a key whose crc32 collides with 400,000 stored keys;
- ``metrics``: a ``/metrics`` scrape with 200 topics x 1,024 queues (every queue
  holding one message).

For each it prints the attack requests' latency and the healthy client's produce
and pull latency (p50, p99, worst) over ``--seconds``, after a quiet baseline.
The target: the healthy client's worst under 50 ms on a quiet machine.

    .venv/bin/python bench/bench_scan.py [--seconds 5] [--only tags,find,metrics]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from equeue import Message, wire
from equeue.broker.process import BrokerProcess
from equeue.broker.storage import CreateTopicOp, ProduceOp, Store
from equeue.client import AsyncClient
from equeue.control import TopicInfo

KEY, COLLIDER = "plumless", "buckeroo"  # crc32("plumless") == crc32("buckeroo")


def append(store: Store, info: TopicInfo, n: int, *, tags: str | None = None, key: str | None = None) -> None:
    entry = wire.encode_entry(Message(b"x" * 100, key=key, tags=tags))
    for i in range(0, n, 20_000):
        store.write([ProduceOp(info, 0, [entry] * min(20_000, n - i))])


def build(data_dir: Path, attack: str) -> None:
    store = Store(data_dir, map_size=4 << 30, sync=False)
    try:
        store.write([CreateTopicOp("ok", 1)])
        if attack == "tags":
            (info,) = store.write([CreateTopicOp("tagged", 1)]).settled()
            append(store, info, 200_000, tags="a")
        elif attack == "find":
            (info,) = store.write([CreateTopicOp("k", 1)]).settled()
            append(store, info, 400_000, key=KEY)
        else:
            infos = store.write([CreateTopicOp(f"t{i:03}", 1024) for i in range(200)]).settled()
            one = [wire.encode_entry(Message(b"x"))]
            for info in infos:
                store.write([ProduceOp(info, q, one) for q in range(1024)])
    finally:
        store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def http_get(port: int, path: str) -> int:
    s = await trio.open_tcp_stream("127.0.0.1", port)
    await s.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while chunk := await s.receive_some(1 << 20):
        n += len(chunk)
    await s.aclose()
    return n


def summary(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name}: none"
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return (f"{name}: n={len(xs)} p50 {statistics.median(xs) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
            f"worst {xs[-1] * 1000:.2f} ms")  # fmt: skip


async def measure(address: str, attack: Callable[[], Awaitable[object]] | None, seconds: float) -> None:
    healthy: list[float] = []
    attacks: list[float] = []
    async with AsyncClient(address) as h, trio.open_nursery() as n:

        async def attacker() -> None:
            assert attack is not None
            while True:
                t0 = time.perf_counter()
                await attack()
                attacks.append(time.perf_counter() - t0)

        if attack is not None:
            n.start_soon(attacker)
        offset = (await h.pull(wire.PullRequest("ok", 0, 0))).max_offset
        with trio.move_on_after(seconds):
            while True:
                t0 = time.perf_counter()
                await h.produce(wire.ProduceRequest("ok", 0, [wire.encode_entry(Message(b"ping"))]))
                t1 = time.perf_counter()
                got = await h.pull(wire.PullRequest("ok", 0, offset))
                t2 = time.perf_counter()
                offset = got.next_offset
                healthy += [t1 - t0, t2 - t1]
                await trio.sleep(0.002)  # a steady client, not a flood
        n.cancel_scope.cancel()
    if attack is not None:
        print("  " + summary("attack requests", attacks))
    print("  " + summary("healthy produce/pull", healthy))


async def run(attack: str, seconds: float, broker_args: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="equeue-bench-scan-") as d:
        t0 = time.perf_counter()
        build(Path(d), attack)
        print(f"{attack}: data set written in {time.perf_counter() - t0:.1f} s")
        port = free_port()
        with BrokerProcess(d, "--flush", "async", "--http-port", str(port), *broker_args) as b:
            async with AsyncClient(b.address) as c:
                if attack == "tags":

                    async def hit() -> object:
                        return await c.pull(wire.PullRequest("tagged", 0, 0, 10_000, tags="b"))
                elif attack == "find":

                    async def hit() -> object:
                        return await c.find_by_key("k", COLLIDER, 1000)
                else:
                    print(f"  /metrics {await http_get(port, '/metrics'):,} bytes, "
                          f"/metrics?queues=1 {await http_get(port, '/metrics?queues=1'):,} bytes")  # fmt: skip

                    async def hit() -> object:
                        return await http_get(port, "/metrics")

                print(" quiet:")
                await measure(b.address, None, seconds)
                print(" under attack:")
                await measure(b.address, hit, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--only", default="tags,find,metrics")
    ap.add_argument("--broker-args", default="", help="extra `broker start` flags, e.g. '--scan-time 2ms'")
    args = ap.parse_args()
    for attack in args.only.split(","):
        trio.run(run, attack, args.seconds, args.broker_args.split())


if __name__ == "__main__":
    main()
