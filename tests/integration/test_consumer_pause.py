"""Pausing and resuming a consumer's own fetching per queue (docs/consumer.md, "Pausing
and resuming fetching"), against a real broker: a paused queue delivers nothing new
while the others go on, what it buffered is still handled and committed, its lease is
kept, resume picks up where it stood, a pause goes with a revoked queue, and only
assigned queues can be paused. Not the operator's ``equeue group pause`` (test_pause.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import EmbeddedBroker, open_broker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.errors import ConfigError
from tests.conftest import make_config, wait_until, wait_until_sync

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0,
)  # fmt: skip
#: the broker's member expiry in these tests: a member silent this long loses its leases
EXPIRY = 1.0


async def produce(c: AsyncClient, topic: str, queue: int, bodies: list[str]) -> None:
    await c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message(b)) for b in bodies]))


async def test_a_paused_queue_fetches_nothing_new_keeps_its_lease_and_resumes_where_it_stood(
    tmp_path: Path,
) -> None:
    async with open_broker(make_config(tmp_path / "data", member_expiry=EXPIRY)) as b:
        with trio.fail_after(40):
            async with AsyncClient(b.address) as c:
                await c.create_topic("bp", 2)
                await produce(c, "bp", 0, [f"early{i}" for i in range(20)])
                seen: list[tuple[int, str]] = []
                gate = trio.Event()  # holds the handlers of queue 0's first messages

                async def handler(m: Message) -> None:
                    if m.queue_id == 0 and m.text.startswith("early"):
                        await gate.wait()
                    seen.append((m.queue_id, m.text))

                def texts(queue: int) -> list[str]:
                    return [t for q, t in seen if q == queue]

                async with AsyncConsumer(b.address, "gp", "bp", start_from="earliest", **FAST) as con:
                    await wait_until(lambda: con.assignment() == {("bp", 0), ("bp", 1)}, what="both queues")
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(con.run, handler)
                        # the 20 early messages are pulled (buffered or in handlers' hands)
                        await wait_until(lambda: con.statistics().buffered == 20, what="early messages pulled")
                        assert con.paused() == set()
                        con.pause([("bp", 0)])
                        con.pause([("bp", 0)])  # idempotent
                        assert con.paused() == {("bp", 0)}
                        # what was buffered before the pause is still handled, and committed
                        gate.set()
                        await wait_until(lambda: len(texts(0)) == 20, what="buffered messages handled")
                        assert sorted(texts(0)) == sorted(f"early{i}" for i in range(20))

                        async def committed_q0() -> bool:
                            return await c.query_offset("gp", "bp", 0) == 20

                        await wait_until(committed_q0, what="queue 0's handled messages committed while paused")
                        # nothing new from the paused queue; the other queue goes on
                        await produce(c, "bp", 0, ["late0-a", "late0-b"])
                        await produce(c, "bp", 1, ["late1"])
                        await wait_until(lambda: "late1" in texts(1), what="the other queue's message")
                        # the lease is kept past several member expiries: the broker still
                        # names this member the owner of the paused queue, which stays paused
                        t0 = trio.current_time()
                        d = await c.describe_group("gp")
                        while trio.current_time() < t0 + 3 * EXPIRY:
                            d = await c.describe_group("gp")
                            owners = {q.queue_id: q.owner for q in d.queues}
                            assert owners == {0: con.consumer_id, 1: con.consumer_id}, owners
                            assert [m.consumer_id for m in d.members] == [con.consumer_id]
                            await trio.sleep(0.1)  # paces the polling of the broker's view
                        assert con.paused() == {("bp", 0)}
                        await produce(c, "bp", 1, ["later1"])
                        await wait_until(lambda: "later1" in texts(1), what="the other queue's later message")
                        assert texts(0) == [t for t in texts(0) if t.startswith("early")], texts(0)
                        # nothing was pulled for queue 0 either (answers while paused are dropped)
                        assert len(con.assignments.queues[("bp", 0)].window) == 0
                        # resume: the paused queue goes on from where it stood, nothing lost or doubled
                        con.resume([("bp", 0)])
                        con.resume([("bp", 0)])  # idempotent
                        assert con.paused() == set()
                        await wait_until(lambda: "late0-b" in texts(0), what="the paused queue's messages")
                        assert texts(0)[20:] == ["late0-a", "late0-b"]

                        async def committed_late() -> bool:
                            return await c.query_offset("gp", "bp", 0) == 22

                        await wait_until(committed_late, what="queue 0 committed after resume")
                        con.stop()


async def test_only_assigned_queues_can_be_paused_and_a_revoked_queue_loses_its_pause(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(40):
            async with AsyncClient(b.address) as c:
                await c.create_topic("rv", 2)
                await c.create_topic("other", 1)
                async with AsyncConsumer(b.address, "gr", "rv", **FAST) as one:
                    both = {("rv", 0), ("rv", 1)}
                    await wait_until(lambda: one.assignment() == both, what="both queues")
                    # not assigned here: a clear error, and nothing is paused (all or none)
                    for bad in ([("rv", 2)], [("other", 0)], [("rv", 0), ("rv", 7)]):
                        with pytest.raises(ConfigError, match="not assigned to this consumer"):
                            one.pause(bad)
                    with pytest.raises(ConfigError, match="not assigned"):
                        one.resume([("rv", 9)])
                    assert one.paused() == set()
                    # not a collection of (topic, queue_id) tuples
                    for wrong in (("rv", 0), [("rv", "0")], ["rv/0"], [("rv", True)], "rv"):
                        with pytest.raises(TypeError):
                            one.pause(wrong)  # type: ignore[arg-type]
                    one.pause(both)
                    assert one.paused() == both
                    # a second member takes one queue over: the pause goes with it
                    async with AsyncConsumer(b.address, "gr", "rv", **FAST) as two:
                        await wait_until(lambda: len(one.assignment()) == 1 and len(two.assignment()) == 1,
                                         what="the queues split between the members")  # fmt: skip
                        kept = one.assignment()
                        assert one.paused() == kept
                        (moved,) = both - kept
                        assert two.paused() == set()  # the new owner fetches it
                        with pytest.raises(ConfigError, match="not assigned"):
                            one.pause([moved])
                        got: list[str] = []

                        async def handler(m: Message) -> None:
                            got.append(m.text)
                            two.stop()

                        await produce(c, "rv", moved[1], ["to-two"])
                        with trio.fail_after(10):
                            await two.run(handler)
                        assert got == ["to-two"]
                    # the queue comes back to the first member unpaused
                    await wait_until(lambda: one.assignment() == both, what="the queue back")
                    assert one.paused() == kept


def test_sync_front_pauses_and_resumes(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("sp", 2)
    both = {("sp", 0), ("sp", 1)}
    with pytest.raises(TypeError):  # checked before anything is sent
        Consumer(addr, "gs", "sp", **FAST).pause(("sp", 0))  # type: ignore[arg-type]
    with Consumer(addr, "gs", "sp", **FAST) as con:
        con.start()
        wait_until_sync(lambda: con.assignment() == both, what="both queues")
        with pytest.raises(ConfigError, match="not assigned"):
            con.pause([("sp", 5)])
        con.pause([("sp", 0)])
        assert con.paused() == {("sp", 0)}
        with Client(addr) as c:
            c.produce(wire.ProduceRequest("sp", 0, [wire.encode_entry(Message("x"))]))
            c.produce(wire.ProduceRequest("sp", 1, [wire.encode_entry(Message("y"))]))
        got: list[str] = []
        for msg in con:
            got.append(msg.text)
            if msg.text == "y":  # the other queue's, produced after the paused one's
                con.resume([("sp", 0)])
                assert con.paused() == set()
            if msg.text == "x":
                con.stop()  # the next request ends the loop; x is done
        assert got == ["y", "x"]
    # from a sync handler (a worker thread or the loop thread): pause its own queue
    with Consumer(addr, "gs", "sp", **FAST) as con:
        con.start()
        wait_until_sync(lambda: con.assignment() == both, what="both queues")
        threads: list[threading.Thread] = []

        def handler(m: Message) -> None:
            threads.append(threading.current_thread())
            con.pause([("sp", m.queue_id)])
            con.stop()

        with Client(addr) as c:
            c.produce(wire.ProduceRequest("sp", 1, [wire.encode_entry(Message("z"))]))
        con.run(handler)
        assert len(threads) == 1
        assert con.paused() == {("sp", 1)}
