"""GroupElection against a real etcd: bootstrap, one winner among concurrent
contenders, ISR-only takeover, epochs, a deposed leader's ISR write, fencing while
etcd is frozen, hand-over at a clean exit and after a lease expiry.

Each contender is one GroupElection with its own Membership (its own lease), all in
this process: etcd is real, so the transactions, leases and watches are too."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from equeue.broker.cluster.election import GroupElection, Leadership
from equeue.broker.cluster.etcd import EtcdClient, EtcdUnavailable, compare_create, put_op
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.cluster.membership import Membership
from equeue.errors import ClusterUnavailable
from equeue.placement import (
    BrokerRecord,
    IsrRecord,
    LeaderRecord,
    decode_isr,
    decode_leader,
    encode_isr,
    encode_leader,
    isr_key,
    leader_key,
)
from tests.conftest import wait_until

TTL = 2


@asynccontextmanager
async def contender(
    etcd: EtcdClient, broker_id: str, group: str = "g", eligible: Callable[[], bool] = lambda: True
) -> AsyncIterator[GroupElection]:
    """One broker's membership and election (leaving: the lease is revoked)."""
    address = f"127.0.0.1:{5800 + int(broker_id[1:])}"
    record = BrokerRecord(group, broker_id, address, started_ms=1, pid=1, version="test")
    async with Membership(etcd, record, ttl=TTL) as m:
        election = GroupElection(
            etcd, group=group, broker_id=broker_id, address=address, membership=m, ttl=TTL, eligible=eligible
        )
        async with election:
            yield election


def leaders(es: list[GroupElection]) -> list[str]:
    return [e.broker_id for e in es if e.is_leader()]


def agreed(es: list[GroupElection], **want: object) -> bool:
    """Every contender's state shows the same leader, with ``want``'s fields."""
    states = {e.state for e in es}
    if len(states) != 1:
        return False
    (state,) = states
    return state.leader_id is not None and all(getattr(state, k) == v for k, v in want.items())


async def run_contender(
    c: EtcdClient, broker_id: str, eligible: Callable[[], bool], *, task_status: trio.TaskStatus[tuple[GroupElection, trio.CancelScope]]
) -> None:
    """A contender in its own task, stopped (cleanly: lease revoked) by cancelling the scope it hands back."""
    with trio.CancelScope() as scope:
        async with contender(c, broker_id, eligible=eligible) as e:
            task_status.started((e, scope))
            await trio.sleep_forever()


async def test_bootstrap_one_winner_isr_only_takeover_epochs(etcd: EtcdProcess) -> None:
    eligible = {"b1": True, "b2": True, "b3": True}
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c, trio.open_nursery() as nursery:
        started = {
            i: await nursery.start(run_contender, c, i, lambda i=i: eligible[i]) for i in eligible
        }
        es = {i: e for i, (e, _) in started.items()}
        every = list(es.values())
        # a new group: the three campaign at once on an absent ISR record; one wins
        await wait_until(lambda: agreed(every, epoch=1), what="one leader at epoch 1")
        (winner,) = leaders(every)
        first = es[winner]
        assert first.state.isr == (winner,) and first.state.leader_address == first.address
        # (the watch may show the win before the winner's transaction answer arrives)
        await wait_until(lambda: sum(e.takeovers for e in every) == 1, what="the winner counted its takeover")
        kv = await c.get(leader_key("g"))
        assert kv is not None and decode_leader(kv.value).broker_id == winner
        assert kv.lease == first._membership.lease_id  # under the winner's membership lease
        isr = await c.get(isr_key("g"))
        assert isr is not None and decode_isr(isr.value) == IsrRecord("g", 1, winner, (winner,))
        assert first.state.isr_revision == isr.mod_revision

        # the ISR grows to two; the leader leaves while the other member is not eligible
        # (store not consistent): the third broker, outside the ISR, never takes over
        second, third = sorted(set(eligible) - {winner})
        assert await first.set_isr((winner, second))
        assert first.state.isr == (winner, second)
        await wait_until(lambda: es[third].state.isr == (winner, second), what="ISR seen by all")
        eligible[second] = False
        started[winner][1].cancel()
        rest = [es[second], es[third]]
        await wait_until(lambda: all(e.state.leader_id is None for e in rest), what="the leader key gone")
        with trio.move_on_after(1.0):
            await wait_until(lambda: any(e.state.leader_id for e in rest), timeout=2)
        assert [e.state.leader_id for e in rest] == [None, None]
        assert es[third].takeovers == 0 and es[second].takeovers == 0
        # eligible again: the ISR member takes over at epoch 2, the old leader out of the ISR
        eligible[second] = True
        es[second].nudge()
        await wait_until(lambda: agreed(rest, epoch=2), what="a new leader at epoch 2")
        assert leaders(rest) == [second] and es[second].state.isr == (second,)
        assert es[third].takeovers == 0
        nursery.cancel_scope.cancel()


