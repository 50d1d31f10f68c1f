"""The client core: multiplexing and write coalescing over a real broker."""

from __future__ import annotations

from typing import Any

import trio

from equeue import Message, wire
from equeue.broker import Broker
from equeue.client import AsyncClient
from tests.conftest import wait_until


async def test_cancelled_request_never_drops_another_tasks_frame(broker: Broker) -> None:
    """Requests queued together are written by whichever task holds the send lock. If
    that task is cancelled (e.g. a pull of a revoked queue) its write must still carry
    the other tasks' frames: a dropped heartbeat would hang until the member expires."""
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            for i in range(120):
                spins = i % 4
                answers: list[object] = []
                async with trio.open_nursery() as n:
                    scope = trio.CancelScope()

                    async def pull(scope: trio.CancelScope = scope) -> None:
                        with scope:
                            await c.pull(wire.PullRequest("t", 0, 0, 1, max_wait_ms=5_000))

                    async def stats(answers: list[object] = answers) -> None:
                        answers.append(await c.stats())

                    n.start_soon(pull)
                    n.start_soon(stats)
                    # let the pull take the send lock and the stats queue its frame,
                    # then cancel the pull while it holds the lock
                    for _ in range(spins):
                        await trio.lowlevel.checkpoint()  # one scheduling round, no time
                    scope.cancel()
                assert len(answers) == 1


async def test_many_concurrent_requests_share_one_connection(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 4)
            results: list[int] = []

            async def one(i: int) -> None:
                info = await c.queue_offsets("t", i % 4)
                results.append(info.queue_id)

            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(one, i)
            assert sorted(results) == sorted(i % 4 for i in range(200))


def test_cancelling_a_task_inside_async_with_client(broker_process: Any) -> None:
    """A task cancelled while it uses a client (a consumer's or a probe's) leaves cleanly:
    the client's nursery is closed even when closing the connection raises Cancelled (it
    used to corrupt trio's nursery stack: "Nursery stack corrupted"). Against a broker
    process: with the broker in the same loop the close is not cancelled."""
    b = broker_process()
    rounds = [0]

    async def run() -> None:
        async with AsyncClient(b.address) as c:
            await c.create_topic("cancelled", 1, exist_ok=True)
            while True:
                await c.produce(wire.ProduceRequest("cancelled", 0, [wire.encode_entry(Message(b"a"))]))
                rounds[0] += 1

    async def main() -> None:
        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(run)
                await wait_until(lambda: rounds[0] >= 3, what="the task is producing")
                n.cancel_scope.cancel()

    trio.run(main)
