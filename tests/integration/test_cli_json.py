"""``--json`` of the CLI against a real broker (one JSON document on stdout, stable
keys), and ``EQUEUE_BROKERS`` as the fallback of ``--broker`` (docs/cli.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.cli import app
from equeue.client import Client

#: an address nothing listens on
NOWHERE = "127.0.0.1:1"


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={"EQUEUE_BROKERS": None, **(env or {})})


def answer(*args: str, env: dict[str, str | None] | None = None) -> Any:
    """The one JSON document a ``--json`` command prints on stdout."""
    res = run(*args, "--json", env=env)
    assert res.exit_code == 0, res.output
    assert "\x1b[" not in res.stdout  # no markup
    assert res.stdout.count("\n") == 1, res.stdout  # one document, on one line
    return json.loads(res.stdout)


def test_topic_commands_print_one_json_document(embedded_broker: EmbeddedBroker) -> None:
    b = ("-b", embedded_broker.address)
    created = answer("topic", "create", "jt", "--queues", "2", "--retention", "24h", *b)
    assert {k: created[k] for k in ("name", "queues", "retention_ms", "retention_bytes")} == {
        "name": "jt", "queues": 2, "retention_ms": 24 * 3600 * 1000, "retention_bytes": None,
    }  # fmt: skip
    assert set(created) == {
        "name", "topic_id", "queues", "created_ms", "retention_ms", "retention_bytes", "paused", "compression"
    }
    altered = answer("topic", "alter", "jt", "--queues", "3", "--retention", "default", *b)
    assert (altered["name"], altered["queues"], altered["retention_ms"]) == ("jt", 3, None)
    assert [t["name"] for t in answer("topic", "list", *b)] == ["jt"]
    described = answer("topic", "describe", "jt", *b)
    assert described["info"]["queues"] == 3 and len(described["queues"]) == 3
    assert answer("topic", "pause", "jt", *b) == {"kind": "topic", "name": "jt", "paused": True, "changed": True}
    assert answer("topic", "describe", "jt", *b)["info"]["paused"] is True
    assert answer("topic", "resume", "jt", *b) == {"kind": "topic", "name": "jt", "paused": False, "changed": True}
    assert answer("topic", "delete", "jt", *b) == {"topic": "jt", "deleted": True}
    # without --json: the human line, as before
    res = run("topic", "create", "jt2", *b)
    assert res.exit_code == 0 and res.stdout.startswith("topic jt2: 4 queues")


def test_describe_says_paused_in_its_first_line_and_in_its_json(embedded_broker: EmbeddedBroker) -> None:
    """``topic describe`` and ``group describe``: a pause is said in the heading line,
    and ``group describe --json`` carries it as ``paused``."""
    b = ("-b", embedded_broker.address)
    with Client(embedded_broker.address) as c:
        c.create_topic("pt", 1)
        c.commit_offset("pg", "pt", 0, 0)

    def heading(*args: str) -> str:
        """The human output's heading: the text before the table (wrapped to the
        terminal's width, so joined back into one line)."""
        res = run(*args, *b)
        assert res.exit_code == 0, res.output
        return " ".join(res.stdout.split("┏")[0].split())

    assert "PAUSED" not in heading("topic", "describe", "pt")
    assert "PAUSED" not in heading("group", "describe", "pg")
    assert answer("group", "describe", "pg", *b)["paused"] is False
    answer("topic", "pause", "pt", *b)
    answer("group", "pause", "pg", *b)
    assert heading("topic", "describe", "pt").endswith(", PAUSED (produce refused)")
    assert heading("group", "describe", "pg").endswith(", PAUSED (pulls held)")
    assert answer("group", "describe", "pg", *b)["paused"] is True
    answer("topic", "resume", "pt", *b)
    answer("group", "resume", "pg", *b)
    assert "PAUSED" not in heading("topic", "describe", "pt")
    assert "PAUSED" not in heading("group", "describe", "pg")
    assert answer("group", "describe", "pg", *b)["paused"] is False


