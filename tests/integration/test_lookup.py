"""Lookup by offset and by key (AsyncClient and the ``equeue message`` CLI)."""

from __future__ import annotations

import json

import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.cli import app
from equeue.client import AsyncClient, Client
from equeue.errors import MessageNotFound, QueueNotFound, TopicNotFound


async def test_get_by_queue_and_global_offset(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("a", 2)
            await c.create_topic("b", 1)
            msg = Message("hello", key="k", tags="t1", properties={"p": "v"})
            ans = await c.produce(wire.ProduceRequest("a", 1, [wire.encode_entry(Message("x")), wire.encode_entry(msg)]))
            [m] = (await c.get_message("a", queue_id=1, queue_offset=1)).messages
            assert (m.text, m.key, m.tags, m.properties) == ("hello", "k", "t1", {"p": "v"})
            assert (m.queue_id, m.queue_offset, m.global_offset) == (1, 1, ans.first_global + 1)
            [g] = (await c.get_message("a", global_offset=ans.first_global + 1)).messages
            assert (g.text, g.queue_offset, g.timestamp) == ("hello", 1, m.timestamp)
            with pytest.raises(MessageNotFound, match=r"retained range \[0, 2\)"):
                await c.get_message("a", queue_id=1, queue_offset=2)
            with pytest.raises(MessageNotFound):
                await c.get_message("b", global_offset=ans.first_global)  # belongs to "a"
            with pytest.raises(MessageNotFound):
                await c.get_message("a", global_offset=10_000)
            with pytest.raises(QueueNotFound):
                await c.get_message("a", queue_id=5, queue_offset=0)
            with pytest.raises(TopicNotFound):
                await c.get_message("nope", queue_id=0, queue_offset=0)


async def test_find_by_key_newest_first_exact_and_limited(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("k", 3)
            await c.create_topic("other", 1)
            expected: list[int] = []
            for i in range(12):
                q = i % 3
                entries = [
                    wire.encode_entry(Message(f"user-{i}", key="user")),
                    wire.encode_entry(Message("noise", key=f"user{i}")),  # similar, different key
                    wire.encode_entry(Message("nokey")),
                ]
                ans = await c.produce(wire.ProduceRequest("k", q, entries))
                expected.append(ans.first_global)
            await c.produce(wire.ProduceRequest("other", 0, [wire.encode_entry(Message("o", key="user"))]))
            res = await c.find_by_key("k", "user", limit=100)
            assert [m.global_offset for m in res.messages] == expected[::-1]
            assert [m.text for m in res.messages] == [f"user-{i}" for i in reversed(range(12))]
            assert all(m.key == "user" for m in res.messages)
            res = await c.find_by_key("k", "user", limit=5)
            assert [m.text for m in res.messages] == [f"user-{i}" for i in range(11, 6, -1)]
            assert (await c.find_by_key("k", "absent")).messages == []
            assert [m.text for m in (await c.find_by_key("other", "user")).messages] == ["o"]


# ---------------------------------------------------------------------- CLI
def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_cli_message_get_and_find(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("orders", 2)
        text = Message("paid order #1", key="user-42", tags="paid", properties={"region": "eu"})
        binary = Message(b"\x00\x01\xffbin", key="user-42")
        ans = c.produce(wire.ProduceRequest("orders", 1, [wire.encode_entry(text), wire.encode_entry(binary)]))
    code, out, _ = _cli("message", "get", "orders", "--queue", "1", "--offset", "0", "-b", addr)
    assert code == 0, out
    assert "paid order #1" in out and "user-42" in out and "region = eu" in out and "text" in out
    code, out, _ = _cli("message", "get", "orders", "--global-offset", str(ans.first_global + 1), "--json", "-b", addr)
    assert code == 0
    doc = json.loads(out)
    assert doc["body_encoding"] == "hex" and doc["body"] == "0001ff62696e"
    assert (doc["queue_id"], doc["queue_offset"], doc["key"], doc["topic"]) == (1, 1, "user-42", "orders")
    code, out, _ = _cli("message", "get", "orders", "-q", "1", "-o", "0", "--json", "--hex", "-b", addr)
    assert json.loads(out)["body"] == b"paid order #1".hex()
    code, out, _ = _cli("message", "find", "orders", "--key", "user-42", "--json", "-b", addr)
    assert code == 0
    assert [d["queue_offset"] for d in json.loads(out)] == [1, 0]  # newest first
    code, out, _ = _cli("message", "find", "orders", "--key", "user-42", "-b", addr)
    assert code == 0 and "2 message(s)" in out and "paid order #1" in out and "0x0001ff62696e" in out
    code, out, _ = _cli("message", "find", "orders", "--key", "user-42", "--limit", "1", "--json", "-b", addr)
    assert [d["queue_offset"] for d in json.loads(out)] == [1]
    # errors: one line, non-zero exit
    code, _, err = _cli("message", "get", "orders", "--queue", "1", "--offset", "9", "-b", addr)
    assert code == 1 and "no message at orders/1 offset 9" in err
    code, _, err = _cli("message", "get", "orders", "-b", addr)
    assert code == 1 and "either --queue" in err
    code, _, err = _cli("message", "get", "orders", "--queue", "1", "--offset", "0", "--global-offset", "3", "-b", addr)
    assert code == 1


@pytest.mark.parametrize("offset", [-5, 2**64, 2**70])
async def test_an_offset_outside_u64_is_a_bad_request_not_an_internal_error(broker: Broker, offset: int) -> None:
    """Negative or oversized offsets (GET_MESSAGE, COMMIT_OFFSET) are coded refusals;
    an oversized commit never aborts the transaction of other clients' writes."""
    from equeue.errors import BadRequest

    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            with pytest.raises(BadRequest, match=r"0\.\.2\^64-1"):
                await c.get_message("t", 0, offset)
            if offset > 0:
                with pytest.raises(BadRequest, match=r"0\.\.2\^64-1"):
                    await c.get_message(global_offset=offset)
            with pytest.raises(BadRequest, match=r"0\.\.2\^64-1"):
                await c.commit_offset("g", "t", 0, offset)
            ans = await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"still fine"))]))
            assert ans.stored == 1
