"""The trio server over real TCP: produce/pull, long-poll, concurrency, multiplexing."""

from __future__ import annotations

import random
import socket

import trio

from equeue import Message, PullStatus, control, wire
from equeue.broker import Broker
from equeue.client import AsyncClient
from equeue.models import PullResult
from tests.conftest import wait_until


def batch(prefix: str, n: int) -> list[bytes]:
    return [wire.encode_entry(Message(f"{prefix}-{i}".encode())) for i in range(n)]


async def test_produce_and_pull_across_batches(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("orders", 2)
            a1 = await c.produce(wire.ProduceRequest("orders", 0, batch("a", 3)))
            a2 = await c.produce(wire.ProduceRequest("orders", 1, batch("b", 2)))
            a3 = await c.produce(wire.ProduceRequest("orders", 0, batch("c", 2)))
            assert [(a.first_global, a.first_queue, a.stored) for a in (a1, a2, a3)] == [
                (0, 0, 3), (3, 0, 2), (5, 3, 2),
            ]  # fmt: skip
            r = await c.pull(wire.PullRequest("orders", 0, 0, 100))
            assert [m.text for m in r.messages] == ["a-0", "a-1", "a-2", "c-0", "c-1"]
            assert [m.global_offset for m in r.messages] == [0, 1, 2, 5, 6]
            assert (r.min_offset, r.max_offset, r.next_offset) == (0, 5, 5)
            r = await c.pull(wire.PullRequest("orders", 0, 3, 1))
            assert [m.text for m in r.messages] == ["c-0"] and r.next_offset == 4
            r = await c.pull(wire.PullRequest("orders", 0, 9, 10))
            assert r.status is PullStatus.OFFSET_OVERFLOW and r.max_offset == 5
            d = await c.describe_topic("orders")
            assert [(q.min_offset, q.max_offset, q.count) for q in d.queues] == [(0, 5, 5), (0, 2, 2)]
            # auto-create on produce (default on, 4 queues)
            a = await c.produce(wire.ProduceRequest("fresh", 3, batch("x", 1)))
            assert a.first_queue == 0
            assert (await c.get_route("fresh")).queues == 4
            st = await c.stats()
            assert st.messages_in == 8 and st.connections >= 1


async def test_parked_pull_woken_long_before_its_hold(broker: Broker) -> None:
    with trio.fail_after(8):  # far below the 10 s hold
        async with AsyncClient(broker.address) as c, AsyncClient(broker.address) as p:
            await c.create_topic("t", 2)
            got: list[PullResult] = []

            async def puller() -> None:
                got.append(await c.pull(wire.PullRequest("t", 1, 0, 32, max_wait_ms=10_000)))

            async with trio.open_nursery() as n:
                n.start_soon(puller)
                await wait_until(lambda: broker.parked.parked == 1, what="the pull is parked")
                # a commit to ANOTHER queue does not answer it: its wake-ups are done
                # when its ack arrives; a pull it woke by mistake answers or parks again
                await p.produce(wire.ProduceRequest("t", 0, batch("other", 1)))
                await wait_until(lambda: got or broker.parked.parked == 1, what="the pull is parked")
                assert not got
                t0 = trio.current_time()
                await p.produce(wire.ProduceRequest("t", 1, batch("mine", 2)))
            assert trio.current_time() - t0 < 2.0
            assert got[0].status is PullStatus.FOUND
            assert [m.text for m in got[0].messages] == ["mine-0", "mine-1"]


async def test_parked_pull_returns_empty_after_its_hold(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            t0 = trio.current_time()
            r = await c.pull(wire.PullRequest("t", 0, 0, 32, max_wait_ms=600))
            waited = trio.current_time() - t0
            assert r.status is PullStatus.NO_NEW_MESSAGE and r.messages == []
            assert 0.55 <= waited < 5
            assert broker.parked.parked == 0


async def test_eight_concurrent_producers_get_dense_offsets(broker: Broker) -> None:
    queues, producers, batches = 4, 8, 40
    acked: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(queues)}
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as admin:
            await admin.create_topic("dense", queues)

            async def producer(pid: int) -> None:
                rnd = random.Random(pid)
                async with AsyncClient(broker.address) as c:
                    async with trio.open_nursery() as n:
                        for b in range(batches):
                            q = rnd.randrange(queues)
                            bodies = [f"p{pid}-b{b}-{i}".encode() for i in range(rnd.randint(1, 20))]
                            n.start_soon(send, c, q, bodies)

            async def send(c: AsyncClient, q: int, bodies: list[bytes]) -> None:
                es = [wire.encode_entry(Message(x)) for x in bodies]
                a = await c.produce(wire.ProduceRequest("dense", q, es))
                assert a.stored == len(bodies)
                acked[q].extend((a.first_queue + i, x) for i, x in enumerate(bodies))

            async with trio.open_nursery() as n:
                for pid in range(producers):
                    n.start_soon(producer, pid)

            globals_seen: list[int] = []
            for q in range(queues):
                offs = sorted(o for o, _ in acked[q])
                assert offs == list(range(len(offs))), f"queue {q}: gaps or duplicates"
                r = await admin.pull(wire.PullRequest("dense", q, 0, 10_000, 16 << 20))
                assert [m.queue_offset for m in r.messages] == offs
                assert {m.queue_offset: m.body for m in r.messages} == dict(acked[q])
                globals_seen += [m.global_offset for m in r.messages]
            assert sorted(globals_seen) == list(range(len(globals_seen)))
            assert broker.appender.transactions < sum(len(v) for v in acked.values())


async def test_one_connection_carries_a_parked_pull_and_other_requests(broker: Broker) -> None:
    with trio.fail_after(8):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 2)
            got: list[PullResult] = []

            async def puller() -> None:
                got.append(await c.pull(wire.PullRequest("t", 0, 0, 32, max_wait_ms=10_000)))

            async with trio.open_nursery() as n:
                n.start_soon(puller)
                await wait_until(lambda: broker.parked.parked == 1, what="the pull is parked")
                # the same connection keeps working while the pull is parked
                with trio.fail_after(2):
                    await c.create_topic("other", 1)
                    a = await c.produce(wire.ProduceRequest("t", 1, batch("q1", 3)))
                    assert a.stored == 3
                    r = await c.pull(wire.PullRequest("t", 1, 0, 32))
                    assert len(r.messages) == 3
                    hb = await c.heartbeat(control.Heartbeat("g", "c1", ["t"]))
                    assert hb is not None
                    await c.commit_offset("g", "t", 1, 3)
                    assert await c.query_offset("g", "t", 1) == 3
                    assert (await c.stats()).parked_pulls == 1
                assert not got
                await c.produce(wire.ProduceRequest("t", 0, batch("q0", 1)))
            assert [m.text for m in got[0].messages] == ["q0-0"]


async def test_many_parked_pulls_all_woken(broker: Broker) -> None:
    with trio.fail_after(8):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            got: list[PullResult] = []

            async def puller() -> None:
                got.append(await c.pull(wire.PullRequest("t", 0, 0, 32, max_wait_ms=10_000)))

            async with trio.open_nursery() as n:
                for _ in range(20):
                    n.start_soon(puller)
                await wait_until(lambda: broker.parked.parked == 20, what="20 pulls are parked")
                await c.produce(wire.ProduceRequest("t", 0, batch("m", 1)))
            assert len(got) == 20 and all(len(r.messages) == 1 for r in got)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_http_is_off_by_default(broker: Broker) -> None:
    assert broker.config.http_port is None and broker.http_port == 0


async def test_closed_connection_is_detached_from_its_group_members(broker: Broker) -> None:
    """``forget_connection`` used to compare bound methods by identity (always
    False), so a closed connection stayed referenced by its members until they expired."""
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.heartbeat(control.Heartbeat("g", "m1", ["t"]))
            member = broker.groups.groups["g"].members["m1"]
            assert member.notify is not None
        while broker.stats.connections:  # the broker noticed the close
            await trio.sleep(0.01)
        assert member.notify is None
