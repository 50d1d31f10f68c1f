"""Rebalance listeners (docs/consumer.md, "Rebalance listeners"), against a real broker
with two members of one group: ``on_assigned`` runs before the first message of its
queues, ``on_revoked`` runs while the lease is still held (the next member gets the
queue only after it returned, and starts after what it committed), on close for every
queue before the leave, and a raising listener breaks nothing. Both fronts."""

from __future__ import annotations

import itertools
import logging
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

#: fast rounds; no periodic commit (a commit the test sees is one a listener or a revoke made)
FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=3600.0, pull_hold=1.0,
    start_from="earliest",
)  # fmt: skip

Lease = tuple[str, int]


async def produce(c: AsyncClient, topic: str, queue: int, bodies: list[str]) -> None:
    await c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message(b)) for b in bodies]))


async def test_on_assigned_runs_before_the_first_message_of_its_queues(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(40):
            async with AsyncClient(b.address) as c:
                await c.create_topic("la", 2)
                for q in (0, 1):
                    await produce(c, "la", q, [f"m{q}-{i}" for i in range(5)])
                events: list[tuple[str, Any]] = []
                entered = trio.Event()
                go_on = trio.Event()

                async def on_assigned(queues: set[Lease]) -> None:
                    events.append(("assigned", frozenset(queues)))
                    entered.set()
                    await go_on.wait()  # the queues' messages wait for it
                    events.append(("assigned-returned", frozenset(queues)))

                async def handler(m: Message) -> None:
                    events.append(("message", (m.topic, m.queue_id)))

                async with AsyncConsumer(b.address, "ga", "la", on_assigned=on_assigned, **FAST) as con:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(con.run, handler)
                        await entered.wait()
                        # the lease is held (the broker names this member the owner) ...
                        d = await c.describe_group("ga")
                        assert {q.queue_id: q.owner for q in d.queues} == {0: con.consumer_id, 1: con.consumer_id}
                        # ... and nothing of the queues is pulled or handed out: not even while a
                        # member of another group joins and reads them all (pulls had time)
                        witnessed: list[str] = []

                        async def witness_handler(m: Message) -> None:
                            witnessed.append(m.text)
                            if len(witnessed) == 10:
                                witness.stop()

                        async with AsyncConsumer(b.address, "ga-witness", "la", **FAST) as witness:
                            await witness.run(witness_handler)
                        assert con.statistics().buffered == 0
                        assert [e for e in events if e[0] == "message"] == []
                        go_on.set()
                        await wait_until(lambda: sum(e[0] == "message" for e in events) == 10, what="all messages")
                        con.stop()
                assert events[:2] == [("assigned", frozenset({("la", 0), ("la", 1)})),
                                      ("assigned-returned", frozenset({("la", 0), ("la", 1)}))]  # fmt: skip


async def test_on_revoked_runs_while_the_lease_is_held_and_what_it_commits_counts(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(60):
            async with AsyncClient(b.address) as c:
                await c.create_topic("lr", 2)
                for q in (0, 1):
                    await produce(c, "lr", q, [f"early{q}-{i}" for i in range(5)])
                order: list[tuple[str, str, frozenset[Lease]]] = []
                got: dict[str, list[tuple[int, str]]] = {"one": [], "two": []}
                revoking = trio.Event()
                release = trio.Event()
                committed_in_listener: list[int] = []

                def handler_of(name: str) -> Any:
                    async def handler(m: Message) -> None:
                        got[name].append((m.queue_id, m.text))

                    return handler

                def assigned_of(name: str) -> Any:
                    def on_assigned(queues: set[Lease]) -> None:  # a sync listener: called on the loop
                        order.append((name, "assigned", frozenset(queues)))

                    return on_assigned

                async def one_revoked(queues: set[Lease]) -> None:
                    order.append(("one", "revoked", frozenset(queues)))
                    if not revoking.is_set():  # the hand-over (not the close)
                        (moved,) = queues
                        await one.commit()  # the lease is still held: the commit is accepted
                        committed_in_listener.append(await c.query_offset("gr", *moved))
                        revoking.set()
                        await release.wait()
                    order.append(("one", "revoked-returned", frozenset(queues)))

                async with AsyncConsumer(b.address, "gr", "lr", on_assigned=assigned_of("one"),
                                         on_revoked=one_revoked, **FAST) as one:  # fmt: skip
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(one.run, handler_of("one"))
                        await wait_until(lambda: len(got["one"]) == 10, what="the first member's messages")
                        assert await c.query_offset("gr", "lr", 0) == -1  # nothing committed yet
                        async with AsyncConsumer(b.address, "gr", "lr", on_assigned=assigned_of("two"),
                                                 **FAST) as two:  # fmt: skip
                            nursery.start_soon(two.run, handler_of("two"))
                            await revoking.wait()
                            (moved,) = [lease for who, what, qs in order if who == "one" and what == "revoked"
                                        for lease in qs]  # fmt: skip
                            assert committed_in_listener == [5]
                            # while on_revoked runs, the queue stays this member's: the other
                            # member's rounds ask for its lease in vain
                            await produce(c, "lr", moved[1], ["late-a", "late-b"])
                            rounds = two.coordinator.rebalances
                            await wait_until(lambda: two.coordinator.rebalances >= rounds + 5,
                                             what="five rounds of the second member")  # fmt: skip
                            d = await c.describe_group("gr")
                            assert {q.queue_id: q.owner for q in d.queues}[moved[1]] == one.consumer_id
                            assert not any(moved in qs for who, _, qs in order if who == "two")
                            assert got["two"] == []
                            release.set()
                            await wait_until(lambda: len(got["two"]) == 2, what="the moved queue's new messages")
                            # the new owner started at the offset committed in on_revoked
                            assert sorted(got["two"]) == [(moved[1], "late-a"), (moved[1], "late-b")]
                            i_returned = order.index(("one", "revoked-returned", frozenset({moved})))
                            i_assigned = next(i for i, (who, what, qs) in enumerate(order)
                                              if who == "two" and moved in qs)  # fmt: skip
                            assert i_returned < i_assigned, order
                            two.stop()
                        one.stop()


async def test_close_revokes_every_queue_before_leaving_and_a_raising_listener_breaks_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(60):
            async with AsyncClient(b.address) as c:
                await c.create_topic("lc", 2)
                for q in (0, 1):
                    await produce(c, "lc", q, [f"m{q}-{i}" for i in range(3)])
                seen: list[str] = []
                revoked: list[set[Lease]] = []
                at_revoke: list[Any] = []

                async def on_assigned(queues: set[Lease]) -> None:
                    raise RuntimeError("listener failed on purpose")

                async def on_revoked(queues: set[Lease]) -> None:
                    revoked.append(queues)
                    d = await c.describe_group("gl")  # still a member, still the owner
                    at_revoke.append(({m.consumer_id for m in d.members}, {q.owner for q in d.queues}))
                    await con.commit()
                    raise ValueError("on_revoked failed on purpose")

                async def handler(m: Message) -> None:
                    seen.append(m.text)

                with caplog.at_level(logging.ERROR, logger="equeue.consumer"):
                    async with AsyncConsumer(b.address, "gl", "lc", on_assigned=on_assigned,
                                             on_revoked=on_revoked, **FAST) as con:  # fmt: skip
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(con.run, handler)
                            # the raising on_assigned did not stop the queues from being consumed
                            await wait_until(lambda: len(seen) == 6, what="every message")
                            con.stop()
                        assert revoked == []
                    # closed: on_revoked once, with every queue, before the leave
                    assert revoked == [{("lc", 0), ("lc", 1)}]
                    assert at_revoke == [({con.consumer_id}, {con.consumer_id})]
                    assert await c.query_offset("gl", "lc", 0) == 3
                    assert await c.query_offset("gl", "lc", 1) == 3
                    d = await c.describe_group("gl")
                    assert d.members == []  # the raising on_revoked did not stop the leave
                    assert {q.owner for q in d.queues} <= {None, ""}
                messages = [r.getMessage() for r in caplog.records]
                assert any("on_assigned" in m and "listener failed on purpose" in m for m in messages), messages
                assert any("on_revoked" in m and "on_revoked failed on purpose" in m for m in messages), messages


async def test_a_lost_lease_is_announced_by_on_lost_not_on_revoked(tmp_path: Path) -> None:
    """Client-side lease expiry shorter than the heartbeat interval: after each round
    the member drops its queue as expired (on_lost), and the next round takes it again
    (on_assigned)."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(40):
            async with AsyncClient(b.address) as c:
                await c.create_topic("lo", 1)
                events: list[tuple[str, frozenset[Lease]]] = []

                def listener(kind: str) -> Any:
                    def call(queues: set[Lease]) -> None:
                        events.append((kind, frozenset(queues)))

                    return call

                async with AsyncConsumer(
                    b.address, "glo", "lo", on_assigned=listener("assigned"), on_revoked=listener("revoked"),
                    on_lost=listener("lost"), heartbeat_interval=1.0, rebalance_interval=1.0, lease_expiry=0.3,
                ) as con:  # fmt: skip
                    await wait_until(lambda: sum(kind == "lost" for kind, _ in events) >= 2, what="two lost leases")
                    con.stop()
                q = frozenset({("lo", 0)})
                kinds = [kind for kind, _ in events]
                assert all(qs == q for _, qs in events), events
                # assigned, lost, assigned, lost ..., and on close revoked if it was held then
                assert kinds[:4] == ["assigned", "lost", "assigned", "lost"], kinds
                assert "revoked" not in kinds[:-1], kinds
                for before, after in itertools.pairwise(kinds):
                    assert (before == "assigned") == (after != "assigned"), kinds


def test_listeners_are_validated() -> None:
    with pytest.raises(ConfigError, match="on_revoked must be callable"):
        AsyncConsumer("127.0.0.1:1", "g", "t", on_revoked=42)

    async def coro(queues: set[Lease]) -> None:
        pass

    with pytest.raises(TypeError, match="plain functions"):
        Consumer("127.0.0.1:1", "g", "t", on_assigned=coro)


def test_sync_listeners_run_in_a_worker_thread_may_commit_and_order_the_hand_over(
    embedded_broker: EmbeddedBroker,
) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("ls", 2)
        for q in (0, 1):
            c.produce(wire.ProduceRequest("ls", q, [wire.encode_entry(Message(f"e{q}-{i}")) for i in range(4)]))
    lock = threading.Lock()
    order: list[tuple[str, str, frozenset[Lease]]] = []
    threads: list[str] = []
    committed: list[tuple[Lease, int]] = []
    got: dict[str, list[tuple[int, str]]] = {"one": [], "two": []}
    release = threading.Event()

    def note(who: str, what: str, queues: set[Lease]) -> None:
        with lock:
            order.append((who, what, frozenset(queues)))
            threads.append(threading.current_thread().name)

    def handler_of(name: str) -> Any:
        def handler(m: Message) -> None:
            with lock:
                got[name].append((m.queue_id, m.text))

        return handler

    def one_revoked(queues: set[Lease]) -> None:
        note("one", "revoked", queues)
        one.commit()  # blocks on the loop from this worker thread; the lease is held
        with Client(addr) as admin:
            for lease in sorted(queues):
                committed.append((lease, admin.query_offset("gs", *lease)))
        if len(queues) == 1:  # the hand-over (on close: both queues, no wait)
            release.wait(30)
        note("one", "revoked-returned", queues)

    def two_assigned(queues: set[Lease]) -> None:
        note("two", "assigned", queues)
        raise RuntimeError("a raising listener is logged, the consumer goes on")

    one = Consumer(addr, "gs", "ls", on_assigned=lambda qs: note("one", "assigned", qs),
                   on_revoked=one_revoked, **FAST)  # fmt: skip
    two = Consumer(addr, "gs", "ls", on_assigned=two_assigned, **FAST)
    runners = [threading.Thread(target=one.run, args=(handler_of("one"),), daemon=True)]
    try:
        one.start()
        runners[0].start()
        wait_until_sync(lambda: len(got["one"]) == 8, what="the first member's messages")
        assert order[0] == ("one", "assigned", frozenset({("ls", 0), ("ls", 1)}))
        two.start()
        runners.append(threading.Thread(target=two.run, args=(handler_of("two"),), daemon=True))
        runners[-1].start()
        wait_until_sync(lambda: committed, what="on_revoked's commit")
        (moved,) = next(qs for who, what, qs in order if what == "revoked")
        assert committed == [(moved, 4)]  # the commit made in on_revoked is at the broker
        with Client(addr) as admin:
            admin.produce(wire.ProduceRequest("ls", moved[1], [wire.encode_entry(Message("late"))]))
            # the lease stays the first member's while on_revoked blocks
            rounds = two.statistics().rebalances
            wait_until_sync(lambda: two.statistics().rebalances >= rounds + 5, what="the second member's rounds")
            owners = {q.queue_id: q.owner for q in admin.describe_group("gs").queues}
            assert owners[moved[1]] == one.consumer_id
        assert not any(who == "two" and moved in qs for who, _, qs in order)
        release.set()
        wait_until_sync(lambda: got["two"] == [(moved[1], "late")], what="the new owner's first message")
        i_returned = order.index(("one", "revoked-returned", frozenset({moved})))
        i_assigned = next(i for i, (who, _, qs) in enumerate(order) if who == "two" and moved in qs)
        assert i_returned < i_assigned, order
        # listeners run in worker threads of the loop, not in the caller's or a handler's
        assert threading.current_thread().name not in threads
        two.close()  # the queue comes back to the first member, then its close revokes both
        wait_until_sync(lambda: one.assignment() == {("ls", 0), ("ls", 1)}, what="both queues back")
        with lock:
            del committed[:]
        one.close()
        assert order[-2:] == [("one", "revoked", frozenset({("ls", 0), ("ls", 1)})),
                              ("one", "revoked-returned", frozenset({("ls", 0), ("ls", 1)}))]  # fmt: skip
        assert sorted(committed) == [(("ls", 0), 4 + (moved[1] == 0)), (("ls", 1), 4 + (moved[1] == 1))]
    finally:
        release.set()
        two.close()
        one.close()
        for t in runners:
            t.join(10)
