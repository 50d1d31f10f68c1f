"""The web console (``equeue.cli.console``) against REAL brokers: Starlette's TestClient
drives the ASGI application (its lifespan too: the console's connections, sessions
and sampler) in a trio loop, and the console talks TCP to brokers started here, one
open (no users file) and one with users and ACLs, each shared by the module.

What each page shows is checked against what the broker holds, and each action
against the broker's state after it (read with a plain client)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from equeue import Message, __version__, control, wire
from equeue.acl import Acl, UsersFile
from equeue.broker import EmbeddedBroker
from equeue.cli.console import Console, ConsoleConfig
from equeue.client import Client
from equeue.errors import TopicPaused
from equeue.security import ClientSecurity
from equeue.users import make_user, update_users_file
from tests.conftest import make_config, wait_until_sync

ROOT = ClientSecurity.from_values(username="root", password="root-pw")

_CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(make_config(tmp_path_factory.mktemp("open") / "data")) as b:
        yield b


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker with users: root (admin), alice (the topic ``jobs`` and the group
    ``workers`` only, no cluster rights)."""
    d = tmp_path_factory.mktemp("secured")
    users = d / "users.json"

    def setup(_: UsersFile) -> UsersFile:
        return (
            UsersFile()
            .with_user(make_user("root", "root-pw", admin=True))
            .with_user(make_user("alice", "alice-pw", acls=[Acl("topic", "jobs", ["describe", "consume"]),
                                                            Acl("group", "workers", ["describe"])]))
        )  # fmt: skip

    update_users_file(users, setup)
    with EmbeddedBroker(make_config(d / "data", users_file=users)) as b:
        with Client(b.address, security=ROOT) as c:
            c.create_topic("jobs", 1, exist_ok=True)
            c.create_topic("secret", 1, exist_ok=True)
        yield b


@contextmanager
def console(address: str, security: ClientSecurity | None = None, **kw: Any) -> Iterator[tuple[TestClient, Console]]:
    config = ConsoleConfig(address, security=security or ClientSecurity(), sample_interval=0.2, **kw)
    c = Console(config)
    with TestClient(c.app(), backend="trio", follow_redirects=False) as client:
        yield client, c


def csrf(client: TestClient, path: str = "/") -> str:
    page = client.get(path)
    m = _CSRF.search(page.text)
    assert m, page.text
    return m.group(1)


def sign_in(client: TestClient, user: str, password: str) -> Any:
    return client.post("/login", data={"username": user, "password": password, "csrf": csrf(client, "/login"),
                                       "next": "/topics"})  # fmt: skip


def texts(html: str, name: str) -> list[str]:
    """The text of every element with ``data-testid="name"`` (no nested tags)."""
    return [m.strip() for m in re.findall(rf'data-testid="{name}"[^>]*>([^<]*)<', html)]


