"""Authentication (SCRAM-SHA-256 in the handshake) and ACLs against a real broker
over TCP: the SDK and the CLI, credentials from the environment and a file,
requests before authentication, NOT_AUTHORIZED for each verb naming the resource,
prefix patterns, filtered listings, live reload of the users file, the audit log
and the open-broker warning."""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, control, wire
from equeue.acl import Acl, UsersFile
from equeue.broker import Broker, open_broker
from equeue.client import AsyncClient
from equeue.errors import AuthFailed, AuthRequired, ErrorCode, NotAuthorized
from equeue.security import ClientSecurity
from equeue.users import make_user, read_users_file, update_users_file
from tests.conftest import ROOT, make_config, wait_until, wait_until_sync

PASSWORDS = {"root": "root-pw", "alice": "alice-pw", "bob": "bob-pw"}


def creds(user: str, password: str | None = None) -> ClientSecurity:
    return ClientSecurity.from_values(username=user, password=password or PASSWORDS[user])


def write_users(path: Path, acls: dict[str, Iterable[Acl]]) -> None:
    """root (admin) plus the users in ``acls`` with those ACLs."""

    def change(_: UsersFile) -> UsersFile:
        doc = UsersFile().with_user(make_user("root", PASSWORDS["root"], admin=True))
        for name, user_acls in acls.items():
            doc = doc.with_user(make_user(name, PASSWORDS[name], acls=user_acls))
        return doc

    update_users_file(path, change)


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[Broker, Path]]:
    users = tmp_path / "users.json"
    write_users(users, {"alice": [Acl("topic", "orders.*", ["produce", "consume"]),
                                  Acl("group", "billing", ["join", "commit"])],
                        "bob": []})  # fmt: skip
    async with open_broker(make_config(tmp_path / "data", users_file=users)) as b:
        yield b, users


def entries(*bodies: str) -> list[bytes]:
    return [wire.encode_entry(Message(b)) for b in bodies]


# ----------------------------------------------------------------------------- authentication
async def test_scram_success_wrong_password_unknown_user_and_no_credentials(secured: tuple[Broker, Path]) -> None:
    broker, _ = secured
    with trio.fail_after(20):
        async with AsyncClient(broker.address, security=creds("root")) as c:
            await c.create_topic("orders.eu", 2)
            assert [t.name for t in await c.list_topics()] == ["orders.eu"]
        answers = []
        for sec in (creds("alice", "wrong"), creds("mallory", "whatever")):
            async with AsyncClient(broker.address, security=sec) as c:
                with pytest.raises(AuthFailed) as info:
                    await c.list_topics()
                answers.append(str(info.value))
        # one answer for both: no user enumeration
        assert answers[0] == answers[1] and "unknown user or wrong password" in answers[0]
        async with AsyncClient(broker.address, security=ClientSecurity()) as c:
            with pytest.raises(AuthRequired, match="requires authentication"):
                await c.list_topics()