def test_message_commands_print_one_json_document(embedded_broker: EmbeddedBroker) -> None:
    b = ("-b", embedded_broker.address)
    with Client(embedded_broker.address) as c:
        c.create_topic("mt", 1)
        c.produce(wire.ProduceRequest("mt", 0, [wire.encode_entry(Message(f"m{i}", key="k")) for i in range(2)]))
    got = answer("message", "get", "mt", "-q", "0", "-o", "1", *b)
    assert (got["body"], got["key"], got["queue_offset"]) == ("m1", "k", 1)
    assert [m["body"] for m in answer("message", "find", "mt", "-k", "k", "-n", "5", *b)] == ["m1", "m0"]
    skipped = answer("message", "skip", "-t", "mt", "-q", "0", "-o", "0", "-y", *b)
    assert skipped == {"topic": "mt", "queue_id": 0, "queue_offset": 0, "already_skipped": False,
                       "problem": ""}  # fmt: skip
    assert answer("message", "skip", "-t", "mt", "-q", "0", "-o", "0", "-y", *b)["already_skipped"] is True
    assert answer("message", "skipped", "mt", *b) == {"0": [0]}
    # a refusal is still one error line on stderr, nothing on stdout
    res = run("message", "get", "mt", "-q", "0", "-o", "9", "--json", *b)
    assert res.exit_code == 1 and res.stdout == "" and "no message at mt/0 offset 9" in res.stderr


def test_cluster_status_prints_one_json_document(embedded_broker: EmbeddedBroker) -> None:
    report = answer("cluster", "status", "-b", embedded_broker.address)
    assert set(report) == {"status", "health", "replication"}
    assert [h["reachable"] for h in report["health"]] == [True]


def test_user_and_acl_commands_print_one_json_document(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"EQUEUE_USERS_FILE": str(tmp_path / "users.json"), "EQUEUE_NEW_PASSWORD": "s3cret"}
    assert answer("user", "add", "ops", "--admin", env=env) == {"user": "ops", "admin": True, "replica": False,
                                                                 "acls": []}  # fmt: skip
    assert answer("user", "add", "reader", env=env)["admin"] is False
    assert answer("user", "passwd", "reader", env=env)["user"] == "reader"
    assert answer("user", "replica", "reader", env=env)["replica"] is True
    assert answer("user", "admin", "ops", "--revoke", env=env)["admin"] is False
    assert answer("user", "admin", "ops", env=env)["admin"] is True
    entry = answer("acl", "add", "-u", "reader", "-t", "pub.*", "--op", "consume", env=env)
    assert entry["acls"] == [{"resource": "topic", "pattern": "pub.*", "ops": ["consume"]}]
    entry = answer("acl", "add", "-u", "reader", "-g", "g1", "--op", "join", "--op", "commit", env=env)
    assert entry["acls"][1] == {"resource": "group", "pattern": "g1", "ops": ["commit", "join"]}
    assert answer("acl", "list", env=env) == [
        {"user": "ops", "resource": "admin", "pattern": "*", "ops": ["all"]},
        {"user": "reader", "resource": "topic", "pattern": "pub.*", "ops": ["consume"]},
        {"user": "reader", "resource": "group", "pattern": "g1", "ops": ["commit", "join"]},
    ]
    entry = answer("acl", "remove", "-u", "reader", "-g", "g1", "--op", "commit", env=env)
    assert entry["acls"][1]["ops"] == ["join"]
    assert [u["user"] for u in answer("user", "list", env=env)] == ["ops", "reader"]
    assert answer("user", "remove", "reader", env=env) == {"user": "reader", "removed": True}
    # without --json: the confirmation on stderr, nothing on stdout
    res = run("user", "add", "third", env=env)
    assert res.exit_code == 0 and res.stdout == "" and "user third added" in res.stderr


def test_equeue_brokers_is_the_broker_when_the_flag_is_absent(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("via-env", 1)
    # only the variable: the command reaches that broker (a routed and a leader command)
    assert [t["name"] for t in answer("topic", "list", env={"EQUEUE_BROKERS": addr})] == ["via-env"]
    assert answer("topic", "describe", "via-env", env={"EQUEUE_BROKERS": addr})["info"]["name"] == "via-env"
    assert answer("cluster", "status", env={"EQUEUE_BROKERS": addr})["health"][0]["reachable"] is True
    # the flag wins over the variable, both ways
    assert [t["name"] for t in answer("topic", "list", "-b", addr, env={"EQUEUE_BROKERS": NOWHERE})] == ["via-env"]
    res = run("topic", "list", "--broker", NOWHERE, env={"EQUEUE_BROKERS": addr})
    assert res.exit_code == 1 and "127.0.0.1:1" in res.stderr, res.output
    # the help says where the address comes from
    assert "EQUEUE_BROKERS" in run("topic", "list", "--help").stdout
