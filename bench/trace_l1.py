"""Where L1 latency goes: a per-stage breakdown of send → consumer receive.

Runs a broker in a forked child with timestamps (``time.time_ns``) hooked onto its
stages, a paced one-at-a-time producer process (the L1 producer of
``bench_consume.py``) and a raw long-poll pull loop over 4 queues in this process,
then matches every message's stages and prints p50/p90 of each hop::

    .venv/bin/python bench/trace_l1.py [--rate 1000] [--seconds 4] [--flush async]

Stages: send → broker parsed the produce (``recv``) → the writer thread starts the
transaction (``cstart``) → commit done (``cend``) → the writer thread has read the
record for the parked pull (``read``; it then writes the answer itself) → the consumer
has the answer (``cons``). A diagnostic: the hooks wrap internal functions.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import trio

STAGES = ["recv", "cstart", "cend", "read"]


def broker_proc(q: Any, done: Any, flush: str) -> None:
    import equeue.broker.handlers.produce as hd
    import equeue.broker.server as srv
    import equeue.broker.storage as st
    from equeue.config import BrokerConfig

    ev: list[tuple[str, int]] = []
    now = time.time_ns

    def hook(cls: Any, name: str, before: str | None, after: str | None, only_found: bool = False) -> None:
        orig = getattr(cls, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            if before:
                ev.append((before, now()))
            r = orig(*a, **k)
            if after and (not only_found or r.batches):
                ev.append((after, now()))
            return r

        setattr(cls, name, wrapped)

    hook(hd.ProduceHandler, "prepare", "recv", None)
    hook(st.Store, "write", "cstart", "cend")
    hook(st.Store, "read_queue", None, "read", only_found=True)

    async def main() -> None:
        b = srv.Broker(BrokerConfig(data_dir=Path(tempfile.mkdtemp()), port=0, flush=flush))
        async with trio.open_nursery() as n:
            await n.start(b.serve)
            q.put(b.port)
            await trio.to_thread.run_sync(done.wait)
            n.cancel_scope.cancel()

    trio.run(main)
    q.put(ev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--flush", default="async")
    a = ap.parse_args()
    import bench_consume

    from equeue import wire
    from equeue.client import AsyncClient
    from equeue.protocol import RequestCode

    q: Any = mp.Queue()
    done = mp.Event()
    child = mp.get_context("fork").Process(target=broker_proc, args=(q, done, a.flush))
    child.start()
    addr = f"127.0.0.1:{q.get()}"
    got: list[tuple[int, int]] = []  # (send ns, consumer receive ns)

    async def run() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("lat", 4, exist_ok=True)
            script = Path(tempfile.mkdtemp()) / "producer.py"
            script.write_text(bench_consume.PRODUCER)

            async def puller(qid: int) -> None:
                off = 0
                while True:
                    req = wire.PullRequest("lat", qid, off, 32, 1 << 20, 15_000)
                    raw = await c.request(RequestCode.PULL, req.encode())
                    t = time.time_ns()
                    _st, _lo, _hi, off, msgs = wire.decode_pull_batches("lat", raw, off, False)
                    got.extend((int(m.body), t) for m in msgs)

            async with trio.open_nursery() as n:
                for qid in range(4):
                    n.start_soon(puller, qid)
                await trio.sleep(0.5)
                root = str(Path(__file__).resolve().parent.parent)
                cmd = [sys.executable, str(script), root, addr, str(a.rate), str(a.seconds)]
                proc = await trio.lowlevel.open_process(cmd)
                await proc.wait()
                await trio.sleep(0.3)
                n.cancel_scope.cancel()

    trio.run(run)
    done.set()
    ev: list[tuple[str, int]] = sorted(q.get(), key=lambda e: e[1])
    child.join()
    times = [t for _, t in ev]
    hops: dict[str, list[float]] = {k: [] for k in [*STAGES, "cons"]}
    for t0, tc in sorted(got):
        seen: dict[str, int] = {}
        for name, t in ev[bisect.bisect_left(times, t0) :][:40]:
            if t > tc:
                break
            seen.setdefault(name, t)
        if all(k in seen for k in STAGES):
            prev = t0
            for k in STAGES:
                hops[k].append((seen[k] - prev) / 1000)
                prev = seen[k]
            hops["cons"].append((tc - prev) / 1000)
    total = sorted((tc - t0) / 1000 for t0, tc in got)
    print(f"{len(got):,} messages at {a.rate}/s, flush {a.flush}; {len(hops['cons']):,} matched")
    for k, v in hops.items():
        v.sort()
        if v:
            print(f"  {k:7s} p50 {v[len(v) // 2]:7.1f} µs   p90 {v[int(len(v) * 0.9)]:7.1f} µs")
    print(f"  total   p50 {total[len(total) // 2]:7.1f} µs   p99 {total[int(len(total) * 0.99)]:7.1f} µs")


if __name__ == "__main__":
    main()