async def test_a_deposed_leaders_set_isr_returns_false(etcd: EtcdProcess) -> None:
    eligible = {"b1": True, "b2": False}
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        async with contender(c, "b1", eligible=lambda: eligible["b1"]) as a, contender(
            c, "b2", eligible=lambda: eligible["b2"]
        ) as b:
            await wait_until(a.is_leader, what="b1 leads")
            eligible["b2"] = True
            assert await a.set_isr(("b1", "b2"))
            await wait_until(lambda: b.state.isr == ("b1", "b2"), what="b2 sees the ISR")
            # b1 loses its lease (as after a partition) and stays out of the campaign
            eligible["b1"] = False
            await c.revoke(a._membership.lease)
            assert not await a.set_isr(("b1",)), "a deposed leader wrote the ISR"
            await wait_until(b.is_leader, what="b2 took over")
            assert b.state.epoch == 2 and b.state.isr == ("b2",)
            assert not await a.set_isr(("b1",))
            assert a.state.leader_id == "b2" and not a.serving()
            isr = await c.get(isr_key("g"))
            assert isr is not None and decode_isr(isr.value) == IsrRecord("g", 2, "b2", ("b2",))


async def test_clean_exit_hands_leadership_over_quickly(etcd: EtcdProcess, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "equeue.cluster.election")
    ready = False
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        async with contender(c, "b2", eligible=lambda: ready) as b:
            async with contender(c, "b1") as a:
                await wait_until(a.is_leader, what="b1 leads")
                ready = True
                assert await a.set_isr(("b1", "b2"))
                await wait_until(lambda: b.state.isr == ("b1", "b2"), what="b2 sees the ISR")
                start = trio.current_time()
            await wait_until(b.is_leader, timeout=TTL, what="b2 took over before the lease could expire")
            took = trio.current_time() - start
            print(f"clean exit to takeover: {took:.3f} s")
            assert took < TTL, f"a clean exit must not wait for the lease: {took:.3f} s"
            await wait_until(lambda: b.takeovers == 1, what="b2's transaction answered")
            assert "took over as leader at epoch 2" in caplog.text


