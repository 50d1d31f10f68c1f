"""The asyncio consumer's Kafka-style calls against a real broker, each test under
asyncio.run (docs/asyncio.md, docs/consumer.md "Polling", "Commits"): ``poll`` returns a
batch, and ``[]`` after its timeout; commit-on-poll seen by the group's offsets and by a
second consumer; ``commit_async``'s callback on the asyncio loop; a cancelled ``await
poll()`` loses no message, also when the trio loop had taken the batch already."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from equeue import ConfigError, EQueueError, Message
from equeue.aio import AsyncClient, AsyncConsumer, AsyncProducer
from equeue.broker import EmbeddedBroker
from tests.conftest import wait_until_sync

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=0.5
)


async def poll_until(con: AsyncConsumer, n: int, max_messages: int = 500) -> list[Message]:
    """Poll until ``n`` messages came (TimeoutError after 10 s)."""
    out: list[Message] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out += await con.poll(1.0, max_messages=min(max_messages, n - len(out)))
    return out


async def offset_is(c: AsyncClient, group: str, topic: str, want: int) -> None:
    """Wait until ``group``'s committed offset of ``topic``/0 is ``want``."""
    async with asyncio.timeout(10):
        while await c.query_offset(group, topic, 0) != want:
            await asyncio.sleep(0.02)


def test_poll_returns_a_batch_and_empty_after_the_timeout(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("ape", 1)
            await c.create_topic("apf", 1)
        async with AsyncProducer(addr) as p:
            await p.send_batch("apf", [f"m{i}" for i in range(10)])
        async with AsyncConsumer(addr, "g-ape", "ape", start_from="earliest", **FAST) as con:
            t0 = time.monotonic()
            assert await con.poll(0.3) == []  # an empty topic: [] once the timeout passed
            assert time.monotonic() - t0 >= 0.29
            with pytest.raises(ConfigError):
                await con.poll(-1)
            with pytest.raises(TypeError):
                await con.poll("1")  # type: ignore[arg-type]
            with pytest.raises(ConfigError):
                await con.poll(1, max_messages=0)
        assert await con.poll(1) == []  # closed: nothing
        async with AsyncConsumer(addr, "g-apf", "apf", start_from="earliest", **FAST) as con:
            got = await poll_until(con, 10, max_messages=4)
            assert [m.text for m in got] == [f"m{i}" for i in range(10)]
            assert await con.poll(0) == []
            with pytest.raises(RuntimeError, match="poll"):
                async for _ in con:  # polled: iteration cannot take over
                    pass

    asyncio.run(main())


def test_commit_on_next_poll_and_commit_async(embedded_broker: EmbeddedBroker) -> None:
    """A polled batch is done at the next poll: the periodic commit covers the first
    batch, not the second, until ``commit_async`` (whose callback runs on the asyncio
    loop); a second consumer of the group then starts after what was committed."""
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("acp", 1)
            async with AsyncProducer(addr) as p:
                await p.send_batch("acp", [f"m{i}" for i in range(8)])
            heard: list[tuple[EQueueError | None, threading.Thread]] = []
            done = asyncio.Event()

            def callback(error: EQueueError | None) -> None:
                heard.append((error, threading.current_thread()))
                done.set()

            async with AsyncConsumer(addr, "g-acp", "acp", start_from="earliest", **FAST) as con:
                assert [m.text for m in await poll_until(con, 3, max_messages=3)] == [
                    "m0",
                    "m1",
                    "m2",
                ]
                assert [m.text for m in await poll_until(con, 3, max_messages=3)] == [
                    "m3",
                    "m4",
                    "m5",
                ]
                await offset_is(
                    c, "g-acp", "acp", 3
                )  # the first batch only: the second is not done yet
                description = await c.describe_group("g-acp")
                assert [q.committed for q in description.queues] == [3]
                con.commit_async(callback)
                async with asyncio.timeout(10):
                    await done.wait()
                assert heard == [
                    (None, threading.current_thread())
                ]  # on this asyncio loop's thread
                assert await c.query_offset("g-acp", "acp", 0) == 6
            async with AsyncConsumer(addr, "g-acp", "acp", start_from="earliest", **FAST) as second:
                assert [m.text for m in await poll_until(second, 2)] == ["m6", "m7"]
            assert await c.query_offset("g-acp", "acp", 0) == 8  # the close commits the last poll

    asyncio.run(main())


def test_a_cancelled_poll_loses_no_message(embedded_broker: EmbeddedBroker) -> None:
    """Cancelled while waiting, a poll takes nothing; cancelled after the trio loop took
    its batch (the asyncio thread held up until then, so the cancellation lands before
    the batch is received), the batch goes back first in line: the next poll returns
    it, and it is not committed before."""
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("acx", 1)
            async with AsyncConsumer(addr, "g-acx", "acx", start_from="earliest",
                                     **{**FAST, "commit_interval": 60.0}) as con:  # fmt: skip
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await con.poll(30)  # nothing there: the cancellation ends the wait
                async with AsyncProducer(addr) as p:
                    await p.send_batch("acx", [f"m{i}" for i in range(6)])
                loop, core = con._ready()
                # everything is pulled first, so the polls below take their batch at once
                wait_until_sync(lambda: con.statistics().buffered == 6)
                assert [m.text for m in await poll_until(con, 2, max_messages=2)] == ["m0", "m1"]
                task = asyncio.create_task(con.poll(30, max_messages=3))
                await asyncio.sleep(0)  # the task starts the poll on the trio loop...
                # ...and this thread holds the asyncio loop until the trio loop took the batch
                wait_until_sync(lambda: loop.run_sync(lambda: len(core._polled) == 1))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await con.commit()  # m0, m1 are done; the batch put back is not
                assert await c.query_offset("g-acx", "acx", 0) == 2
                assert [m.text for m in await poll_until(con, 4)] == ["m2", "m3", "m4", "m5"]

    asyncio.run(main())
