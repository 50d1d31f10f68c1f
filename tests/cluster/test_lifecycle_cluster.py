"""Delayed delivery, retry and dead letters across broker groups (they work across
groups exactly as on one broker), on a REAL etcd and three broker groups.

Each group keeps the schedule of its own queues and writes a failed message's copy into
a queue of ``%RETRY%<group>`` / ``%DLQ%<group>`` that it owns (docs/cluster.md, "Retry and
DLQ"), so a delayed message is delivered by its queue's owner at its due time, a retried
message comes back through its origin group, and every dead letter sits with the group
that owned its origin queue; ``equeue dlq list`` merges them all.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import trio

from equeue import Message
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.names import dlq_topic, retry_topic
from equeue.producer import AsyncProducer
from equeue.routing import queue_for_key
from tests.cluster.test_client_cluster import GROUPS, cli, cluster
from tests.conftest import wait_until

FAST = dict(heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0)
QUEUES = 6
DELAY_MS = 1500


async def test_delayed_retry_and_dead_letters_across_groups(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(90):
        async with cluster(tmp_path, etcd) as running, AsyncClient(running["g1"].broker.address) as admin:
            await admin.create_topic("jobs", QUEUES)
            owners = (await admin.get_routes(["jobs"])).topics[0].owners
            assert Counter(owners) == {g: QUEUES // len(GROUPS) for g in GROUPS}
            # one key per queue, so every group gets each kind of message
            key_of = {queue_for_key(f"k{i}", QUEUES): f"k{i}" for i in range(200)}
            assert sorted(key_of) == list(range(QUEUES))
            addresses = running["g2"].broker.address

            delivered: dict[str, tuple[int, int, str]] = {}  # text -> (wall ms, attempts, topic)
            bad_attempts: Counter[str] = Counter()
            async with AsyncConsumer(addresses, "gl", "jobs", start_from="earliest", retry_delays=[0.2],
                                     max_reconsume_times=1, **FAST) as con:  # fmt: skip

                async def handler(m: Message) -> None:
                    if m.text.startswith("bad"):
                        bad_attempts[m.text] += 1
                        raise RuntimeError("always fails")
                    delivered[m.text] = (time.time_ns() // 1_000_000, m.reconsume_times, m.topic)

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    due: dict[str, int] = {}
                    async with AsyncProducer(addresses, linger=0) as p:
                        for q, key in sorted(key_of.items()):
                            due[f"d{q}"] = time.time_ns() // 1_000_000 + DELAY_MS  # at the earliest
                            sent = await p.send("jobs", f"d{q}", key=key, delay=DELAY_MS / 1000)
                            assert sent.queue_id == q
                            await p.send("jobs", f"bad{q}", key=key)
                            await p.send("jobs", f"ok{q}", key=key)
                    await wait_until(
                        lambda: len(delivered) == 2 * QUEUES and con.statistics().dead_lettered == QUEUES,
                        timeout=60, what=f"all delivered and {QUEUES} dead letters",
                    )  # fmt: skip
                    con.stop()

            # delayed: each delivered once, not before its due time, by its own queue's owner
            for q in range(QUEUES):
                at, attempts, topic = delivered[f"d{q}"]
                assert at >= due[f"d{q}"], f"d{q} delivered {due[f'd{q}'] - at} ms early"
                assert (attempts, topic) == (0, "jobs")
                assert delivered[f"ok{q}"][1:] == (0, "jobs")
            # retried once (max_reconsume_times=1), then dead-lettered: 2 attempts each
            assert bad_attempts == {f"bad{q}": 2 for q in range(QUEUES)}

            # every copy stayed in its origin queue's group: each group's retry and DLQ
            # queues hold only messages whose origin queue it owns
            routes = {t.info.name: t.owners for t in (await admin.get_routes([retry_topic("gl"), dlq_topic("gl")])).topics}
            assert set(routes[retry_topic("gl")]) == set(GROUPS)
            assert set(routes[dlq_topic("gl")]) == set(GROUPS)
            letters_by_group: dict[str, list[int]] = {}
            for g in GROUPS:
                async with AsyncClient(running[g].broker.address) as c:
                    page = await c.dlq_list("gl")
                    assert page.done
                    letters_by_group[g] = sorted(d.origin_queue for d in page.letters)
            assert letters_by_group == {g: [q for q in range(QUEUES) if owners[q] == g] for g in GROUPS}

            # the CLI merges every group's letters
            code, out = await trio.to_thread.run_sync(cli, "dlq", "list", "gl", "--json", "-b", addresses)
            assert code == 0, out
            rows = json.loads(out)
            assert sorted((r["broker_group"], r["body"]) for r in rows) == sorted(
                (owners[q], f"bad{q}") for q in range(QUEUES)
            )