# ---------------------------------------------------------------------- open mode: pages
def test_open_console_pages_show_the_brokers_numbers(open_broker: EmbeddedBroker) -> None:
    with Client(open_broker.address) as c:
        c.create_topic("orders", 2, exist_ok=True)
        entries = [wire.encode_entry(Message(b'{"n": 1, "item": "<b>tea</b>"}', key="k1", tags="t", properties={"p": "v"})),
                   wire.encode_entry(Message(b"plain text")), wire.encode_entry(Message(bytes(range(250, 256))))]  # fmt: skip
        c.produce(wire.ProduceRequest("orders", 0, entries))
        c.commit_offset("billing", "orders", 0, 1)
        stats = c.stats()
    with console(open_broker.address) as (client, _con):
        home = client.get("/")
        assert home.status_code == 200
        assert 'data-testid="open-mode-banner"' in home.text  # no sign-in: said on every page
        assert texts(home.text, "broker-version") == [__version__]
        assert texts(home.text, "broker-flush") == [stats.flush]
        topics = client.get("/topics")
        assert 'data-testid="open-mode-banner"' in topics.text
        row = re.search(r'data-topic="orders".*?</tr>', topics.text, re.S)
        assert row and texts(row.group(0), "topic-messages") == ["3"] and texts(row.group(0), "topic-queues") == ["2"]
        topic = client.get("/topics/orders")
        assert texts(topic.text, "queue-max") == ["3", "0"]
        assert texts(topic.text, "consumer-lag") == ["2"]  # billing committed 1 of 3
        assert texts(topic.text, "topic-compression") == ["default"]  # the broker's --compression
        groups = client.get("/groups")
        assert texts(groups.text, "group-lag") == ["2"] and texts(groups.text, "group-state") == ["empty"]
        group = client.get("/groups/billing")
        assert texts(group.text, "committed") == ["1", "–"] and texts(group.text, "group-total-lag") == ["2"]
        assert "standalone" in client.get("/cluster").text
        # messages: JSON pretty-printed and escaped, text, hex
        m = client.get("/messages", params={"by": "queue", "topic": "orders", "queue": "0", "offset": "0"})
        assert texts(m.text, "message-body-kind") == ["json"] and texts(m.text, "message-key") == ["k1"]
        assert "&lt;b&gt;tea&lt;/b&gt;" in m.text and "<b>tea" not in m.text  # autoescaped
        assert '"item": ' in m.text.replace("&#34;", '"')
        m = client.get("/messages", params={"by": "queue", "topic": "orders", "queue": "0", "offset": "2"})
        assert texts(m.text, "message-body-kind") == ["hex"] and "fa fb fc fd fe ff" in m.text
        m = client.get("/messages", params={"by": "key", "topic": "orders", "key": "k1"})
        assert texts(m.text, "message-position") == ["0 / 0"]
        m = client.get("/messages", params={"by": "time", "topic": "orders", "queue": "0", "time": "0"})
        assert texts(m.text, "message-position") == ["0 / 0"]
        m = client.get("/messages", params={"by": "global", "global_offset": "1"})
        assert texts(m.text, "message-body") == ["plain text"]


def test_bad_input_and_unknown_names_are_one_line_not_a_traceback(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, _):
        r = client.get("/messages", params={"by": "queue", "topic": "orders", "queue": "x", "offset": "0"})
        assert r.status_code == 400 and texts(r.text, "page-error") == ["queue: &#39;x&#39; is not a whole number"]
        r = client.get("/topics/nope")
        assert r.status_code == 404 and "TOPIC_NOT_FOUND" in r.text and "Traceback" not in r.text
        r = client.get("/groups/bad name!")
        assert r.status_code in (400, 404) and texts(r.text, "page-error")
        r = client.get("/topics", params={"sort": "<script>"})
        assert r.status_code == 400 and "<script>" not in r.text
        # an htmx refresh gets the error in a 200 (htmx swaps only 2xx answers)
        r = client.get("/topics/nope", headers={"HX-Request": "true"})
        assert r.status_code == 200 and 'data-testid="page-error"' in r.text


def test_a_dead_broker_is_a_message(tmp_path: Path) -> None:
    with console("127.0.0.1:1") as (client, _):
        r = client.get("/")
        assert r.status_code == 503 and "no broker answered" in r.text and "Traceback" not in r.text


def test_a_broker_that_stops_under_the_console_is_a_message(tmp_path: Path) -> None:
    with EmbeddedBroker(make_config(tmp_path / "data")) as b, console(b.address) as (client, _):
        assert client.get("/topics").status_code == 200
        b.stop()
        r = client.get("/topics")
        assert r.status_code == 502 and "cannot connect" in texts(r.text, "page-error")[0]
        assert "Traceback" not in r.text


@pytest.mark.parametrize("own", [None, ROOT], ids=["without-credentials", "with-credentials"])
def test_an_open_console_asks_for_sign_in_once_the_brokers_authenticate(tmp_path: Path, own: ClientSecurity | None) -> None:
    """With credentials of its own (which the restarted broker accepts), the console
    still serves anonymous visitors without them: they are asked to sign in."""
    users = tmp_path / "users.json"
    update_users_file(users, lambda _: UsersFile().with_user(make_user("root", "root-pw", admin=True)))
    with EmbeddedBroker(make_config(tmp_path / "data")) as b:
        port = b.port
        with console(b.address, own) as (client, con):
            assert client.get("/topics").status_code == 200 and con.mode == "open"
            b.stop()  # restarted with a users file, on the same port
            with EmbeddedBroker(make_config(tmp_path / "data", port=port, users_file=users)):
                r = client.get("/topics")
                assert r.status_code == 403 and "AUTH_REQUIRED" in r.text
                assert client.get("/topics").status_code == 303 and con.mode == "auth"  # to the sign-in page
                assert sign_in(client, "root", "root-pw").status_code == 303


