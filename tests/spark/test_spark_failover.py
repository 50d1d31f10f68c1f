"""A Spark availableNow query reads a topic of a 3-replica broker
group (real etcd, real broker processes, ``--cluster-lease-ttl 2``) into Parquet while
the group's leader is SIGKILLed between its micro-batches; the Parquet output holds
every row exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")

from equeue.broker.cluster.etcdproc import EtcdProcess  # noqa: E402
from equeue.producer import Producer  # noqa: E402
from tests.cluster.replication.conftest import ReplicaGroup  # noqa: E402
from tests.conftest import wait_until_sync  # noqa: E402


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_available_now_to_parquet_across_a_failover(ss: Any, tmp_path: Path) -> None:
    n, queues, per_trigger = 6_000, 4, 1_500
    with EtcdProcess() as etcd:
        rs = ReplicaGroup(tmp_path / "brokers", etcd.endpoint, "s", 3).start()
        try:
            leader = rs.leader()
            rs.client(leader).create_topic("sf", queues)
            rs.wait_isr(3)
            sent = {f"k{i % 50}:{i}" for i in range(n)}
            with Producer(rs.bootstrap) as p:
                for body in sent:
                    p.send_async("sf", body, key=body.split(":")[0])
                p.flush()

            out, ck = tmp_path / "out", tmp_path / "ck"
            commits = ck / "commits"
            q = (
                ss.readStream.format("equeue").option("brokers", rs.bootstrap).option("topic", "sf")
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_trigger).load()
                .select("queue_id", "queue_offset", "key", "body")
                .writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
            )  # fmt: skip

            def batches_done() -> int:
                return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.exists() else 0

            killed: list[tuple[int, float]] = []

            def kill_after_first_batch() -> None:
                wait_until_sync(lambda: batches_done() >= 1 or not q.isActive, timeout=120, interval=0.02,
                                what="the first micro-batch committed")  # fmt: skip
                if q.isActive:
                    killed.append((batches_done(), time.monotonic()))
                    rs.kill(leader)

            killer = threading.Thread(target=kill_after_first_batch, daemon=True)
            killer.start()
            assert q.awaitTermination(240), "the availableNow query did not finish"
            killer.join(10)
            assert q.exception() is None, q.exception()
            assert killed, "the query finished before the leader could be killed"
            total_batches = batches_done()
            assert total_batches > killed[0][0], f"no micro-batch ran after the kill ({killed}, {total_batches})"
            print(f"leader killed after {killed[0][0]} of {total_batches} micro-batches")

            rows = ss.read.parquet(str(out)).collect()
            positions = [(r.queue_id, r.queue_offset) for r in rows]
            assert len(set(positions)) == len(positions), f"{len(positions) - len(set(positions))} rows twice"
            bodies = [bytes(r.body).decode() for r in rows]
            assert len(bodies) == n and set(bodies) == sent, (
                f"{len(bodies)} rows for {n} messages; missing {len(sent - set(bodies))}"
            )
        finally:
            rs.close()
