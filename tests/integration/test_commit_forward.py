"""A lease-holding member's commit never moves its group's offset back.

The fault campaign found it (seed 168): member m1 lost the lease of a queue, m0 took
it, consumed further and committed 184; m1 got the queue back and its late commit of
116 (from its earlier hold, retried or still in flight) was accepted, so the group
went back to 116 and would deliver 68 messages again. Now the broker keeps 184:
such a commit is answered OK and not written. RESET_OFFSETS and commits without a
member id (tools) still move an offset wherever they say."""

from __future__ import annotations

import trio

from equeue import Message, control, wire
from equeue.broker import Broker
from equeue.client import AsyncClient


async def test_a_stale_holds_late_commit_does_not_move_the_group_back(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"%d" % i)) for i in range(300)]))
            hb = await c.heartbeat(control.Heartbeat("g", "m1", ["t"], acquire=["t/0"]))
            assert hb.held == ["t/0"]
            await c.commit_offset("g", "t", 0, 116, "m1")  # m1's first hold
            await c.heartbeat(control.Heartbeat("g", "m1", ["t"], release=["t/0"]))
            hb = await c.heartbeat(control.Heartbeat("g", "m0", ["t"], acquire=["t/0"]))
            assert hb.held == ["t/0"]
            await c.commit_offset("g", "t", 0, 184, "m0")  # m0 consumed further
            await c.heartbeat(control.Heartbeat("g", "m0", ["t"], release=["t/0"]))
            hb = await c.heartbeat(control.Heartbeat("g", "m1", ["t"], acquire=["t/0"]))
            assert hb.held == ["t/0"]
            await c.commit_offset("g", "t", 0, 116, "m1")  # the late commit of its first hold
            assert (await c.query_offset("g", "t", 0)) == 184
            await c.commit_offset("g", "t", 0, 190, "m1")  # forward still moves
            assert (await c.query_offset("g", "t", 0)) == 190
            # an operator's reset, and a commit without a member id, move it back as asked
            await c.leave_group("g", "m1")
            await c.leave_group("g", "m0")
            assert await c.reset_offsets("g", "t", control.ResetTarget.EARLIEST) == {0: 0}
            assert (await c.query_offset("g", "t", 0)) == 0
            await c.commit_offset("g", "t", 0, 250)
            await c.commit_offset("g", "t", 0, 40)
            assert (await c.query_offset("g", "t", 0)) == 40
