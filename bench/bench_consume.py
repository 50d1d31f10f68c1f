"""Consumer benchmarks against a broker process (``python -m equeue broker start``).

C1: one member drains a 200,000 x 100-byte backlog from 4 queues (no-op handler).
C2: two member processes drain the same backlog (fresh group) together.
L1: a producer process sends 2,000 msg/s for 10 s; one long-polling member records
    send-to-handler latency (send timestamp in the body, CLOCK_REALTIME).

    .venv/bin/python bench/bench_consume.py [--messages 200000] [--flush sync|async]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from broker.process import BrokerProcess  # noqa: E402
from consumer import AsyncConsumer, Consumer  # noqa: E402
from equeue import Message, wire  # noqa: E402
from producer import AsyncClient  # noqa: E402

FAST = dict(heartbeat_interval=0.5, rebalance_interval=0.5, commit_interval=1.0)

MEMBER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from consumer import Consumer
addr, group, n, go = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
import os
c = Consumer(addr, group, "bench", start_from="earliest", heartbeat_interval=0.5,
             rebalance_interval=0.5, commit_interval=1.0)
c.start()
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
count = 0; first = 0.0; last = 0.0
def handler(m):
    global count, first, last
    if not count:
        first = time.time()
    count += 1
    last = time.time()
import threading
def watch():
    # stop once nothing arrived for 1.5 s after the go signal (the backlog is drained)
    while True:
        time.sleep(0.25)
        if count and time.time() - last > 1.5:
            c.stop(); return
threading.Thread(target=watch, daemon=True).start()
c.run(handler)
c.close()
print(f"done {count} {first} {last}", flush=True)
"""

PRODUCER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import trio
from equeue import Message, wire
from producer import AsyncClient
addr, rate, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
async def main():
    async with AsyncClient(addr) as c:
        async def send(i):
            body = str(time.time_ns()).encode()
            await c.produce(wire.ProduceRequest("lat", i % 4, [wire.encode_entry(Message(body))]))
        n = int(rate * secs)
        t0 = trio.current_time()
        async with trio.open_nursery() as nur:
            for i in range(n):
                await trio.sleep_until(t0 + i / rate)
                nur.start_soon(send, i)
trio.run(main)
"""


def start_broker(data: str, flush: str) -> tuple[subprocess.Popen[str], str]:
    b = BrokerProcess(data, "--flush", flush).start()
    assert b.proc is not None
    return b.proc, b.address


async def fill(addr: str, n: int, size: int) -> None:
    async with AsyncClient(addr) as c:
        await c.create_topic("bench", 4)
        entries = [wire.encode_entry(Message(b"x" * size)) for _ in range(1000)]
        async with trio.open_nursery() as nur:
            for q in range(4):

                async def prod(q: int = q) -> None:
                    for _ in range(n // 4 // 1000):
                        await c.produce(wire.ProduceRequest("bench", q, entries))

                nur.start_soon(prod)


def c1_sync(addr: str, n: int, group: str, **kw: object) -> float:
    count = 0
    first = 0.0
    with Consumer(addr, group, "bench", start_from="earliest", **FAST, **kw) as c:  # type: ignore[arg-type]

        def handler(m: Message) -> None:
            nonlocal count, first
            if not count:
                first = time.perf_counter()
            count += 1
            if count == n:
                c.stop()

        c.run(handler)
        dt = time.perf_counter() - first
    return n / dt


def c1_async(addr: str, n: int, group: str) -> float:
    async def main() -> float:
        count = 0
        first = 0.0
        async with AsyncConsumer(addr, group, "bench", start_from="earliest", **FAST) as c:  # type: ignore[arg-type]

            async def handler(m: Message) -> None:
                nonlocal count, first
                if not count:
                    first = time.perf_counter()
                count += 1
                if count == n:
                    c.stop()

            await c.run(handler)
            return n / (time.perf_counter() - first)

    return trio.run(main)


def c2(addr: str, n: int, tmp: str) -> tuple[float, list[int]]:
    script = Path(tmp) / "member.py"
    script.write_text(MEMBER)
    go = Path(tmp) / "go"
    procs = [
        subprocess.Popen([sys.executable, str(script), str(ROOT), addr, "c2", str(n), str(go)],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(1.5)  # both members joined and split the queues
    go.touch()
    results = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.read().strip().splitlines()[-1].split()
        results.append((int(line[1]), float(line[2]), float(line[3])))
        p.wait()
    total = sum(r[0] for r in results)
    dt = max(r[2] for r in results) - min(r[1] for r in results)
    return total / dt, [r[0] for r in results]


def l1(addr: str, rate: int, secs: float, tmp: str) -> tuple[float, float, float, int]:
    script = Path(tmp) / "producer.py"
    script.write_text(PRODUCER)
    lat: list[float] = []
    with Consumer(addr, "lat", "lat", start_from="latest", **FAST) as c:  # type: ignore[arg-type]

        def handler(m: Message) -> None:
            lat.append((time.time_ns() - int(m.body)) / 1e6)

        async def create() -> None:
            async with AsyncClient(addr) as cl:
                await cl.create_topic("lat", 4, exist_ok=True)

        trio.run(create)
        c.start()
        time.sleep(1.0)
        p = subprocess.Popen([sys.executable, str(script), str(ROOT), addr, str(rate), str(secs)], cwd=ROOT)
        import threading

        def stopper() -> None:
            p.wait()
            time.sleep(1.0)
            c.stop()

        threading.Thread(target=stopper, daemon=True).start()
        c.run(handler)
    lat.sort()
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)], lat[-1], len(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--flush", default="sync")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    n = args.messages
    with tempfile.TemporaryDirectory(prefix="equeue-bench-") as tmp:
        broker, addr = start_broker(os.path.join(tmp, "data"), args.flush)
        try:
            trio.run(fill, addr, n, args.size)
            print(f"backlog: {n:,} x {args.size} B in 4 queues (broker flush={args.flush})")
            print(f"C1 sync Consumer, no-op handler:        {c1_sync(addr, n, 'c1s'):,.0f} msg/s")
            print(f"C1 AsyncConsumer, no-op async handler:  {c1_async(addr, n, 'c1a'):,.0f} msg/s")
            print(f"C1 sync, fixed pull batch 32:           "
                  f"{c1_sync(addr, n, 'c1f', max_pull_batch=32):,.0f} msg/s")  # fmt: skip
            rate, split = c2(addr, n, tmp)
            print(f"C2 two member processes:                {rate:,.0f} msg/s together (split {split})")
            p50, p99, mx, cnt = l1(addr, args.rate, args.seconds, tmp)
            print(f"L1 {args.rate} msg/s for {args.seconds:.0f} s, {cnt:,} msgs: send-to-handler "
                  f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {mx:.2f} ms")  # fmt: skip
        finally:
            broker.kill()


if __name__ == "__main__":
    main()
