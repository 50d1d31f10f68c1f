"""Pausing and resuming a topic's produce and a consumer group's consumption on a real
standalone broker (docs/operations.md, "Pause and resume"): the refusal and the
producer SDK's wait, the held pulls, listings, metrics, the CLI, and a restart."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.errors import ReservedTopic, TopicNotFound, TopicPaused
from equeue.logs import formatter
from equeue.producer import AsyncProducer
from equeue.protocol import PullStatus
from tests.conftest import make_config, wait_until, wait_wall_clock_past, wall_ms


def entries(*bodies: str) -> list[bytes]:
    return [wire.encode_entry(Message(b)) for b in bodies]


async def bodies(c: AsyncClient, topic: str, queue: int) -> list[str]:
    r = await c.pull(wire.PullRequest(topic, queue, 0, max_messages=1000))
    return [m.text for m in r.messages]


async def test_paused_topic_refuses_produce_and_the_producer_waits_it_out(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "equeue.client.retry")
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 2)
            await c.produce(wire.ProduceRequest("t", 0, entries("before")))
            first = await c.pause_topic("t")
            assert (first.kind, first.name, first.paused, first.changed) == ("topic", "t", True, True)
            assert (await c.pause_topic("t")).changed is False  # paused already
            with pytest.raises(TopicPaused) as refused:
                await c.produce(wire.ProduceRequest("t", 0, entries("refused")))
            assert refused.value.code == 38 and "'t' is paused" in str(refused.value)
            assert [t.paused for t in await c.list_topics() if t.name == "t"] == [True]
            assert (await c.describe_topic("t")).info.paused
            with pytest.raises(TopicNotFound):
                await c.pause_topic("nope")
            with pytest.raises(ReservedTopic):
                await c.pause_topic("%RETRY%g")
            # consumers still read what the topic holds
            assert await bodies(c, "t", 0) == ["before"]

            # past its send_timeout, a send fails with TopicPaused
            async with AsyncProducer(broker.address, send_timeout=0.5, retry_backoff=0.05) as p:
                with pytest.raises(TopicPaused):
                    await p.send("t", "late", key="k")

            # within it, the sends wait; resumed mid-wait, they go through in order, once
            async with AsyncProducer(broker.address, send_timeout=20, retry_backoff=0.05, linger=0) as p:
                handles = [await p.send_async("t", f"m{i}", key="k") for i in range(5)]
                await wait_until(lambda: any("producer.send:t" in line for line in lines(caplog)),
                                 what="the retry line naming the paused topic")  # fmt: skip
                assert not any(h.done() for h in handles)
                assert "TopicPaused" in next(line for line in lines(caplog) if "producer.send:t" in line)
                resumed = await c.resume_topic("t")
                assert (resumed.paused, resumed.changed) == (False, True)
                results = [await h for h in handles]
            queue = results[0].queue_id
            assert [r.queue_id for r in results] == [queue] * 5
            assert [r.queue_offset for r in results] == sorted(r.queue_offset for r in results)
            stored = await bodies(c, "t", queue)
            assert [b for b in stored if b.startswith("m")] == [f"m{i}" for i in range(5)]
            assert not (await c.describe_topic("t")).info.paused
            assert (await c.resume_topic("t")).changed is False


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [formatter().format(r) for r in caplog.records if r.name == "equeue.client.retry"]


async def test_a_delayed_message_due_in_a_paused_topic_is_delivered(broker: Broker) -> None:
    """The pause refuses producers, not the broker's own writes: a delayed message
    accepted before the pause is moved into its queue when due (nothing is lost)."""
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("d", 1)
            due = wall_ms() + 300
            await c.produce(wire.ProduceRequest("d", 0, [wire.encode_entry(Message("later", deliver_at=due))]))
            await c.pause_topic("d")
            await wait_wall_clock_past(due)

            async def delivered() -> bool:
                return await bodies(c, "d", 0) == ["later"]

            await wait_until(delivered, what="the delayed message moved into the paused topic")


async def test_paused_group_gets_nothing_stays_a_member_and_gets_everything_after_resume(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_broker(make_config(tmp_path / "data", http_port=0)) as broker:
            async with AsyncClient(broker.address) as c:
                await c.create_topic("o", 1)
                await c.produce(wire.ProduceRequest("o", 0, entries(*(f"o{i}" for i in range(5)))))
                paused = await c.pause_group("cg")
                assert (paused.kind, paused.name, paused.paused, paused.changed) == ("group", "cg", True, True)
                # a paused group that never consumed is listed (and described) as paused
                assert next(g for g in await c.list_groups() if g.group == "cg").paused
                assert (await c.describe_group("cg")).paused
                # a pull of the group finds nothing, at the offset it asked for; other groups read
                r = await c.pull(wire.PullRequest("o", 0, 0, group="cg"))
                assert (r.status, r.messages, r.next_offset, r.max_offset) == (PullStatus.NO_NEW_MESSAGE, [], 0, 5)
                assert len((await c.pull(wire.PullRequest("o", 0, 0, group="other"))).messages) == 5
                text = await metrics(broker)
                assert 'equeue_group_paused{group="cg"} 1.0' in text

                got: list[str] = []
                async with AsyncConsumer(broker.address, "cg", "o", start_from="earliest", heartbeat_interval=0.2,
                                         rebalance_interval=0.2, commit_interval=0.2, pull_hold=5.0) as con:  # fmt: skip

                    async def handler(m: Message) -> None:
                        got.append(m.text)
                        if len(got) == 5:
                            con.stop()

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(con.run, handler)

                        async def member_held() -> bool:
                            d = await c.describe_group("cg")
                            return len(d.members) == 1 and [q.owner for q in d.queues] == [d.members[0].consumer_id]

                        await wait_until(member_held, what="the consumer a member holding the queue")
                        # a pull held as a long poll: resumed, it reads at once (well within its hold)
                        held: list[int] = []

                        async def held_pull() -> None:
                            r = await c.pull(wire.PullRequest("o", 0, 0, max_wait_ms=30_000, group="cg"))
                            held.append(len(r.messages))

                        nursery.start_soon(held_pull)
                        pauses = broker.handlers.pauses  # the consumer's own pull and ours, both held
                        await wait_until(lambda: pauses.held >= 2, what="the pull held at the broker")
                        await c.commit_offset("cg", "o", 0, 0)  # commits are accepted while paused
                        d = await c.describe_group("cg")
                        assert got == [] and len(d.members) == 1 and d.paused
                        assert [q.committed for q in d.queues] == [0]
                        await c.resume_group("cg")
                        await wait_until(lambda: len(got) == 5 and held == [5], what="everything delivered on resume")
                assert got == [f"o{i}" for i in range(5)]
                assert not (await c.describe_group("cg")).paused
                assert 'equeue_group_paused{group="cg"}' not in await metrics(broker)


async def metrics(broker: Broker) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{broker.http_port}") as http:
        return (await http.get("/metrics")).text


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


async def test_pauses_survive_a_restart_and_the_cli_shows_them(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data", http_port=0)
    with trio.fail_after(60):
        async with open_broker(config) as broker:
            b = broker.address
            async with AsyncClient(b) as c:
                await c.create_topic("r", 1)
                await c.create_topic("gone", 1)
            code, out, err = await trio.to_thread.run_sync(cli, "topic", "pause", "r", "-b", b, "--json")
            assert code == 0 and json.loads(out) == {"kind": "topic", "name": "r", "paused": True, "changed": True}, err
            code, out, err = await trio.to_thread.run_sync(cli, "group", "pause", "cg", "-b", b)
            assert code == 0 and out.strip() == "group cg paused", err
            code, out, err = await trio.to_thread.run_sync(cli, "group", "pause", "cg", "-b", b)
            assert code == 0 and out.strip() == "group cg was already paused", err
            code, out, err = await trio.to_thread.run_sync(cli, "topic", "pause", "nope", "-b", b)
            assert code == 1 and err.startswith("error:") and "nope" in err, err
            await trio.to_thread.run_sync(cli, "topic", "pause", "gone", "-b", b)
            async with AsyncClient(b) as c:  # deleting a topic drops its pause
                await c.delete_topic("gone")
                await c.create_topic("gone", 1)
                await c.produce(wire.ProduceRequest("gone", 0, entries("x")))
            assert 'equeue_topic_paused{topic="r"} 1.0' in await metrics(broker)
        async with open_broker(config) as broker:
            b = broker.address
            async with AsyncClient(b) as c:
                with pytest.raises(TopicPaused):
                    await c.produce(wire.ProduceRequest("r", 0, entries("x")))
                assert {g.group for g in await c.list_groups() if g.paused} == {"cg"}
            code, out, err = await trio.to_thread.run_sync(cli, "topic", "list", "-b", b, "--json")
            assert code == 0 and {t["name"]: t["paused"] for t in json.loads(out)} == {"r": True, "gone": False}, err
            code, out, err = await trio.to_thread.run_sync(cli, "group", "list", "-b", b)
            assert code == 0 and "paused" in out, out
            code, out, err = await trio.to_thread.run_sync(cli, "topic", "resume", "r", "-b", b)
            assert code == 0 and out.strip() == "topic r resumed", err
            code, out, err = await trio.to_thread.run_sync(cli, "group", "resume", "cg", "-b", b, "--json")
            assert code == 0 and json.loads(out)["paused"] is False, err
            async with AsyncClient(b) as c:
                await c.produce(wire.ProduceRequest("r", 0, entries("x")))
                assert not any(g.paused for g in await c.list_groups())


async def test_a_pull_parked_before_the_pause_is_not_answered_with_messages_after_it(broker: Broker) -> None:
    with trio.fail_after(30):
        async with AsyncClient(broker.address) as c, AsyncClient(broker.address) as puller:
            await c.create_topic("p", 1)
            got: list[int] = []
            async with trio.open_nursery() as nursery:

                async def parked() -> None:
                    r = await puller.pull(wire.PullRequest("p", 0, 0, max_wait_ms=1500, group="cg"))
                    got.append(len(r.messages))

                nursery.start_soon(parked)
                await wait_until(lambda: broker.parked.parked == 1, what="the pull parked")
                await c.pause_group("cg")
                await c.produce(wire.ProduceRequest("p", 0, entries("new")))  # would wake and feed it
            assert got == [0]
            await c.resume_group("cg")
            assert len((await c.pull(wire.PullRequest("p", 0, 0, group="cg"))).messages) == 1
