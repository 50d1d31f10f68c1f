"""An ephemeral group (``<name>#ephemeral``) in a cluster: a REAL etcd and two broker
groups (one broker each, in this test's trio loop, over TCP). Each broker group keeps
the offsets of the queues it owns in memory (none in its store) and deletes its part
when the last member leaves, its lag series in /metrics with it."""

from __future__ import annotations

from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import trio

from equeue import Message, wire
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from tests.cluster.conftest import open_groups
from tests.conftest import wait_until

GROUPS = ("g1", "g2")
G = "tap#ephemeral"


async def lag_series(http: httpx.AsyncClient, group: str) -> list[str]:
    """The ``*_lag`` series of ``group`` in a broker's /metrics (per queue too)."""
    text = (await http.get("/metrics", params={"queues": "1"})).text
    return [line for line in text.splitlines() if "_lag{" in line and f'group="{group}"' in line]


async def test_an_ephemeral_group_spans_broker_groups_and_goes_from_each(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            brokers = await open_groups(stack, tmp_path, etcd, GROUPS, member_expiry=6.0, http_port=0)
            admin = await stack.enter_async_context(AsyncClient(brokers["g1"].address))
            await admin.create_topic("t", 4)
            owners = (await admin.get_routes(["t"])).topics[0].owners
            assert Counter(owners) == {"g1": 2, "g2": 2}
            for q, owner in enumerate(owners):
                async with AsyncClient(brokers[owner].address) as c:
                    await c.produce(wire.ProduceRequest("t", q, [wire.encode_entry(Message(f"{q}-{i}")) for i in range(3)]))
            clients = {g: await stack.enter_async_context(AsyncClient(b.address)) for g, b in brokers.items()}
            https = {g: await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}"))
                     for g, b in brokers.items()}  # fmt: skip
            got: list[bytes] = []

            async def handler(m: Message) -> None:
                got.append(m.body)

            addresses = ",".join(b.address for b in brokers.values())
            async with AsyncConsumer(addresses, G, "t", start_from="earliest", heartbeat_interval=0.3) as con:
                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_until(lambda: len(got) == 12, timeout=30, what="the 12 messages handled")
                    await con.commit()
                    for g, b in brokers.items():  # each broker group holds its own queues' offsets, in memory
                        mine = [q for q in range(4) if owners[q] == g]
                        assert b.groups.ephemeral_offsets(G) == {("t", q): 3 for q in mine}
                        assert b.store.group_offsets(G) == {}
                        (summary,) = await clients[g].list_groups()
                        assert (summary.group, summary.ephemeral, summary.members) == (G, True, 1)
                        # its lag, in each broker's /metrics while it lives
                        await wait_until(lambda g=g: lag_series(https[g], G), what=f"{g}'s lag series of the group")
                    n.cancel_scope.cancel()
            # the member left every broker group: gone at each
            for g in GROUPS:
                assert await clients[g].list_groups() == []
                assert G not in brokers[g].groups.groups
                # and no lag series of it is left in any broker's /metrics

                async def no_lag(g: str = g) -> bool:
                    return await lag_series(https[g], G) == []

                await wait_until(no_lag, what=f"{g}'s lag series of the group gone")
