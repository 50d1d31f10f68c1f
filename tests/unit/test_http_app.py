"""The HTTP port's ASGI application (:func:`equeue.broker.http.http_app`) through
Starlette's test client (trio backend), over a real store: the answers' codes,
types and bodies, without sockets."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from equeue import control
from equeue.broker.http import MAX_REQUEST_HEAD, Readiness, http_app
from equeue.broker.metrics import Metrics, ReplicationSample
from equeue.broker.stats import Histogram
from equeue.broker.storage import CommitOffsetOp, CreateTopicOp, Store

with warnings.catch_warnings():  # Starlette 1.x asks for httpx2 instead of httpx; httpx serves
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

STATS = control.BrokerStats(
    "9.9", 1.5, 2, 1, 10, 7, 1000, 700, 0.5, 0.25, 0, 10, 4096, 1 << 30, "async"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "d", map_size=1 << 26, sync=False)
    s.write([CreateTopicOp("orders", 3)])
    try:
        yield s
    finally:
        s.close()


def client(
    store: Store, readiness: Readiness, sample: ReplicationSample | None = None
) -> TestClient:
    metrics = Metrics(
        lambda: STATS, store, 2, ready=lambda: readiness.ready, replication=lambda: sample
    )
    return TestClient(http_app(metrics, lambda: readiness), backend="trio")


def test_ready_and_not_ready(store: Store) -> None:
    with client(store, Readiness(True, "standalone")) as c:
        assert c.get("/healthz").json() == {"alive": True}
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json() == {
            "ready": True,
            "role": "standalone",
            "reason": "",
        }
    why = Readiness(False, "follower", "behind the high watermark (4 < 10)")
    with client(store, why) as c:
        assert c.get("/healthz").status_code == 200  # alive all the same
        r = c.get("/readyz")
        assert r.status_code == 503 and r.headers["content-type"] == "application/json"
        assert r.json() == {
            "ready": False,
            "role": "follower",
            "reason": "behind the high watermark (4 < 10)",
        }


def test_metrics_of_a_leader(store: Store) -> None:
    status = control.ReplicationStatus(
        "leader", "g1", "b1", 4, "b1", 10, 9, 100, ["b1", "b2"], "all", 1,
        replicas=[control.ReplicaStatus("b2", "h:1", 9, 3, 250, True, 0.1)],
    )  # fmt: skip
    with client(store, Readiness(True, "leader"), ReplicationSample(status, 2, False)) as c:
        r = c.get("/metrics", params={"queues": "1"})
        assert (
            r.status_code == 200
            and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        )
        values = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples
        }
    assert values[("equeue_info", (("flush", "async"), ("version", "9.9")))] == 1
    assert (
        values[("equeue_messages_in_total", ())] == 10
        and values[("equeue_bytes_out_total", ())] == 700
    )
    assert values[("equeue_topic_queues", (("topic", "orders"),))] == 3
    # 2 queues at most (the limit), 1 omitted
    assert {lb for n, lb in values if n == "equeue_queue_max_offset"} == {
        (("queue", "0"), ("topic", "orders")), (("queue", "1"), ("topic", "orders"))
    }  # fmt: skip
    assert values[("equeue_metrics_queues_omitted", ())] == 1
    assert values[("equeue_ready", ())] == 1
    assert (
        values[("equeue_replication_leader", ())] == 1
        and values[("equeue_replication_isr_size", ())] == 2
    )
    assert values[("equeue_replication_promotions_total", ())] == 2
    assert values[("equeue_replication_follower_lag_messages", (("follower", "b2"),))] == 3
    assert values[("equeue_replication_follower_lag_seconds", (("follower", "b2"),))] == 0.25


def test_methods_paths_and_head_size(store: Store) -> None:
    with client(store, Readiness(True, "standalone")) as c:
        assert c.post("/metrics").status_code == 405
        r = c.get("/nope")
        assert r.status_code == 404 and "/readyz" in r.text
        r = c.get("/stats", headers={"x-big": "a" * MAX_REQUEST_HEAD})
        assert r.status_code == 431
        assert c.get("/stats").json()["messages_in"] == 10


def test_group_lag_per_queue_is_bounded_by_the_queue_limit(store: Store) -> None:
    """The limit (2 here) caps the per-queue series and, separately, the group queues'
    lag; what is left out is counted in the omitted gauge."""
    store.write([CommitOffsetOp("g", "orders", q, 0) for q in range(3)])
    with client(store, Readiness(True, "standalone")) as c:
        text = c.get("/metrics", params={"topic": "orders"}).text
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("equeue_group_lag", (("group", "g"), ("topic", "orders")))] == 0
    assert len([n for n, _ in values if n == "equeue_group_queue_lag"]) == 2
    assert len([n for n, _ in values if n == "equeue_queue_max_offset"]) == 2
    assert values[("equeue_metrics_queues_omitted", ())] == 2


def test_a_latency_histogram_counts_each_observation_in_its_inclusive_bucket() -> None:
    h = Histogram((0.1, 1.0))
    for seconds in (0.1, 0.5, 1.0, 2.0):
        h.observe(seconds)
    buckets, total = h.cumulative()
    assert buckets == [("0.1", 1), ("1.0", 3), ("+Inf", 4)]
    assert total == pytest.approx(3.6)
