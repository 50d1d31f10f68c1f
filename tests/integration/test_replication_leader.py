"""The leader's side of replication (broker/replication/leader.py) over a real
replicated store and the real appender: held acks and the high watermark,
--min-insync, ISR shrink and expand, DIVERGED / TOO_OLD, trimming.

The group's leadership is a fixed value here (the election against a real etcd is
tests/cluster/test_election.py; whole replicas are tests/cluster/test_replication_*).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from equeue import Message, control, wire
from equeue.broker import storage as st
from equeue.broker.appender import Appender
from equeue.broker.replication.leader import LeaderLog, LogTrimmer
from equeue.broker.storage.layout import FORMAT_VERSION
from equeue.config import BrokerConfig
from equeue.errors import ClusterUnavailable, NotEnoughReplicas, NotLeader, StaleEpoch
from equeue.wire.replica import FetchRequest, FetchStatus
from tests.conftest import wait_until

ME, F1, F2 = "leader", "f1", "f2"


@attrs.define
class State:
    epoch: int
    isr: tuple[str, ...]


class FixedLeadership:
    """This broker leads at ``state.epoch``; ISR writes always succeed (recorded)."""

    def __init__(self, epoch: int, isr: tuple[str, ...]) -> None:
        self.state = State(epoch, isr)
        self.serving_now = True
        self.writes: list[tuple[str, ...]] = []
        #: the next writes raise ClusterUnavailable although they were applied
        self.unanswered = 0

    def serving(self) -> bool:
        return self.serving_now

    async def set_isr(self, members: Sequence[str]) -> bool:
        self.writes.append(tuple(members))
        if self.unanswered:  # etcd wrote it, but the answer was lost
            self.unanswered -= 1
            self.state = State(self.state.epoch, tuple(members))
            raise ClusterUnavailable("no answer from etcd (the write may have been applied)")
        self.state = State(self.state.epoch, tuple(members))
        return True


def _op(info: control.TopicInfo, body: bytes) -> st.ProduceOp:
    return st.ProduceOp(info, 0, [wire.encode_entry(Message(body))], None, -1, 4 << 20, 86_400_000)


def _fetch(
    broker_id: str, position: int, last_epoch: int = 1, wait_ms: int = 0, epoch: int = 1, consistent: bool = True
) -> FetchRequest:
    return FetchRequest(
        broker_id, f"{broker_id}:1", epoch, position, last_epoch, 1 << 20, wait_ms, FORMAT_VERSION, b"", consistent
    )


async def answer(p: Any) -> Any:
    """A pending op's result (or its error raised), failing the test after 10 s (the
    appender's own wait is shielded: a missing answer would hang the test)."""
    with trio.fail_after(10):
        await p.done.wait()
    return p.outcome.unwrap()


class Leader:
    def __init__(self, store: st.Store, app: Appender, ll: LeaderLog, election: FixedLeadership) -> None:
        self.store, self.app, self.ll, self.election = store, app, ll, election
        self.woken: list[tuple[int, int]] = []


@asynccontextmanager
async def leading(tmp_path: Path, isr: tuple[str, ...], **cfg: Any) -> AsyncIterator[Leader]:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False, replicated=True)
    config = BrokerConfig(data_dir=tmp_path, replica_lag_max=cfg.pop("replica_lag_max", 60.0), **cfg)
    election = FixedLeadership(1, isr)
    holder: list[LeaderLog] = []
    app = Appender(store, hold=lambda batch, committed: holder[0].hold(batch, committed))
    try:
        async with trio.open_nursery() as n:
            n.start_soon(app.run)
            await app.call(store.replication.reload)
            hw = store.replication.position
            await app.call(lambda: store.replication.begin_epoch(1))
            woken: list[tuple[int, int]] = []

            def wake(queues: Iterable[tuple[int, int]]) -> None:
                woken.extend(queues)

            ll = LeaderLog(
                replication=store.replication, election=election, answers=app, call=app.call, wake=wake,
                on_scheduled=lambda: None, config=config, broker_id=ME, group="g", epoch=1, high_watermark=hw, promoted_at=hw,
            )  # fmt: skip
            holder.append(ll)
            ll.committed()
            leader = Leader(store, app, ll, election)
            leader.woken = woken
            try:
                yield leader
            finally:  # also when the test fails: else the appender's task keeps the nursery open
                ll.close(NotLeader("test over"))
                app.close()
    finally:
        store.close()


