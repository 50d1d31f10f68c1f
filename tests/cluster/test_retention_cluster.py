"""Retention's special values through the cluster path (a REAL etcd and a real
broker): CREATE_TOPIC / ALTER_TOPIC write them to etcd's topic record, the broker
materializes them in its store; -1 keeps forever, ``reset`` goes back to the default,
other values <= 0 are refused before etcd is written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.broker.cluster.etcd import EtcdClient
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.errors import BadRequest
from equeue.placement import topic_key
from equeue.protocol import RequestCode
from tests.conftest import make_config, wait_until


async def etcd_record(etcd: EtcdClient, topic: str) -> dict[str, object]:
    kv = await etcd.get(topic_key(topic))
    assert kv is not None
    return json.loads(kv.value)  # type: ignore[no-any-return]


def local_retention(b: Broker, topic: str) -> tuple[int | None, int | None] | None:
    info = b.store.topics.get(topic)
    return None if info is None else (info.retention_ms, info.retention_bytes)


async def test_forever_reset_and_refusals_in_a_cluster(tmp_path: Path, etcd: EtcdProcess) -> None:
    cfg = make_config(tmp_path / "g1", cluster=etcd.endpoint, broker_group="g1", retention_ms=1000, retention_bytes=1)
    with trio.fail_after(45):
        async with (
            EtcdClient([etcd.endpoint], request_timeout=5.0) as e,
            open_broker(cfg) as b,
            AsyncClient(b.address) as c,
        ):
            wall = [time.time_ns() // 1_000_000]
            b.store.clock = lambda: wall[0]
            info = await c.create_topic("keep", 1, retention_ms=-1, retention_bytes=-1)
            assert (info.retention_ms, info.retention_bytes) == (-1, -1)
            rec = await etcd_record(e, "keep")
            assert (rec["retention_ms"], rec["retention_bytes"]) == (0, 0)  # what earlier versions read as no limit
            await wait_until(lambda: local_retention(b, "keep") == (-1, -1), what="the store has keep forever")
            await c.produce(wire.ProduceRequest("keep", 0, [wire.encode_entry(Message(f"m{i}")) for i in range(4)]))
            wall[0] += 60_000
            assert await b.lifecycle.enforce_retention() == 0

            for bad in ({"retention_ms": 0}, {"retention_bytes": -5}, {"retention_ms": -1000}):
                with pytest.raises(BadRequest, match="-1"):
                    await c.request(RequestCode.CREATE_TOPIC, json.dumps({"name": "t", "queues": 1, **bad}).encode())
                with pytest.raises(BadRequest, match="-1"):
                    await c.request(RequestCode.ALTER_TOPIC, json.dumps({"name": "keep", **bad}).encode())
            assert [t.name for t in await c.list_topics()] == ["keep"]
            assert (await etcd_record(e, "keep"))["retention_ms"] == 0

            info = await c.alter_topic("keep", reset=["retention_ms"])
            assert (info.retention_ms, info.retention_bytes) == (None, -1)
            rec = await etcd_record(e, "keep")
            assert (rec["retention_ms"], rec["retention_bytes"]) == (None, 0)
            await wait_until(lambda: local_retention(b, "keep") == (None, -1), what="the store has the reset")
            assert await b.lifecycle.enforce_retention() == 4  # the broker's 1 s default