# ---------------------------------------------------------------------- open mode: actions
def test_topic_actions_change_the_broker(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, _), Client(open_broker.address) as c:
        token = csrf(client)
        r = client.post("/topics/create", data={"name": "made", "queues": "3", "csrf": token})
        assert r.status_code == 303 and r.headers["location"] == "/topics/made"
        assert {t.name: t.queues for t in c.list_topics()}["made"] == 3
        assert "topic made created with 3 queues" in client.get("/topics/made").text  # the flash
        client.post("/topics/made/alter", data={"queues": "5", "csrf": token})
        assert {t.name: t.queues for t in c.list_topics()}["made"] == 5
        r = client.post("/topics/made/alter", data={"queues": "2", "csrf": token})  # shrinking: refused
        assert r.status_code == 303 and "BAD_REQUEST" in client.get("/topics/made").text
        assert {t.name: t.queues for t in c.list_topics()}["made"] == 5
        assert 'data-testid="delete-topic-confirm"' in client.get("/topics/made/delete").text
        client.post("/topics/made/delete", data={"confirm": "wrong", "csrf": token})
        assert "made" in {t.name for t in c.list_topics()}
        r = client.post("/topics/made/delete", data={"confirm": "made", "csrf": token})
        assert r.headers["location"] == "/topics"
        assert "made" not in {t.name for t in c.list_topics()}


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, _), Client(open_broker.address) as c:
        csrf(client)  # the session has a token; the form below does not carry it
        r = client.post("/topics/create", data={"name": "forged", "queues": "1"})
        assert r.status_code == 403
        r = client.post("/topics/create", data={"name": "forged", "queues": "1", "csrf": "guess"})
        assert r.status_code == 403
        assert "forged" not in {t.name for t in c.list_topics()}


def test_a_big_body_or_a_file_upload_is_refused_without_a_traceback(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, _):
        token = csrf(client)
        r = client.post("/topics/create", data={"name": "x" * 70_000, "queues": "1", "csrf": token})
        assert r.status_code == 413
        r = client.post("/topics/create", data={"csrf": token}, files={"name": ("a.txt", b"data")})
        assert r.status_code == 303
        assert "the form could not be read" in texts(client.get("/topics").text, "flash")[0]


def test_reset_offsets_and_dead_letter_resend_change_the_broker(open_broker: EmbeddedBroker) -> None:
    with Client(open_broker.address) as c:
        c.create_topic("resets", 1, exist_ok=True)
        c.produce(wire.ProduceRequest("resets", 0, [wire.encode_entry(Message(f"m{i}")) for i in range(4)]))
        c.commit_offset("rg", "resets", 0, 4)
        c.send_back("rg", "resets", 0, 1, 16, 16)  # past its attempts: to the group's dead letters
        c.send_back("rg", "resets", 0, 2, 16, 16)
        wait_until_sync(lambda: len(c.dlq_list("rg").letters) == 2, what="two dead letters")
    with console(open_broker.address) as (client, _), Client(open_broker.address) as c:
        token = csrf(client)
        client.post("/groups/rg/reset", data={"topic": "resets", "to": "earliest", "csrf": token})
        assert c.query_offset("rg", "resets", 0) == 0
        r = client.post("/groups/rg/reset", data={"topic": "resets", "to": "time", "time": "not a time", "csrf": token})
        assert r.status_code == 303 and "time: invalid time" in client.get("/groups/rg").text
        assert c.query_offset("rg", "resets", 0) == 0
        page = client.get("/dlq/rg")
        assert len(texts(page.text, "dlq-state")) == 2 and set(texts(page.text, "dlq-state")) == {"dead"}
        first = c.dlq_list("rg").letters[0]
        client.post("/dlq/rg/resend", data={"what": "selected", "one": f":{first.id}", "csrf": token})
        assert [d.resent for d in c.dlq_list("rg").letters] == [True, False]
        client.post("/dlq/rg/resend", data={"what": "all", "csrf": token})
        assert [d.resent for d in c.dlq_list("rg").letters] == [True, True]
        assert "resent 1 dead letter(s), 1 resent before" in client.get("/dlq/rg").text


