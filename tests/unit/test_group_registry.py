"""The broker's group registry (``equeue.broker.groups``) on trio's MockClock: an
ephemeral group's in-memory offsets, and its deletion when the last member expires
(the registry's expiry task, on the injected clock: no wall time)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from equeue.broker.groups import GroupRegistry
from equeue.control import Heartbeat
from equeue.errors import GroupNotFound

G = "e#ephemeral"


def beat(reg: GroupRegistry, member: str, *leases: str) -> None:
    reg.heartbeat(Heartbeat(G, member, ["t"], acquire=list(leases)), None, {"t": 2})


async def test_an_ephemeral_group_goes_when_its_last_member_expires(autojump_clock: trio.testing.MockClock) -> None:
    reg = GroupRegistry(member_expiry=10.0)
    async with trio.open_nursery() as n:
        n.start_soon(reg.run_expiry)
        beat(reg, "m1", "t/0")
        beat(reg, "m2", "t/1")
        reg.commit_ephemeral(G, "t", 0, 5, forward_only=True)
        reg.commit_ephemeral(G, "t", 1, 7, forward_only=True)
        reg.commit_ephemeral(G, "t", 1, 6, forward_only=True)  # a member's commit never moves it back
        for _ in range(3):  # m2 heartbeats for 15 s, m1 is silent: m1 expires, the group stays
            await trio.sleep(5)
            beat(reg, "m2", "t/1")
        assert [m.consumer_id for m in reg.live_members(G)] == ["m2"]
        assert reg.all_ephemeral_offsets() == {(G, "t", 0): 5, (G, "t", 1): 7}
        await trio.sleep(12)  # m2 silent too: the group goes, with its leases and offsets
        assert G not in reg.groups and reg.all_ephemeral_offsets() == {} and reg.ephemeral_offsets(G) == {}
        with pytest.raises(GroupNotFound):
            reg.commit_ephemeral(G, "t", 0, 1, forward_only=False)
        n.cancel_scope.cancel()


async def test_a_persistent_group_keeps_nothing_in_memory_but_membership() -> None:
    reg = GroupRegistry(member_expiry=10.0)
    reg.heartbeat(Heartbeat("p", "m1", ["t"], acquire=["t/0"]), None, {"t": 1})
    assert reg.all_ephemeral_offsets() == {} and not reg.groups["p"].ephemeral
    beat(reg, "m1")
    assert reg.groups[G].ephemeral
    reg.leave(G, "m1")
    assert G not in reg.groups and "p" in reg.groups
