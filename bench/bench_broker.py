"""Broker over loopback, the broker in a SEPARATE process.

Workloads (100-byte messages, 4 queues, one client process):

- ``broker-produce``: pipelined ProduceRequests of 100 messages (``--inflight``
  requests outstanding) through one AsyncClient connection; ``--flush sync``.
- ``broker-pull``: drain the backlog (1,000,000 messages by default) from the 4
  queues, one pull of up to 1,000 messages in flight per queue; records are counted
  straight from the response bytes (``--decode`` also builds Message objects).
- ``longpoll-wake``: an idle broker; a pull parked on an empty queue, then one
  1-message produce on another connection; latency from the produce ack to the
  parked pull's answer (and from the produce request to that answer).

    .venv/bin/python bench/bench_broker.py [--messages 1000000] [--flush sync]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue import Message, wire  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import AsyncClient  # noqa: E402
from equeue.protocol import RequestCode  # noqa: E402


def start_broker(data_dir: str, flush: str, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    b = BrokerProcess(data_dir, "--flush", flush, *extra).start()
    assert b.proc is not None
    return b.proc, b.address


async def produce(addr: str, total: int, batch: int, size: int, inflight: int, queues: int) -> float:
    body = b"x" * size
    reqs = [
        wire.ProduceRequest("bench", q, [wire.encode_entry(Message(body)) for _ in range(batch)]).encode()
        for q in range(queues)
    ]
    n_req = total // batch
    async with AsyncClient(addr) as c:
        await c.create_topic("bench", queues, exist_ok=True)
        sent = 0
        t0 = time.perf_counter()

        async def lane(i: int) -> None:
            nonlocal sent
            while sent < n_req:
                k = sent
                sent += 1
                ans = wire.ProduceResponse.decode(await c.request(RequestCode.PRODUCE, reqs[k % queues]))
                assert ans.stored == batch

        async with trio.open_nursery() as n:
            for i in range(inflight):
                n.start_soon(lane, i)
        dt = time.perf_counter() - t0
    return n_req * batch / dt


async def drain(addr: str, queues: int, max_messages: int, decode: bool) -> tuple[int, float]:
    got = 0
    async with AsyncClient(addr) as c:
        t0 = time.perf_counter()

        async def one_queue(q: int) -> None:
            nonlocal got
            off = 0
            while True:
                req = wire.PullRequest("bench", q, off, max_messages, 16 << 20)
                raw = await c.request(RequestCode.PULL, req.encode())
                if decode:
                    r = wire.decode_pull_response("bench", raw, off)
                    n, off = len(r.messages), r.next_offset
                else:  # records counted from the head (its count is of batches)
                    head = wire.decode_pull_head(raw)
                    n = head.next_offset - off if head.count else 0
                    off = head.next_offset
                if n == 0:
                    return
                got += n

        async with trio.open_nursery() as n:
            for q in range(queues):
                n.start_soon(one_queue, q)
        dt = time.perf_counter() - t0
    return got, got / dt


async def wake_latency(addr: str, rounds: int) -> tuple[list[float], list[float]]:
    from_ack: list[float] = []
    from_send: list[float] = []
    async with AsyncClient(addr) as puller, AsyncClient(addr) as producer:
        await puller.create_topic("wake", 1, exist_ok=True)
        off = (await puller.queue_offsets("wake", 0)).max_offset
        entry = [wire.encode_entry(Message(b"x" * 100))]
        for _ in range(rounds):
            t: dict[str, float] = {}

            async def pull(off: int = off, t: dict[str, float] = t) -> None:
                r = await puller.pull(wire.PullRequest("wake", 0, off, 32, max_wait_ms=10_000))
                t["pull"] = time.perf_counter()
                assert len(r.messages) == 1

            async with trio.open_nursery() as n:
                n.start_soon(pull)
                await trio.sleep(0.002)  # let it park
                t["send"] = time.perf_counter()
                await producer.produce(wire.ProduceRequest("wake", 0, entry))
                t["ack"] = time.perf_counter()
            off += 1
            from_ack.append(t["pull"] - t["ack"])
            from_send.append(t["pull"] - t["send"])
    return from_ack, from_send


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--pull-batch", type=int, default=1000)
    ap.add_argument("--flush", default="sync")
    ap.add_argument("--decode", action="store_true", help="also decode pulled records into Messages")
    ap.add_argument("--wake-rounds", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="equeue-bench-") as d:
        proc, addr = start_broker(d, args.flush, [])
        try:
            rate = trio.run(produce, addr, args.messages, args.batch, args.size, args.inflight, args.queues)
            print(f"broker-produce: {args.messages:,} msgs of {args.size} B, batches of {args.batch}, "
                  f"{args.inflight} in flight, flush {args.flush}: {rate:,.0f} msg/s")
            got, rate = trio.run(drain, addr, args.queues, args.pull_batch, False)
            print(f"broker-pull: drained {got:,} msgs from {args.queues} queues, "
                  f"{args.pull_batch}/pull (raw records): {rate:,.0f} msg/s")
            if args.decode:
                _got, rate = trio.run(drain, addr, args.queues, args.pull_batch, True)
                print(f"broker-pull-decoded: same, decoded into Message objects: {rate:,.0f} msg/s")
            a, s = trio.run(wake_latency, addr, args.wake_rounds)
            print(
                f"longpoll-wake ({args.wake_rounds} rounds, idle broker): produce ack -> pull answer "
                f"p50 {statistics.median(a) * 1e3:.3f} ms, p99 {pct(a, 99) * 1e3:.3f} ms; "
                f"produce sent -> pull answer p50 {statistics.median(s) * 1e3:.3f} ms, "
                f"p99 {pct(s, 99) * 1e3:.3f} ms"
            )
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
