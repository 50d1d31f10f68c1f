"""A ``send_batch`` over several queues leaves in one write (``AsyncClient.cork``),
so the broker reads its requests as one chunk and commits them in one transaction.

The broker runs in its own process: in one loop with the client, the broker would
read the four requests together whether they left in one write or four."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from equeue.client import AsyncClient
from equeue.models import Message
from equeue.producer import AsyncProducer

BATCHES = 20


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_batch_over_four_queues_is_one_transaction(broker_process: Callable[..., Any], flush: str) -> None:
    b = broker_process("--flush", flush)

    async def main() -> int:
        async with AsyncClient(b.address) as c, AsyncProducer(b.address) as p:
            await p.send("t", b"warm-up", key="w")  # the route is known, the topic made
            assert await p.queue_count("t") == 4
            before = (await c.stats()).transactions
            for i in range(BATCHES):
                results = await p.send_batch("t", [Message(b"x" * 100, key=f"k{i}-{j}") for j in range(100)])
                assert len({r.queue_id for r in results}) == 4
            return (await c.stats()).transactions - before

    txns = trio.run(main)
    # one transaction per batch (a few more if a segment was ever split). Without the
    # cork each of the four requests is its own write: 2-4 transactions per batch.
    assert BATCHES <= txns <= BATCHES + 4, txns
