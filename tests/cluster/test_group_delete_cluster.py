"""``equeue group delete`` in a cluster: a REAL etcd (the ``etcd`` fixture) and three
broker groups (one broker each, in this test's trio loop, over TCP). A group's offsets
live with each queue's owner group and its state at every group its members heartbeat
to: the delete reaches every broker group (DELETE_GROUP at each, as ``group describe``
asks each), and a group with a live member at any broker group is refused everywhere."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import trio
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import Broker
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from tests.cluster.conftest import open_groups

GROUPS = ("g1", "g2", "g3")


def cli(*args: str) -> tuple[int, str, str]:
    """The ``equeue`` CLI in this thread (call it through trio.to_thread: it runs its own loop)."""
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def offsets_of(b: Broker, group: str) -> dict[tuple[str, int], int]:
    return b.store.group_offsets(group)


async def test_group_delete_reaches_every_broker_group(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            brokers = await open_groups(stack, tmp_path, etcd, GROUPS, member_expiry=6.0)
            addresses = ",".join(b.address for b in brokers.values())
            admin = await stack.enter_async_context(AsyncClient(brokers["g1"].address))
            await admin.create_topic("t", 6)
            owners = (await admin.get_routes(["t"])).topics[0].owners
            assert Counter(owners) == {"g1": 2, "g2": 2, "g3": 2}
            for q, owner in enumerate(owners):  # each queue's messages at its owner
                async with AsyncClient(brokers[owner].address) as c:
                    await c.produce(wire.ProduceRequest("t", q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(3)]))

            # a group that read everything: offsets at every broker group
            code, out, err = await trio.to_thread.run_sync(
                cli, "consume", "t", "-g", "cg", "--from", "earliest", "-e", "-b", addresses
            )
            assert code == 0 and len(out.splitlines()) == 18, err
            for g, b in brokers.items():
                assert offsets_of(b, "cg") == {("t", q): 3 for q in range(6) if owners[q] == g}

            # a live member: refused, nothing deleted anywhere
            async with AsyncConsumer(addresses, "cg", "t", heartbeat_interval=0.5) as member:
                code, _, err = await trio.to_thread.run_sync(cli, "group", "delete", "cg", "-b", brokers["g2"].address)
                assert code == 1 and "live member" in err, err
                assert all(len(offsets_of(b, "cg")) == 2 for b in brokers.values())
                await member.aclose()

            # idle: deleted at every broker group, asked at any one of them
            code, out, err = await trio.to_thread.run_sync(cli, "group", "delete", "cg", "-b", brokers["g3"].address)
            assert code == 0 and out.strip() == "deleted group cg: 6 committed offset(s) at 3 broker groups", (out, err)
            for b in brokers.values():
                assert offsets_of(b, "cg") == {}
                async with AsyncClient(b.address) as c:
                    assert "cg" not in {g.group for g in await c.list_groups()}
            code, _, err = await trio.to_thread.run_sync(cli, "group", "describe", "cg", "-b", addresses)
            assert code == 1 and "no such group 'cg'" in err