def live_part(html: str) -> str:
    """The opening tag of the page's refreshed part (``id="live"``), or "" without one."""
    m = re.search(r'<div id="live"[^>]*>', html)
    return m.group(0) if m else ""


def test_the_list_pages_refresh_themselves_and_the_lookup_page_does_not(open_broker: EmbeddedBroker) -> None:
    """Each list page (the dead letters' too) asks its own URL again every
    ``refresh_s`` and swaps in its ``#live`` part; the message lookup is one-shot."""
    with Client(open_broker.address) as c:
        c.create_topic("refreshed", 1, exist_ok=True)
        c.produce(wire.ProduceRequest("refreshed", 0, [wire.encode_entry(Message("looked up"))]))
        c.commit_offset("rfg", "refreshed", 0, 0)
    with console(open_broker.address, refresh_s=2.5) as (client, _):
        for path in ("/", "/cluster", "/topics", "/topics/refreshed", "/groups", "/groups/rfg", "/dlq",
                     "/dlq/rfg", "/dlq/rfg?queue=0&offset=0"):  # fmt: skip
            live = live_part(client.get(path).text)
            assert f'hx-get="{path.replace("&", "&amp;")}"' in live, (path, live)
            assert 'hx-trigger="every 2500ms"' in live and 'hx-select="#live"' in live, (path, live)
            assert 'hx-swap="outerHTML"' in live, (path, live)
        # the dead letters' refreshed part holds the list (the group form stays above it)
        dlq = client.get("/dlq").text
        assert dlq.index('data-testid="dlq-group-form"') < dlq.index('id="live"') < dlq.index('data-testid="dlq-groups"')
        letters = client.get("/dlq/rfg").text
        assert letters.index('id="live"') < letters.index('data-testid="dlq-table"')
        found = client.get("/messages", params={"by": "queue", "topic": "refreshed", "queue": "0", "offset": "0"})
        assert texts(found.text, "message-body") == ["looked up"]
        assert live_part(found.text) == "" and "hx-trigger" not in found.text


def test_a_reset_is_refused_while_members_are_live_unless_forced(open_broker: EmbeddedBroker) -> None:
    with Client(open_broker.address) as c:
        c.create_topic("live", 1, exist_ok=True)
        c.produce(wire.ProduceRequest("live", 0, [wire.encode_entry(Message("m"))] * 3))
        c.commit_offset("lg", "live", 0, 3)
        c.create_topic("live2", 1, exist_ok=True)
        c.heartbeat(control.Heartbeat("lg", "member-1", ["live", "live2"], host="host-a"))  # a live member
        with console(open_broker.address) as (client, _):
            token = csrf(client)
            page = client.get("/groups/lg")
            assert re.findall(r'data-member="([^"]+)"', page.text) == ["member-1"]
            assert texts(page.text, "group-member-count") == ["1"]
            # the reset form offers the committed topics and the members' (live2: nothing committed yet)
            assert re.findall(r"<option>([^<]+)</option>", page.text) == ["live", "live2"]
            client.post("/groups/lg/reset", data={"topic": "live", "to": "earliest", "csrf": token})
            assert "GROUP_HAS_MEMBERS" in texts(client.get("/groups/lg").text, "flash")[0]
            assert c.query_offset("lg", "live", 0) == 3  # unchanged
            client.post("/groups/lg/reset", data={"topic": "live", "to": "earliest", "force": "1", "csrf": token})
            assert c.query_offset("lg", "live", 0) == 0


