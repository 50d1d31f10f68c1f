"""The Spark source and sink against a cluster: a real etcd and two
broker groups in processes, a topic of 6 queues (3 per group).

The source bootstraps from ONE broker, yet reads every queue of both groups, each
from its owner; the sink writes through the routing producer. The route-table logic
the driver uses (``equeue.spark.common.Routes``) is checked without Spark first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue.control import GroupRoute, RouteTable, TopicInfo, TopicRoute
from equeue.errors import QueueUnavailable
from equeue.spark.common import Owner, Routes

pyspark = pytest.importorskip("pyspark")

from equeue.broker.cluster.etcdproc import EtcdProcess  # noqa: E402
from equeue.producer import Producer  # noqa: E402
from equeue.routing import queue_for_key  # noqa: E402
from tests.cluster.test_scenarios import Cluster  # noqa: E402
from tests.conftest import wait_until_sync  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def table(owners: list[str], groups: dict[str, list[str]], cluster: bool = True) -> RouteTable:
    return RouteTable(
        cluster, 7, [GroupRoute(n, a) for n, a in groups.items()], [TopicRoute(TopicInfo("t", 1, len(owners)), owners)]
    )


def test_routes_map_queues_to_owners_and_refuse_a_down_group() -> None:
    r = Routes(table(["a", "b", "a", "c"], {"a": ["h1:1"], "b": ["h2:1", "h2:2"], "c": []}), "boot:1")
    assert r.queues("t") == 4 and r.queues("nope") == 0
    assert r.owner("t", 1) == Owner("b", "h2:1,h2:2")
    assert r.by_owner("t", [0, 1, 2]) == {Owner("a", "h1:1"): [0, 2], Owner("b", "h2:1,h2:2"): [1]}
    with pytest.raises(QueueUnavailable, match=r"t: queue\(s\) 3 are owned by broker group 'c'"):
        r.by_owner("t")
    # standalone (and a queue the table does not list): the bootstrap brokers
    s = Routes(table(["", ""], {}, cluster=False), "boot:1")
    assert s.by_owner("t") == {Owner("", "boot:1"): [0, 1]}
    assert s.owner("gone", 3) == Owner("", "boot:1")


def test_sink_picks_queues_from_the_rows_alone_not_from_availability() -> None:
    """A replayed sink task must send each row to the queue the first attempt chose,
    even if a group went down or came back in between: the producer's keyless
    round-robin skips unavailable queues, the sink's does not."""
    from equeue.producer import ProducerOptions
    from equeue.producer.routes import Route
    from equeue.spark.sink import sink_options

    route = Route("t", 4)
    route.available = [0, 2]  # the groups of queues 1 and 3 are down
    plain = ProducerOptions()
    assert [route.select(None, plain, b"", None, None, 0) for _ in range(4)] == [0, 2, 0, 2]
    sink = sink_options(b"p" * 16)
    assert [route.select(None, sink, b"", None, None, 0) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    assert route.select(b"k7", sink, b"", None, None, 0) == queue_for_key("k7", 4)


# --------------------------------------------------------------------------- Spark
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with EtcdProcess() as etcd:
        c = Cluster(tmp_path_factory.mktemp("spark-cluster"), etcd, ("g1", "g2"))
        try:
            for g in c.groups:
                c.start_group(g)
            c.heal()
            yield c
        finally:
            c.close()


def check_per_key_order(rows: list[Any]) -> None:
    """Rows ``(queue_id, queue_offset, key, body "key:i")``: each key sits in one queue
    and its ``i`` grows with the queue offset."""
    by_key: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for r in rows:
        by_key[r.key].append((r.queue_id, r.queue_offset, int(bytes(r.body).decode().split(":")[1])))
    for key, items in by_key.items():
        assert len({q for q, _, _ in items}) == 1, f"key {key} in several queues"
        seq = [i for _, _, i in sorted(items)]
        assert seq == sorted(seq), f"key {key} out of order"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_source_and_sink_against_two_groups(ss: Any, cluster: Cluster, tmp_path: Path) -> None:
    from equeue.spark.source import EQueueBatchReader, RangePartition

    g1, g2 = cluster.address("g1"), cluster.address("g2")
    cluster.client("g1").create_topic("sp", 6)
    cluster.client("g1").create_topic("sp-out", 6)
    owners = cluster.owners("sp")
    assert sorted(owners) == ["g1", "g1", "g1", "g2", "g2", "g2"]
    n, keys = 3000, 50
    sent = {f"k{i % keys}:{i}" for i in range(n)}
    with Producer(cluster.bootstrap) as p:
        for i in range(n):
            p.send_async("sp", f"k{i % keys}:{i}", key=f"k{i % keys}")
        p.flush()

    # the driver plans one partition per queue, each carrying its owner's address
    reader = EQueueBatchReader({"brokers": g1, "topic": "sp"}, ss.read.format("equeue").load().schema)
    parts = [x for x in reader.partitions() if isinstance(x, RangePartition)]
    assert sorted(x.queue_id for x in parts) == list(range(6))
    for x in parts:
        assert (x.group, x.address) == (owners[x.queue_id], cluster.address(owners[x.queue_id]))

    # batch read bootstrapped from g1 only: every row of both groups, once
    df = ss.read.format("equeue").option("brokers", g1).option("topic", "sp").load()
    rows = df.select("queue_id", "queue_offset", "key", "body").collect()
    assert len(rows) == n and len({(r.queue_id, r.queue_offset) for r in rows}) == n
    assert {bytes(r.body).decode() for r in rows} == sent
    check_per_key_order(rows)

    # availableNow stream bootstrapped from g2, written by the sink to another topic
    q = (
        ss.readStream.format("equeue").option("brokers", g2).option("topic", "sp")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 1500).load()
        .select("key", "body")
        .writeStream.format("equeue").option("brokers", g2).option("topic", "sp-out")
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )  # fmt: skip
    assert q.awaitTermination(180)
    assert q.exception() is None
    out = ss.read.format("equeue").option("brokers", g1).option("topic", "sp-out").load()
    out_rows = out.select("queue_id", "queue_offset", "key", "body").collect()
    assert len(out_rows) == n and {bytes(r.body).decode() for r in out_rows} == sent, "each row once"
    assert {r.queue_id for r in out_rows} == set(range(6)), "the sink wrote to both groups' queues"
    check_per_key_order(out_rows)

    # a group down: planning fails with a coded error naming the queues and the group
    assert cluster.brokers["g2"].stop() == 0
    down = ", ".join(str(i) for i, g in enumerate(owners) if g == "g2")

    def g2_down() -> bool:
        return not {x.name: x for x in cluster.status("g1").groups}["g2"].available

    wait_until_sync(g2_down, timeout=30, interval=0.1, what="g1 sees g2 down")
    # the planner waits out a failover for failoverTimeout (default 30 s) before it
    # gives up; a group that stays down fails the same way after a shorter wait
    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match=f"sp: queue\\(s\\) {down} are owned by broker group 'g2'"):
        EQueueBatchReader({"brokers": g1, "topic": "sp", "failoverTimeout": "1"}, df.schema).partitions()
    assert time.monotonic() - started >= 1, "planning gave up before failoverTimeout"
