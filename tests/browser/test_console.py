"""The web console in headless Chromium against a real broker with a users file
(tests/browser/conftest.py seeds it): signing in, every page's numbers against the
broker's own answers, the actions clicked through (and checked at the broker), and
what a user limited by ACLs sees and is refused.

The read-only checks come first in the file and the actions after them; every check
compares the page with the broker's answer of the moment, so the order only decides
what the screenshots show."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from equeue import Message, control, wire
from equeue.client.client import Client
from equeue.errors import TopicPaused
from equeue.producer import Producer
from tests.browser.harness import (
    ADMIN,
    ADMIN_PW,
    ALICE,
    ALICE_PW,
    GROUP,
    ORDERS,
    PAYMENTS,
    RESET_GROUP,
    SCRATCH,
    ConsoleProcess,
    Seeded,
    creds,
    follow,
    key,
    new_context,
    number,
    shoot,
    sign_in,
    text,
)

pytestmark = pytest.mark.xdist_group("browser-console")


@pytest.fixture(autouse=True)
def _console_logged_no_error(console: ConsoleProcess) -> Iterator[None]:
    yield
    console.check()


@pytest.fixture(scope="module")
def admin_page(browser: Any, console_url: str) -> Iterator[Any]:
    """A page signed in as the admin, shared by the module's tests (one sign-in)."""
    with new_context(browser) as ctx:
        yield sign_in(ctx, console_url, ADMIN, ADMIN_PW)


@pytest.fixture(scope="module")
def alice_page(browser: Any, console_url: str) -> Iterator[Any]:
    """A page signed in as alice, the user limited by ACLs."""
    with new_context(browser) as ctx:
        yield sign_in(ctx, console_url, ALICE, ALICE_PW)


@pytest.fixture(scope="module")
def alice_client(seeded: Seeded) -> Iterator[Client]:
    """The broker's answers to alice (what her pages must match)."""
    with Client(seeded.address, security=creds(ALICE, ALICE_PW)) as c:
        yield c


def rows(page: Any, testid: str, attr: str) -> dict[str, Any]:
    """The rows with that test id, by the value of their ``attr`` attribute."""
    found = page.get_by_test_id(testid)
    return {found.nth(i).get_attribute(attr): found.nth(i) for i in range(found.count())}


def refused(page: Any, what: str) -> None:
    """The page shows the broker's refusal of alice's action: NOT_AUTHORIZED, naming her
    and ``what`` she lacks, as a failed action's one line."""
    flash = page.get_by_test_id("flash")
    expect(flash).to_contain_text(f"NOT_AUTHORIZED: user '{ALICE}'")
    expect(flash).to_contain_text(what)
    expect(flash).to_have_class(re.compile(r"\bfail\b"))


# ----------------------------------------------------------------------------- sign-in
def test_sign_in_refuses_a_wrong_password_then_signs_in(
    context: Any, console_url: str, tmp_path: Path
) -> None:
    page = context.new_page()
    page.goto(console_url + "/topics")
    expect(page).to_have_url(console_url + "/login?next=%2Ftopics")  # a page asks for sign-in first
    shoot(page, "sign-in", tmp_path)
    page.get_by_test_id("username").fill(ADMIN)
    page.get_by_test_id("password").fill("not-the-password")
    follow(page.get_by_test_id("sign-in"))
    expect(page.get_by_test_id("login-error")).to_contain_text("wrong user name or password")
    expect(page.get_by_test_id("signed-in-user")).to_have_count(0)
    page.get_by_test_id("password").fill(ADMIN_PW)
    follow(page.get_by_test_id("sign-in"))
    expect(page).to_have_url(console_url + "/topics")  # back where it was going
    expect(page.get_by_test_id("signed-in-user")).to_have_text(ADMIN)
    follow(page.get_by_test_id("sign-out"))
    expect(page).to_have_url(console_url + "/login")
    page.goto(console_url + "/groups")
    expect(page.get_by_test_id("login-form")).to_be_visible()  # signed out: the session is gone


