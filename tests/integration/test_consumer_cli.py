"""``equeue consume``, ``equeue group ...`` and ``equeue dlq ...`` against a real broker."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.cli import app
from equeue.client import Client
from equeue.consumer import Consumer
from equeue.names import dlq_topic

runner = CliRunner()


def cli(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def test_consume_describe_reset(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with Client(b) as c:
        c.create_topic("cli", 2)
        for q in range(2):
            c.produce(wire.ProduceRequest("cli", q, [wire.encode_entry(Message(f"{q}-{i}", key="k")) for i in range(3)]))
    out = cli("consume", "cli", "--group", "cg", "--from", "earliest", "--max", "6", "--format", "json", "-b", b)
    bodies = sorted(json.loads(line)["body"] for line in out.splitlines())
    assert bodies == ["0-0", "0-1", "0-2", "1-0", "1-1", "1-2"]
    out = cli("group", "describe", "cg", "-b", b)
    assert "lag" in out and "cli" in out
    d = json.loads(cli("group", "describe", "cg", "--json", "-b", b))
    assert [(q["queue_id"], q["committed"], q["lag"]) for q in d["queues"]] == [(0, 3, 0), (1, 3, 0)]
    assert "cg" in cli("group", "list", "-b", b)
    cli("group", "reset-offsets", "cg", "--topic", "cli", "--to", "earliest", "-b", b)
    out = cli("consume", "cli", "--group", "cg", "--max", "6", "-b", b)
    assert len(out.splitlines()) == 6  # from the start again
    cli("group", "reset-offsets", "cg", "--topic", "cli", "--to", "2000-01-01T00:00:00Z", "-b", b)
    d = json.loads(cli("group", "describe", "cg", "--json", "-b", b))
    assert [q["committed"] for q in d["queues"]] == [0, 0]
    # refused while a member is live, unless --force
    with Consumer(b, "cg", "cli", heartbeat_interval=0.2) as con:
        con.start()
        res = runner.invoke(app, ["group", "reset-offsets", "cg", "--topic", "cli", "--to", "latest", "-b", b])
        assert res.exit_code == 1
        cli("group", "reset-offsets", "cg", "--topic", "cli", "--to", "latest", "--force", "-b", b)


def test_dlq_list_and_resend(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with Client(b) as c:
        c.create_topic("src", 1)
        c.produce(wire.ProduceRequest("src", 0, [wire.encode_entry(Message("boom", key="k9"))]))
    with Consumer(b, "dg", "src", start_from="earliest", max_reconsume_times=0, heartbeat_interval=0.2,
                  commit_interval=0.2) as con:  # fmt: skip

        def handler(m: Message) -> None:
            con.stop()
            raise RuntimeError("fail")

        con.run(handler)
    rows = json.loads(cli("dlq", "list", "dg", "--json", "-b", b))
    assert [(r["body"], r["origin_topic"], r["key"]) for r in rows] == [("boom", "src", "k9")]
    assert "boom" in cli("dlq", "list", "dg", "-b", b)
    assert "resent 1" in cli("dlq", "resend", "dg", "--id", str(rows[0]["id"]), "-b", b)
    with Client(b) as c:
        r = c.pull(wire.PullRequest("src", 0, 1, 10))
        assert [(m.text, m.key, m.reconsume_times) for m in r.messages] == [("boom", "k9", 0)]
        assert c.describe_topic(dlq_topic("dg")).queues[0].max_offset == 1