async def test_acks_wait_for_every_isr_member_and_visibility_follows(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1, F2)) as L:
            create = L.app.enqueue(st.CreateTopicOp("t", 1))
            start = L.ll.high_watermark
            await wait_until(lambda: L.store.replication.position == start + 2)  # the epoch marker, the create
            # nothing acknowledged, nothing visible, before both followers have it
            assert not create.done.is_set() and "t" not in L.store.topics
            a = await L.ll.fetch(_fetch(F1, start))
            assert a.status is FetchStatus.OK and [p for p, _ in a.entries] == [start, start + 1]
            end = a.end
            assert end == start + 2
            await L.ll.fetch(_fetch(F1, end))
            assert not create.done.is_set()  # F2 lags
            await L.ll.fetch(_fetch(F2, end))
            info = await answer(create)
            assert L.ll.high_watermark == end and "t" in L.store.topics
            p = L.app.enqueue(_op(info, b"x"))
            await wait_until(lambda: L.store.replication.position > end)
            for f in (F1, F2):
                await L.ll.fetch(_fetch(f, L.store.replication.position))
            assert (await answer(p)).stored == 1
            assert (info.topic_id, 0) in L.woken  # the parked pulls of its queue woke at the HW


async def test_a_lone_leader_acknowledges_at_commit(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME,)) as L:
            info = await L.app.submit(st.CreateTopicOp("t", 1))
            assert (await L.app.submit(_op(info, b"x"))).stored == 1
            assert L.ll.high_watermark == L.store.replication.position


async def test_min_insync_refuses_before_and_after_the_write(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1), min_insync=2, replica_lag_max=0.5) as L:
            start = L.ll.high_watermark
            await L.ll.fetch(_fetch(F1, start))
            create = L.app.enqueue(st.CreateTopicOp("t", 1))
            await wait_until(lambda: L.store.replication.position == start + 2)  # the epoch marker, the create
            await L.ll.fetch(_fetch(F1, L.store.replication.position))
            info = await answer(create)
            L.ll.check_produce()  # 2 in sync: accepted
            p = L.app.enqueue(_op(info, b"held"))
            async with trio.open_nursery() as n:
                n.start_soon(L.ll.run)  # F1 stops fetching: it leaves after 0.5 s
                with pytest.raises(NotEnoughReplicas, match="stored"):
                    await answer(p)
                n.cancel_scope.cancel()
            assert L.election.state.isr == (ME,)
            with pytest.raises(NotEnoughReplicas, match="nothing was written"):
                L.ll.check_produce()
            # F1 catches up and rejoins
            async with trio.open_nursery() as n:
                n.start_soon(L.ll.run)
                await L.ll.fetch(_fetch(F1, L.store.replication.position))
                await wait_until(lambda: L.election.state.isr == (ME, F1))
                n.cancel_scope.cancel()
            L.ll.check_produce()


async def test_divergence_too_old_stale_epoch_and_not_leader(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1)) as L:
            await L.ll.fetch(_fetch(F1, L.ll.high_watermark))
            end = L.store.replication.position
            # a follower with entries of an epoch this log ended earlier: DIVERGED at the end of it
            a = await L.ll.fetch(_fetch(F1, end + 5, last_epoch=1))
            assert a.status is FetchStatus.DIVERGED and a.diverge_at == end
            a = await L.ll.fetch(_fetch(F1, end, last_epoch=0))
            assert a.status is FetchStatus.DIVERGED and a.diverge_at == L.store.replication.end_of_epoch(0)
            # KIP-279: a last epoch this log never had diverges too (at most at the follower's end)
            a = await L.ll.fetch(_fetch(F1, end, last_epoch=7))
            assert a.status is FetchStatus.DIVERGED and a.diverge_at == end
            with pytest.raises(StaleEpoch):
                await L.ll.fetch(_fetch(F1, end, epoch=2))
            # trimmed past the follower's position: TOO_OLD
            await L.ll.fetch(_fetch(F1, end))
            await L.app.call(lambda: L.store.replication.trim_log(end))
            a = await L.ll.fetch(_fetch(F2, 0, last_epoch=0))
            assert a.status is FetchStatus.TOO_OLD and a.log_start == end
            # stepping down answers held acks and long-polled fetches NOT_LEADER
            held = L.app.enqueue(st.CreateTopicOp("late", 1))
            await wait_until(lambda: L.store.replication.position > end)
            async with trio.open_nursery() as n:

                async def poll() -> None:
                    with pytest.raises(NotLeader):
                        await L.ll.fetch(_fetch(F2, L.store.replication.position, wait_ms=10_000))  # not in the ISR

                n.start_soon(poll)
                await trio.testing.wait_all_tasks_blocked()
                assert not held.done.is_set(), held.outcome  # F1 has not acknowledged it
                L.ll.close(NotLeader("stepped down"))
            with pytest.raises(NotLeader):
                await answer(held)
            late = L.app.enqueue(st.CreateTopicOp("later", 1))
            with pytest.raises(NotLeader):  # committed after the step-down: refused too
                await answer(late)


