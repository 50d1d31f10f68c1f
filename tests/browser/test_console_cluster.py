"""The web console of a real cluster in headless Chromium: one etcd and two broker
groups of two replicas each (:class:`equeue.broker.cluster.local.LocalCluster`), no
users file (the console is open and says so). The cluster page (leaders, epochs, ISR,
followers caught up), the overview and a topic spread over both groups, against the
cluster's own answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from equeue.broker.cluster.local import LocalCluster
from equeue.client import async_admin as admin
from equeue.client.client import Client
from equeue.producer import Producer
from tests.browser.harness import ConsoleProcess, follow, new_context, number, shoot, text
from tests.conftest import wait_until_sync

pytestmark = pytest.mark.xdist_group("browser-console-cluster")

TOPIC = "spread"
QUEUES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd and broker groups g1, g2 (a leader and a follower each), with a topic of 4
    queues placed over both and a few messages in each queue; returns once every
    follower is in sync and caught up."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), groups=2, base_port=0, replicas=2).start()
    try:
        with Client(c.bootstrap) as client:
            client.create_topic(TOPIC, QUEUES)
        with Producer(c.bootstrap) as p:
            for i in range(QUEUES * 3):
                p.send(TOPIC, f"m{i}", key=f"k{i}")
        wait_until_sync(
            lambda: caught_up(report(c)),
            timeout=20,
            interval=0.2,
            what="every follower is in sync and caught up",
        )
        yield c
    finally:
        c.stop()


def report(cluster: LocalCluster) -> admin.ClusterReport:
    return admin.run_routed(cluster.bootstrap, lambda a: a.cluster_report())


def caught_up(r: admin.ClusterReport) -> bool:
    """Both groups report a leader with one follower, in sync and 0 messages behind."""
    followers = [f for g in r.replication if g.status for f in g.status.replicas]
    return (
        len(r.replication) == 2
        and len(followers) == 2
        and all(f.in_sync and not f.lag_messages for f in followers)
    )


@pytest.fixture(scope="module")
def console(cluster: LocalCluster) -> Iterator[ConsoleProcess]:
    with ConsoleProcess(cluster.bootstrap) as c:
        yield c


@pytest.fixture(autouse=True)
def _console_logged_no_error(console: ConsoleProcess) -> Iterator[None]:
    yield
    console.check()


@pytest.fixture(scope="module")
def page(browser: Any, console: ConsoleProcess) -> Iterator[Any]:
    """A page of the cluster's console (open: no sign-in)."""
    with new_context(browser) as ctx:
        p = ctx.new_page()
        p.goto(console.url + "/")
        expect(p.get_by_test_id("open-mode-banner")).to_be_visible()
        yield p


def test_cluster_page_shows_each_groups_leader_and_replicas(
    page: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    follow(page.get_by_test_id("nav-cluster"))
    expect(page.get_by_test_id("etcd-health")).to_have_text("reachable")
    now = report(cluster)
    groups = {g.name: g for g in now.status.groups}
    assert set(groups) == {"g1", "g2"} and caught_up(now)
    shown = page.get_by_test_id("broker-group")
    expect(shown).to_have_count(2)
    for name, g in groups.items():
        box = page.locator(f'[data-testid="broker-group"][data-group="{name}"]')
        assert g.leader and text(box, "group-leader") == g.leader
        assert number(box, "group-epoch") == g.epoch
        assert text(box, "group-isr") == ", ".join(g.isr) and len(g.isr) == 2
        replicas = box.get_by_test_id("replica-row")
        expect(replicas).to_have_count(len(g.brokers))
        for b in g.brokers:
            row = box.locator(f'[data-testid="replica-row"][data-broker="{b.broker_id}"]')
            expect(row).to_contain_text(b.address)
            expect(row).to_contain_text("leader" if b.broker_id == g.leader else "follower")
            assert number(row, "replica-lag") == 0  # the leader, and its follower caught up
    shoot(page, "cluster", tmp_path)


def test_overview_lists_every_broker(page: Any, cluster: LocalCluster) -> None:
    follow(page.get_by_test_id("nav-overview"))
    rows = page.get_by_test_id("broker-row")
    expect(rows).to_have_count(4)
    addresses = {b.address for b in cluster.brokers.values()}
    assert {rows.nth(i).get_attribute("data-address") for i in range(4)} == addresses
    for b in cluster.brokers.values():
        with Client(b.address) as c:
            version = c.stats().version
        row = page.locator(f'[data-testid="broker-row"][data-address="{b.address}"]')
        assert text(row, "broker-version") == version


def test_topic_page_shows_each_queues_owner_group(page: Any, cluster: LocalCluster) -> None:
    merged = admin.run_routed(cluster.bootstrap, lambda a: a.describe_topic(TOPIC))
    assert set(merged.owners) == {"g1", "g2"}  # placed over both groups
    follow(page.get_by_test_id("nav-topics"))
    follow(
        page.locator(f'[data-testid="topic-row"][data-topic="{TOPIC}"]').get_by_test_id(
            "topic-link"
        )
    )
    expect(page.get_by_test_id("topic-name")).to_have_text(TOPIC)
    rows = page.get_by_test_id("queue-row")
    expect(rows).to_have_count(QUEUES)
    for qid, (q, owner) in enumerate(zip(merged.queues, merged.owners, strict=True)):
        assert q is not None
        row = page.locator(f'[data-testid="queue-row"][data-queue="{qid}"]')
        assert text(row, "queue-owner") == owner
        assert (number(row, "queue-max"), number(row, "queue-count")) == (q.max_offset, q.count)
    assert sum(q.count for q in merged.queues if q) == QUEUES * 3
