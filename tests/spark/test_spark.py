"""The equeue Spark source and sink against a real broker and a real local Spark.

One embedded broker for the module and the run's shared SparkSession
(tests/spark/conftest.py); every test uses its own topics and directories. Streams
use availableNow triggers (deterministic, and stopping a query mid-batch would log
error traces).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")

from equeue import Message, wire  # noqa: E402
from equeue.broker import EmbeddedBroker  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.config import BrokerConfig  # noqa: E402
from tests.conftest import wait_until_sync  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    cfg = BrokerConfig(
        data_dir=tmp_path_factory.mktemp("spark-broker") / "data", port=0, map_size=1 << 30,
        flush="async", retention_check_interval=0.3, shutdown_grace=2.0,
    )  # fmt: skip
    with EmbeddedBroker(cfg) as b:
        yield b


@pytest.fixture(scope="module")
def client(broker: EmbeddedBroker) -> Iterator[Client]:
    with Client(broker.address) as c:
        yield c


def produce(c: Client, topic: str, queue: int, n: int, tag: str = "t") -> None:
    """``n`` messages into one queue: body ``<topic>-<queue>-<i>``, every other one keyed."""
    start = c.queue_offsets(topic, queue).max_offset
    entries = [
        wire.encode_entry(
            Message(
                f"{topic}-{queue}-{start + i}",
                key=f"k{i}" if i % 2 else None,
                tags=tag,
                properties={"i": str(start + i)} if i % 3 == 0 else {},
            )
        )
        for i in range(n)
    ]
    for k in range(0, n, 1000):
        c.produce(wire.ProduceRequest(topic, queue, entries[k : k + 1000]))


def stream(ss: Any, broker: EmbeddedBroker, topic: str, **options: Any) -> Any:
    r = ss.readStream.format("equeue").option("brokers", broker.address).option("topic", topic)
    r = r.option("startingOffsets", "earliest")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def to_parquet(df: Any, out: Path, checkpoint: Path) -> Any:
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    return q


def pairs(ss: Any, out: Path) -> list[tuple[int, int]]:
    return sorted((r.queue_id, r.queue_offset) for r in ss.read.parquet(str(out)).select("queue_id", "queue_offset").collect())


def expected(client: Client, topic: str) -> list[tuple[int, int]]:
    d = client.describe_topic(topic)
    return sorted((qs.queue_id, o) for qs in d.queues for o in range(qs.min_offset, qs.max_offset))


def rows_per_batch(q: Any) -> list[int]:
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


# --------------------------------------------------------------------------- source
def test_available_now_max_offsets_exactly_once_then_restart(
    ss: Any, broker: EmbeddedBroker, client: Client, tmp_path: Path
) -> None:
    client.create_topic("s-avail", 4)
    for q, n in enumerate((40, 160, 100, 0)):  # uneven lag: the limit is split by lag
        produce(client, "s-avail", q, n)
    out, ck = tmp_path / "out", tmp_path / "ck"
    q = to_parquet(stream(ss, broker, "s-avail", maxOffsetsPerTrigger=120), out, ck)
    batches = rows_per_batch(q)
    assert len(batches) >= 3 and max(batches) <= 120 and sum(batches) == 300
    got = pairs(ss, out)
    assert got == expected(client, "s-avail") and len(got) == 300  # every (queue, offset) once

    for qid in range(4):
        produce(client, "s-avail", qid, 25)
    q = to_parquet(stream(ss, broker, "s-avail", maxOffsetsPerTrigger=120), out, ck)
    assert sum(rows_per_batch(q)) == 100  # only the new rows
    got = pairs(ss, out)
    assert got == expected(client, "s-avail") and len(got) == 400
    src = q.lastProgress["sources"][0]
    assert json.loads(src["latestOffset"]) == json.loads(src["endOffset"])  # reportLatestOffset


def test_batch_read_json_offsets_exact_range(ss: Any, broker: EmbeddedBroker, client: Client) -> None:
    client.create_topic("s-range", 3)
    for qid in range(3):
        produce(client, "s-range", qid, 20, tag=f"tag{qid}")
    df = (
        ss.read.format("equeue")
        .option("brokers", broker.address)
        .option("topic", "s-range")
        .option("startingOffsets", json.dumps({"s-range": {"0": 5, "1": -2, "2": 18}}))
        .option("endingOffsets", json.dumps({"s-range": {"0": 9, "1": 3, "2": -1}}))
        .load()
    )
    rows = df.orderBy("queue_id", "queue_offset").collect()
    assert [(r.queue_id, r.queue_offset) for r in rows] == (
        [(0, o) for o in range(5, 9)] + [(1, o) for o in range(0, 3)] + [(2, 18), (2, 19)]
    )
    r = rows[0]  # queue 0 offset 5 = the 6th message of queue 0
    assert (r.topic, bytes(r.body), r.key, r.tags) == ("s-range", b"s-range-0-5", "k5", "tag0")
    assert rows[1].properties == {"i": "6"} and rows[0].properties == {}
    assert r.timestamp.year >= 2024 and r.global_offset >= 0
    assert df.schema.simpleString() == (
        "struct<topic:string,queue_id:int,queue_offset:bigint,global_offset:bigint,key:string,"
        "tags:string,properties:map<string,string>,body:binary,timestamp:timestamp>"
    )


def _wait_retention(client: Client, topic: str, low: int) -> None:
    wait_until_sync(
        lambda: client.queue_offsets(topic, 0).min_offset >= low, timeout=20, interval=0.1, what="retention ran"
    )


def test_fail_on_data_loss_both_ways(ss: Any, broker: EmbeddedBroker, client: Client) -> None:
    client.create_topic("s-loss", 1)
    produce(client, "s-loss", 0, 30)
    client.alter_topic("s-loss", retention_ms=1)  # everything stored so far expires
    _wait_retention(client, "s-loss", 30)
    client.alter_topic("s-loss", retention_ms=-1)  # -1 = keep forever (no limit) again
    produce(client, "s-loss", 0, 10)  # offsets 30..39 remain

    def read(**options: str) -> Any:
        r = ss.read.format("equeue").option("brokers", broker.address).option("topic", "s-loss")
        r = r.option("startingOffsets", '{"s-loss": {"0": 10}}')
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match="no longer retained") as exc:
        read().collect()
    assert "failOnDataLoss" in str(exc.value)
    rows = read(failOnDataLoss="false").collect()
    assert sorted(r.queue_offset for r in rows) == list(range(30, 40))


def test_group_option_commits_end_offsets(ss: Any, broker: EmbeddedBroker, client: Client, tmp_path: Path) -> None:
    client.create_topic("s-group", 2)
    produce(client, "s-group", 0, 30)
    produce(client, "s-group", 1, 12)
    q = to_parquet(stream(ss, broker, "s-group", group="spark-job", maxOffsetsPerTrigger=20), tmp_path / "o", tmp_path / "c")
    assert sum(rows_per_batch(q)) == 42
    desc = client.describe_group("spark-job")
    got = {(g.topic, g.queue_id): (g.committed, g.lag) for g in desc.queues}
    assert got == {("s-group", 0): (30, 0), ("s-group", 1): (12, 0)}


def test_new_queue_is_read_from_zero(ss: Any, broker: EmbeddedBroker, client: Client, tmp_path: Path) -> None:
    client.create_topic("s-grow", 2)
    produce(client, "s-grow", 0, 10)
    produce(client, "s-grow", 1, 10)
    out, ck = tmp_path / "out", tmp_path / "ck"
    to_parquet(stream(ss, broker, "s-grow"), out, ck)
    produce(client, "s-grow", 0, 3)
    client.alter_topic("s-grow", queues=3)
    produce(client, "s-grow", 2, 7)
    q = to_parquet(stream(ss, broker, "s-grow"), out, ck)
    assert sum(rows_per_batch(q)) == 10
    assert pairs(ss, out) == [(0, o) for o in range(13)] + [(1, o) for o in range(10)] + [(2, o) for o in range(7)]


# --------------------------------------------------------------------------- crash
def _driver(broker: EmbeddedBroker, topic: str, out: Path, ck: Path, marker: Path | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(ROOT / "tests" / "spark" / "_driver.py"), broker.address, topic, str(out), str(ck)]
    if marker is not None:
        cmd.append(str(marker))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_driver_sigkill_between_offsets_and_commit(ss: Any, broker: EmbeddedBroker, client: Client, tmp_path: Path) -> None:
    client.create_topic("s-kill", 2)
    produce(client, "s-kill", 0, 150)
    produce(client, "s-kill", 1, 90)
    out, ck, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "reading"
    p = _driver(broker, "s-kill", out, ck, marker)
    try:

        def reading() -> bool:
            assert p.poll() is None, f"driver exited early ({p.returncode})"
            return marker.exists()

        wait_until_sync(reading, timeout=150, interval=0.2, what="the driver reads the second batch")
        # batch 1 is planned (offsets logged) and being read; it is not committed
        assert (ck / "offsets" / "1").exists() and not (ck / "commits" / "1").exists()
        assert (ck / "commits" / "0").exists()
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the Python driver, its JVM and its workers
        p.wait(30)
    # a new driver (this process's session: a second JVM start would only cost time)
    # resumes from the checkpoint: it replays batch 1 with the logged ranges, then the rest
    q = to_parquet(stream(ss, broker, "s-kill", maxOffsetsPerTrigger=100), out, ck)
    assert [(p["batchId"], p["numInputRows"]) for p in q.recentProgress if p["numInputRows"]] == [(1, 100), (2, 40)]
    got = pairs(ss, out)
    assert got == expected(client, "s-kill") and len(got) == 240  # no loss, no duplicate


# --------------------------------------------------------------------------- sink
def _count(client: Client, topic: str) -> int:
    return sum(qs.max_offset - qs.min_offset for qs in client.describe_topic(topic).queues)


def test_sink_replayed_batch_is_not_duplicated(
    ss: Any, broker: EmbeddedBroker, client: Client, tmp_path: Path
) -> None:
    client.create_topic("k-in", 2)
    client.create_topic("k-out", 3)
    produce(client, "k-in", 0, 60)
    produce(client, "k-in", 1, 40)
    ck = tmp_path / "ck"

    def run() -> Any:
        q = (
            stream(ss, broker, "k-in", maxOffsetsPerTrigger=50)
            .selectExpr("key", "body", "tags", "properties")
            .writeStream.format("equeue")
            .option("brokers", broker.address)
            .option("topic", "k-out")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        return q

    q = run()
    assert sum(rows_per_batch(q)) == 100 and _count(client, "k-out") == 100
    # forget that the last batch was committed: Spark replays it with the same batch id
    commits = sorted(int(f.name) for f in (ck / "commits").iterdir() if f.name.isdigit())
    last = commits[-1]
    (ck / "commits" / str(last)).unlink()
    (ck / "commits" / f".{last}.crc").unlink(missing_ok=True)
    q = run()
    replayed = [p for p in q.recentProgress if p["batchId"] == last and p["numInputRows"]]
    assert replayed, "Spark did not replay the uncommitted batch"
    assert _count(client, "k-out") == 100  # the replay stored nothing twice
    got = ss.read.format("equeue").option("brokers", broker.address).option("topic", "k-out").load()
    bodies = sorted(bytes(r.body).decode() for r in got.select("body").collect())
    want = sorted(f"k-in-{qid}-{o}" for qid, n in ((0, 60), (1, 40)) for o in range(n))
    assert bodies == want
    keyed = got.where("key is not null").select("key", "queue_id").collect()
    from equeue.routing import queue_for_key

    assert keyed and all(r.queue_id == queue_for_key(r.key, 3) for r in keyed)


def test_batch_write_appends(ss: Any, broker: EmbeddedBroker, client: Client) -> None:
    client.create_topic("k-batch", 2)
    df = ss.createDataFrame([(f"v{i}", f"key{i % 5}" if i % 2 else None) for i in range(50)], "body string, key string")
    df.write.format("equeue").option("brokers", broker.address).option("topic", "k-batch").mode("append").save()
    assert _count(client, "k-batch") == 50
    with pytest.raises(Exception, match="only appends"):
        df.write.format("equeue").option("brokers", broker.address).option("topic", "k-batch").mode("overwrite").save()
