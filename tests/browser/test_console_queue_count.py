"""Changing a topic's queue count from its console page, in headless Chromium, against
the seeded broker of tests/browser/conftest.py (its own broker and console: a console
that fails here must not take the other modules' pages with it).

The console's route of the topic is read again when the broker answers with more
queues than it holds (``AsyncAdminClient.describe_topic``), so the page shows the new
queue at once and the sampler reads it too; a defect in the sampler is logged, never
the end of the console."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from equeue.client.client import Client
from tests.browser.harness import ADMIN, ADMIN_PW, ConsoleProcess, follow, sign_in
from tests.conftest import wait_until_sync

pytestmark = pytest.mark.xdist_group("browser-console-queue-count")

TOPIC = "orders.grown"


@pytest.fixture(autouse=True)
def _the_console_logs_no_error(console: ConsoleProcess) -> Iterator[None]:
    yield
    console.check()


def queue_2_sampled(page: Any) -> bool:
    """The topic page (reloaded) shows a rate for queue 2: the sampler read the topic
    with its third queue."""
    page.reload()
    rate = page.locator('[data-testid="queue-row"][data-queue="2"]').get_by_test_id("queue-rate")
    return rate.count() == 1 and rate.inner_text().strip() not in ("", "–")


def test_change_a_topics_queue_count(
    context: Any, admin_client: Client, console_url: str, console: ConsoleProcess
) -> None:
    admin_client.create_topic(TOPIC, 2)
    page = sign_in(context, console_url, ADMIN, ADMIN_PW)
    page.goto(f"{console_url}/topics/{TOPIC}")
    expect(page.get_by_test_id("queue-row")).to_have_count(2)
    page.get_by_test_id("alter-topic-queues").fill("3")
    follow(page.get_by_test_id("alter-topic-submit"))
    expect(page.get_by_test_id("flash")).to_contain_text(f"topic {TOPIC} now has 3 queues")
    assert {t.name: t for t in admin_client.list_topics()}[TOPIC].queues == 3
    expect(page.get_by_test_id("queue-row")).to_have_count(3, timeout=3000)
    # the sampler (every second here) reads the grown topic too, and the console lives on
    wait_until_sync(
        lambda: queue_2_sampled(page), timeout=15, interval=0.5, what="the sampler reads queue 2"
    )
    assert console.proc is not None and console.proc.poll() is None
