"""Manual assignment with a group, against a real broker (docs/consumer.md, "Manual
assignment"): a consumer made with a group and no topics reads the queues ``assign()``
gives it from the group's committed offsets, commits to the group (periodically, on
``commit()``, when a queue is no longer assigned, on close), never becomes a member, is
held by an operator's pause of the group, and refuses what does not fit (subscription with assign, an ephemeral group, listeners)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import EmbeddedBroker, open_broker
from equeue.client import AsyncClient, Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.errors import ConfigError
from tests.conftest import make_config, wait_until

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=60.0, pull_hold=0.5,
)  # fmt: skip


def entries(prefix: str, n: int, start: int = 0) -> list[bytes]:
    return [wire.encode_entry(Message(f"{prefix}{i}")) for i in range(start, start + n)]


def poll_until(con: Consumer, n: int) -> list[Message]:
    """Poll until ``n`` messages came (AssertionError after 10 s)."""
    out: list[Message] = []
    deadline = time.monotonic() + 10
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} messages"
        out += con.poll(1.0, max_messages=n - len(out))
    return out


def test_sync_assign_with_a_group_starts_at_and_commits_to_its_offsets(
    embedded_broker: EmbeddedBroker,
) -> None:
    addr = embedded_broker.address
    with Client(addr) as c:
        c.create_topic("mg", 2)
        c.produce(wire.ProduceRequest("mg", 0, entries("zero", 5)))
        c.produce(wire.ProduceRequest("mg", 1, entries("one", 3)))
        c.commit_offset("gmg", "mg", 0, 2)  # the group has read queue 0 up to 2
        with pytest.raises(ConfigError, match="ephemeral"):
            Consumer(addr, "gmg#ephemeral")
        with pytest.raises(ConfigError, match="rebalance"):
            Consumer(addr, "gmg", on_revoked=lambda qs: None)
        with pytest.raises(ConfigError, match="mode"):
            Consumer(addr, "gmg", mode="broadcast")
        with (
            Consumer(addr, "gmg-sub", "mg", **FAST) as member,
            pytest.raises(ConfigError, match="do not mix"),
        ):
            member.assign([("mg", 0)])  # subscribed: its queues come from the rebalance
        with Consumer(addr, "gmg", start_from="earliest", **FAST) as con:
            assert con.manual and con.group == "gmg"
            con.assign([("mg", 0), ("mg", 1)])
            got = poll_until(con, 6)
            assert sorted(m.text for m in got) == [
                "one0",
                "one1",
                "one2",
                "zero2",
                "zero3",
                "zero4",
            ]
            con.commit()  # to the group, as no member
            assert (c.query_offset("gmg", "mg", 0), c.query_offset("gmg", "mg", 1)) == (5, 3)
            d = c.describe_group("gmg")
            assert d.members == []  # never joined: no heartbeat, no lease
            assert {(q.queue_id, q.committed, q.owner) for q in d.queues} == {
                (0, 5, None),
                (1, 3, None),
            }
            con.seek("mg", 0, 1)  # back: a commit without a member id sets the offset as given
            assert [m.text for m in poll_until(con, 1)] == ["zero1"]
            con.commit()
            assert c.query_offset("gmg", "mg", 0) == 2
            assert [m.text for m in poll_until(con, 1)] == ["zero2"]  # done at the close
        assert c.query_offset("gmg", "mg", 0) == 3  # the close committed the last poll
        c.produce(wire.ProduceRequest("mg", 0, entries("zero", 1, 5)))
        with Consumer(
            addr, "gmg", start_from="earliest", **FAST
        ) as again:  # another run goes on from there
            again.assign([("mg", 0)])
            assert [m.text for m in poll_until(again, 3)] == ["zero3", "zero4", "zero5"]
            again.commit()
            c.pause_group("gmg")  # an operator's pause of the group holds its pulls too
            c.produce(wire.ProduceRequest("mg", 0, entries("zero", 1, 6)))
            assert again.poll(0.5) == []
            c.resume_group("gmg")
            assert [m.text for m in poll_until(again, 1)] == ["zero6"]
        assert c.query_offset("gmg", "mg", 0) == 7
        assert c.describe_group("gmg").members == []


async def test_trio_assign_with_a_group_commits_a_queue_no_longer_assigned(tmp_path: Path) -> None:
    """A handler-run consumer with a group: a queue dropped by ``assign()`` is committed
    once its handlers finished (no periodic commit meanwhile: commit_interval is long);
    the queues still assigned are committed on close."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("mt", 2)
                await c.produce(wire.ProduceRequest("mt", 0, entries("zero", 4)))
                await c.produce(wire.ProduceRequest("mt", 1, entries("one", 3)))
                await c.commit_offset("gmt", "mt", 1, 1)
                seen: list[str] = []

                async def handler(m: Message) -> None:
                    seen.append(m.text)

                async with AsyncConsumer(b.address, "gmt", start_from="earliest", **FAST) as con:
                    con.assign([("mt", 0), ("mt", 1)])
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(con.run, handler)
                        await wait_until(lambda: len(seen) == 6)
                        assert sorted(seen) == ["one1", "one2", "zero0", "zero1", "zero2", "zero3"]
                        con.assign(
                            [("mt", 0)]
                        )  # queue 1 is dropped: what was done of it is committed

                        async def queue_1_committed() -> bool:
                            return await c.query_offset("gmt", "mt", 1) == 3

                        await wait_until(queue_1_committed)
                        assert (
                            await c.query_offset("gmt", "mt", 0) == -1
                        )  # not yet: no periodic commit
                        con.stop()
                assert await c.query_offset("gmt", "mt", 0) == 4  # the close commits
                assert (await c.describe_group("gmt")).members == []


async def test_a_queue_assigned_again_before_its_commit_never_moves_the_offset_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue dropped by ``assign()`` is committed once its handlers finish; when it is
    assigned again meanwhile, its new run starts from the group's offset and commits
    from there, and the dropped run's older position is not committed (it would move
    the group's offset back)."""
    caplog.set_level(logging.INFO, logger="equeue.consumer")
    async with open_broker(make_config(tmp_path / "data")) as b:
        with trio.fail_after(30):
            async with AsyncClient(b.address) as c:
                await c.create_topic("ma", 1)
                await c.produce(wire.ProduceRequest("ma", 0, entries("m", 3)))
                gate, held = trio.Event(), trio.Event()
                seen: list[str] = []

                async def handler(m: Message) -> None:
                    if m.text == "m1" and not held.is_set():  # the first run's m1 waits
                        held.set()
                        await gate.wait()
                    seen.append(m.text)

                async with AsyncConsumer(b.address, "gma", start_from="earliest", **FAST) as con:
                    con.assign([("ma", 0)])
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(con.run, handler)
                        await held.wait()  # m0 done, m1 in the first run's handler
                        con.assign([])  # dropped: committed once m1's handler returns
                        con.assign([("ma", 0)])  # again: a new run from the group's offset

                        async def new_run_committed() -> bool:  # m0, m1, m2 done by the new run
                            await con.commit()
                            return await c.query_offset("gma", "ma", 0) == 3

                        await wait_until(new_run_committed)
                        gate.set()  # the first run's m1 finishes: its position (2) is older
                        await wait_until(lambda: "was assigned again" in caplog.text)
                        assert await c.query_offset("gma", "ma", 0) == 3
                        con.stop()
                assert await c.query_offset("gma", "ma", 0) == 3
