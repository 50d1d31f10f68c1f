"""Ephemeral consumer groups (``<name>#ephemeral``, docs/consumer.md "Ephemeral
groups"), on a real broker: offsets in the broker's memory only (never in the store,
so not after a restart), the group gone with its last member (leave or expiry) and
its lag series with it, SEND_BACK refused, a failed message retried in place then
dropped."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, control, wire
from equeue.broker import Broker, open_broker
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.errors import ConfigError, EphemeralGroup, GroupHasMembers, GroupNotFound
from tests.conftest import make_config, wait_until

G = "e#ephemeral"


def cli(*args: str) -> tuple[int, str, str]:
    """The ``equeue`` CLI in this thread (call it through trio.to_thread: it runs its own loop)."""
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


async def fill(c: AsyncClient, topic: str, queues: int, per_queue: int) -> None:
    await c.create_topic(topic, queues)
    for q in range(queues):
        await c.produce(wire.ProduceRequest(topic, q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(per_queue)]))


def stored(b: Broker, group: str) -> dict[tuple[str, int], int]:
    """The group's offsets in the broker's store (its published view)."""
    return b.store.group_offsets(group)


async def lag_series(http: httpx.AsyncClient, group: str) -> list[str]:
    text = (await http.get("/metrics", params={"queues": "1"})).text
    return [line for line in text.splitlines() if "_lag{" in line and f'group="{group}"' in line]


async def test_an_ephemeral_group_lives_in_memory_and_goes_with_its_last_member(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            open_broker(make_config(tmp_path / "d", http_port=0)) as b,
            AsyncClient(b.address) as c,
        ):
            http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}")
            await fill(c, "t", 2, 3)
            got: list[str] = []

            async def handler(m: Message) -> None:
                got.append(m.body.decode())

            async with AsyncConsumer(b.address, G, "t", start_from="earliest", heartbeat_interval=0.2) as con:
                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_until(lambda: len(got) == 6, what="the 6 messages handled")
                    await con.commit()
                    # commits, queries and describe work as for any group...
                    assert [await c.query_offset(G, "t", q) for q in range(2)] == [3, 3]
                    (summary,) = await c.list_groups()
                    assert (summary.group, summary.members, summary.ephemeral) == (G, 1, True)
                    d = await c.describe_group(G)
                    assert d.ephemeral and [(q.committed, q.lag) for q in d.queues] == [(3, 0), (3, 0)]
                    code, out, _ = await trio.to_thread.run_sync(cli, "group", "describe", G, "-b", b.address)
                    assert code == 0 and f"group {G} (ephemeral" in out, out
                    code, out, _ = await trio.to_thread.run_sync(cli, "group", "list", "-b", b.address)
                    assert code == 0 and "ephemeral" in out and "yes" in out, out
                    # ... its lag is in /metrics while it lives ...
                    await wait_until(lambda: lag_series(http, G), what="the group's lag series")
                    assert len(await lag_series(http, G)) == 3  # per topic, and per queue (2)
                    # ... and nothing of it is in the store
                    assert stored(b, G) == {}
                    n.cancel_scope.cancel()
            # its last member left: gone, offsets, lag series and all
            assert await c.list_groups() == []
            assert [await c.query_offset(G, "t", q) for q in range(2)] == [-1, -1]
            code, _, err = await trio.to_thread.run_sync(cli, "group", "describe", G, "-b", b.address)
            assert code == 1 and f"no such group {G!r}" in err, err
            await wait_until(lambda: _no(lag_series(http, G)), what="the group's lag series gone")
            await http.aclose()
            # equeue consume --group NAME#ephemeral: a new group, from --from, gone after
            code, out, err = await trio.to_thread.run_sync(
                cli, "consume", "t", "--group", G, "--from", "earliest", "-e", "-b", b.address
            )
            assert code == 0 and len(out.splitlines()) == 6, (out, err)
            assert await c.list_groups() == []


async def _no(series: object) -> bool:
    return not await series  # type: ignore[misc]


async def test_expiry_admin_requests_and_restart(tmp_path: Path) -> None:
    """The group goes when its last member expires; reset and delete need a live
    member (and --force); SEND_BACK is refused; a restart forgets a live group."""
    cfg = make_config(tmp_path / "d", member_expiry=1.0)
    with trio.fail_after(60):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await fill(c, "t", 1, 5)
            hb = control.Heartbeat(G, "m1", ["t"], acquire=["t/0"])
            assert (await c.heartbeat(hb)).held == ["t/0"]
            await c.commit_offset(G, "t", 0, 2, "m1")
            await c.commit_offset(G, "t", 0, 1, "m1")  # a member's commit never moves it back
            assert await c.query_offset(G, "t", 0) == 2 and stored(b, G) == {}
            # no member: no such group (a commit cannot make one)
            with pytest.raises(GroupNotFound):
                await c.commit_offset("other#ephemeral", "t", 0, 1)
            with pytest.raises(EphemeralGroup):
                await c.send_back(G, "t", 0, 0, 0)
            # reset and delete: as for any group with a live member (--force needed)
            with pytest.raises(GroupHasMembers):
                await c.reset_offsets(G, "t", control.ResetTarget.LATEST)
            assert await c.reset_offsets(G, "t", control.ResetTarget.LATEST, force=True) == {0: 5}
            assert await c.query_offset(G, "t", 0) == 5 and stored(b, G) == {}
            with pytest.raises(GroupHasMembers):
                await c.call(control.DeleteGroup(G), control.DeleteGroupAnswer)
            ans = await c.call(control.DeleteGroup(G, force=True), control.DeleteGroupAnswer)
            assert (ans.offsets, ans.members) == (1, 1) and await c.query_offset(G, "t", 0) == -1
            await c.commit_offset(G, "t", 0, 3, "m1")
            # silence: the member expires (1 s), and the group with it
            await wait_until(lambda: _no(c.list_groups()), timeout=15, what="the group expired")
            assert await c.query_offset(G, "t", 0) == -1
            with pytest.raises(GroupNotFound):
                await c.call(control.DeleteGroup(G, force=True), control.DeleteGroupAnswer)
            with pytest.raises(GroupNotFound):
                await c.reset_offsets(G, "t", control.ResetTarget.EARLIEST, force=True)
            # a live member with a commit when the broker stops...
            await c.heartbeat(control.Heartbeat(G, "m2", ["t"], acquire=["t/0"]))
            await c.commit_offset(G, "t", 0, 4, "m2")
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            # ... is not there after the restart: the group does not exist until a member joins
            assert await c.list_groups() == [] and await c.query_offset(G, "t", 0) == -1


@pytest.mark.parametrize("orderly", [False, True])
async def test_a_failed_message_is_retried_in_place_then_dropped(broker: Broker, orderly: bool) -> None:
    with trio.fail_after(60):
        async with AsyncClient(broker.address) as c:
            await fill(c, "t", 1, 3)
            tries: list[str] = []

            async def handler(m: Message) -> None:
                tries.append(m.body.decode())
                if m.body == b"0-1":
                    raise ValueError("always fails")

            async with AsyncConsumer(
                broker.address, G, "t", start_from="earliest", max_reconsume_times=2, retry_delays=[0.01],
                orderly=orderly,
            ) as con:  # fmt: skip
                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_until(lambda: con.statistics().dropped == 1, what="the failing message dropped")
                    await con.commit()
                    assert await c.query_offset(G, "t", 0) == 3  # the queue moved on past it
                    n.cancel_scope.cancel()
            assert sorted(tries) == ["0-0", "0-1", "0-1", "0-1", "0-2"]  # 1 + max_reconsume_times tries
            assert [t.name for t in await c.list_topics()] == ["t"]  # no retry or dead-letter topic
    with pytest.raises(ConfigError, match="ephemeral"):
        AsyncConsumer(broker.address, G, "t", mode="broadcast")
