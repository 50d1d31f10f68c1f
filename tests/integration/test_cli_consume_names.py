"""Wrong names in ``equeue group`` and ``equeue consume``: one ``error:`` line and exit
1, or (a topic that may still be created) a line saying what the consumer waits for.

Before, ``group describe`` of an unknown group or an invalid name printed an empty
table and exited 0, and ``consume`` of a missing topic waited without a word."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.cli import app
from equeue.client import Client
from equeue.errors import InvalidName
from tests.conftest import wait_until_sync
from tests.integration.cli_child import Child, consume

runner = CliRunner()


def _error_line(args: list[str]) -> str:
    """Run the CLI; it must fail with one ``error:`` line (exit 1). That line."""
    res = runner.invoke(app, args)
    assert res.exit_code == 1, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return lines[0]


def test_group_describe_of_an_unknown_or_invalid_group(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    assert "no such group 'nobody'" in _error_line(["group", "describe", "nobody", "-b", b])
    assert "no such group 'nobody'" in _error_line(["group", "describe", "nobody", "--json", "-b", b])
    assert "invalid group name 'bad name!'" in _error_line(["group", "describe", "bad name!", "-b", b])
    assert "invalid group name" in _error_line(["group", "reset-offsets", "a/b", "--topic", "t", "--to", "earliest",
                                                "-b", b])  # fmt: skip
    with Client(b) as c, pytest.raises(InvalidName):  # the broker checks it too (DESCRIBE_GROUP)
        c.describe_group("bad name!")
    # a group known only by its committed offsets is described (no member)
    with Client(b) as c:
        c.create_topic("t", 1)
        c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("m"))]))
        c.commit_offset("known", "t", 0, 1)
    res = runner.invoke(app, ["group", "describe", "known", "-b", b])
    assert res.exit_code == 0 and "0 live member(s)" in res.stdout, res.output


def test_consume_of_a_missing_topic_says_what_it_waits_for(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    # with --exit-at-end there is nothing to read: an error
    r = consume("nothere", "-g", "g", "-e", "-b", b)
    assert r.returncode == 1 and r.stderr.strip() == "error: no topic 'nothere': nothing to read (--exit-at-end)"
    r = consume("bad/topic", "-g", "g", "-b", b)
    assert r.returncode == 1 and r.stderr.startswith("error: invalid topic name"), r.stderr
    # without an end condition it waits (the broker may auto-create it), and says so;
    # a produce creates it and the message is printed
    child = Child("-m", "equeue", "consume", "later", "-g", "g", "--from", "earliest", "-b", b)
    try:
        wait_until_sync(lambda: any("does not exist (yet)" in line for line in child.err), timeout=60,
                        what="the note on stderr")  # fmt: skip
        with Client(b) as c:
            c.produce(wire.ProduceRequest("later", 0, [wire.encode_entry(Message("hello"))]))
        wait_until_sync(lambda: any(line.endswith(" hello") for line in child.out), timeout=60,
                        what="the message printed once the topic exists")  # fmt: skip
        child.interrupt()
        assert child.finish() == 0, child.err
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    assert child.err[0].startswith("topic 'later' does not exist (yet): waiting until it is created"), child.err
