"""End-to-end smoke: produce, pull, long-poll over real TCP."""

from __future__ import annotations

import trio

from equeue import Message, PullStatus, wire
from equeue.broker import Broker
from equeue.client import AsyncClient
from tests.conftest import wait_until


async def test_produce_then_pull(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("orders", 4)
            entries = [wire.encode_entry(Message(f"m{i}", key=f"k{i}")) for i in range(10)]
            ans = await c.produce(wire.ProduceRequest("orders", 1, entries))
            assert (ans.first_queue, ans.stored) == (0, 10)
            res = await c.pull(wire.PullRequest("orders", 1, 0, 32))
            assert res.status is PullStatus.FOUND
            assert [m.text for m in res.messages] == [f"m{i}" for i in range(10)]
            assert [m.queue_offset for m in res.messages] == list(range(10))


async def test_parked_pull_woken_by_commit(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 2)
            got: list[object] = []

            async def puller() -> None:
                got.append(await c.pull(wire.PullRequest("t", 0, 0, 32, max_wait_ms=10_000)))

            async def parked() -> bool:
                return (await c.stats()).parked_pulls == 1

            async with trio.open_nursery() as n:
                n.start_soon(puller)
                await wait_until(parked, what="the pull is parked")
                start = trio.current_time()
                await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"x"))]))
            assert trio.current_time() - start < 5  # woken long before the 10 s hold
            assert got[0].status is PullStatus.FOUND  # type: ignore[attr-defined]
