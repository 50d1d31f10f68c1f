"""SEND_BACK, DLQ_LIST and DLQ_RESEND against a real broker."""

from __future__ import annotations

import base64
import time

import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.cli import app
from equeue.client import AsyncClient, Client
from equeue.errors import BadRequest, MessageNotFound, TopicNotFound
from equeue.models import PROP_ORIGIN_OFFSET, PROP_ORIGIN_QUEUE, PROP_ORIGIN_TOPIC, PROP_RETRY_GROUP
from equeue.names import dlq_topic, retry_topic


async def _dead_letters(c: AsyncClient, group: str, n: int) -> list[int]:
    """Produce ``n`` messages to "src" (2 queues) and send each back past the
    maximum: they land in the group's dead-letter topic. Their source offsets."""
    await c.create_topic("src", 2, exist_ok=True)
    for i in range(n):
        key = f"k{i}"
        a = await c.produce(wire.ProduceRequest("src", i % 2, [wire.encode_entry(Message(f"m{i}", key=key))]))
        ans = await c.send_back(group, "src", i % 2, a.first_queue, reconsume_times=3, max_reconsume_times=3)
        assert ans.dead_lettered and ans.topic == dlq_topic(group) and ans.deliver_at == 0
    return list(range(n))


async def test_send_back_lands_in_retry_then_in_the_dead_letter_topic(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("src", 2)
            await c.produce(wire.ProduceRequest("src", 1, [wire.encode_entry(Message("boom", key="k", tags="t"))]))
            # attempt 1 failed: a retry due at once (delay 0)
            first = await c.send_back("g", "src", 1, 0, reconsume_times=0, max_reconsume_times=1, retry_delays_ms=[0])
            assert (first.topic, first.dead_lettered) == (retry_topic("g"), False)
            r = await c.pull(wire.PullRequest(retry_topic("g"), first.queue_id, 0, 10))
            [retry] = r.messages
            assert (retry.text, retry.key, retry.tags, retry.reconsume_times) == ("boom", "k", "t", 1)
            assert retry.properties[PROP_ORIGIN_TOPIC] == "src"
            assert retry.properties[PROP_ORIGIN_QUEUE] == "1"
            assert retry.properties[PROP_ORIGIN_OFFSET] == "0"
            assert retry.properties[PROP_RETRY_GROUP] == "g"
            # attempt 2 (read from the retry topic) failed too: past the maximum
            second = await c.send_back("g", retry_topic("g"), first.queue_id, retry.queue_offset, 1, 1, [0])
            assert (second.topic, second.dead_lettered) == (dlq_topic("g"), True)
            page = await c.dlq_list("g")
            [letter] = page.letters
            assert (letter.origin_topic, letter.origin_queue, letter.origin_offset) == ("src", 1, 0)
            assert (base64.b64decode(letter.body), letter.key, letter.reconsume_times) == (b"boom", "k", 1)
            assert page.done and not letter.resent


async def test_send_back_follows_the_delay_ladder(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("src", 1)
            await c.produce(wire.ProduceRequest("src", 0, [wire.encode_entry(Message("x"))]))
            before = time.time_ns() // 1_000_000
            ans = await c.send_back("g", "src", 0, 0, 2, 16, [1000, 5000, 60_000, 120_000])
            assert ans.topic == retry_topic("g") and not ans.dead_lettered
            assert before + 60_000 <= ans.deliver_at <= time.time_ns() // 1_000_000 + 60_000
            assert (await c.describe_topic(retry_topic("g"))).pending_delayed == 1
            # past the ladder's end the last delay repeats; no ladder: the default one (1 s first)
            ans = await c.send_back("g", "src", 0, 0, 9, 16, [1000, 5000])
            assert ans.deliver_at >= before + 5000
            ans = await c.send_back("g", "src", 0, 0, 0, 16)
            assert before + 1000 <= ans.deliver_at < before + 5000
            with pytest.raises(MessageNotFound):
                await c.send_back("g", "src", 0, 7, 0)
            with pytest.raises(BadRequest):
                await c.send_back("g", "src", 0, 0, -1)


async def test_dlq_list_answers_pages(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            assert (await c.dlq_list("nobody")).done  # no dead letters yet: an empty page
            await _dead_letters(c, "g", 7)
            seen: list[tuple[int, int]] = []
            bodies: list[bytes] = []
            q, off, pages = 0, 0, 0
            while True:
                page = await c.dlq_list("g", q, off, limit=3)
                pages += 1
                assert len(page.letters) <= 3
                seen += [(d.queue_id, d.queue_offset) for d in page.letters]
                bodies += [base64.b64decode(d.body) for d in page.letters]
                if page.done:
                    break
                q, off = page.next_queue_id, page.next_offset
            assert pages == 3
            assert len(set(seen)) == 7 and seen == sorted(seen)  # queue by queue, oldest first
            assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(7))


async def test_dlq_resend_twice_resends_once(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await _dead_letters(c, "g", 5)
            before = [(await c.queue_offsets("src", q)).max_offset for q in (0, 1)]
            page = await c.dlq_list("g", limit=100)
            ids = [d.id for d in page.letters]
            one = await c.dlq_resend("g", ids=[ids[0]])
            assert (one.resent, one.already_resent) == ([ids[0]], [])
            everything = await c.dlq_resend("g", all_letters=True)
            assert sorted(everything.resent) == sorted(ids[1:]) and everything.already_resent == [ids[0]]
            again = await c.dlq_resend("g", all_letters=True)
            assert again.resent == [] and sorted(again.already_resent) == sorted(ids)
            after = [(await c.queue_offsets("src", q)).max_offset for q in (0, 1)]
            assert sum(after) - sum(before) == 5  # each letter resent exactly once
            resent = []
            for q in (0, 1):
                r = await c.pull(wire.PullRequest("src", q, before[q], 100))
                resent += r.messages
            assert sorted(m.text for m in resent) == [f"m{i}" for i in range(5)]
            assert all(m.reconsume_times == 0 and not m.properties for m in resent)
            assert all(m.queue_id == int(m.key[1:]) % 2 for m in resent)  # back to the origin queue
            assert all(d.resent for d in (await c.dlq_list("g")).letters)
            with pytest.raises(MessageNotFound):
                await c.dlq_resend("g", ids=[10_000])
            src_id = (await c.get_message("src", 0, 0)).messages[0].global_offset
            with pytest.raises(MessageNotFound):  # a message, but not one of this group's letters
                await c.dlq_resend("g", ids=[src_id])
            with pytest.raises(TopicNotFound):  # a group without dead letters
                await c.dlq_resend("other", all_letters=True)


async def test_concurrent_resends_resend_each_letter_once(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c, AsyncClient(broker.address) as c2:
            await _dead_letters(c, "g", 6)
            answers = []

            async def resend(client: AsyncClient) -> None:
                answers.append(await client.dlq_resend("g", all_letters=True))

            async with trio.open_nursery() as n:
                n.start_soon(resend, c)
                n.start_soon(resend, c2)
            assert sorted(answers[0].resent + answers[1].resent) == sorted(
                d.id for d in (await c.dlq_list("g")).letters
            )


def test_cli_dlq_list_pages_and_resend_all_twice(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with Client(b) as c:
        c.create_topic("src", 1)
        for i in range(3):
            c.produce(wire.ProduceRequest("src", 0, [wire.encode_entry(Message(f"dead-{i}"))]))
            c.send_back("g", "src", 0, i, 0, 0)
    runner = CliRunner()

    def cli(*args: str) -> str:
        res = runner.invoke(app, [*args, "-b", b])
        assert res.exit_code == 0, res.output
        return res.output

    first = cli("dlq", "list", "g", "--limit", "2")
    assert "dead-0" in first and "dead-1" in first and "dead-2" not in first
    assert "more: equeue dlq list g --queue 0 --offset 2" in first
    assert "dead-2" in cli("dlq", "list", "g", "--queue", "0", "--offset", "2")
    assert "resent 3 message(s)" in cli("dlq", "resend", "g", "--all")
    assert "resent 0 message(s) from %DLQ%g; 3 resent before" in cli("dlq", "resend", "g", "--all")
    with Client(b) as c:
        assert c.queue_offsets("src", 0).max_offset == 6


async def test_resend_records_of_removed_letters_are_pruned(broker: Broker) -> None:
    def records() -> list[bytes]:
        with broker.store.env.begin() as txn:
            return [bytes(k) for k, _ in txn.cursor(db=broker.store.db[b"meta"]) if bytes(k).startswith(b"dlq-resent/g/")]

    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await _dead_letters(c, "g", 4)
            assert len((await c.dlq_resend("g", all_letters=True)).resent) == 4
            assert len(records()) == 4
            # retention removes every letter; the next resend drops their records
            await c.alter_topic(dlq_topic("g"), retention_bytes=1)
            assert await broker.lifecycle.enforce_retention() == 4
            await c.alter_topic(dlq_topic("g"), reset=["retention_bytes"])
            await c.produce(wire.ProduceRequest("src", 0, [wire.encode_entry(Message("late"))]))
            late = (await c.queue_offsets("src", 0)).max_offset - 1
            await c.send_back("g", "src", 0, late, 1, 1)
            again = await c.dlq_resend("g", all_letters=True)
            assert len(again.resent) == 1 and again.already_resent == []
            assert len(records()) == 1