async def test_trim_cuts_past_the_byte_bound_only_and_keeps_pinned_entries(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with leading(tmp_path, (ME,), replica_log_bytes=1) as L:
            info = await L.app.submit(st.CreateTopicOp("t", 1))

            async def produce(n: int) -> int:
                for i in range(n):
                    await L.app.submit(_op(info, b"%d" % i))
                return L.store.replication.position

            first = await produce(50)
            assert await L.ll.trim() == first  # past the bound: the step scanned is cut, whole
            second = await produce(50)
            L.ll.pin(F2, first + 10)  # a follower copying the store from there
            L.ll.pin(F2, second)  # (a later chunk never moves the pin forward)
            assert await L.ll.trim() == first  # past the bound, but the pin holds it
            await L.ll.fetch(_fetch(F2, second))  # F2 fetching: its pin is gone
            assert await L.ll.trim() == second
            third = await produce(50)
            await L.ll.fetch(_fetch(F2, third))
            assert await L.ll.trim() == L.store.replication.log_start == third


async def test_trim_keeps_a_log_under_its_bound_whatever_the_followers(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with leading(tmp_path, (ME,)) as L:
            info = await L.app.submit(st.CreateTopicOp("t", 1))
            for i in range(300):
                await L.app.submit(_op(info, b"%d" % i))
                if i % 100 == 0:
                    await L.ll.trim()
            assert await L.ll.trim() == 0  # no follower, yet every entry is kept (1 GiB bound)


async def test_a_new_leader_holds_reads_until_the_high_watermark_reaches_its_takeover_end(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1)) as L:
            info = L.app.enqueue(st.CreateTopicOp("t", 1))
            await wait_until(lambda: L.store.replication.position == L.ll.high_watermark + 2)
            old_hw = L.ll.high_watermark  # F1 never acknowledged the create
            L.ll.close(NotLeader("a new epoch"))
            with pytest.raises(NotLeader):
                await answer(info)
            # this replica leads again at epoch 2: its store shows the create, which F1 may lack
            await L.app.call(L.store.replication.reload)
            promoted_at = L.store.replication.position
            await L.app.call(lambda: L.store.replication.begin_epoch(2))
            L.election.state = State(2, (ME, F1))
            ll = LeaderLog(
                replication=L.store.replication, election=L.election, answers=L.app, call=L.app.call, wake=lambda q: None,
                on_scheduled=lambda: None, config=BrokerConfig(data_dir=tmp_path), broker_id=ME, group="g", epoch=2,
                high_watermark=old_hw, promoted_at=promoted_at,
            )  # fmt: skip
            ll.committed()
            assert not ll.readable.is_set()
            await ll.fetch(_fetch(F1, promoted_at - 1, epoch=2))
            assert not ll.readable.is_set() and ll.high_watermark == promoted_at - 1
            await ll.fetch(_fetch(F1, promoted_at, epoch=2))
            assert ll.readable.is_set() and ll.high_watermark == promoted_at
            ll.close(NotLeader("test over"))


async def test_a_joining_member_whose_isr_write_is_unanswered_keeps_counting(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME,)) as L:
            info = await L.app.submit(st.CreateTopicOp("t", 1))
            L.election.unanswered = 1
            L.election.state = State(1, (ME,))
            async with trio.open_nursery() as n:
                n.start_soon(L.ll.run)
                await L.ll.fetch(_fetch(F1, L.store.replication.position))
                await wait_until(lambda: L.election.writes == [(ME, F1)])
                # etcd may have F1 in the ISR (here it has): the leader waits for F1
                L.election.state = State(1, (ME,))  # (as if the answer never came back)
                p = L.app.enqueue(_op(info, b"x"))
                await L.app.call(lambda: None)  # answered after p's commit was handed over
                assert not p.done.is_set() and L.ll.high_watermark < L.store.replication.position
                await L.ll.fetch(_fetch(F1, L.store.replication.position))
                assert (await answer(p)).stored == 1
                n.cancel_scope.cancel()


