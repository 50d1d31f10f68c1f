"""``/readyz`` in a cluster (docs/operations.md, "HTTP port"): a real etcd and two
real brokers of one group. The leader and its in-sync follower are ready; cut off
from etcd (frozen), neither is, and says why; etcd back, the group serves again.
The replication series along the way: elections, produce latency with ``--acks all``,
and the leader's fence and step-down counted."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from equeue import wire
from equeue.broker import open_broker
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from tests.conftest import make_config, wait_until
from tests.integration.test_server import batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def readyz(http: httpx.AsyncClient, port: int) -> tuple[int, dict[str, Any]]:
    r = await http.get(f"http://127.0.0.1:{port}/readyz")
    return r.status_code, r.json()


async def test_readyz_of_a_leader_a_follower_and_brokers_cut_off_from_etcd(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    def config(name: str) -> Any:
        return make_config(
            tmp_path / name,
            cluster=etcd.endpoint,
            broker_group="g1",
            http_port=0,
            cluster_lease_ttl=2,
        )

    with trio.fail_after(90):
        async with AsyncExitStack() as stack, httpx.AsyncClient() as http:
            first = await stack.enter_async_context(open_broker(config("a")))
            second = await stack.enter_async_context(open_broker(config("b")))
            brokers = [first, second]

            async def roles_when_ready() -> list[str] | None:
                answers = [await readyz(http, b.http_port) for b in brokers]
                if all(status == 200 for status, _ in answers):
                    return sorted(body["role"] for _, body in answers)
                return None

            async def both_ready() -> bool:
                return await roles_when_ready() == ["follower", "leader"]

            await wait_until(
                both_ready, timeout=30, what="a ready leader and a ready (in-sync) follower"
            )
            leader = next(b for b in brokers if b.role is not None and b.role.leader_log is not None)
            async with AsyncClient(leader.address) as c:  # acknowledged once the follower has it
                await c.create_topic("acked", 1)
                await c.produce(wire.ProduceRequest("acked", 0, batch("m", 2)))

            async def metric_values(port: int) -> dict[tuple[str, tuple[str, ...]], float]:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                return {
                    (s.name, tuple(s.labels.values())): s.value
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                }

            for b in brokers:  # the replication series, parsed by prometheus-client
                values = await metric_values(b.http_port)
                assert values[("equeue_ready", ())] == 1
                assert values[("equeue_replication_isr_size", ())] == 2
                assert values[("equeue_replication_fenced", ())] == 0
                assert values[("equeue_replication_epoch", ())] >= 1
                other = next(o for o in brokers if o is not b)
                other_id = other.role.broker_id if other.role is not None else ""
                assert values[("equeue_replication_fences_total", ())] == 0
                assert values[("equeue_replication_step_downs_total", ())] == 0
                won = values[("equeue_replication_elections_won_total", ())]
                assert values[("equeue_replication_elections_attempted_total", ())] >= won
                if values[("equeue_replication_leader", ())] == 1:
                    assert b is leader and won >= 1
                    assert values[("equeue_replication_promotions_total", ())] >= 1
                    assert values[("equeue_produce_latency_seconds_count", ())] == 1
                    assert values[("equeue_replication_follower_in_sync", (other_id,))] == 1
                    assert ("equeue_replication_follower_lag_messages", (other_id,)) in values
                else:
                    assert not any(
                        name.startswith("equeue_replication_follower_") for name, _ in values
                    )
            etcd.freeze()
            try:

                async def both_cut_off() -> bool:
                    answers = [await readyz(http, b.http_port) for b in brokers]
                    return all(
                        s == 503 and "etcd unreachable" in body["reason"] for s, body in answers
                    )

                await wait_until(
                    both_cut_off, timeout=20, what="both brokers not ready, etcd unreachable"
                )
                text = (await http.get(f"http://127.0.0.1:{first.http_port}/metrics")).text
                assert "\nequeue_ready 0.0\n" in text
                for b in brokers:  # alive all the same
                    assert (
                        await http.get(f"http://127.0.0.1:{b.http_port}/healthz")
                    ).status_code == 200
            finally:
                etcd.thaw()

            async def a_leader_ready() -> bool:
                for b in brokers:
                    status, body = await readyz(http, b.http_port)
                    if status == 200 and body["role"] == "leader":
                        return True
                return False

            await wait_until(a_leader_ready, timeout=40, what="a ready leader once etcd is back")
            # the leader cut off from etcd was fenced and stopped serving, once each at least
            values = await metric_values(leader.http_port)
            assert values[("equeue_replication_fences_total", ())] >= 1
            assert values[("equeue_replication_step_downs_total", ())] >= 1
