"""Consumer benchmarks against a broker process (``python -m equeue broker start``).

C1: one member drains a 200,000 x 100-byte backlog from 4 queues (no-op handler).
C2: two member processes drain the same backlog (fresh group) together.
L1: a producer process sends 2,000 msg/s for 10 s; one long-polling member records
    send-to-handler latency (send timestamp in the body, CLOCK_REALTIME).

    .venv/bin/python bench/bench_consume.py [--messages 200000] [--flush sync|async]
        [--only c1s,c1t,c1i,c1a,c1f,c2,c2t,c2a,l1] [--repeat N]

c1s: sync Consumer (default handler placement: inline on the loop while fast);
c1t: sync Consumer with handler_threads="always" (every handler call in a worker thread);
c1i: sync Consumer, iterator form (``for msg in consumer``);
c1a: AsyncConsumer; c1f: sync Consumer with max_pull_batch=32; c2: two sync Consumer
processes; c2t: the same with handler_threads="always"; c2a: two AsyncConsumer processes.
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

from equeue import Message, wire  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import AsyncClient  # noqa: E402
from equeue.consumer import AsyncConsumer, Consumer  # noqa: E402

FAST = dict(heartbeat_interval=0.5, rebalance_interval=0.5, commit_interval=1.0)

MEMBER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from equeue.consumer import Consumer
addr, group, n, go, placement = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
import os
c = Consumer(addr, group, "bench", start_from="earliest", heartbeat_interval=0.5,
             rebalance_interval=0.5, commit_interval=1.0, handler_threads=placement)
c.start()
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
cpu0 = time.process_time()
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
cpu = time.process_time() - cpu0
c.close()
print(f"done {count} {first} {last} {cpu}", flush=True)
"""

MEMBER_ASYNC = r"""
import sys, time, os
sys.path.insert(0, sys.argv[1])
import trio
from equeue.consumer import AsyncConsumer
addr, group, n, go = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
count = 0; first = 0.0; last = 0.0
async def main():
    async with AsyncConsumer(addr, group, "bench", start_from="earliest", heartbeat_interval=0.5,
                             rebalance_interval=0.5, commit_interval=1.0) as c:
        print("ready", flush=True)
        while not os.path.exists(go):
            await trio.sleep(0.01)
        global cpu0
        cpu0 = time.process_time()
        async def handler(m):
            global count, first, last
            if not count:
                first = time.time()
            count += 1
            last = time.time()
        async def watch():
            while True:
                await trio.sleep(0.25)
                if count and time.time() - last > 1.5:
                    c.stop(); return
        async with trio.open_nursery() as nur:
            nur.start_soon(watch)
            await c.run(handler)
        global cpu
        cpu = time.process_time() - cpu0
cpu0 = cpu = 0.0
trio.run(main)
print(f"done {count} {first} {last} {cpu}", flush=True)
"""

PRODUCER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import trio
from equeue.producer import AsyncProducer
addr, rate, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
async def main():
    async with AsyncProducer(addr) as p:
        await p.queue_count("lat")
        async def send(i):
            await p.send("lat", str(time.time_ns()).encode(), key="k%d" % (i % 8))
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