def row_of(html: str, attr: str, name: str) -> str:
    """The table row with ``data-<attr>="name"`` of a list page."""
    m = re.search(rf'data-{attr}="{re.escape(name)}".*?</tr>', html, re.S)
    assert m, html
    return m.group(0)


def test_pausing_a_topic_from_the_console_refuses_its_produce(open_broker: EmbeddedBroker) -> None:
    batch = wire.ProduceRequest("held", 0, [wire.encode_entry(Message("m"))])
    with console(open_broker.address) as (client, _), Client(open_broker.address) as c:
        c.create_topic("held", 1, exist_ok=True)
        token = csrf(client)
        r = client.post("/topics/held/pause", data={"csrf": token})
        assert r.status_code == 303 and r.headers["location"] == "/topics/held"
        assert c.describe_topic("held").info.paused
        with pytest.raises(TopicPaused):
            c.produce(batch)
        page = client.get("/topics/held")
        assert texts(page.text, "flash") == ["topic held paused"] and texts(page.text, "topic-paused") == ["yes"]
        listed = client.get("/topics", params={"sort": "paused", "desc": "1"})
        assert texts(row_of(listed.text, "topic", "held"), "topic-paused") == ["yes"]
        assert texts(listed.text, "topic-link")[0] == "held"  # sorted by the paused column, paused first
        client.post("/topics/held/pause", data={"csrf": token})
        assert texts(client.get("/topics/held").text, "flash") == ["topic held was paused already"]
        client.post("/topics/held/resume", data={"csrf": token})
        assert not c.describe_topic("held").info.paused
        c.produce(batch)  # served again
        assert texts(client.get("/topics/held").text, "topic-paused") == ["no"]
        client.post("/topics/held/resume", data={"csrf": token})
        assert texts(client.get("/topics/held").text, "flash") == ["topic held was not paused: nothing to resume"]
        r = client.post("/topics/%25RETRY%25pg/pause", data={"csrf": token})  # internal: refused
        assert r.headers["location"] == "/topics/%25RETRY%25pg"  # the refusal is shown on its page
        assert texts(client.get(r.headers["location"]).text, "flash")[0].startswith("RESERVED_TOPIC")


def test_pausing_a_group_from_the_console_holds_it_at_the_broker(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, _), Client(open_broker.address) as c:
        c.create_topic("paused-reads", 1, exist_ok=True)
        c.commit_offset("pg", "paused-reads", 0, 0)
        token = csrf(client)
        r = client.post("/groups/pg/pause", data={"csrf": token})
        assert r.status_code == 303 and r.headers["location"] == "/groups/pg"
        assert c.describe_group("pg").paused
        page = client.get("/groups/pg")
        assert texts(page.text, "flash") == ["group pg paused"] and texts(page.text, "group-paused") == ["yes"]
        assert texts(row_of(client.get("/groups").text, "group", "pg"), "group-paused") == ["yes"]
        client.post("/groups/pg/resume", data={"csrf": token})
        assert not c.describe_group("pg").paused
        assert texts(client.get("/groups/pg").text, "group-paused") == ["no"]


def test_an_ephemeral_group_with_a_live_member_shows_as_ephemeral(open_broker: EmbeddedBroker) -> None:
    with Client(open_broker.address) as c:
        c.create_topic("tapped", 1, exist_ok=True)
        c.heartbeat(control.Heartbeat("tap#ephemeral", "member-1", ["tapped"], host="host-a"))
        with console(open_broker.address) as (client, _):
            listed = client.get("/groups")
            assert texts(row_of(listed.text, "group", "tap#ephemeral"), "group-ephemeral") == ["yes"]
            assert texts(row_of(listed.text, "group", "tap#ephemeral"), "group-paused") == ["no"]
            page = client.get("/groups/tap%23ephemeral")
            assert texts(page.text, "group-ephemeral") == ["yes"] and texts(page.text, "group-member-count") == ["1"]
            assert "offsets are kept in the brokers' memory only, and go with its last member" in texts(
                page.text, "group-ephemeral-note")[0]  # fmt: skip


