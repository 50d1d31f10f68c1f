"""Members leave gracefully and join while a backlog drains: a
graceful ``close()`` and a revoke commit everything already handled before the lease
is released, so no message is handled twice and no queue has two holders at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.client import Client
from equeue.consumer import Consumer
from tests.conftest import make_config

TOTAL, QUEUES, MEMBERS, CHURN_EVERY = 16_000, 8, 4, 1_000
OPTS = dict(heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.5, pull_hold=1.0,
            start_from="earliest", pull_batch=16, max_pull_batch=64, concurrency=4)  # fmt: skip


@pytest.mark.parametrize("handler_threads", ["auto", "always"])
def test_graceful_leave_and_join_while_draining_no_duplicates(tmp_path: Path, handler_threads: str) -> None:
    with EmbeddedBroker(make_config(tmp_path / "data")) as b:
        with Client(b.address) as c:
            c.create_topic("churn", QUEUES)
            for q in range(QUEUES):
                entries = [wire.encode_entry(Message(f"{q}-{i}")) for i in range(TOTAL // QUEUES)]
                c.produce(wire.ProduceRequest("churn", q, entries))
        lock = threading.Lock()
        handled: list[tuple[str, int, int, float, float]] = []
        distinct: set[tuple[int, int]] = set()
        progress = threading.Condition(lock)

        def member(name: str) -> tuple[Consumer, threading.Thread]:
            con = Consumer(b.address, "g", "churn", consumer_id=name, handler_threads=handler_threads, **OPTS)

            def handler(m: Message) -> None:
                t0 = time.monotonic()
                time.sleep(0.0002)
                with progress:
                    handled.append((name, m.queue_id, m.queue_offset, t0, time.monotonic()))
                    distinct.add((m.queue_id, m.queue_offset))
                    progress.notify_all()

            con.start()
            t = threading.Thread(target=con.run, args=(handler,), daemon=True)
            t.start()
            return con, t

        admin = Client(b.address)
        members = [member(f"m{i:02d}") for i in range(MEMBERS)]
        started = MEMBERS
        churned = 0
        deadline = time.monotonic() + 60
        try:
            while True:
                goal = min((churned + 1) * CHURN_EVERY, TOTAL)
                with progress:
                    progress.wait_for(
                        lambda goal=goal: len(distinct) >= goal,
                        timeout=max(0.0, deadline - time.monotonic()),
                    )
                    done = len(distinct)
                assert time.monotonic() < deadline, f"only {done} of {TOTAL} handled"
                # a member that left is gone from the group: one the broker still lists
                # (until member_expiry) holds its queues, which stall
                listed = {m.consumer_id for m in admin.describe_group("g").members}
                ghosts = listed - {con.consumer_id for con, _ in members}
                assert not ghosts, f"members still listed after their graceful close: {sorted(ghosts)}"
                if done == TOTAL:
                    break
                oldest, thread = members.pop(0)  # graceful leave, then a newcomer
                oldest.close()
                thread.join(10)
                members.append(member(f"m{started:02d}"))
                started += 1
                churned += 1
        finally:
            for con, thread in members:
                con.close()
                thread.join(10)
            admin.close()
    counts = Counter((q, o) for _, q, o, _, _ in handled)
    dups = sorted(k for k, n in counts.items() if n > 1)
    assert churned >= 8
    assert not dups, f"{len(dups)} messages handled twice: {[r for r in handled if (r[1], r[2]) in dups[:3]]}"
    check_one_holder(handled)


def check_one_holder(handled: list[tuple[str, int, int, float, float]]) -> None:
    """No queue is handled by two members at the same time: once another member
    handles a queue, the previous one never handles it again before that."""
    by_queue: dict[int, list[tuple[float, float, str]]] = {}
    for name, q, _off, t0, t1 in handled:
        by_queue.setdefault(q, []).append((t0, t1, name))
    for q, runs in by_queue.items():
        last_end: dict[str, float] = {}
        for start, end, name in sorted(runs):
            for other, other_end in last_end.items():
                assert other == name or start >= other_end, f"queue {q}: {other} and {name} overlapped"
            last_end[name] = max(end, last_end.get(name, end))
