"""Three member processes, one joining later and one SIGKILLed half-way: every message
handled at least once, in queue order per member, duplicates only from the killed
member's uncommitted window, and no queue handled by two members at the same time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.client import Client
from tests.conftest import ROOT, make_config, wait_until_sync
from tests.integration.test_consumer import check_no_overlap_and_order

MEMBER = r"""
import signal, sys, time
sys.path.insert(0, sys.argv[1])
from equeue.consumer import Consumer
addr, name, out = sys.argv[2], sys.argv[3], sys.argv[4]
f = open(out, "a", buffering=1)
c = Consumer(addr, %(group)r, %(topic)r, orderly=True, start_from="earliest", consumer_id=name,
             heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=%(hold)r)
def handler(m):
    t0 = time.monotonic()
    time.sleep(%(sleep)r)
    f.write(f"{m.queue_id} {m.queue_offset} {t0} {time.monotonic()}\n")
signal.signal(signal.SIGTERM, lambda *a: c.stop())
c.run(handler)
c.close()
"""


def member_script(group: str, topic: str, *, sleep: float, hold: float) -> str:
    """A consumer member process (orderly; argv: repo root, brokers, consumer id, log
    file) that logs "queue offset start end" per message, and stops on SIGTERM."""
    return MEMBER % {"group": group, "topic": topic, "sleep": sleep, "hold": hold}


TOTAL, QUEUES = 30_000, 8


def read(path: Path, name: str) -> list[tuple[str, int, int, float, float]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((name, int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3])))
    return out


@pytest.mark.slow
def test_kill_and_join(tmp_path: Path) -> None:
    script = tmp_path / "member.py"
    script.write_text(member_script("cg", "orders", sleep=0.001, hold=1.0))
    with EmbeddedBroker(make_config(tmp_path / "data", member_expiry=2.0)) as b:
        with Client(b.address) as c:
            c.create_topic("orders", QUEUES)
            per_queue: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
            from equeue.routing import queue_for_key

            for i in range(TOTAL):
                key = f"user-{i % 500}"
                per_queue[queue_for_key(key, QUEUES)].append(wire.encode_entry(Message(f"{i}", key=key)))
            for q, entries in per_queue.items():
                for k in range(0, len(entries), 1000):
                    c.produce(wire.ProduceRequest("orders", q, entries[k : k + 1000]))
        procs: dict[str, subprocess.Popen[bytes]] = {}

        def spawn(name: str) -> None:
            procs[name] = subprocess.Popen(
                [sys.executable, str(script), str(ROOT), b.address, name, str(tmp_path / f"{name}.log")],
                cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )  # fmt: skip

        # Read the member logs incrementally: the broker runs in this process, and
        # re-parsing every line ten times a second would starve it of the GIL (and
        # delay heartbeats past the short member expiry used here).
        seen: dict[str, list[tuple[str, int, int, float, float]]] = {"m1": [], "m2": [], "m3": []}
        pos: dict[str, int] = {"m1": 0, "m2": 0, "m3": 0}

        def handled() -> list[tuple[str, int, int, float, float]]:
            for n in seen:
                path = tmp_path / f"{n}.log"
                if not path.exists():
                    continue
                with path.open() as f:
                    f.seek(pos[n])
                    chunk = f.read()
                cut = chunk.rfind("\n") + 1  # whole lines only
                pos[n] += len(chunk[:cut].encode())
                for line in chunk[:cut].splitlines():
                    parts = line.split()
                    if len(parts) == 4:
                        seen[n].append((n, int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3])))
            return [r for n in seen for r in seen[n]]

        try:

            def progress(at_least: int, by_m3: bool = False) -> bool:
                recs = handled()
                distinct = len({(q, o) for _, q, o, _, _ in recs})
                return distinct >= at_least and (not by_m3 or any(r[0] == "m3" for r in recs))

            spawn("m1")
            spawn("m2")
            wait_until_sync(lambda: progress(TOTAL // 5), timeout=60, interval=0.1, what="a fifth handled")
            spawn("m3")
            wait_until_sync(lambda: progress(TOTAL // 2, by_m3=True), timeout=60, interval=0.1, what="m3 at work")
            procs["m1"].send_signal(signal.SIGKILL)
            procs["m1"].wait(10)
            wait_until_sync(lambda: progress(TOTAL), timeout=60, interval=0.1, what="every message handled")
            for name in ("m2", "m3"):
                if name in procs and procs[name].poll() is None:
                    procs[name].send_signal(signal.SIGTERM)
            for name in ("m2", "m3"):
                if name in procs:
                    assert procs[name].wait(30) == 0
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
    recs = [r for n in ("m1", "m2", "m3") for r in read(tmp_path / f"{n}.log", n)]
    keys = [(q, o) for _, q, o, _, _ in recs]
    assert len(set(keys)) == TOTAL, "every message handled at least once"
    assert {r[0] for r in recs} == {"m1", "m2", "m3"}
    counts: dict[tuple[int, int], int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    by_m1 = {(q, o) for n, q, o, _, _ in recs if n == "m1"}
    dups = [k for k, n in counts.items() if n > 1]
    assert all(k in by_m1 for k in dups), "duplicates only from the killed member"
    check_no_overlap_and_order(recs)
