"""Deleting a consumer group (DELETE_GROUP, ``equeue group delete``), and ``equeue
consume`` without ``--group``: a temporary group that commits nothing and leaves
nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, control, wire
from equeue.broker import EmbeddedBroker, open_broker
from equeue.cli import app
from equeue.cli.consume_cmd import TEMP_GROUP_PREFIX
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.errors import GroupHasMembers, GroupNotFound, InvalidName
from tests.conftest import make_config, wait_until_sync
from tests.integration.cli_child import Child, consume

runner = CliRunner()


def _topic(b: str, name: str, queues: int, per_queue: int) -> None:
    with Client(b) as c:
        c.create_topic(name, queues)
        for q in range(queues):
            c.produce(wire.ProduceRequest(name, q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(per_queue)]))


def test_consume_without_a_group_leaves_nothing_behind(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    _topic(b, "t", 2, 3)
    with Client(b) as c:
        before = {g.group for g in c.list_groups()}
    # while it runs, its temporary group is there (one member)...
    child = Child("-m", "equeue", "consume", "t", "--from", "earliest", "-b", b)
    try:
        wait_until_sync(lambda: len(child.out) == 6, timeout=60, what="the 6 messages printed")
        with Client(b) as c:
            (running,) = [g for g in c.list_groups() if g.group not in before]
        assert running.group.startswith(TEMP_GROUP_PREFIX) and running.members == 1
        child.interrupt()
        assert child.finish() == 0, child.err
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    # ... and gone once it left: no member, no committed offset, no state
    with Client(b) as c:
        assert {g.group for g in c.list_groups()} == before
        assert c.query_offset(running.group, "t", 0) == -1
    # every run starts at --from again (nothing committed)
    for _ in range(2):
        r = consume("t", "--from", "earliest", "-e", "-b", b)
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 6, r.stderr
    with Client(b) as c:
        assert {g.group for g in c.list_groups()} == before


def _cli(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_group_delete(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    _topic(b, "t", 2, 3)
    r = consume("t", "-g", "idle", "--from", "earliest", "-e", "-b", b)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 6, r.stderr
    with Client(b) as c:
        assert [c.query_offset("idle", "t", q) for q in range(2)] == [3, 3]

    # an idle group: its offsets go, and it is gone
    code, out, err = _cli("group", "delete", "idle", "-b", b)
    assert code == 0 and out.strip() == "deleted group idle: 2 committed offset(s)", (out, err)
    with Client(b) as c:
        assert [c.query_offset("idle", "t", q) for q in range(2)] == [-1, -1]
        assert "idle" not in {g.group for g in c.list_groups()}
    code, _, err = _cli("group", "describe", "idle", "-b", b)
    assert code == 1 and "no such group 'idle'" in err
    # deleting again: no such group (one line)
    code, _, err = _cli("group", "delete", "idle", "-b", b)
    assert code == 1 and err.strip() == (
        "error: no such group 'idle': no broker group has a live member or a committed offset of it"
    )
    code, _, err = _cli("group", "delete", "no such", "-b", b)
    assert code == 1 and "invalid group name" in err
    # it starts afresh (from --from)
    r = consume("t", "-g", "idle", "--from", "earliest", "-e", "-b", b)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 6, r.stderr

    # a group with a live member: refused, nothing deleted; --force deletes its offsets
    with Consumer(b, "live", "t", start_from="earliest", heartbeat_interval=0.2) as con:
        next(iter(con))  # joined, consuming (the message goes back: not done)
        con.commit()
        with Client(b) as c:
            wait_until_sync(lambda: c.query_offset("live", "t", 0) >= 0 or c.query_offset("live", "t", 1) >= 0,
                            what="a committed offset")  # fmt: skip
            held = [c.query_offset("live", "t", q) for q in range(2)]
        code, _, err = _cli("group", "delete", "live", "-b", b)
        assert code == 1 and "group 'live' has 1 live member(s)" in err and "--force" in err, err
        with Client(b) as c:
            assert [c.query_offset("live", "t", q) for q in range(2)] == held
        code, out, err = _cli("group", "delete", "live", "--force", "-b", b)
        assert code == 0 and "deleted group live" in out and "1 live member(s) stay" in err, (out, err)
        with Client(b) as c:
            assert [c.query_offset("live", "t", q) for q in range(2)] == [-1, -1]
            assert len(c.describe_group("live").members) == 1


async def test_delete_group_request(tmp_path: Path) -> None:
    """DELETE_GROUP at one broker: coded refusals; the deletes are durable (a broker
    started again on the same data has no offset of the group)."""
    cfg = make_config(tmp_path / "data")
    with trio.fail_after(60):
        async with open_broker(cfg) as br, AsyncClient(br.address) as c:
            await c.create_topic("t", 3)
            for q in range(3):
                await c.commit_offset("g", "t", q, 0)
                await c.commit_offset("keep", "t", q, 0)
            with pytest.raises(GroupNotFound):
                await c.call(control.DeleteGroup("nobody"), control.DeleteGroupAnswer)
            with pytest.raises(InvalidName):
                await c.call(control.DeleteGroup("a b"), control.DeleteGroupAnswer)
            async with AsyncConsumer(br.address, "g", "t") as member:
                with pytest.raises(GroupHasMembers):
                    await c.call(control.DeleteGroup("g"), control.DeleteGroupAnswer)
                ans = await c.call(control.DeleteGroup("g", force=True), control.DeleteGroupAnswer)
                assert (ans.offsets, ans.members) == (3, 1)
                await member.aclose()
            ans = await c.call(control.DeleteGroup("keep"), control.DeleteGroupAnswer)
            assert (ans.group, ans.offsets, ans.members) == ("keep", 3, 0)
            assert [g.group for g in await c.list_groups()] == []
        async with open_broker(cfg) as br, AsyncClient(br.address) as c:
            assert [await c.query_offset(g, "t", q) for g in ("g", "keep") for q in range(3)] == [-1] * 6
            assert await c.list_groups() == []
    assert json.loads(json.dumps(control.encode(ans).decode()))  # the answer is plain JSON
