"""The issue's security probes, replayed against a broker with a users file (real
TCP): without authentication nobody can delete a topic, reset a group or commit
past a queue's end; an authenticated user without the rights cannot either; and a
user without join rights cannot hijack a group (20 fake heartbeating members),
so the real consumer keeps consuming.

Each probe fails without the checks: with the broker started without
``users_file`` the same frames delete the topic, move the offsets and freeze the
real consumer (checked by hand when this file was written)."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from equeue import Message, control, wire
from equeue.acl import Acl, UsersFile
from equeue.broker import Broker, open_broker
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.errors import ErrorCode, NotAuthorized
from equeue.protocol import RequestCode
from equeue.security import ClientSecurity
from equeue.users import make_user, update_users_file
from tests.conftest import make_config, wait_until

ROOT = ClientSecurity.from_values(username="root", password="root-pw")
ALICE = ClientSecurity.from_values(username="alice", password="alice-pw")
MALLORY = ClientSecurity.from_values(username="mallory", password="mallory-pw")


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    users = tmp_path / "users.json"

    def setup(_: UsersFile) -> UsersFile:
        return (
            UsersFile()
            .with_user(make_user("root", "root-pw", admin=True))
            .with_user(make_user("alice", "alice-pw", acls=[Acl("topic", "jobs", ["produce", "consume"]),
                                                            Acl("group", "workers", ["join", "commit"])]))
            # mallory may read the topic, but has no right on the group
            .with_user(make_user("mallory", "mallory-pw", acls=[Acl("topic", "jobs", ["consume"])]))
            # ops administers every topic (admin on *), but is not in the admin role
            .with_user(make_user("ops", "ops-pw", acls=[Acl("topic", "*", ["admin"])]))
        )  # fmt: skip

    update_users_file(users, setup)
    async with open_broker(make_config(tmp_path / "data", users_file=users, member_expiry=3.0)) as b:
        yield b


def frame(code: int, rid: int, req: object) -> bytes:
    payload = control.encode(req)
    return struct.pack(">IBHI", 7 + len(payload), 0, code, rid) + payload


def unauthenticated(port: int, frames: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"EQMQ" + struct.pack(">HH", 1, 0) + frames)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


async def test_unauthenticated_client_cannot_delete_reset_or_commit_past_the_end_nor_delete_a_group(broker: Broker) -> None:
    with trio.fail_after(30):
        async with AsyncClient(broker.address, security=ROOT) as root:
            await root.create_topic("jobs", 1)
            await root.produce(wire.ProduceRequest("jobs", 0, [wire.encode_entry(Message("j"))] * 3))
            await root.commit_offset("workers", "jobs", 0, 2)
        probes = (
            frame(RequestCode.DELETE_TOPIC, 1, control.DeleteTopic("jobs"))
            + frame(RequestCode.RESET_OFFSETS, 2, control.ResetOffsets("workers", "jobs", "earliest", force=True))
            + frame(RequestCode.COMMIT_OFFSET, 3, control.CommitOffset("workers", "jobs", 0, 123456))
            + frame(RequestCode.DELETE_GROUP, 4, control.DeleteGroup("workers", force=True))
        )
        out = await trio.to_thread.run_sync(unauthenticated, broker.port, probes)
        assert out[:8] == b"EQMQ" + struct.pack(">HH", 1, ErrorCode.AUTH_REQUIRED)
        # the first request is refused, then the connection closes: nothing ran
        _, kind, code, rid = struct.unpack_from(">IBHI", out, 8)
        assert (kind, code, rid) == (1, ErrorCode.AUTH_REQUIRED, 1)
        # an authenticated user without the rights is refused each probe too
        async with AsyncClient(broker.address, security=MALLORY) as m:
            for call, op in (
                (m.delete_topic("jobs"), "admin"),
                (m.reset_offsets("workers", "jobs", "earliest", force=True), "reset"),
                (m.commit_offset("workers", "jobs", 0, 123456), "commit"),
                (m.call(control.DeleteGroup("workers", force=True), control.DeleteGroupAnswer), "reset"),
            ):
                with pytest.raises(NotAuthorized, match=f"no '{op}' permission"):
                    await call
        async with AsyncClient(broker.address, security=ROOT) as root:
            assert [t.name for t in await root.list_topics()] == ["jobs"]
            assert await root.query_offset("workers", "jobs", 0) == 2


async def test_pause_and_resume_need_admin_on_the_topic_and_reset_on_the_group(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """PAUSE_TOPIC / RESUME_TOPIC need ``admin`` on the topic, PAUSE_GROUP / RESUME_GROUP
    ``reset`` on the group: refused without authentication, refused to users with
    other rights (produce, consume, join, commit), allowed to the admin role; each
    attempt is an audit line."""
    caplog.set_level(logging.INFO, "equeue.audit")
    with trio.fail_after(30):
        async with AsyncClient(broker.address, security=ROOT) as root:
            await root.create_topic("jobs", 1)
        probes = (
            frame(RequestCode.PAUSE_TOPIC, 1, control.PauseTopic("jobs"))
            + frame(RequestCode.PAUSE_GROUP, 2, control.PauseGroup("workers"))
        )
        out = await trio.to_thread.run_sync(unauthenticated, broker.port, probes)
        _, kind, code, rid = struct.unpack_from(">IBHI", out, 8)
        assert (kind, code, rid) == (1, ErrorCode.AUTH_REQUIRED, 1)
        for who in (MALLORY, ALICE):
            async with AsyncClient(broker.address, security=who) as m:
                for call, op in (
                    (m.pause_topic("jobs"), "admin"),
                    (m.resume_topic("jobs"), "admin"),
                    (m.pause_group("workers"), "reset"),
                    (m.resume_group("workers"), "reset"),
                ):
                    with pytest.raises(NotAuthorized, match=f"no '{op}' permission"):
                        await call
        ops = ClientSecurity.from_values(username="ops", password="ops-pw")
        async with AsyncClient(broker.address, security=ops) as o:  # admin on every topic, no group right
            assert (await o.pause_topic("jobs")).changed
            with pytest.raises(NotAuthorized, match="no 'reset' permission"):
                await o.pause_group("workers")
        async with AsyncClient(broker.address, security=ROOT) as root:
            assert (await root.pause_group("workers")).changed
            assert [t.paused for t in await root.list_topics()] == [True]
            assert (await root.describe_group("workers")).paused
    audits = [r.getMessage() for r in caplog.records if r.name == "equeue.audit"]
    assert any("action=pause_topic" in a and "user=ops" in a and "outcome=ok" in a for a in audits), audits
    assert any("action=PAUSE_GROUP" in a and "user=mallory" in a and "outcome=denied" in a for a in audits), audits
    assert any("action=pause_group" in a and "user=root" in a and "resource=group:workers" in a for a in audits)


async def consume_all(address: str, got: list[str]) -> None:
    """Produce 200 messages as alice and consume them in group ``workers``."""
    async with AsyncConsumer(
        address, "workers", "jobs", security=ALICE, start_from="earliest",
        heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=0.5,
    ) as con, AsyncClient(address, security=ALICE) as producer:  # fmt: skip
        bodies = [f"m{i}" for i in range(200)]
        await producer.produce(wire.ProduceRequest("jobs", 0, [wire.encode_entry(Message(b)) for b in bodies]))

        async def handler(m: Message) -> None:
            got.append(m.text)
            if len(got) == len(bodies):
                con.stop()

        await con.run(handler)


async def test_without_join_rights_twenty_fake_members_cannot_hijack_the_group(broker: Broker) -> None:
    with trio.fail_after(60):
        async with AsyncClient(broker.address, security=ROOT) as root:
            await root.create_topic("jobs", 1)
        got: list[str] = []
        refusals = accepted = 0
        async with AsyncClient(broker.address, security=MALLORY) as attacker, trio.open_nursery() as n:

            async def fake_member(i: int) -> None:
                nonlocal refusals, accepted
                while True:  # heartbeat like a live member grabbing the queue
                    try:
                        await attacker.heartbeat(
                            control.Heartbeat("workers", f"fake-{i}", ["jobs"], acquire=["jobs/0"])
                        )
                        accepted += 1  # counted once answered (the test cancels some mid-call)
                    except NotAuthorized:
                        refusals += 1
                    await trio.sleep(0.05)

            for i in range(20):
                n.start_soon(fake_member, i)
            await wait_until(lambda: refusals + accepted >= 40, what="the fake members heartbeat")
            with trio.move_on_after(30):  # without ACLs the fake members hold the queue: nothing arrives
                await consume_all(broker.address, got)
            n.cancel_scope.cancel()
        assert len(got) == 200, f"the real consumer got {len(got)} of 200 messages in 30 s"
        assert sorted(got) == sorted(f"m{i}" for i in range(200))
        assert accepted == 0 and refusals >= 40, f"{accepted} fake heartbeats were accepted, {refusals} refused"
        async with AsyncClient(broker.address, security=ROOT) as root:
            members = (await root.describe_group("workers")).members
            assert not any(m.consumer_id.startswith("fake-") for m in members)


async def test_internal_topics_are_altered_or_deleted_by_the_admin_role_only(broker: Broker) -> None:
    """``admin`` on every topic name does not reach the internal ones (%RETRY%, %DLQ%):
    only the admin role may alter or delete them, and nobody produces into them."""
    ops = ClientSecurity.from_values(username="ops", password="ops-pw")
    with trio.fail_after(30):
        async with AsyncClient(broker.address, security=ROOT) as root:
            await root.create_topic("jobs", 1)
            await root.produce(wire.ProduceRequest("jobs", 0, [wire.encode_entry(Message("j"))]))
            await root.send_back("workers", "jobs", 0, 0, 16, 16)  # dead-letters it: %DLQ%workers exists
        async with AsyncClient(broker.address, security=ops) as o:
            await o.alter_topic("jobs", queues=2)  # its own admin right works on a regular topic
            for call in (o.alter_topic("%DLQ%workers", queues=2), o.delete_topic("%DLQ%workers")):
                with pytest.raises(NotAuthorized, match="topic '%DLQ%workers'"):
                    await call
            with pytest.raises(NotAuthorized):
                await o.produce(wire.ProduceRequest("%DLQ%workers", 0, [wire.encode_entry(Message("forged"))]))
        async with AsyncClient(broker.address, security=ROOT) as root:
            assert (await root.queue_offsets("%DLQ%workers", 0)).max_offset == 1  # nothing forged
            await root.delete_topic("%DLQ%workers")  # the admin role may