def test_the_sampler_fills_the_overview_chart(open_broker: EmbeddedBroker) -> None:
    with console(open_broker.address) as (client, con):
        wait_until_sync(lambda: len(con.sampler.broker_times.get(open_broker.address, ())) >= 2,
                        what="two broker samples")  # fmt: skip
        home = client.get("/")
        data = re.search(r'id="broker-rates-chart-data">(.*?)</script>', home.text, re.S)
        assert data and f"{open_broker.address} in" in data.group(1)


# ---------------------------------------------------------------------- sign-in
def test_sign_in_out_and_the_cookie(secured: EmbeddedBroker) -> None:
    with console(secured.address) as (client, con):
        r = client.get("/topics")
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        assert 'data-testid="open-mode-banner"' not in client.get("/login").text
        r = sign_in(client, "root", "wrong")
        assert r.status_code == 403 and texts(r.text, "login-error") == ["sign-in refused: wrong user name or password"]
        assert con.sessions is not None and len(con.sessions) == 0
        r = sign_in(client, "root", "root-pw")
        assert r.status_code == 303 and r.headers["location"] == "/topics"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
        assert "root-pw" not in r.headers["set-cookie"]
        page = client.get("/topics")
        assert texts(page.text, "signed-in-user") == ["root"] and {"jobs", "secret"} <= set(texts(page.text, "topic-link"))
        assert len(con.sessions) == 1
        r = client.post("/logout", data={"csrf": csrf(client, "/topics")})
        assert r.status_code == 303 and len(con.sessions) == 0
        assert client.get("/topics").status_code == 303


def test_sign_in_needs_the_csrf_token(secured: EmbeddedBroker) -> None:
    with console(secured.address) as (client, con):
        client.get("/login")
        r = client.post("/login", data={"username": "root", "password": "root-pw"})
        assert r.status_code == 403 and con.sessions is not None and len(con.sessions) == 0