async def test_fenced_while_etcd_is_frozen_only_with_another_isr_member(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        async with contender(c, "b1", "g1") as a, contender(c, "b2", "g1") as b, contender(c, "b3", "g2") as alone:
            await wait_until(lambda: a.is_leader() or b.is_leader(), what="g1 has a leader")
            await wait_until(alone.is_leader, what="g2 has a leader")
            lead, other = (a, b) if a.is_leader() else (b, a)
            assert await lead.set_isr((lead.broker_id, other.broker_id))
            assert lead.serving() and not lead.fenced() and alone.serving()
            changed = lead.changed
            etcd.freeze()
            try:
                await wait_until(lead.fenced, timeout=TTL * 2, what="the leader fenced itself")
                age = lead._membership.clock() - lead._membership.last_renewal_sent
                assert age > TTL * 2 / 3 and not lead.serving()
                await wait_until(changed.is_set, timeout=1, what="changed set when fenced() flipped")
                # a leader alone in its ISR keeps serving (no one else may take over)
                await wait_until(
                    lambda: alone._membership.clock() - alone._membership.last_renewal_sent > TTL * 2 / 3 + 0.05,
                    timeout=TTL * 2, what="g2's leader without a renewal as long",
                )  # fmt: skip
                assert alone.is_leader() and not alone.fenced() and alone.serving()
            finally:
                etcd.thaw()
            await wait_until(lambda: lead.serving() or other.is_leader(), timeout=TTL * 5, what="served again")


async def test_takeover_after_a_dead_leaders_lease_expires(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        # a leader that died right after its takeover: its lease is never renewed
        lease = await c.grant(TTL)
        granted = trio.current_time()
        ok, _ = await c.txn(
            [compare_create(leader_key("g"), 0)],
            [
                put_op(leader_key("g"), encode_leader(LeaderRecord("g", "b9", "127.0.0.1:9", 4, 1)), lease=lease),
                put_op(isr_key("g"), encode_isr(IsrRecord("g", 4, "b9", ("b9", "b1", "b2")))),
            ],
        )
        assert ok
        async with contender(c, "b1") as a, contender(c, "b2") as b, contender(c, "b3") as x:
            await wait_until(lambda: a.state.leader_id == "b9", what="b1 sees the dead leader")
            assert a.state == Leadership("b9", "127.0.0.1:9", 4, ("b9", "b1", "b2"), a.state.isr_revision)
            await wait_until(lambda: a.is_leader() or b.is_leader(), timeout=TTL + 5, what="a takeover")
            took = trio.current_time() - granted
            print(f"lease grant to takeover: {took:.3f} s")
            assert took <= TTL + 1, f"takeover {took:.3f} s after the dead leader's last renewal"
            lead = a if a.is_leader() else b
            await wait_until(lambda: agreed([a, b, x], epoch=5), what="all see epoch 5")
            assert lead.state.isr == (lead.broker_id, ({"b1", "b2"} - {lead.broker_id}).pop())
            assert x.takeovers == 0


async def test_a_restarted_leader_removes_its_previous_lives_key(etcd: EtcdProcess) -> None:
    """A leader that crashed and restarted at once (same broker id, a new lease)
    does not wait for its old lease to expire: it deletes its own stale key."""
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        old = await c.grant(60)  # the previous life's lease, far from expiring
        ok, _ = await c.txn(
            [compare_create(leader_key("g"), 0)],
            [
                put_op(leader_key("g"), encode_leader(LeaderRecord("g", "b1", "127.0.0.1:9", 3, 1)), lease=old),
                put_op(isr_key("g"), encode_isr(IsrRecord("g", 3, "b1", ("b1", "b2")))),
            ],
        )
        assert ok
        start = trio.current_time()
        async with contender(c, "b1") as a:
            await wait_until(a.is_leader, timeout=10, what="b1 leads again")
            took = trio.current_time() - start
            assert took < 10, f"{took:.3f} s"
            assert a.state.epoch == 4 and a.state.isr == ("b1", "b2")


async def test_the_election_reloads_after_an_etcd_restart(etcd: EtcdProcess) -> None:
    eligible = {"b1": True, "b2": True}
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        async with contender(c, "b1", eligible=lambda: eligible["b1"]) as a:
            await wait_until(a.is_leader, what="b1 leads")
            await trio.to_thread.run_sync(etcd.stop)
            await trio.to_thread.run_sync(etcd.start)
            # the leader's lease survived the restart; its ISR write needs the right revision
            await wait_until(lambda: a._membership.registered and a.loaded.is_set(), timeout=10, what="b1 back")
            async with contender(c, "b2", eligible=lambda: eligible["b2"]) as b:
                await wait_until(lambda: b.state.leader_id == "b1", what="b2 sees b1")
                assert await a.set_isr(("b1", "b2"))
                eligible["b1"] = False
                await c.revoke(a._membership.lease)
                # b1's watch (re-established after the restart) shows the new leader
                await wait_until(lambda: a.state.leader_id == "b2" and a.state.epoch == 2, what="b1 sees b2 lead")
                await wait_until(b.is_leader, what="b2 leads")
                assert not a.is_leader()


class Severable(EtcdClient):
    """A real etcd client (one broker's link to the real etcd) that the test can cut:
    once ``cut``, every call fails and no watch event is delivered, as when the
    broker is partitioned from etcd. ``lose_txn_answer``: the next transaction is
    applied by etcd but its answer is lost, and the link is cut at that moment (the
    case a review found: the leader never learns its ISR write went through).
    ``slow_keepalive``: the next keepalive answers that many seconds late."""

    cut = False
    lose_txn_answer = False
    slow_keepalive = 0.0

    async def _call(self, path: str, body: dict[str, Any], *, idempotent: bool = True) -> dict[str, Any]:
        if self.cut:
            raise EtcdUnavailable(f"{path}: cut from etcd by the test")
        if path == "/v3/kv/txn" and self.lose_txn_answer:
            self.lose_txn_answer = False
            self.cut = True  # before the answer: the watch cannot tell either
            await super()._call(path, body, idempotent=idempotent)
            raise EtcdUnavailable(f"{path}: applied, answer lost (the test)")
        if path == "/v3/lease/keepalive" and self.slow_keepalive:
            delay, self.slow_keepalive = self.slow_keepalive, 0.0
            await trio.sleep(delay)  # the fault: etcd answers late
        return await super()._call(path, body, idempotent=idempotent)

    @asynccontextmanager
    async def watch_range(self, key: str, range_end: str | bytes, start_revision: int) -> AsyncIterator[Any]:
        if self.cut:
            raise EtcdUnavailable("watch: cut from etcd by the test")
        async with super().watch_range(key, range_end, start_revision) as stream:
            yield self._events(stream)

    async def _events(self, stream: Any) -> AsyncIterator[Any]:
        async for batch in stream:
            if self.cut:
                raise EtcdUnavailable("watch: cut from etcd by the test")
            yield batch


@asynccontextmanager
async def severable_leader(etcd: EtcdProcess) -> AsyncIterator[tuple[Severable, GroupElection, GroupElection]]:
    """b1 leading group g through a :class:`Severable` link to etcd, and b2, a second
    contender on a plain one."""
    async with Severable([etcd.endpoint], request_timeout=1.0) as link, EtcdClient(
        [etcd.endpoint], request_timeout=1.0
    ) as c:
        async with contender(link, "b1") as a:
            await wait_until(a.is_leader, what="b1 leads")
            async with contender(c, "b2") as b:
                yield link, a, b


async def test_an_isr_write_whose_answer_was_lost_counts_for_fencing(etcd: EtcdProcess) -> None:
    """The leader's ISR write {b1, b2} is applied but its answer lost, and b1 is then
    cut from etcd: b2 may take over once b1's lease expires, so b1 must fence itself
    first although the ISR it last saw was {b1} alone. Two leaders never serve."""
    async with severable_leader(etcd) as (lossy, a, b):
        await wait_until(lambda: b.state.leader_id == "b1", what="b2 sees b1 lead")
        lossy.lose_txn_answer = True
        with pytest.raises(ClusterUnavailable):
            await a.set_isr(("b1", "b2"))
        assert a.state.isr == ("b1",)  # b1 never learnt: etcd has {b1, b2}
        both: list[float] = []

        async def watch_both() -> None:
            while True:
                if a.serving() and b.serving():
                    both.append(trio.current_time())
                await trio.sleep(0.01)

        async with trio.open_nursery() as n:
            n.start_soon(watch_both)
            await wait_until(a.fenced, timeout=TTL * 2, what="b1 fenced itself")
            await wait_until(b.is_leader, timeout=TTL * 5, what="b2 took over")
            n.cancel_scope.cancel()
        assert b.state.epoch == 2 and not a.serving()
        assert not both, "two leaders served at once"


async def test_one_slow_keepalive_does_not_fence_a_healthy_leader(etcd: EtcdProcess) -> None:
    """One keepalive answered 1 s late (half of TTL 2, most of the fence window of
    1.33 s): the next renewal goes out on time, so the leader never fences."""
    async with severable_leader(etcd) as (slow, a, b):
        assert await a.set_isr(("b1", "b2"))
        await wait_until(lambda: b.state.isr == ("b1", "b2"), what="b2 sees the ISR")
        fenced: list[float] = []

        async def watch_fence() -> None:
            while True:
                if a.fenced():
                    fenced.append(trio.current_time())
                await trio.sleep(0.01)

        async with trio.open_nursery() as n:
            n.start_soon(watch_fence)
            slow.slow_keepalive = 1.0
            await wait_until(lambda: not slow.slow_keepalive, what="the slow keepalive sent")
            start = trio.current_time()
            renewed = a._membership.last_renewal_sent
            await wait_until(lambda: a._membership.last_renewal_sent > renewed + 1.5,
                             timeout=10, what="renewals past the slow answer")  # fmt: skip
            n.cancel_scope.cancel()
        assert trio.current_time() - start >= 1.0
        assert not fenced, f"fenced by one slow keepalive at {fenced[:3]}"
        assert a.serving()


async def test_a_leader_that_resigns_hands_over_and_does_not_campaign_again(etcd: EtcdProcess) -> None:
    """A leader whose store turned out inconsistent at the takeover resigns: its key
    is deleted, another ISR member takes over at a new epoch, and the resigner does not
    win it back while it is not eligible."""
    eligible = {"b1": True, "b2": True}
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        async with contender(c, "b1", eligible=lambda: eligible["b1"]) as a:
            await wait_until(a.is_leader, what="b1 leads")
            async with contender(c, "b2", eligible=lambda: eligible["b2"]) as b:
                assert await a.set_isr(("b1", "b2"))
                await wait_until(lambda: b.state.isr == ("b1", "b2"), what="b2 sees the ISR")
                eligible["b1"] = False  # (its store is not consistent)
                assert await a.resign()
                assert not a.is_leader()  # at once, not at the watch's next event
                await wait_until(b.is_leader, what="b2 took over")
                await wait_until(lambda: a.state.leader_id == "b2", what="b1 sees b2 lead")
                assert b.state.epoch == 2 and not a.is_leader()
                assert not await a.resign()  # not the leader any more: nothing to give back
                assert a.takeovers == 1  # b1 never took the group back (b2's own count may miss a
                # takeover whose answer timed out under load: the watch made it the leader)


async def test_a_stale_or_missing_record_is_not_elected_from_until_an_operator_recovers(
    etcd: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd restored from an older state: its ISR record is at epoch 3, but b1's store
    has seen epoch 5. Electing from the record could reuse epoch 4 or 5 (the old
    leader's divergent entries would then pass the truncation checks), so b1 does not
    campaign; likewise with no record at all (etcd lost its data) while its store has
    history. The operator's recovery writes the record at epoch 5, and b1 takes over at
    epoch 6, an epoch no replica used."""
    caplog.set_level(logging.ERROR, "equeue.cluster.election")
    async with EtcdClient([etcd.endpoint], request_timeout=1.0) as c:
        for stale in (True, False):
            if stale:
                await c.put(isr_key("g"), encode_isr(IsrRecord("g", 3, "b9", ("b9", "b1"))))
            else:
                await c.delete(isr_key("g"))
            address = "127.0.0.1:5801"
            record = BrokerRecord("g", "b1", address, started_ms=1, pid=1, version="test")
            async with Membership(c, record, ttl=TTL) as m:
                e = GroupElection(c, group="g", broker_id="b1", address=address, membership=m, ttl=TTL,
                                  eligible=lambda: True, floor_epoch=lambda: 5)  # fmt: skip
                async with e:
                    await m.wait_registered()
                    with trio.fail_after(10):
                        await e.wait_settled()  # returns: it may not campaign
                    assert not e.is_leader() and e.takeovers == 0
                    assert "Recover with: equeue cluster recover --group g" in caplog.text
                    assert e.stale_record() is not None
                    assert not await e.recover(4, ["b1"])  # below the store's epoch 5: it would be used twice
                    assert await e.recover(5, ["b1"])
                    await wait_until(e.is_leader, what="b1 took over after the recovery")
                    assert e.state.epoch == 6
                    assert not await e.recover(7, ["b1"])  # a leader exists: nothing to recover
            caplog.clear()
