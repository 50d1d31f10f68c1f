"""Lifecycle across crashes: a broker subprocess is SIGKILLed with delayed messages
pending (one falls due while it is down), in the middle of moving a burst of due
messages, and with keyed messages stored; after a restart every delayed message is
delivered exactly once, in due order, and the key index still answers."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from equeue import Message, PullStatus, wire
from equeue.client import AsyncClient
from tests.conftest import wait_wall_clock_past
from tests.conftest import wall_ms as now_ms


async def drain(c: AsyncClient, topic: str, queue: int, want: int, deadline_s: float) -> list[Message]:
    """Long-poll ``queue`` from offset 0 until ``want`` messages or the deadline; then
    one more short pull to catch any extra (duplicate) message."""
    got: list[Message] = []
    offset = 0
    with trio.move_on_after(deadline_s):
        while len(got) < want:
            r = await c.pull(wire.PullRequest(topic, queue, offset, 5000, 16 << 20, max_wait_ms=1000))
            assert r.status in (PullStatus.FOUND, PullStatus.NO_NEW_MESSAGE), r.status
            got += r.messages
            offset = r.next_offset
    r = await c.pull(wire.PullRequest(topic, queue, offset, 5000, 16 << 20, max_wait_ms=300))
    return got + r.messages


@pytest.mark.slow
async def test_restart_with_pending_delayed_incl_one_due_while_down(broker_process: Any) -> None:
    proc = broker_process()
    with trio.fail_after(40):
        async with AsyncClient(proc.address) as c:
            await c.create_topic("d", 1)
            due_down = now_ms() + 1000  # falls due while the broker is down
            due_later = now_ms() + 6500  # still pending after the restart
            for body, due in (("later", due_later), ("while-down", due_down)):
                ans = await c.produce(wire.ProduceRequest("d", 0, [wire.encode_entry(Message(body, deliver_at=due))]))
                assert ans.scheduled == 1
            assert (await c.describe_topic("d")).pending_delayed == 2
        proc.kill()  # the acks above were fsynced: the schedule must survive
        await wait_wall_clock_past(due_down + 300)
        restarted_at = now_ms()
        proc2 = broker_process()
        async with AsyncClient(proc2.address) as c:
            [m] = await drain(c, "d", 0, 1, 5)
            arrived = now_ms()
            assert m.text == "while-down"
            assert m.timestamp >= restarted_at  # moved by the new process ...
            assert arrived < due_later  # ... right after start, long before the next one
            d = await c.describe_topic("d")
            assert (d.pending_delayed, d.queues[0].max_offset) == (1, 1)
            got = await drain(c, "d", 0, 2, 15)
            assert [x.text for x in got] == ["while-down", "later"]
            assert got[1].timestamp >= due_later
            assert (await c.describe_topic("d")).pending_delayed == 0


@pytest.mark.slow
async def test_sigkill_while_moving_due_messages_delivers_each_once(broker_process: Any) -> None:
    n, queues = 60_000, 2
    proc = broker_process()
    with trio.fail_after(90):
        async with AsyncClient(proc.address) as c:
            await c.create_topic("burst", queues)
            due = now_ms() + 3500
            for start in range(0, n, 2500):
                q = (start // 2500) % queues
                entries = [wire.encode_entry(Message(f"{i}", deliver_at=due)) for i in range(start, start + 2500)]
                await c.produce(wire.ProduceRequest("burst", q, entries))
            before = (await c.describe_topic("burst")).pending_delayed  # n unless moves began
            assert before > n // 2, "producing the burst took too long for this test"
            await wait_wall_clock_past(due - 1)  # due
            pending = before
            while pending == before:  # kill as soon as a move transaction committed
                pending = (await c.describe_topic("burst")).pending_delayed
        proc.kill()
        assert 0 < pending < n, f"the kill came too late ({pending} pending)"
        proc2 = broker_process()
        async with AsyncClient(proc2.address) as c:
            bodies: list[int] = []
            for q in range(queues):
                got = await drain(c, "burst", q, n // queues, 30)
                nums = [int(m.text) for m in got]
                # in produce order within the queue (same due time), no gap, no repeat
                assert nums == sorted(nums)
                assert [m.queue_offset for m in got] == list(range(len(got)))
                bodies += nums
            assert len(bodies) == n, f"{len(bodies)} delivered for {n} scheduled"
            assert sorted(bodies) == list(range(n))
            d = await c.describe_topic("burst")
            assert d.pending_delayed == 0
            assert sum(qs.count for qs in d.queues) == n


async def test_key_lookup_after_restart(broker_process: Any) -> None:
    proc = broker_process()
    with trio.fail_after(30):
        async with AsyncClient(proc.address) as c:
            await c.create_topic("k", 4)
            expected: list[int] = []
            for i in range(40):
                entries = [
                    wire.encode_entry(Message(f"order-{i}", key="cust-7")),
                    wire.encode_entry(Message(f"other-{i}", key=f"cust-{i + 100}")),
                ]
                ans = await c.produce(wire.ProduceRequest("k", i % 4, entries))
                expected.append(ans.first_global)
        proc.kill()
        proc2 = broker_process()
        async with AsyncClient(proc2.address) as c:
            res = await c.find_by_key("k", "cust-7", limit=1000)
            assert [m.global_offset for m in res.messages] == expected[::-1]
            assert [m.text for m in res.messages] == [f"order-{i}" for i in reversed(range(40))]
            [m] = (await c.find_by_key("k", "cust-105")).messages
            assert m.text == "other-5"
            [g] = (await c.get_message("k", global_offset=expected[3])).messages
            assert (g.text, g.queue_id) == ("order-3", 3)
