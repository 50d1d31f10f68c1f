"""``equeue consume`` ends by itself: ``--exit-at-end`` (``-e``, every queue assigned to
it read to its end), ``--idle-timeout``, ``--max`` -- the first one met. Before, ``--max
10`` with 2 messages never exited (as in README's quick start). The child runs as a
process with a deadline: one that never exits fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer
from equeue.names import retry_topic
from tests.integration.cli_child import child_env, consume


def _produce(b: str, topic: str, counts: list[int]) -> None:
    with Client(b) as c:
        c.create_topic(topic, len(counts), exist_ok=True)
        for q, n in enumerate(counts):
            if n:
                c.produce(wire.ProduceRequest(topic, q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(n)]))


def test_max_with_exit_at_end_stops_at_the_end(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    _produce(b, "orders", [2, 0, 0, 0])  # README's quick start: 2 messages, 4 queues
    r = consume("orders", "--group", "billing", "--from", "earliest", "--max", "10", "--exit-at-end", "-b", b)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[-1] for line in r.stdout.splitlines()) == ["0-0", "0-1"]
    assert "consumed 2 message(s)" in r.stderr
    with Client(b) as c:  # committed, left
        d = c.describe_group("billing")
        assert d.members == [] and [(q.queue_id, q.committed) for q in d.queues if q.queue_id == 0] == [(0, 2)]
    # again: nothing new, it exits at once (-e, the short form)
    r = consume("orders", "-g", "billing", "-e", "-b", b)
    assert r.returncode == 0 and r.stdout == "" and "consumed 0 message(s)" in r.stderr, r.stderr
    # --max still ends first when it comes first
    _produce(b, "orders", [3, 3, 0, 0])
    r = consume("orders", "-g", "billing", "-e", "--max", "2", "-b", b)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    r = consume("orders", "-g", "billing", "-e", "--format", "json", "-b", b)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 4, r.stderr
    assert {json.loads(line)["queue_id"] for line in r.stdout.splitlines()} <= {0, 1}


def test_idle_timeout(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    _produce(b, "t", [2, 1])
    r = consume("t", "-g", "g", "--from", "earliest", "--idle-timeout", "1s", "-b", b)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stderr
    r = consume("t", "-g", "g", "--idle-timeout", "0", "-b", b)
    assert r.returncode == 1 and "--idle-timeout must be above 0" in r.stderr
    r = consume("t", "-g", "g", "--idle-timeout", "soon", "-b", b)
    assert r.returncode == 1 and "invalid duration 'soon'" in r.stderr


async def test_stop_at_end_in_the_sdk(broker: Broker) -> None:
    """``AsyncConsumer(stop_at_end=True)``: ``run`` returns once the queues are read to
    their end and handled; a queue with nothing in it counts at once."""
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("t", 3)
        for q in (0, 2):
            await admin.produce(wire.ProduceRequest("t", q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(40)]))
        seen: list[str] = []
        with trio.fail_after(60):
            async with AsyncConsumer(broker.address, "g", "t", start_from="earliest", stop_at_end=True,
                                     pull_batch=8) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    seen.append(m.text)
                    await trio.sleep(0)

                await con.run(handler)
        assert sorted(seen) == sorted(f"{q}-{i}" for q in (0, 2) for i in range(40))
        assert [await admin.query_offset("g", "t", q) for q in range(3)] == [40, 0, 40]


def test_a_reader_that_goes_away_stops_it(embedded_broker: EmbeddedBroker) -> None:
    """``equeue consume ... | head -3``: once the pipe is broken it stops, quietly.
    Before, every later message failed in the handler and went to the group's retry
    topic (to be delivered to the group again), and it went on until an end condition.

    The backlog's lines (~200 kB) overflow the pipe's buffer (64 kB), so the consumer
    is still writing when ``head`` goes: with a backlog that fits the buffer, it could
    write it all before ``head`` left and then wait, unaware, for the next message."""
    b = embedded_broker.address
    with Client(b) as c:
        c.create_topic("t", 1)
        for _ in range(4):
            c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("x" * 100)) for _ in range(500)]))
    cmd = f"{sys.executable} -m equeue consume t -g g --from earliest -b {b} | head -3; exit ${{PIPESTATUS[0]}}"
    # its own session: a pipeline that does not end is killed whole, not left running
    with subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=child_env(), start_new_session=True) as p:  # fmt: skip
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise AssertionError("equeue consume | head -3 did not exit within 60 s") from None
    r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 3
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert r.stderr.strip().startswith("consumed "), r.stderr
    with Client(b) as c:
        assert retry_topic("g") not in {t.name for t in c.list_topics()}
        assert c.describe_group("g").members == []