class _Meter:
    """Wall time, this process's CPU and the broker's CPU from the first message on."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.t0 = self.cpu0 = self.b0 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.b0 = cpu_seconds(self.broker_pid) if self.broker_pid else 0.0

    def result(self, n: int) -> tuple[float, str]:
        dt = time.perf_counter() - self.t0
        cpu = time.process_time() - self.cpu0
        note = f"wall {dt:.2f} s; CPU per message: consumer {1e6 * cpu / n:.2f} us"
        if self.broker_pid:
            note += f", broker {1e6 * (cpu_seconds(self.broker_pid) - self.b0) / n:.2f} us"
        return n / dt, note


def c1_sync(addr: str, n: int, group: str, broker_pid: int | None = None, **kw: object) -> tuple[float, str]:
    count = 0
    meter = _Meter(broker_pid)
    with Consumer(addr, group, "bench", start_from="earliest", **FAST, **kw) as c:  # type: ignore[arg-type]

        def handler(m: Message) -> None:
            nonlocal count
            if not count:
                meter.start()
            count += 1
            if count == n:
                c.stop()

        c.run(handler)
        return meter.result(n)


def c1_iter(addr: str, n: int, group: str, broker_pid: int | None = None) -> tuple[float, str]:
    meter = _Meter(broker_pid)
    count = 0
    with Consumer(addr, group, "bench", start_from="earliest", **FAST) as c:  # type: ignore[arg-type]
        for _msg in c:
            if not count:
                meter.start()
            count += 1
            if count == n:
                c.stop()
        return meter.result(n)


def c1_async(addr: str, n: int, group: str, broker_pid: int | None = None) -> tuple[float, str]:
    async def main() -> tuple[float, str]:
        count = 0
        meter = _Meter(broker_pid)
        async with AsyncConsumer(addr, group, "bench", start_from="earliest", **FAST) as c:  # type: ignore[arg-type]

            async def handler(m: Message) -> None:
                nonlocal count
                if not count:
                    meter.start()
                count += 1
                if count == n:
                    c.stop()

            await c.run(handler)
            return meter.result(n)

    return trio.run(main)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def c2(
    addr: str, n: int, tmp: str, group: str = "c2", use_async: bool = False, broker_pid: int | None = None,
    handler_threads: str = "auto",
) -> tuple[float, list[int], str]:
    """(msg/s together, per-member counts, CPU note: member and broker CPU seconds
    against the wall time of the drain)."""
    script = Path(tmp) / ("member_async.py" if use_async else "member.py")
    script.write_text(MEMBER_ASYNC if use_async else MEMBER)
    go = Path(tmp) / f"go-{group}"
    procs = [
        subprocess.Popen([sys.executable, str(script), str(ROOT), addr, group, str(n), str(go), handler_threads],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(1.5)  # both members joined and split the queues
    b0 = cpu_seconds(broker_pid) if broker_pid else 0.0
    go.touch()
    results = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.read().strip().splitlines()[-1].split()
        results.append((int(line[1]), float(line[2]), float(line[3]), float(line[4])))
        p.wait()
    b1 = cpu_seconds(broker_pid) if broker_pid else 0.0
    total = sum(r[0] for r in results)
    dt = max(r[2] for r in results) - min(r[1] for r in results)
    note = (f"drain {dt:.2f} s; CPU s: members {', '.join(f'{r[3]:.2f}' for r in results)} "
            f"(incl. the 1.5 s idle tail), broker {b1 - b0:.2f}")  # fmt: skip
    return total / dt, [r[0] for r in results], note


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
    ap.add_argument("--only", default="c1s,c1a,c1f,c2,l1",
                    help="comma-separated subset of c1s,c1t,c1i,c1a,c1f,c2,c2t,c2a,l1 (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="run each selected C benchmark N times")
    args = ap.parse_args()
    n = args.messages // 4000 * 4000  # fill() writes 1000-message batches to 4 queues
    if not n:
        ap.error("--messages must be at least 4000")
    only = set(args.only.split(","))
    unknown = only - {"c1s", "c1t", "c1i", "c1a", "c1f", "c2", "c2t", "c2a", "l1"}
    if unknown:
        ap.error(f"unknown benchmark(s): {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="equeue-bench-") as tmp:
        if only - {"l1"}:
            c_benchmarks(args, only, n, tmp)
        if "l1" in only:
            # a fresh broker of its own, like the peer harness: no backlog being flushed
            broker, addr = start_broker(os.path.join(tmp, "l1-data"), args.flush)
            try:
                p50, p99, mx, cnt = l1(addr, args.rate, args.seconds, tmp)
            finally:
                broker.kill()
            print(f"L1 {args.rate} msg/s for {args.seconds:.0f} s, {cnt:,} msgs (broker flush={args.flush}): "
                  f"send-to-handler p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {mx:.2f} ms")  # fmt: skip


def c_benchmarks(args: argparse.Namespace, only: set[str], n: int, tmp: str) -> None:
    """The C benchmarks, on one broker holding the backlog."""
    broker, addr = start_broker(os.path.join(tmp, "data"), args.flush)
    try:
        trio.run(fill, addr, n, args.size)
        print(f"backlog: {n:,} x {args.size} B in 4 queues (broker flush={args.flush})")
        for r in range(args.repeat):
            bp = broker.pid
            if "c1s" in only:
                rate, note = c1_sync(addr, n, f"c1s{r}", bp)
                print(f"C1 sync Consumer, no-op handler:        {rate:,.0f} msg/s ({note})")
            if "c1t" in only:
                rate, note = c1_sync(addr, n, f"c1t{r}", bp, handler_threads="always")
                print(f"C1 sync Consumer, handler_threads=always: {rate:,.0f} msg/s ({note})")
            if "c1i" in only:
                rate, note = c1_iter(addr, n, f"c1i{r}", bp)
                print(f"C1 sync Consumer, iterator form:        {rate:,.0f} msg/s ({note})")
            if "c1a" in only:
                rate, note = c1_async(addr, n, f"c1a{r}", bp)
                print(f"C1 AsyncConsumer, no-op async handler:  {rate:,.0f} msg/s ({note})")
            if "c1f" in only:
                rate, note = c1_sync(addr, n, f"c1f{r}", bp, max_pull_batch=32)
                print(f"C1 sync, fixed pull batch 32:           {rate:,.0f} msg/s ({note})")
            if "c2" in only:
                rate, split, note = c2(addr, n, tmp, f"c2s{r}", broker_pid=broker.pid)
                print(f"C2 two member processes (Consumer):     {rate:,.0f} msg/s together (split {split}; {note})")
            if "c2t" in only:
                rate, split, note = c2(addr, n, tmp, f"c2t{r}", broker_pid=broker.pid, handler_threads="always")
                print(f"C2 two member processes (Consumer, handler_threads=always): {rate:,.0f} msg/s together "
                      f"(split {split}; {note})")  # fmt: skip
            if "c2a" in only:
                rate, split, note = c2(addr, n, tmp, f"c2a{r}", use_async=True, broker_pid=broker.pid)
                print(f"C2 two member processes (AsyncConsumer): {rate:,.0f} msg/s together "
                      f"(split {split}; {note})")  # fmt: skip
    finally:
        broker.kill()


if __name__ == "__main__":
    main()