def test_an_unreadable_sign_in_or_out_form_is_a_400_or_a_redirect_not_a_traceback(
    secured: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with console(secured.address) as (client, con), caplog.at_level(logging.ERROR, logger="equeue.cli.console"):
        token = csrf(client, "/login")
        r = client.post("/login", data={"username": "root", "password": "root-pw", "csrf": token},
                        files={"file": ("a.txt", b"data")})  # fmt: skip
        assert r.status_code == 400 and "the form could not be read" in texts(r.text, "login-error")[0]
        r = client.post("/logout", data={"csrf": token}, files={"file": ("a.txt", b"data")})
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert con.sessions is not None and len(con.sessions) == 0
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_an_idle_session_expires(secured: EmbeddedBroker) -> None:
    now = [0.0]
    config = ConsoleConfig(secured.address, session_idle=60.0)
    con = Console(config, clock=lambda: now[0])
    with TestClient(con.app(), backend="trio", follow_redirects=False) as client:
        assert sign_in(client, "root", "root-pw").status_code == 303
        now[0] = 59.0
        assert client.get("/topics").status_code == 200
        now[0] = 59.0 + 61.0
        assert client.get("/topics").status_code == 303  # idle for longer than 60 s: signed out
        assert con.sessions is not None and len(con.sessions) == 0


def test_failed_sign_ins_are_throttled_per_user_and_address(secured: EmbeddedBroker) -> None:
    now = [0.0]
    con = Console(ConsoleConfig(secured.address), clock=lambda: now[0])
    with TestClient(con.app(), backend="trio", follow_redirects=False) as client:
        for _ in range(con.throttle.limit):
            assert sign_in(client, "root", "wrong").status_code == 403
        now[0] = 10.0
        for user, password in (("root", "root-pw"), ("alice", "alice-pw")):  # the user and the address are held
            r = sign_in(client, user, password)
            assert r.status_code == 429 and texts(r.text, "login-error") == ["too many failed sign-ins: try again in 290 s"]
        assert con.sessions is not None and len(con.sessions) == 0
        now[0] = con.throttle.window + 1.0  # the failures are older than the window
        assert sign_in(client, "root", "root-pw").status_code == 303


def test_the_least_recently_used_session_goes_past_the_limit(secured: EmbeddedBroker) -> None:
    with console(secured.address) as (client, con):
        assert con.sessions is not None
        con.sessions.max_sessions = 1
        assert sign_in(client, "root", "root-pw").status_code == 303
        first = dict(client.cookies)
        client.cookies.clear()  # another browser
        assert sign_in(client, "alice", "alice-pw").status_code == 303
        second = dict(client.cookies)
        assert len(con.sessions) == 1
        client.cookies.clear()
        client.cookies.update(first)
        assert client.get("/topics").status_code == 303  # signed out
        client.cookies.clear()
        client.cookies.update(second)
        assert client.get("/topics").status_code == 200


def test_an_acl_limited_user_sees_and_does_what_the_broker_allows(secured: EmbeddedBroker) -> None:
    with console(secured.address) as (client, _), Client(secured.address, security=ROOT) as root:
        assert sign_in(client, "alice", "alice-pw").status_code == 303
        page = client.get("/topics")
        assert texts(page.text, "topic-link") == ["jobs"]  # "secret" is not hers to see
        r = client.get("/")  # broker statistics need the cluster's describe right
        assert r.status_code == 403 and "NOT_AUTHORIZED" in r.text
        r = client.post("/topics/create", data={"name": "hers", "queues": "1", "csrf": csrf(client, "/topics")})
        assert r.status_code == 303
        assert "NOT_AUTHORIZED" in texts(client.get("/topics").text, "flash")[0]
        assert "hers" not in {t.name for t in root.list_topics()}



def test_an_acl_limited_users_pause_is_refused_and_changes_nothing(secured: EmbeddedBroker) -> None:
    with console(secured.address) as (client, _), Client(secured.address, security=ROOT) as root:
        root.commit_offset("workers", "jobs", 0, 0)
        assert sign_in(client, "alice", "alice-pw").status_code == 303
        token = csrf(client, "/topics")
        r = client.post("/topics/jobs/pause", data={"csrf": token})  # needs admin on the topic
        assert r.status_code == 303 and r.headers["location"] == "/topics/jobs"
        flash = texts(client.get("/topics/jobs").text, "flash")[0]
        assert flash.startswith("NOT_AUTHORIZED") and "alice" in flash
        assert not root.describe_topic("jobs").info.paused
        client.post("/groups/workers/pause", data={"csrf": token})  # needs reset on the group
        assert texts(client.get("/groups/workers").text, "flash")[0].startswith("NOT_AUTHORIZED")
        assert not root.describe_group("workers").paused
        root.pause_topic("jobs")
        try:  # what she may see she sees paused
            assert texts(client.get("/topics/jobs").text, "topic-paused") == ["yes"]
        finally:
            root.resume_topic("jobs")


async def test_a_lasting_sampler_failure_is_logged_once_not_every_round(nursery: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens at the address: every round fails the same way; the log says so
    once, not every minute (the overview page shows ``last_error``)."""
    import logging

    import trio

    from equeue.cli.console.sampler import Sampler
    from equeue.cli.console.sessions import open_link

    link = await open_link(nursery, "127.0.0.1:1", ClientSecurity(), probe=False)
    sampler = Sampler(lambda: link.admin, interval=0.1)
    with caplog.at_level(logging.WARNING, logger="equeue.cli.console"), trio.fail_after(30):
        for _ in range(3):
            await sampler.sample()
            sampler._logged -= 120  # as if two minutes went by between rounds
    link.close()
    assert sampler.rounds == 3 and "cannot connect" in sampler.last_error
    assert len([r for r in caplog.records if r.getMessage().startswith("console sampler:")]) == 1


async def test_a_link_whose_opener_is_cancelled_is_not_left_open(open_broker: EmbeddedBroker) -> None:
    """A sign-in past its time cancels the opening: no task of the console's nursery
    goes on holding a connection (outside the session table's limit)."""
    import trio

    from equeue.cli.console.sessions import open_link

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            scope.cancel()
            await open_link(nursery, open_broker.address, ClientSecurity(), probe=True)
        assert not nursery.child_tasks
        link = await open_link(nursery, open_broker.address, ClientSecurity(), probe=True)  # not cancelled: held
        assert len(nursery.child_tasks) == 1
        link.close()
