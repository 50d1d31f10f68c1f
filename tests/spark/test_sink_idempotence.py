"""The sink's publishing protocol without Spark: a task that died half-way and is run
again with the same producer id stores every row exactly once (real broker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from broker import BrokerConfig, EmbeddedBroker
from equeue import wire
from equeue.routing import queue_for_key
from producer import Client
from spark import sink
from spark.common import drop_client
from spark.source import allocate, split_ranges

pytestmark = [pytest.mark.spark, pytest.mark.timeout(60)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data", port=0, map_size=1 << 28)) as b:
        yield b
        drop_client(b.address)


def _rows(n: int) -> list[tuple[str | None, bytes]]:
    return [(f"user-{i % 7}" if i % 3 else None, f"row-{i}".encode()) for i in range(n)]


def _publish(addr: str, pid: bytes, rows: list[tuple[str | None, bytes]], stop_after: int | None = None) -> sink.SinkCommit:
    pub = sink._Publisher(addr, "out", pid, 0)
    for key, body in rows:
        if stop_after is not None and pub.commit.requests >= stop_after:
            return pub.commit  # the task "dies": buffered rows are never sent
        pub.add("out", key, sink._encode(body, key, None, None))
    return pub.close()


def _stored(c: Client) -> list[tuple[int, bytes, str | None]]:
    out = []
    for qs in c.describe_topic("out").queues:
        r = c.pull(wire.PullRequest("out", qs.queue_id, 0, 10_000))
        out += [(m.queue_id, m.body, m.key) for m in r.messages]
    return out


def test_half_done_task_replayed_stores_each_row_once(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink, "MAX_REQUEST_ENTRIES", 10)  # many requests per queue
    rows = _rows(200)
    pid = sink.producer_id_for("spark-stream", "query-1", 7, 0)
    with Client(broker.address) as c:
        c.create_topic("out", 3)
        first = _publish(broker.address, pid, rows, stop_after=5)
        assert 0 < first.stored < 200
        again = _publish(broker.address, pid, rows)  # Spark replays the task
        assert again.rows == 200 and again.duplicates == first.stored
        assert again.stored == 200 - first.stored
        third = _publish(broker.address, pid, rows)  # and once more: nothing new
        assert third.stored == 0 and third.duplicates == 200
        stored = _stored(c)
        assert sorted(b for _, b, _ in stored) == sorted(b for _, b in rows)
        assert all(q == queue_for_key(k, 3) for q, _, k in stored if k is not None)
        # another batch id is another producer: its rows are new messages
        other = _publish(broker.address, sink.producer_id_for("spark-stream", "query-1", 8, 0), rows[:10])
        assert other.stored == 10


def test_allocate_splits_budget_by_lag() -> None:
    lags = {("t", "0"): 300, ("t", "1"): 100, ("t", "2"): 0}
    assert allocate(lags, 1000) == lags
    got = allocate(lags, 100)
    assert got == {("t", "0"): 75, ("t", "1"): 25, ("t", "2"): 0}
    got = allocate({("t", "0"): 5, ("t", "1"): 5, ("t", "2"): 5}, 2)
    assert sum(got.values()) == 2 and max(got.values()) == 1


def test_split_ranges_min_partitions_and_cap() -> None:
    parts = split_ranges([("t", 0, 0, 100), ("t", 1, 50, 50), ("t", 2, 0, 10)], 1, 40)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 0, 33), (0, 33, 66), (0, 66, 100), (2, 0, 10)]
    parts = split_ranges([("t", 0, 0, 90), ("t", 1, 0, 10)], 10, 1_000_000)
    assert len(parts) == 10 and sum(p.end - p.start for p in parts) == 100