async def test_a_long_log_found_at_the_first_check_is_cut_in_steps_not_whole(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with leading(tmp_path, (ME,)) as L:
            info = await L.app.submit(st.CreateTopicOp("t", 1))
            for i in range(320):
                await L.app.submit(_op(info, b"%0100d" % i))
            end = L.store.replication.position
            total = L.store.replication.log_bytes(L.store.replication.log_start)
            trimmer = LogTrimmer(L.store.replication, L.app.call, total // 2)  # e.g. a follower just promoted
            start = await trimmer.trim(floor=end)
            kept = L.store.replication.log_bytes(start)
            assert 0 < start < end and total // 2 - total // 8 <= kept <= total // 2, (start, end, kept, total)


async def test_lookups_see_only_what_is_below_the_high_watermark(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1)) as L:
            create = L.app.enqueue(st.CreateTopicOp("t", 1))
            await wait_until(lambda: L.store.replication.position == L.ll.high_watermark + 2)
            await L.ll.fetch(_fetch(F1, L.store.replication.position))
            info = await answer(create)
            keyed = wire.encode_entry(Message(b"k", key="k"))
            p = L.app.enqueue(st.ProduceOp(info, 0, [keyed], None, -1, 4 << 20, 86_400_000))
            await L.app.call(lambda: None)  # committed and held: F1 lacks it
            assert L.store.head.next_global == 1  # written
            assert L.store.get_global(0) is None and L.store.get_queue_offset(info, 0, 0) is None
            assert L.store.find_by_key(info, "k", 10).hits == []
            await L.ll.fetch(_fetch(F1, L.store.replication.position))
            await answer(p)
            assert L.store.get_global(0) is not None and L.store.get_queue_offset(info, 0, 0) is not None
            assert len(L.store.find_by_key(info, "k", 10).hits) == 1


async def test_a_follower_whose_position_goes_backwards_leaves_the_isr(tmp_path: Path) -> None:
    """F1 acknowledged position p, then fetches below it (it lost entries: an OS crash
    with --flush async, a restored disk): it leaves the ISR although it keeps
    fetching (--replica-lag-max is 60 s here), the leader waits for it until etcd
    confirmed, and it rejoins once caught up again."""
    with trio.fail_after(20):
        async with leading(tmp_path, (ME, F1)) as L:
            create = L.app.enqueue(st.CreateTopicOp("t", 1))
            await L.app.call(lambda: None)
            await L.ll.fetch(_fetch(F1, L.store.replication.position))
            info = await answer(create)
            for i in range(3):
                p = L.app.enqueue(_op(info, b"m%d" % i))
                await L.app.call(lambda: None)
                await L.ll.fetch(_fetch(F1, L.store.replication.position))
                await answer(p)
            acked = L.store.replication.position
            async with trio.open_nursery() as n:
                n.start_soon(L.ll.run)
                await L.ll.fetch(_fetch(F1, acked - 2))  # below what it acknowledged
                await wait_until(lambda: L.election.state.isr == (ME,), what="F1 left the ISR")
                p = L.app.enqueue(_op(info, b"after"))
                assert (await answer(p)).stored == 1  # acked by the leader alone now
                await L.ll.fetch(_fetch(F1, L.store.replication.position))  # caught up again: rejoins
                await wait_until(lambda: L.election.state.isr == (ME, F1), what="F1 rejoined")
                n.cancel_scope.cancel()


async def test_a_follower_joins_only_with_a_consistent_store(tmp_path: Path) -> None:
    """A follower at the leader's end whose store is not consistent yet (a repair or
    a fuzzy copy not complete, also after a restart mid-repair) is not caught up:
    it joins the ISR only once it says its store is consistent; a snapshot request
    makes it not caught up again."""
    with trio.fail_after(20):
        async with leading(tmp_path, (ME,)) as L:
            await L.ll.fetch(_fetch(F1, L.store.replication.position, consistent=False))
            await L.ll.fetch(_fetch(F1, L.store.replication.position, consistent=False))
            await L.ll._update_isr()  # one ISR check (what run() does every 0.25 s)
            assert L.election.writes == []
            await L.ll.fetch(_fetch(F1, L.store.replication.position, consistent=True))
            L.ll.pin(F1, L.store.replication.position)  # then it starts copying the store
            await L.ll._update_isr()
            assert L.election.writes == []
            await L.ll.fetch(_fetch(F1, L.store.replication.position, consistent=True))
            await L.ll.fetch(_fetch(F1, L.store.replication.position, consistent=True))
            await L.ll._update_isr()
            assert L.election.state.isr == (ME, F1)
