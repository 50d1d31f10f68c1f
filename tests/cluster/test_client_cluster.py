"""The clients in a cluster: a REAL etcd (the ``etcd`` fixture) and three broker
groups (one broker each, in this test's trio loop, over TCP). The producer sends each
queue's batches to its owner group, the consumer group heartbeats to every group and
pulls each queue from its owner, a stale route is corrected after NOT_OWNER, a
stopped group fails keyed sends with QUEUE_UNAVAILABLE while keyless sends and the
other groups' queues go on; the CLI shows the cluster and the merged group."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from typer.testing import CliRunner

from equeue import control
from equeue.broker import Broker, open_broker
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.client.routing import Router
from equeue.consumer import AsyncConsumer
from equeue.errors import QueueUnavailable
from equeue.producer import AsyncProducer
from equeue.routing import queue_for_key
from tests.conftest import make_config, wait_until

GROUPS = ("g1", "g2", "g3")


@attrs.define
class Running:
    broker: Broker
    stop: trio.Event
    #: set once the broker has stopped serving
    stopped: trio.Event


async def _serve(
    cfg: Any, stop: trio.Event, stopped: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_broker(cfg) as b:
        task_status.started(b)
        await stop.wait()
    stopped.set()


@asynccontextmanager
async def cluster(tmp_path: Path, etcd: EtcdProcess) -> AsyncIterator[dict[str, Running]]:
    """One broker per group, each stoppable on its own; yields once every view has all."""
    async with trio.open_nursery() as nursery:
        running: dict[str, Running] = {}
        for g in GROUPS:
            stop, stopped = trio.Event(), trio.Event()
            cfg = make_config(tmp_path / g, cluster=etcd.endpoint, broker_group=g, member_expiry=6.0)
            running[g] = Running(await nursery.start(_serve, cfg, stop, stopped), stop, stopped)
        for r in running.values():
            await wait_until(partial(sees_all, r.broker), what="every group live")
        try:
            yield running
        finally:
            for r in running.values():
                r.stop.set()


def view(b: Broker) -> Any:
    assert b.cluster is not None
    return b.cluster.view


def sees_all(b: Broker) -> bool:
    return set(view(b).live_groups()) == set(GROUPS)


def cli(*args: str) -> tuple[int, str]:
    """The ``equeue`` CLI in this thread (call it through trio.to_thread: it runs its own loop)."""
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout + r.stderr


async def consume_into(c: AsyncConsumer, seen: list[tuple[str, int, int, str]]) -> None:
    async for m in c:
        seen.append((m.key or "", int(m.text), m.queue_id, m.topic))


async def test_produce_consume_stale_route_group_down_and_cli(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(120):
        async with cluster(tmp_path, etcd) as running, AsyncClient(running["g1"].broker.address) as admin:
            addresses = ",".join(running[g].broker.address for g in ("g2", "g1"))
            await admin.create_topic("t", 6)
            owners = (await admin.get_routes(["t"])).topics[0].owners
            assert Counter(owners) == {"g1": 2, "g2": 2, "g3": 2}

            # a 2-member consumer group, then a few thousand keyed messages through the producer
            seen: list[tuple[str, int, int, str]] = []
            keys = [f"k{i}" for i in range(40)]
            async with AsyncExitStack() as stack:
                p = await stack.enter_async_context(AsyncProducer(addresses, linger=0.002))
                members = [
                    await stack.enter_async_context(AsyncConsumer(
                        addresses, "cg", "t", start_from="earliest", heartbeat_interval=0.5, rebalance_interval=0.5,
                        consumer_id=f"m{i}",
                    ))
                    for i in range(2)
                ]  # fmt: skip
                # a router bootstrapped from g3 alone (which is stopped below)
                boot3 = await stack.enter_async_context(AsyncClient(running["g3"].broker.address))
                router3 = await stack.enter_async_context(Router(boot3, refresh_interval=60))
                async with trio.open_nursery() as nursery:
                    for c in members:
                        nursery.start_soon(consume_into, c, seen)
                    n = 3000
                    handles = [await p.send_async("t", str(i).encode(), key=keys[i % len(keys)]) for i in range(n)]
                    results = [await h for h in handles]
                    assert all(r.queue_id == queue_for_key(r_key, 6) for r, r_key in
                               zip(results, [keys[i % len(keys)] for i in range(n)], strict=True))  # fmt: skip
                    # each queue's messages were stored by its owner group
                    for q in range(6):
                        b = running[owners[q]].broker
                        assert b.store.topics["t"].queues == 6
                    await wait_until(lambda: len(seen) >= n, timeout=60, what=f"{n} consumed (have {len(seen)})")
                    values = [v for _, v, _, _ in seen]
                    assert sorted(values) == list(range(n)), "every message exactly once"
                    per_key: dict[str, list[int]] = {}
                    for k, v, _, _ in seen:
                        per_key.setdefault(k, []).append(v)
                    assert all(vs == sorted(vs) for vs in per_key.values()), "queue order per key"
                    holders = {c.consumer_id: sorted(c.assignments.queues) for c in members}
                    assert sorted(q for qs in holders.values() for q in qs if q[0] == "t") == [("t", q) for q in range(6)]
                    assert all(c.coordinator.reached == list(GROUPS) for c in members)

                    # group describe (CLI), merged over the groups: every queue from its owner
                    for c in members:
                        await c.commit()
                    code, out = await trio.to_thread.run_sync(cli, "group", "describe", "cg", "--json", "-b",
                                                              running["g3"].broker.address)  # fmt: skip
                    assert code == 0, out
                    desc = json.loads(out)
                    rows = {r["queue_id"]: r for r in desc["queues"] if r["topic"] == "t"}
                    assert {q: r["broker_group"] for q, r in rows.items()} == dict(enumerate(owners))
                    assert sum(r["committed"] for r in rows.values()) == n and {m["consumer_id"] for m in desc["members"]} == {"m0", "m1"}

                    # broadcast mode: one member reads every queue of every group
                    everything: list[tuple[str, int, int, str]] = []
                    async with AsyncConsumer(addresses, "bc", "t", mode="broadcast", start_from="earliest",
                                             state_dir=tmp_path / "bc") as bc:  # fmt: skip
                        async with trio.open_nursery() as inner:
                            inner.start_soon(consume_into, bc, everything)
                            await wait_until(lambda: len(everything) >= n, timeout=30, what="broadcast read all")
                            inner.cancel_scope.cancel()
                    assert sorted(v for _, v, _, _ in everything) == list(range(n))

                    # a stale route: the producer's table names the wrong group for every queue
                    s = p.router.cache.topics["t"]
                    wrong = [GROUPS[(GROUPS.index(o) + 1) % 3] for o in s.owners]
                    p.router.cache.topics["t"] = control.TopicRoute(s.info, wrong)
                    p._routes.update()
                    before = p.router.cache.revision
                    stale = [await p.send("t", b"-1", key=keys[i]) for i in range(12)]
                    assert p.router.cache.topics["t"].owners == owners and p.router.cache.revision >= before
                    assert any(lane.reroutes for lane in p._routes.lanes()), "NOT_OWNER was answered"
                    assert {r.queue_id for r in stale} == {queue_for_key(k, 6) for k in keys[:12]}

                    # group g3 stopped: keyed sends to its queues fail with QUEUE_UNAVAILABLE after
                    # send_timeout; keyless ones land on the live groups; consumers go on elsewhere
                    assert set(await router3.all_clients()) == set(GROUPS)
                    assert (await router3.route("t")).owners == owners
                    running["g3"].stop.set()
                    # every live broker's view (router3 may ask either one) has seen g3 go
                    await wait_until(lambda: all(view(running[g].broker).address_of("g3") is None for g in ("g1", "g2")),
                                     what="g3 down in g1's and g2's views")  # fmt: skip
                    # its bootstrap broker gone, router3 asks the other groups it knows
                    await running["g3"].stopped.wait()
                    table = await router3.refresh()
                    assert {g.name: bool(g.addresses) for g in table.groups} == {"g1": True, "g2": True, "g3": False}
                    assert [router3.available("t", q) for q in range(6)] == [o != "g3" for o in owners]
                    down_key = next(k for k in keys if owners[queue_for_key(k, 6)] == "g3")
                    live_key = next(k for k in keys if owners[queue_for_key(k, 6)] != "g3")
                    async with AsyncProducer(addresses, send_timeout=2.0, linger=0) as p2:
                        t0 = trio.current_time()
                        with pytest.raises(QueueUnavailable):
                            await p2.send("t", b"-1", key=down_key)
                        assert trio.current_time() - t0 < 10
                        keyless = [await p2.send("t", b"-2") for _ in range(30)]
                        assert {owners[r.queue_id] for r in keyless} == {"g1", "g2"}
                        more = await p2.send("t", str(n).encode(), key=live_key)
                    await wait_until(lambda: n in [v for _, v, _, _ in seen], timeout=30, what="consumed on a live group")
                    assert more.queue_id == queue_for_key(live_key, 6)

                    code, out = await trio.to_thread.run_sync(cli, "cluster", "status", "--json", "-b",
                                                              running["g1"].broker.address)  # fmt: skip
                    assert code == 0, out
                    report = json.loads(out)
                    st = report["status"]
                    assert st["cluster"] and st["etcd_ok"] and st["revision"] > 0
                    assert {g["name"]: g["available"] for g in st["groups"]} == {"g1": True, "g2": True, "g3": False}
                    health = {h["group"]: h for h in report["health"]}
                    assert health["g1"]["reachable"] and health["g1"]["rtt_ms"] is not None
                    assert health["g2"]["reachable"]
                    nursery.cancel_scope.cancel()
