"""Crash safety: a broker subprocess is SIGKILLed while producers send; after a
restart every acknowledged message is where its ack said, with its exact body, and
no queue has a gap. Also the graceful path (SIGTERM)."""

from __future__ import annotations

import random
import signal
from typing import Any

import pytest
import trio

from equeue import Message, PullStatus, wire
from equeue.client import AsyncClient
from equeue.errors import EQueueError
from equeue.models import PullResult
from tests.conftest import wait_until

QUEUES = 4


async def produce_until_killed(address: str, acked: dict[tuple[int, int], bytes], pid: int) -> None:
    """Send batches (two in flight) until the broker dies; record every ack."""
    rnd = random.Random(pid)
    seq = 0

    async def one(c: AsyncClient) -> None:
        nonlocal seq
        q = rnd.randrange(QUEUES)
        bodies = []
        for _ in range(rnd.randint(1, 50)):
            seq += 1
            bodies.append(f"p{pid}-{seq}-".encode() + rnd.randbytes(rnd.randint(0, 300)))
        a = await c.produce(wire.ProduceRequest("crash", q, [wire.encode_entry(Message(b)) for b in bodies]))
        assert a.stored == len(bodies)
        for i, b in enumerate(bodies):
            acked[(q, a.first_queue + i)] = b

    try:
        async with AsyncClient(address, connect_timeout=2) as c:

            async def lane() -> None:
                while True:
                    await one(c)

            async with trio.open_nursery() as n:
                n.start_soon(lane)
                n.start_soon(lane)
    except* EQueueError:
        pass  # the broker is gone


async def read_all(address: str) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    async with AsyncClient(address) as c:
        for q in range(QUEUES):
            msgs: list[Any] = []
            off = 0
            while True:
                r = await c.pull(wire.PullRequest("crash", q, off, 10_000, 16 << 20))
                if r.status is not PullStatus.FOUND:
                    assert r.status is PullStatus.NO_NEW_MESSAGE, r.status
                    break
                msgs += r.messages
                off = r.next_offset
            out[q] = msgs
    return out


async def crash_and_check(broker_process: Any, flush: str) -> None:
    proc = broker_process("--flush", flush)
    acked: dict[tuple[int, int], bytes] = {}
    with trio.fail_after(60):
        async with AsyncClient(proc.address) as admin:
            await admin.create_topic("crash", QUEUES)
        async with trio.open_nursery() as n:
            for pid in range(4):
                n.start_soon(produce_until_killed, proc.address, acked, pid)
            kill_at = 3000 + random.randrange(3000)  # a random point mid-stream
            await wait_until(lambda: len(acked) >= kill_at, timeout=50, what=f"{kill_at} messages acked")
            proc.kill()  # SIGKILL mid-stream: no shutdown code runs
        assert len(acked) >= 3000
        proc2 = broker_process("--flush", flush)
        stored = await read_all(proc2.address)
    globals_seen: list[int] = []
    for q in range(QUEUES):
        offs = [m.queue_offset for m in stored[q]]
        assert offs == list(range(len(offs))), f"queue {q} has gaps"
        globals_seen += [m.global_offset for m in stored[q]]
    assert len(set(globals_seen)) == len(globals_seen)
    for (q, off), body in acked.items():
        assert off < len(stored[q]), f"acknowledged message {q}/{off} lost"
        assert stored[q][off].body == body, f"message {q}/{off} has a different body"
    # and the restarted broker appends right after the recovered tail
    async with AsyncClient(proc2.address) as c:
        a = await c.produce(wire.ProduceRequest("crash", 0, [wire.encode_entry(Message(b"after"))]))
        assert a.first_queue == len(stored[0])


@pytest.mark.slow
async def test_sigkill_loses_nothing_acknowledged_flush_sync(broker_process: Any) -> None:
    await crash_and_check(broker_process, "sync")


@pytest.mark.slow
async def test_sigkill_loses_nothing_acknowledged_flush_async(broker_process: Any) -> None:
    await crash_and_check(broker_process, "async")


async def test_sigterm_answers_parked_pulls_and_exits_cleanly(broker_process: Any) -> None:
    proc = broker_process()
    got: list[PullResult] = []
    with trio.fail_after(30):
        async with AsyncClient(proc.address) as c:
            await c.create_topic("t", 2)
            a = await c.produce(wire.ProduceRequest("t", 1, [wire.encode_entry(Message(b"kept"))]))
            assert a.stored == 1

            async def puller(q: int) -> None:
                got.append(await c.pull(wire.PullRequest("t", q, 0 if q == 0 else 1, 32, max_wait_ms=20_000)))

            async def both_parked() -> bool:
                return (await c.stats()).parked_pulls == 2

            async with trio.open_nursery() as n:
                n.start_soon(puller, 0)
                n.start_soon(puller, 1)
                await wait_until(both_parked, what="both pulls are parked")
                t0 = trio.current_time()
                assert proc.proc is not None
                proc.proc.send_signal(signal.SIGTERM)
            # both parked pulls answered (empty) long before their 20 s hold
            assert trio.current_time() - t0 < 5
            assert [r.status for r in got] == [PullStatus.NO_NEW_MESSAGE] * 2
        rc = await trio.to_thread.run_sync(proc.proc.wait, 15)
        assert rc == 0
        proc2 = broker_process()
        async with AsyncClient(proc2.address) as c:
            r = await c.pull(wire.PullRequest("t", 1, 0, 32))
            assert [m.body for m in r.messages] == [b"kept"]