# ----------------------------------------------------------------------------- pages (admin)
def test_overview_shows_the_brokers_stats(
    admin_page: Any, admin_client: Client, seeded: Seeded, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-overview"))
    stats = admin_client.stats()
    brokers = page.get_by_test_id("broker-row")
    expect(brokers).to_have_count(1)
    row = brokers.first
    assert row.get_attribute("data-address") == seeded.address
    assert text(row, "broker-version") == stats.version
    assert text(row, "broker-flush") == stats.flush
    assert int(row.get_by_test_id("broker-map-size").get_attribute("data-value")) == stats.map_size
    assert f"{stats.topics} topics" in text(page, "broker-totals")
    shoot(page, "overview", tmp_path)


def test_cluster_page_of_a_standalone_broker(
    admin_page: Any, admin_client: Client, seeded: Seeded
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-cluster"))
    assert not admin_client.cluster_status().cluster
    expect(page.get_by_test_id("standalone")).to_contain_text("Standalone broker")
    expect(page.get_by_test_id("broker-group")).to_have_count(0)
    health = page.get_by_test_id("health-row")
    expect(health).to_have_count(1)
    expect(health.first).to_contain_text(seeded.address)
    expect(health.first).to_contain_text("yes")


def test_topics_page_matches_the_broker(
    admin_page: Any, admin_client: Client, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-topics"))
    expect(page.get_by_test_id("topics-table")).to_be_visible()
    shown = rows(page, "topic-row", "data-topic")
    assert set(shown) == {t.name for t in admin_client.list_topics(include_internal=False)}
    assert {ORDERS, PAYMENTS, SCRATCH} <= set(shown)
    for name, row in shown.items():
        d = admin_client.describe_topic(name)
        assert number(row, "topic-queues") == d.info.queues, name
        assert number(row, "topic-messages") == sum(q.count for q in d.queues), name
        assert int(row.get_by_test_id("topic-bytes").get_attribute("data-value")) == sum(
            q.bytes for q in d.queues
        )
    shoot(page, "topics", tmp_path)


def test_topic_page_matches_the_broker(
    admin_page: Any, admin_client: Client, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-topics"))
    follow(
        page.locator(f'[data-testid="topic-row"][data-topic="{ORDERS}"]').get_by_test_id(
            "topic-link"
        )
    )
    expect(page.get_by_test_id("topic-name")).to_have_text(ORDERS)
    d = admin_client.describe_topic(ORDERS)
    queues = rows(page, "queue-row", "data-queue")
    assert len(queues) == d.info.queues
    for q in d.queues:
        row = queues[str(q.queue_id)]
        assert (number(row, "queue-min"), number(row, "queue-max"), number(row, "queue-count")) == (
            q.min_offset, q.max_offset, q.count,
        )  # fmt: skip
    lag = sum(q.lag for q in admin_client.describe_group(GROUP).queues if q.topic == ORDERS)
    assert lag > 0
    assert number(rows(page, "consumer-row", "data-group")[GROUP], "consumer-lag") == lag
    shoot(page, "topic", tmp_path)


def test_groups_and_group_pages_match_the_broker(
    admin_page: Any, admin_client: Client, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-groups"))
    shown = rows(page, "group-row", "data-group")
    assert set(shown) == {g.group for g in admin_client.list_groups()}
    d = admin_client.describe_group(GROUP)
    total = sum(max(0, q.lag) for q in d.queues)
    assert number(shown[GROUP], "group-members") == len(d.members) == 0
    assert number(shown[GROUP], "group-lag") == total
    shoot(page, "groups", tmp_path)

    follow(shown[GROUP].get_by_test_id("group-link"))
    expect(page.get_by_test_id("group-name")).to_have_text(GROUP)
    assert number(page, "group-total-lag") == total
    queues = page.get_by_test_id("group-queue-row")
    expect(queues).to_have_count(len(d.queues))
    for q in d.queues:
        row = page.locator(
            f'[data-testid="group-queue-row"][data-topic="{q.topic}"][data-queue="{q.queue_id}"]'
        )
        assert (number(row, "committed"), number(row, "lag")) == (q.committed, q.lag)
    shoot(page, "group", tmp_path)


def test_messages_lookups_show_the_brokers_message(
    admin_page: Any, admin_client: Client, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-messages"))
    # by queue offset
    page.get_by_test_id("lookup-queue-topic").fill(ORDERS)
    page.get_by_test_id("lookup-queue-queue").fill("0")
    page.get_by_test_id("lookup-queue-offset").fill("2")
    follow(page.get_by_test_id("lookup-queue-submit"))
    [want] = admin_client.get_message(ORDERS, 0, 2).messages
    found = page.get_by_test_id("message")
    expect(found).to_have_count(1)
    assert text(found, "message-body") == want.text
    assert text(found, "message-key") == want.key == key(ORDERS, 0, 2)
    assert number(found, "message-global-offset") == want.global_offset
    assert text(found, "message-position") == "0 / 2"
    # by global offset (the same message)
    page.get_by_test_id("lookup-global-offset").fill(str(want.global_offset))
    follow(page.get_by_test_id("lookup-global-submit"))
    expect(page.get_by_test_id("message")).to_have_attribute(
        "data-global-offset", str(want.global_offset)
    )
    assert text(page, "message-body") == want.text
    # by key
    wanted = key(ORDERS, 1, 2)
    page.get_by_test_id("lookup-key-topic").fill(ORDERS)
    page.get_by_test_id("lookup-key-key").fill(wanted)
    follow(page.get_by_test_id("lookup-key-submit"))
    [by_key] = admin_client.find_by_key(ORDERS, wanted).messages
    expect(page.get_by_test_id("message")).to_have_count(1)
    assert text(page, "message-body") == by_key.text
    assert text(page, "message-position") == f"{by_key.queue_id} / {by_key.queue_offset}" == "1 / 2"
    # by time (epoch ms): the first message of the queue stored at or after it
    page.get_by_test_id("lookup-time-topic").fill(ORDERS)
    page.get_by_test_id("lookup-time-queue").fill("0")
    page.get_by_test_id("lookup-time-time").fill(str(want.timestamp))
    follow(page.get_by_test_id("lookup-time-submit"))
    at = admin_client.offset_for_time(ORDERS, 0, want.timestamp)
    [first] = admin_client.get_message(ORDERS, 0, at).messages
    expect(page.get_by_test_id("lookup-note")).to_contain_text(f"is at queue offset {at}")
    expect(page.get_by_test_id("message-position")).to_have_text(f"0 / {at}")
    assert text(page, "message-body") == first.text
    # the key lookup is the page's picture
    page.get_by_test_id("lookup-key-topic").fill(ORDERS)
    page.get_by_test_id("lookup-key-key").fill(wanted)
    follow(page.get_by_test_id("lookup-key-submit"))
    shoot(page, "messages", tmp_path)


def test_dead_letters_page_matches_the_broker(
    admin_page: Any, admin_client: Client, tmp_path: Path
) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-dlq"))
    follow(page.get_by_test_id("dlq-group-link").filter(has_text=GROUP))
    expect(page.get_by_test_id("dlq-group-name")).to_have_text(GROUP)
    letters = admin_client.dlq_list(GROUP).letters
    shown = rows(page, "dlq-row", "data-id")
    assert list(shown) == [str(d.id) for d in letters] and letters
    for d in letters:
        row = shown[str(d.id)]
        assert text(row, "dlq-state") == ("resent" if d.resent else "dead")
        expect(row).to_contain_text(base64.b64decode(d.body).decode())
        expect(row).to_contain_text(f"{d.origin_topic}/{d.origin_queue}@{d.origin_offset}")
    shoot(page, "dead-letters", tmp_path)


def test_dead_letters_page_refreshes_but_not_while_a_box_is_ticked(
    admin_page: Any, console_url: str
) -> None:
    """The page asks for itself again every few seconds, except while a letter is
    ticked: a refresh would untick it (console.js cancels the request). The test
    polls every 300 ms instead of the page's 5 s (the served page's own trigger comes
    back with the first refresh); what it checks is the cancel, not the period."""
    page = admin_page
    page.goto(f"{console_url}/dlq/{GROUP}")
    page.evaluate(
        """() => {
        window.refreshes = {skipped: 0, swapped: 0};
        document.addEventListener("htmx:beforeRequest", (e) => {
            if (e.detail.elt.id === "live" && e.defaultPrevented) window.refreshes.skipped++;
        });
        document.addEventListener("htmx:afterSwap", () => { window.refreshes.swapped++; });
        const live = document.getElementById("live");
        live.setAttribute("hx-trigger", "every 300ms");
        htmx.process(live);
    }"""
    )
    box = page.get_by_test_id("dlq-select").first
    box.check()
    page.wait_for_function("() => window.refreshes.skipped >= 1")
    assert page.evaluate("() => window.refreshes.swapped") == 0
    expect(box).to_be_checked()
    box.uncheck()
    page.wait_for_function("() => window.refreshes.swapped >= 1")  # refreshed again
    expect(page.get_by_test_id("dlq-row")).not_to_have_count(0)


# ----------------------------------------------------------------------------- the limited user
def test_a_limited_user_sees_what_the_broker_shows_it(
    alice_page: Any, alice_client: Client, console_url: str
) -> None:
    page = alice_page
    follow(page.get_by_test_id("nav-overview"))
    # the overview needs the cluster's describe right, which alice lacks: the refusal is shown
    expect(page.get_by_test_id("page-error")).to_contain_text("NOT_AUTHORIZED")
    follow(page.get_by_test_id("nav-topics"))
    shown = set(rows(page, "topic-row", "data-topic"))
    assert shown == {t.name for t in alice_client.list_topics(include_internal=False)} == {ORDERS}
    follow(page.get_by_test_id("nav-groups"))
    assert (
        set(rows(page, "group-row", "data-group"))
        == {g.group for g in alice_client.list_groups()}
        == {GROUP}
    )
    page.goto(f"{console_url}/topics/{PAYMENTS}")
    expect(page.get_by_test_id("page-error")).to_contain_text(
        f"NOT_AUTHORIZED: user '{ALICE}' has no 'describe' permission on topic '{PAYMENTS}'"
    )
    # she may read orders.* messages, not payments'
    [mine] = alice_client.get_message(ORDERS, 1, 1).messages
    page.goto(f"{console_url}/messages?by=queue&topic={ORDERS}&queue=1&offset=1")
    expect(page.get_by_test_id("message-body")).to_have_text(mine.text)
    page.goto(f"{console_url}/messages?by=queue&topic={PAYMENTS}&queue=0&offset=0")
    expect(page.get_by_test_id("page-error")).to_contain_text(  # its route first: describe
        f"NOT_AUTHORIZED: user '{ALICE}' has no 'describe' permission on topic '{PAYMENTS}'"
    )
    # the group's dead letters: she may list them (join), as the broker lists them to her
    page.goto(f"{console_url}/dlq/{GROUP}")
    assert list(rows(page, "dlq-row", "data-id")) == [
        str(d.id) for d in alice_client.dlq_list(GROUP).letters
    ]


def test_a_limited_user_is_refused_and_nothing_changes(
    alice_page: Any, admin_client: Client, console_url: str
) -> None:
    page = alice_page
    # create a topic: alice has no admin right on orders.*
    page.goto(console_url + "/topics")
    page.get_by_test_id("create-topic").locator("summary").click()
    page.get_by_test_id("create-topic-name").fill("orders.alice")
    follow(page.get_by_test_id("create-topic-submit"))
    refused(page, "'admin' permission on topic 'orders.alice'")
    assert "orders.alice" not in {t.name for t in admin_client.list_topics()}

    # reset the group's offsets: alice has describe and join on it, not reset
    before = admin_client.describe_group(GROUP).queues
    page.goto(f"{console_url}/groups/{GROUP}")
    page.get_by_test_id("reset-topic").select_option(ORDERS)
    page.get_by_test_id("reset-to").select_option("latest")
    follow(page.get_by_test_id("reset-submit"))
    refused(page, f"'reset' permission on group '{GROUP}'")
    assert admin_client.describe_group(GROUP).queues == before

    # resend the dead letters: the admin role's
    letters = admin_client.dlq_list(GROUP).letters
    page.goto(f"{console_url}/dlq/{GROUP}")
    follow(page.get_by_test_id("dlq-resend-all"))
    refused(page, "DLQ_RESEND")
    assert admin_client.dlq_list(GROUP).letters == letters

    # delete a topic she may see and consume
    page.goto(f"{console_url}/topics/{ORDERS}")
    follow(page.get_by_test_id("delete-topic"))
    page.get_by_test_id("delete-topic-confirm").fill(ORDERS)
    follow(page.get_by_test_id("delete-topic-submit"))
    refused(page, f"'admin' permission on topic '{ORDERS}'")
    assert ORDERS in {t.name for t in admin_client.list_topics()}


# ----------------------------------------------------------------------------- actions (admin)
def test_create_a_topic(admin_page: Any, admin_client: Client, console_url: str) -> None:
    page = admin_page
    follow(page.get_by_test_id("nav-topics"))
    page.get_by_test_id("create-topic").locator("summary").click()
    page.get_by_test_id("create-topic-name").fill("orders.created")
    page.get_by_test_id("create-topic-queues").fill("3")
    follow(page.get_by_test_id("create-topic-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text(
        "topic orders.created created with 3 queues"
    )
    expect(page.get_by_test_id("topic-name")).to_have_text("orders.created")
    info = {t.name: t for t in admin_client.list_topics()}["orders.created"]
    assert info.queues == 3
    expect(page.get_by_test_id("queue-row")).to_have_count(3)


def test_reset_a_groups_offsets(admin_page: Any, admin_client: Client, console_url: str) -> None:
    page = admin_page
    before = {q.queue_id: q for q in admin_client.describe_group(RESET_GROUP).queues}
    ends = {q.queue_id: q.max_offset for q in admin_client.describe_topic(PAYMENTS).queues}
    assert {q: b.committed for q, b in before.items()} == {0: 1, 1: 1} != ends
    page.goto(f"{console_url}/groups/{RESET_GROUP}")
    page.get_by_test_id("reset-topic").select_option(PAYMENTS)
    page.get_by_test_id("reset-to").select_option("earliest")
    follow(page.get_by_test_id("reset-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text(
        f"group {RESET_GROUP}: offsets of {PAYMENTS} reset to earliest"
    )
    after = {q.queue_id: q for q in admin_client.describe_group(RESET_GROUP).queues}
    assert {q: a.committed for q, a in after.items()} == {0: 0, 1: 0}
    for q, a in after.items():
        row = page.locator(f'[data-testid="group-queue-row"][data-queue="{q}"]')
        assert (
            (number(row, "committed"), number(row, "lag")) == (a.committed, a.lag) == (0, ends[q])
        )


def test_reset_a_groups_offsets_to_a_time(
    admin_page: Any, admin_client: Client, console_url: str
) -> None:
    """To a time: each queue's offset becomes the broker's first message stored at or
    after it (a message sent now is after every seeded one)."""
    at = admin_client.queue_offsets(PAYMENTS, 0).max_offset
    entry = wire.encode_entry(Message(b"after the seed"))
    admin_client.produce(wire.ProduceRequest(PAYMENTS, 0, [entry], auto_create=False))
    [later] = admin_client.get_message(PAYMENTS, 0, at).messages
    want = {q: admin_client.offset_for_time(PAYMENTS, q, later.timestamp) for q in (0, 1)}
    before = {q.queue_id: q.committed for q in admin_client.describe_group(RESET_GROUP).queues}
    assert want[0] == at and want != before
    page = admin_page
    page.goto(f"{console_url}/groups/{RESET_GROUP}")
    page.get_by_test_id("reset-topic").select_option(PAYMENTS)
    page.get_by_test_id("reset-to").select_option("time")
    page.get_by_test_id("reset-time").fill(str(later.timestamp))
    follow(page.get_by_test_id("reset-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text(
        f"group {RESET_GROUP}: offsets of {PAYMENTS} reset to time (0→{want[0]}, 1→{want[1]})"
    )
    after = {q.queue_id: q for q in admin_client.describe_group(RESET_GROUP).queues}
    assert {q: a.committed for q, a in after.items()} == want
    for q, a in after.items():
        row = page.locator(f'[data-testid="group-queue-row"][data-queue="{q}"]')
        expect(row.get_by_test_id("committed")).to_have_text(str(a.committed))
        expect(row.get_by_test_id("lag")).to_have_text(str(a.lag))


def test_resend_a_dead_letter(admin_page: Any, admin_client: Client, console_url: str) -> None:
    page = admin_page
    first, *rest = admin_client.dlq_list(GROUP).letters
    assert not first.resent
    origin_end = admin_client.queue_offsets(first.origin_topic, first.origin_queue).max_offset
    page.goto(f"{console_url}/dlq/{GROUP}")
    follow(
        page.locator(f'[data-testid="dlq-row"][data-id="{first.id}"]').get_by_test_id(
            "dlq-resend-one"
        )
    )
    expect(page.get_by_test_id("flash")).to_contain_text("resent 1 dead letter(s)")
    # the broker: that letter is marked resent, the others are not, and it is back in its origin queue
    letters = {d.id: d for d in admin_client.dlq_list(GROUP).letters}
    assert letters[first.id].resent and not any(letters[d.id].resent for d in rest)
    [back] = admin_client.get_message(first.origin_topic, first.origin_queue, origin_end).messages
    assert back.body == base64.b64decode(first.body)
    # the page
    row = page.locator(f'[data-testid="dlq-row"][data-id="{first.id}"]')
    expect(row.get_by_test_id("dlq-state")).to_have_text("resent")
    for d in rest:
        expect(
            page.locator(f'[data-testid="dlq-row"][data-id="{d.id}"]').get_by_test_id("dlq-state")
        ).to_have_text("dead")
    # resending it again sends nothing
    follow(row.get_by_test_id("dlq-resend-one"))
    expect(page.get_by_test_id("flash")).to_contain_text("resent 0 dead letter(s), 1 resent before")
    assert (
        admin_client.queue_offsets(first.origin_topic, first.origin_queue).max_offset
        == origin_end + 1
    )


def test_resend_the_selected_dead_letters(
    admin_page: Any, admin_client: Client, console_url: str
) -> None:
    """Two of three new dead letters ticked and resent: the broker resends those two
    (back in their origin queues), not the third."""
    known = {d.id for d in admin_client.dlq_list(GROUP).letters}
    for q, offset in ((2, 0), (2, 1), (0, 1)):
        assert admin_client.send_back(
            GROUP, ORDERS, q, offset, reconsume_times=16, max_reconsume_times=16
        ).dead_lettered
    by_origin = {
        (d.origin_queue, d.origin_offset): d
        for d in admin_client.dlq_list(GROUP).letters
        if d.id not in known
    }
    new = [by_origin[(2, 0)], by_origin[(2, 1)], by_origin[(0, 1)]]
    assert len(by_origin) == 3 and not any(d.resent for d in new)
    *chosen, left = new
    ends = {q: admin_client.queue_offsets(ORDERS, q).max_offset for q in (0, 2)}
    page = admin_page
    page.goto(f"{console_url}/dlq/{GROUP}")
    for d in chosen:
        page.locator(f'[data-testid="dlq-row"][data-id="{d.id}"]').get_by_test_id(
            "dlq-select"
        ).check()
    follow(page.get_by_test_id("dlq-resend-selected"))
    expect(page.get_by_test_id("flash")).to_contain_text("resent 2 dead letter(s)")
    # the broker: the two ticked are resent and back at the end of their origin queues
    letters = {d.id: d for d in admin_client.dlq_list(GROUP).letters}
    assert [letters[d.id].resent for d in new] == [True, True, False]
    assert {
        q: admin_client.queue_offsets(ORDERS, q).max_offset - end for q, end in ends.items()
    } == {0: 0, 2: 2}
    back = [admin_client.get_message(ORDERS, 2, ends[2] + i).messages[0].body for i in range(2)]
    assert back == [base64.b64decode(d.body) for d in chosen]
    # the page
    for d, state in ((chosen[0], "resent"), (chosen[1], "resent"), (left, "dead")):
        row = page.locator(f'[data-testid="dlq-row"][data-id="{d.id}"]')
        expect(row.get_by_test_id("dlq-state")).to_have_text(state)


def test_delete_a_topic_after_confirmation(
    admin_page: Any, admin_client: Client, console_url: str
) -> None:
    page = admin_page
    page.goto(f"{console_url}/topics/{SCRATCH}")
    follow(page.get_by_test_id("delete-topic"))
    # a wrong name deletes nothing
    page.get_by_test_id("delete-topic-confirm").fill(SCRATCH + "x")
    follow(page.get_by_test_id("delete-topic-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text("not deleted")
    assert SCRATCH in {t.name for t in admin_client.list_topics()}
    # the name deletes it
    page.get_by_test_id("delete-topic-confirm").fill(SCRATCH)
    follow(page.get_by_test_id("delete-topic-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text(f"topic {SCRATCH} deleted")
    expect(page).to_have_url(console_url + "/topics")
    assert SCRATCH not in {t.name for t in admin_client.list_topics()}
    expect(page.locator(f'[data-testid="topic-row"][data-topic="{SCRATCH}"]')).to_have_count(0)


def test_pause_and_resume_a_topic_and_a_group(
    admin_page: Any, admin_client: Client, console_url: str, seeded: Seeded, tmp_path: Path
) -> None:
    topic = "orders.paused"
    admin_client.create_topic(topic, 1)
    page = admin_page
    page.goto(f"{console_url}/topics/{topic}")
    expect(page.get_by_test_id("topic-paused")).to_have_text("no")
    follow(page.get_by_test_id("pause-topic"))
    expect(page.get_by_test_id("flash")).to_contain_text(f"topic {topic} paused")
    expect(page.get_by_test_id("topic-paused")).to_have_text("yes")
    assert admin_client.describe_topic(topic).info.paused
    # a producer is refused while the topic is paused: its send waits, then fails past its timeout
    with Producer(seeded.address, security=creds(ADMIN, ADMIN_PW), send_timeout=0.5, linger=0) as p:
        with pytest.raises(TopicPaused):
            p.send(topic, b"refused")
    shoot(page, "topic-paused", tmp_path)
    follow(page.get_by_test_id("resume-topic"))
    expect(page.get_by_test_id("flash")).to_contain_text(f"topic {topic} resumed")
    expect(page.get_by_test_id("topic-paused")).to_have_text("no")
    with Producer(seeded.address, security=creds(ADMIN, ADMIN_PW), linger=0) as p:
        served = p.send(topic, b"served")
    assert [m.body for m in admin_client.get_message(topic, 0, served.queue_offset).messages] == [
        b"served"
    ]
    # a group: a member's pull gets nothing while paused, though messages wait, and is served after
    member = "paused-member"
    lease = f"{ORDERS}/0"
    joined = admin_client.heartbeat(
        control.Heartbeat(GROUP, member, [ORDERS], host="test", acquire=[lease])
    )
    assert lease in joined.held
    try:
        offset = admin_client.query_offset(GROUP, ORDERS, 0)
        pull = wire.PullRequest(ORDERS, 0, offset, group=GROUP, consumer_id=member)
        assert admin_client.queue_offsets(ORDERS, 0).max_offset > offset  # messages to deliver
        page.goto(f"{console_url}/groups/{GROUP}")
        follow(page.get_by_test_id("pause-group"))
        expect(page.get_by_test_id("flash")).to_contain_text(f"group {GROUP} paused")
        expect(page.get_by_test_id("group-paused")).to_have_text("yes")
        assert admin_client.describe_group(GROUP).paused
        held = admin_client.pull(pull)
        assert held.messages == [] and held.max_offset > offset
        follow(page.get_by_test_id("resume-group"))
        expect(page.get_by_test_id("flash")).to_contain_text(f"group {GROUP} resumed")
        assert not admin_client.describe_group(GROUP).paused
        served = admin_client.pull(pull)
        want = admin_client.get_message(ORDERS, 0, offset).messages[0]
        assert served.messages and served.messages[0].body == want.body
    finally:
        admin_client.leave_group(GROUP, member)
