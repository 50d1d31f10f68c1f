"""Delayed delivery: lag against due time, and the effect on a concurrent produce run.

The broker runs as ``python -m equeue broker start --port 0`` (``--flush sync``). The
delayed side runs in a child process of this script (so its client CPU is not
charged to the producer being measured); the P1-style producer runs here. Both use
the low-level ``AsyncClient``.

- D1 "spread": 100,000 x 100-byte delayed messages (4 queues), due uniformly over a
  10 s window (run once on its own, once with P1 running); each body carries its due time. Four long-poll pull loops (one per
  queue) read them as they arrive. Reported: lag = broker store timestamp - due
  (when the scheduler moved it) and arrival - due (when the pull loop had it), p50 /
  p99 / max, and how many arrived early (must be 0).
- D2 "burst": 100,000 due at the same instant: the same figures plus the time until
  the last one was delivered (order of due time is checked per queue).
- P1 "produce": 200,000 x 100-byte keyed messages in batches of 100, 8 requests in
  flight over 4 queues, msg/s -- alone before and after each scenario, and while the
  D1 / D2 messages are being delivered (compared with the mean of the alone runs
  around it, as the shared machine drifts); plus the P1 request latency during the
  delivery window.

    .venv/bin/python bench/bench_delayed.py [--delayed 100000] [--window 10] [--p1 200000]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue import Message, PullStatus, wire  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import AsyncClient  # noqa: E402

QUEUES = 4


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerProc(BrokerProcess):
    """The broker under test, in its own process, on a temporary data dir."""

    def __init__(self, *args: str) -> None:
        super().__init__(None, *args)
        self.start()

def lat_text(lat: list[tuple[int, float]], lo: int = 0, hi: int = 1 << 62) -> str:
    xs = [x for t, x in lat if lo <= t <= hi]
    if not xs:
        return "n/a"
    return f"p50 {pct(xs, 50):.1f} / p99 {pct(xs, 99):.1f} / max {max(xs):.1f} ms ({len(xs)} requests)"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


# ---------------------------------------------------------------------- P1 producer
async def p1(
    address: str, n: int, topic: str, inflight: int = 8, batch: int = 100
) -> tuple[float, list[tuple[int, float]]]:
    """Produce ``n`` keyed 100-byte messages; returns (msg/s, request latencies in ms).

    Latencies are ``[start epoch ms, latency ms]`` pairs (to pick a time window)."""
    body = b"x" * 100
    per_queue = [
        [wire.encode_entry(Message(body, key=f"k{q}-{i}")) for i in range(batch)] for q in range(QUEUES)
    ]
    batches = n // batch
    nxt = 0
    lat: list[tuple[int, float]] = []
    async with AsyncClient(address) as c:
        await c.create_topic(topic, QUEUES, exist_ok=True)
        t0 = time.perf_counter()

        async def lane() -> None:
            nonlocal nxt
            while nxt < batches:
                i = nxt
                nxt += 1
                q = i % QUEUES
                s, wall = time.perf_counter(), now_ms()
                a = await c.produce(wire.ProduceRequest(topic, q, per_queue[q]))
                lat.append((wall, (time.perf_counter() - s) * 1000))
                assert a.stored == batch

        async with trio.open_nursery() as ns:
            for _ in range(inflight):
                ns.start_soon(lane)
        dt = time.perf_counter() - t0
    return batches * batch / dt, lat


# ---------------------------------------------------------------------- delayed side (child)
async def delayed_side(address: str, n: int, window: float, burst: bool, lead: float, topic: str) -> dict[str, Any]:
    """Schedule ``n`` delayed messages, announce T0 on stdout, collect their lag."""
    pad = b"." * 80
    async with AsyncClient(address) as c:
        await c.create_topic(topic, QUEUES, exist_ok=True)
        t0 = now_ms() + int(lead * 1000)
        span = 0 if burst else int(window * 1000)
        produce_start = time.perf_counter()
        per = 1000
        for start in range(0, n, per):
            q = (start // per) % QUEUES
            entries = []
            for i in range(start, min(n, start + per)):
                due = t0 + (span * i) // n
                entries.append(wire.encode_entry(Message(b"%d:%d:" % (due, i) + pad, deliver_at=due)))
            a = await c.produce(wire.ProduceRequest(topic, q, entries))
            assert a.scheduled == len(entries)
        produce_s = time.perf_counter() - produce_start
        if now_ms() >= t0:
            raise SystemExit(f"scheduling took {produce_s:.1f} s, past T0: raise --lead")
        print(f"T0 {t0}", flush=True)
        store_lag: list[float] = []
        arrive_lag: list[float] = []
        order_ok = True
        last_arrival = 0

        async def reader(q: int) -> None:
            nonlocal order_ok, last_arrival
            off = 0
            prev_due = 0
            want = n // QUEUES
            got = 0
            while got < want:
                r = await c.pull(wire.PullRequest(topic, q, off, 2000, 8 << 20, max_wait_ms=2000))
                arrived = now_ms()
                if r.status is not PullStatus.FOUND:
                    continue
                for m in r.messages:
                    due = int(m.body.split(b":", 1)[0])
                    store_lag.append(m.timestamp - due)
                    arrive_lag.append(arrived - due)
                    if due < prev_due:
                        order_ok = False
                    prev_due = due
                got += len(r.messages)
                off = r.next_offset
                last_arrival = max(last_arrival, arrived)

        with trio.fail_after(window + lead + 120):
            async with trio.open_nursery() as ns:
                for q in range(QUEUES):
                    ns.start_soon(reader, q)
        return {
            "n": len(store_lag),
            "schedule_rate": n / produce_s,
            "store_lag": [pct(store_lag, 50), pct(store_lag, 99), max(store_lag)],
            "arrive_lag": [pct(arrive_lag, 50), pct(arrive_lag, 99), max(arrive_lag)],
            "early": sum(1 for x in store_lag if x < 0),
            "mean_store_lag": statistics.fmean(store_lag),
            "order_ok": order_ok,
            "last_after_t0_ms": last_arrival - t0,
            "window_ms": span,
            "t0": t0,
        }


def run_child(args: argparse.Namespace) -> None:
    res = trio.run(delayed_side, args.address, args.delayed, args.window, args.burst, args.lead, args.topic)
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------- driver
def scenario(
    address: str, args: argparse.Namespace, name: str, burst: bool, with_p1: bool = True
) -> tuple[dict[str, Any], tuple[float, list[tuple[int, float]]]]:
    cmd = [
        sys.executable, __file__, "--role", "delayed", "--address", address, "--delayed", str(args.delayed),
        "--window", str(args.window), "--lead", str(args.lead), "--topic", f"delayed-{name}",
    ] + (["--burst"] if burst else [])  # fmt: skip
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert child.stdout is not None
    line = child.stdout.readline()
    m = re.match(r"T0 (\d+)", line)
    if not m:
        child.wait(60)
        raise RuntimeError(f"delayed side failed: {line!r}")
    t0 = int(m.group(1))
    time.sleep(max(0.0, (t0 - now_ms()) / 1000))
    rate = trio.run(p1, address, args.p1, f"p1-{name}") if with_p1 else (0.0, [])
    out = child.stdout.read()
    child.wait(60)
    res = json.loads(out.split("RESULT ", 1)[1])
    return res, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delayed", type=int, default=100_000)
    ap.add_argument("--window", type=float, default=10.0, help="seconds over which D1 falls due")
    ap.add_argument("--lead", type=float, default=8.0, help="seconds from scheduling start to T0")
    ap.add_argument("--p1", type=int, default=200_000)
    ap.add_argument("--flush", default="sync")
    ap.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--address", default="", help=argparse.SUPPRESS)
    ap.add_argument("--topic", default="delayed", help=argparse.SUPPRESS)
    ap.add_argument("--burst", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "delayed":
        run_child(args)
        return
    broker = BrokerProc("--flush", args.flush)
    try:
        trio.run(p1, broker.address, args.p1 // 10, "p1-warmup")
        alone: list[float] = []

        def baseline(tag: str) -> float:
            rate, lat = trio.run(p1, broker.address, args.p1, f"p1-alone-{tag}")
            alone.append(rate)
            print(f"P1 alone ({tag}): {args.p1:,} x 100 B keyed, batches of 100, 8 in flight: "
                  f"{rate:,.0f} msg/s; request latency {lat_text(lat)}")
            return rate

        res, _ = scenario(broker.address, args, "D1-quiet", False, with_p1=False)
        sl, al = res["store_lag"], res["arrive_lag"]
        print(
            f"D1 without P1: {res['n']:,} delayed msgs due over {args.window:.0f} s"
            f" (scheduled at {res['schedule_rate']:,.0f} msg/s)\n"
            f"    lag store-due  p50 {sl[0]:.0f} ms  p99 {sl[1]:.0f} ms  max {sl[2]:.0f} ms"
            f"  (early: {res['early']}, in due order per queue: {res['order_ok']})\n"
            f"    lag arrive-due p50 {al[0]:.0f} ms  p99 {al[1]:.0f} ms  max {al[2]:.0f} ms"
        )
        before = baseline("1")
        for i, (name, burst) in enumerate((("D1", False), ("D2", True))):
            res, (rate, lat) = scenario(broker.address, args, name, burst)
            after = baseline(str(i + 2))
            ref = (before + after) / 2
            before = after
            what = f"due over {args.window:.0f} s" if not burst else "due at the same instant"
            sl, al = res["store_lag"], res["arrive_lag"]
            t0 = res["t0"]
            print(
                f"{name}: {res['n']:,} delayed msgs {what} (scheduled at {res['schedule_rate']:,.0f} msg/s)\n"
                f"    lag store-due  p50 {sl[0]:.0f} ms  p99 {sl[1]:.0f} ms  max {sl[2]:.0f} ms"
                f"  (early: {res['early']}, in due order per queue: {res['order_ok']})\n"
                f"    lag arrive-due p50 {al[0]:.0f} ms  p99 {al[1]:.0f} ms  max {al[2]:.0f} ms;"
                f"  last delivered {res['last_after_t0_ms'] / 1000:.2f} s after T0\n"
                f"    P1 during delivery: {rate:,.0f} msg/s = {rate / ref:.0%} of the mean of the P1-alone"
                f" runs around it ({ref:,.0f} msg/s)\n"
                f"    P1 request latency while delayed messages were being delivered: "
                f"{lat_text(lat, t0, t0 + res['last_after_t0_ms'])}"
            )
    finally:
        broker.close()


if __name__ == "__main__":
    main()