def raw_handshake(port: int, *frames: bytes) -> bytes:
    """Hello + ``frames`` in one write; everything the broker sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"EQMQ" + struct.pack(">HH", 1, 0) + b"".join(frames))
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def request_frame(code: int, rid: int, payload: bytes) -> bytes:
    return struct.pack(">IBHI", 7 + len(payload), 0, code, rid) + payload


async def test_a_request_before_authentication_is_refused_and_the_connection_closed(
    secured: tuple[Broker, Path],
) -> None:
    broker, _ = secured
    async with AsyncClient(broker.address, security=creds("root")) as c:
        await c.create_topic("orders.keep", 1)
    delete = request_frame(21, 7, control.encode(control.DeleteTopic("orders.keep")))
    out = await trio.to_thread.run_sync(raw_handshake, broker.port, delete)
    assert out[:8] == b"EQMQ" + struct.pack(">HH", 1, ErrorCode.AUTH_REQUIRED)
    length, kind, code, rid = struct.unpack_from(">IBHI", out, 8)
    assert (kind, code, rid) == (1, ErrorCode.AUTH_REQUIRED, 7)
    assert b"authenticate first" in out[19 : 12 + length]
    assert len(out) == 12 + length  # then closed: nothing else was answered
    async with AsyncClient(broker.address, security=creds("root")) as c:
        assert "orders.keep" in [t.name for t in await c.list_topics()]


def cli(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EQUEUE_")}
    return subprocess.run(
        [sys.executable, "-m", "equeue", *args], input=stdin, capture_output=True, text=True,
        env={**clean, **(env or {})}, cwd=ROOT, timeout=60,
    )  # fmt: skip


async def test_cli_user_commands_and_credentials_from_env_and_file(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    env = {"EQUEUE_USERS_FILE": str(users)}
    run = trio.to_thread.run_sync
    r = await run(lambda: cli("user", "add", "ops", "--admin", "--password-stdin", env=env, stdin="ops-secret\n"))
    assert r.returncode == 0, r.stderr
    r = await run(lambda: cli("user", "add", "reader", env={**env, "EQUEUE_NEW_PASSWORD": "reader-secret"}))
    assert r.returncode == 0, r.stderr
    r = await run(lambda: cli("acl", "add", "--user", "reader", "--topic", "pub.*", "--op", "consume", env=env))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(users.stat().st_mode) == 0o600
    text = users.read_text()
    assert "ops-secret" not in text and "reader-secret" not in text
    listing = await run(lambda: cli("user", "list", "--json", env=env))
    assert '"user": "reader"' in listing.stdout and "stored_key" not in listing.stdout
    acls = await run(lambda: cli("acl", "list", "--user", "reader", env=env))
    assert "pub.*" in acls.stdout and "consume" in acls.stdout
    async with open_broker(make_config(tmp_path / "data", users_file=users)) as b:
        addr = b.address
        ok = await run(lambda: cli("topic", "create", "pub.news", "--broker", addr,
                                   env={"EQUEUE_USERNAME": "ops", "EQUEUE_PASSWORD": "ops-secret"}))  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        cred_file = tmp_path / "reader.cred"
        cred_file.write_text("reader:reader-secret\n")
        desc = await run(lambda: cli("topic", "describe", "pub.news", "--broker", addr,
                                     env={"EQUEUE_CREDENTIALS_FILE": str(cred_file)}))  # fmt: skip
        assert desc.returncode == 0, desc.stderr
        denied = await run(lambda: cli("topic", "delete", "pub.news", "--broker", addr,
                                       env={"EQUEUE_CREDENTIALS_FILE": str(cred_file)}))  # fmt: skip
        assert denied.returncode == 1 and "no 'admin' permission on topic 'pub.news'" in denied.stderr
        wrong = await run(lambda: cli("topic", "list", "--broker", addr,
                                      env={"EQUEUE_USERNAME": "ops", "EQUEUE_PASSWORD": "nope"}))  # fmt: skip
        assert wrong.returncode == 1 and "authentication failed" in wrong.stderr
        anon = await run(lambda: cli("topic", "list", "--broker", addr))
        assert anon.returncode == 1 and "requires authentication" in anon.stderr
    r = await run(lambda: cli("user", "remove", "reader", env=env))
    assert r.returncode == 0 and "reader" not in read_users_file(users).users


# ----------------------------------------------------------------------------- authorization
async def expect_denied(call: Any, resource: str, op: str) -> None:
    with pytest.raises(NotAuthorized) as info:
        await call
    assert f"no '{op}' permission on {resource}" in str(info.value), str(info.value)


async def test_each_verb_is_refused_with_not_authorized_naming_the_resource(secured: tuple[Broker, Path]) -> None:
    broker, _ = secured
    with trio.fail_after(30):
        async with AsyncClient(broker.address, security=creds("root")) as root:
            await root.create_topic("orders.eu", 1)
            await root.create_topic("payments", 1)
            await root.produce(wire.ProduceRequest("payments", 0, entries("p0")))
        async with AsyncClient(broker.address, security=creds("bob")) as bob:
            await expect_denied(bob.produce(wire.ProduceRequest("payments", 0, entries("x"))), "topic 'payments'", "produce")
            await expect_denied(bob.pull(wire.PullRequest("payments", 0, 0)), "topic 'payments'", "consume")
            await expect_denied(bob.describe_topic("payments"), "topic 'payments'", "describe")
            await expect_denied(bob.create_topic("payments2", 1), "topic 'payments2'", "admin")
            await expect_denied(bob.alter_topic("payments", queues=2), "topic 'payments'", "admin")
            await expect_denied(bob.delete_topic("payments"), "topic 'payments'", "admin")
            await expect_denied(bob.heartbeat(control.Heartbeat("billing", "c1", ["payments"])), "group 'billing'", "join")
            await expect_denied(bob.commit_offset("billing", "payments", 0, 1), "group 'billing'", "commit")
            await expect_denied(bob.reset_offsets("billing", "payments", "earliest"), "group 'billing'", "reset")
            await expect_denied(bob.stats(), "the cluster", "describe")
            with pytest.raises(NotAuthorized, match="DLQ_RESEND: it needs the admin role"):
                await bob.dlq_resend("billing", all_letters=True)
            # listings show only what bob may describe: nothing
            assert await bob.list_topics() == [] and await bob.list_groups() == []
        # alice: prefix pattern orders.*, and the group billing
        async with AsyncClient(broker.address, security=creds("alice")) as alice:
            await alice.produce(wire.ProduceRequest("orders.eu", 0, entries("a", "b")))
            got = await alice.pull(wire.PullRequest("orders.eu", 0, 0))
            assert [m.text for m in got.messages] == ["a", "b"]
            await alice.commit_offset("billing", "orders.eu", 0, 2)
            await alice.heartbeat(control.Heartbeat("billing", "c1", ["orders.eu"]))
            await expect_denied(alice.produce(wire.ProduceRequest("payments", 0, entries("x"))), "topic 'payments'", "produce")
            await expect_denied(alice.heartbeat(control.Heartbeat("billing", "c1", ["payments"])), "topic 'payments'", "consume")
            await expect_denied(alice.reset_offsets("billing", "orders.eu", "earliest"), "group 'billing'", "reset")
            await expect_denied(alice.create_topic("orders.new", 1), "topic 'orders.new'", "admin")
            assert [t.name for t in await alice.list_topics()] == ["orders.eu"]
            assert await alice.query_offset("billing", "orders.eu", 0) == 2
            # auto-creation needs what creating needs (admin on the name), like Kafka's CREATE:
            # produce rights on orders.* do not let alice create orders.new by producing
            await expect_denied(alice.produce(wire.ProduceRequest("orders.new", 0, entries("x"))), "topic 'orders.new'", "admin")
            await expect_denied(alice.get_route("orders.new"), "topic 'orders.new'", "admin")
            assert "orders.new" not in broker.store.topics
        async with AsyncClient(broker.address, security=creds("root")) as root:
            assert (await root.queue_offsets("payments", 0)).max_offset == 1  # bob's produce stored nothing


async def test_live_reload_grants_revokes_and_removes_on_open_connections(secured: tuple[Broker, Path]) -> None:
    broker, users = secured
    with trio.fail_after(30):
        async with AsyncClient(broker.address, security=creds("root")) as root:
            await root.create_topic("reports", 1)
        async with AsyncClient(broker.address, security=creds("bob")) as bob:
            await expect_denied(bob.produce(wire.ProduceRequest("reports", 0, entries("r"))), "topic 'reports'", "produce")

            def grant(doc: UsersFile) -> UsersFile:
                u = doc.users["bob"]
                return doc.with_user(make_user("bob", PASSWORDS["bob"], acls=[*u.acls, Acl("topic", "reports", ["produce"])]))

            await trio.to_thread.run_sync(update_users_file, users, grant)

            async def produced() -> bool:
                try:
                    await bob.produce(wire.ProduceRequest("reports", 0, entries("r")))
                except NotAuthorized:
                    return False
                return True

            await wait_until(produced, timeout=10, interval=0.05, what="the grant reaches bob's open connection")
            await trio.to_thread.run_sync(update_users_file, users, lambda d: d.without("bob"))

            async def refused() -> bool:
                try:
                    await bob.produce(wire.ProduceRequest("reports", 0, entries("r")))
                except NotAuthorized as exc:
                    return "no longer exists" in str(exc)
                return False

            # the session stays open (as in Kafka), but a removed user may do nothing
            await wait_until(refused, timeout=10, interval=0.05, what="bob's removal reaches his open connection")
        async with AsyncClient(broker.address, security=creds("bob")) as bob:
            with pytest.raises(AuthFailed):
                await bob.list_topics()


async def test_audit_log_records_admin_actions_and_refused_logins(
    secured: tuple[Broker, Path], caplog: pytest.LogCaptureFixture
) -> None:
    broker, _ = secured
    caplog.set_level(logging.INFO, logger="equeue.audit")
    async with AsyncClient(broker.address, security=creds("root")) as root:
        await root.create_topic("orders.audit", 1)
        await root.delete_topic("orders.audit")
        with pytest.raises(Exception, match="no topic"):
            await root.delete_topic("orders.audit")
    async with AsyncClient(broker.address, security=creds("alice", "bad")) as c:
        with pytest.raises(AuthFailed):
            await c.list_topics()
    lines = [r.getMessage() for r in caplog.records if r.name == "equeue.audit"]
    assert any("action=delete_topic user=root" in x and "resource=topic:orders.audit outcome=ok" in x for x in lines), lines
    assert any("action=delete_topic" in x and "outcome=error:TOPIC_NOT_FOUND" in x for x in lines), lines
    assert any("action=authenticate user=alice" in x and "outcome=failed" in x for x in lines), lines
    rec = next(r for r in caplog.records if "action=create_topic" in r.getMessage())
    assert rec.audit["peer"].startswith("127.0.0.1:") and rec.audit["time"]  # type: ignore[attr-defined]


async def test_an_open_broker_beyond_loopback_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="equeue.broker")
    async with open_broker(make_config(tmp_path / "data", host="0.0.0.0")):
        pass
    assert any("authentication is OFF" in r.getMessage() for r in caplog.records)
    caplog.clear()
    async with open_broker(make_config(tmp_path / "data2")):
        pass
    assert not any("authentication is OFF" in r.getMessage() for r in caplog.records)


def test_sighup_reloads_the_users_file_and_keeps_the_broker(tmp_path: Path, broker_process: Any) -> None:
    """``kill -HUP`` re-reads the users file (SIGHUP would end an unprepared process)."""
    import signal

    from equeue.client import Client

    users = tmp_path / "users.json"
    write_users(users, {})
    b = broker_process("--users-file", str(users))
    write_users(users, {"alice": [Acl("topic", "*", ["describe"])]})
    os.kill(b.pid, signal.SIGHUP)

    def alice_gets_in() -> bool:
        assert b.proc.poll() is None, "the broker died on SIGHUP"
        try:
            with Client(b.address, security=creds("alice")) as c:
                return c.list_topics() == []
        except AuthFailed:
            return False  # not reloaded yet

    wait_until_sync(alice_gets_in, timeout=15, what="alice can log in after SIGHUP")


async def test_a_broken_users_file_keeps_the_users_loaded_before(
    secured: tuple[Broker, Path], caplog: pytest.LogCaptureFixture
) -> None:
    broker, users = secured
    good = users.read_text()
    users.write_text("{ not json")
    await wait_until(lambda: any("not JSON" in r.getMessage() for r in caplog.records), what="the reload error")
    async with AsyncClient(broker.address, security=creds("root")) as c:
        assert await c.list_topics() == []
    users.unlink()
    users.write_text(good.replace('"admin": true', '"admin": false'))

    async def root_demoted() -> bool:
        async with AsyncClient(broker.address, security=creds("root")) as c:
            try:
                await c.stats()
            except NotAuthorized:
                return True
        return False

    await wait_until(root_demoted, interval=0.1, what="a fixed file is picked up again")


def test_the_users_file_is_edited_without_the_broker_package(tmp_path: Path) -> None:
    """`equeue user` and `equeue acl` edit the users file through equeue.users: the
    broker package (its trio server, LMDB store) is not imported for it."""
    users = tmp_path / "users.json"
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from equeue.cli import app\n"
        f"r = CliRunner().invoke(app, ['user', 'add', 'ann', '--users-file', {str(users)!r}, '--password-stdin'],"
        " input='pw\\n')\n"
        "assert r.exit_code == 0, r.output\n"
        f"r = CliRunner().invoke(app, ['user', 'list', '--users-file', {str(users)!r}])\n"
        "assert r.exit_code == 0 and 'ann' in r.output, r.output\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('equeue.broker') or m in ('lmdb', 'trio'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ann" in read_users_file(users).users
