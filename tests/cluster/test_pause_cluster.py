"""Pause and resume in a cluster: a REAL etcd (the ``etcd`` fixture) and two broker
groups (one broker each, in this test's trio loop, over TCP). A pause is a ``paused/``
record in etcd that every broker group watches: a topic with queues on both groups is
refused at both, a consumer group is held at both, whichever broker was asked."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import trio

from equeue import Message, wire
from equeue.broker.cluster.etcd import EtcdClient
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.client.async_admin import AsyncAdminClient
from equeue.errors import TopicNotFound, TopicPaused
from equeue.placement import pause_key, topic_key
from equeue.producer import AsyncProducer
from equeue.protocol import PullStatus
from tests.cluster.conftest import open_groups
from tests.conftest import wait_until

GROUPS = ("g1", "g2")


async def refused(c: AsyncClient, topic: str, queue: int) -> bool:
    try:
        await c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message("x"))]))
    except TopicPaused:
        return True
    return False


async def test_a_pause_holds_at_every_broker_group(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            brokers = await open_groups(stack, tmp_path, etcd, GROUPS)
            boot = await stack.enter_async_context(AsyncClient(brokers["g1"].address))
            admin = await stack.enter_async_context(AsyncAdminClient(brokers["g1"].address))
            admin2 = await stack.enter_async_context(AsyncAdminClient(brokers["g2"].address))  # at the other group
            await boot.create_topic("t", 2)
            owners = (await boot.get_routes(["t"])).topics[0].owners
            assert sorted(owners) == ["g1", "g2"]
            at = {q: await stack.enter_async_context(AsyncClient(brokers[o].address)) for q, o in enumerate(owners)}
            for q, c in at.items():
                await c.produce(wire.ProduceRequest("t", q, [wire.encode_entry(Message(f"{q}"))]))

            # asked at g1, the pause is in etcd, and both groups refuse their queue's produce
            assert (await admin.pause_topic("t")).changed
            async with EtcdClient([etcd.endpoint]) as e:
                assert await e.get(pause_key("topic", "t")) is not None
                # a record that does not decode still pauses (the key is the pause), logged
                await e.put(pause_key("group", "odd"), b"not json")
            for b in brokers.values():
                await wait_until(lambda b=b: b.handlers.pauses.group_paused("odd"), what="the odd pause honoured")
            for q, c in at.items():
                await wait_until(lambda c=c, q=q: refused(c, "t", q), what=f"queue {q}'s owner refuses")
            assert (await admin.describe_topic("t")).info.paused
            # a producer waits; resumed (asked at g2), its sends to both groups go through
            async with AsyncProducer(brokers["g2"].address, send_timeout=30, retry_backoff=0.05, linger=0) as p:
                handles = [await p.send_async("t", f"m{i}") for i in range(4)]  # round-robin: both queues
                assert (await admin2.resume_topic("t")).changed
                results = [await h for h in handles]
            assert {r.queue_id for r in results} == {0, 1}

            # a paused consumer group: pulls at both groups find nothing, and a held one wakes on resume
            assert (await admin.pause_group("cg")).changed
            for q, c in at.items():

                async def empty(c: AsyncClient = c, q: int = q) -> bool:
                    r = await c.pull(wire.PullRequest("t", q, 0, group="cg"))
                    return r.status is PullStatus.NO_NEW_MESSAGE and r.next_offset == 0

                await wait_until(empty, what=f"queue {q}'s owner holds the group")
            assert next(g for g in await admin.list_groups() if g.group == "cg").paused
            assert (await admin.describe_group("cg")).paused
            got: dict[int, int] = {}
            async with trio.open_nursery() as nursery:
                for q, c in at.items():

                    async def held(c: AsyncClient = c, q: int = q) -> None:
                        r = await c.pull(wire.PullRequest("t", q, 0, max_wait_ms=60_000, group="cg"))
                        got[q] = len(r.messages)

                    nursery.start_soon(held)
                # both pulls held at their broker (not still on their way) before the resume
                await wait_until(
                    lambda: all(b.handlers.pauses.held == 1 for b in brokers.values()), what="both pulls held"
                )
                assert (await admin2.resume_group("cg")).changed
                # woken by the resume: well within their 60 s hold
                await wait_until(lambda: len(got) == 2, timeout=10, what="the held pulls woken by the resume")
            assert got == {0: 3, 1: 3}
            assert "cg" not in {g.group for g in await admin.list_groups()}  # nothing else of it: gone



async def test_a_topic_pause_never_outlives_its_topic(tmp_path: Path, etcd: EtcdProcess) -> None:
    """The pause record goes with the placement: a stale one is cleared by the create
    (one transaction), a delete removes it with the placement, and a pause is written
    only while etcd has the placement."""
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            broker = (await open_groups(stack, tmp_path, etcd, ("g1",)))["g1"]
            c = await stack.enter_async_context(AsyncClient(broker.address))
            e = await stack.enter_async_context(EtcdClient([etcd.endpoint]))
            # a pause left by a delete that did not finish: the topic created again is not paused
            await e.put(pause_key("topic", "s"), b'{"kind": "topic", "name": "s", "since_ms": 1}')
            await wait_until(lambda: broker.handlers.pauses.topic_paused("s"), what="the stale pause seen")
            await c.create_topic("s", 1)
            assert await e.get(pause_key("topic", "s")) is None
            await wait_until(lambda: not broker.handlers.pauses.topic_paused("s"), what="the stale pause dropped")
            assert not await refused(c, "s", 0)
            # paused, then deleted: no pause record remains in etcd
            assert (await c.pause_topic("s")).changed
            assert await e.get(pause_key("topic", "s")) is not None
            await c.delete_topic("s")
            assert await e.get(pause_key("topic", "s")) is None
            # the placement gone from etcd (however fresh this broker's copy): nothing is written
            await c.create_topic("u", 1)
            assert await e.delete(topic_key("u"))
            try:
                await broker.cluster.set_paused("topic", "u", True)
            except TopicNotFound:
                pass
            else:
                raise AssertionError("pausing a topic etcd does not have succeeded")
            assert await e.get(pause_key("topic", "u")) is None
