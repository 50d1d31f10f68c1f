"""The client core: multiplexing and write coalescing over a real broker."""

from __future__ import annotations

import trio

from broker import Broker
from equeue import wire
from producer import AsyncClient


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
