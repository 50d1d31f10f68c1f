"""A topic's compression setting in a cluster: a REAL etcd (the ``etcd`` fixture) and
two broker groups (one broker each, in this test's trio loop). The setting is stored
with the topic's placement in etcd, so every broker group stores the batches of its
queues with the topic's codec, and the setting survives a restart."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from equeue.broker import Broker
from equeue.broker.cluster.etcd import EtcdClient
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.client import AsyncClient
from equeue.client.async_admin import AsyncAdminClient
from equeue.placement import topic_key
from equeue.producer import AsyncProducer
from equeue.wire.batches import Codec, batch_head
from tests.cluster.conftest import open_groups
from tests.conftest import wait_until
from tests.integration.test_produce_batches import stored

GROUPS = ("g1", "g2")


def codecs(brokers: dict[str, Broker], owners: list[str]) -> list[Codec]:
    """The codec of each queue's newest stored batch, read at its owner group."""
    return [batch_head(stored(brokers[o], "z", q)[1][-1], 1 << 20).codec for q, o in enumerate(owners)]


async def produce_to_both(address: str, n: int) -> None:
    async with AsyncProducer(address, linger=0) as p:  # round-robin: both queues, sent uncompressed
        results = [await p.send("z", b"the same words again and again " * 4) for _ in range(n)]
    assert {r.queue_id for r in results} == {0, 1}


async def test_the_setting_lives_in_etcd_and_every_group_applies_it(tmp_path: Path, etcd: EtcdProcess) -> None:
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            brokers = await open_groups(stack, tmp_path, etcd, GROUPS)
            boot = await stack.enter_async_context(AsyncClient(brokers["g1"].address))
            admin = await stack.enter_async_context(AsyncAdminClient(brokers["g1"].address))
            assert (await boot.create_topic("z", 2, compression="zstd")).compression == "zstd"
            owners = list((await boot.get_routes(["z"])).topics[0].owners)
            assert sorted(owners) == ["g1", "g2"]
            async with EtcdClient([etcd.endpoint]) as e:
                kv = await e.get(topic_key("z"))
                assert kv is not None and json.loads(kv.value)["compression"] == "zstd"
            for b in brokers.values():
                await wait_until(lambda b=b: b.store.topics["z"].compression == "zstd", what="zstd materialized")
            await produce_to_both(brokers["g2"].address, 4)
            assert codecs(brokers, owners) == [Codec.ZSTD, Codec.ZSTD]

            # altered at the other group: both groups store lz4 from then on
            async with AsyncClient(brokers["g2"].address) as c2:
                assert (await c2.alter_topic("z", compression="lz4")).compression == "lz4"
            for b in brokers.values():
                await wait_until(lambda b=b: b.store.topics["z"].compression == "lz4", what="lz4 materialized")
            await produce_to_both(brokers["g1"].address, 4)
            assert codecs(brokers, owners) == [Codec.LZ4, Codec.LZ4]
            assert (await admin.describe_topic("z")).info.compression == "lz4"

        # restarted, the groups still store lz4; a reset goes back to the brokers' --compression
        async with AsyncExitStack() as stack:
            brokers = await open_groups(stack, tmp_path, etcd, GROUPS)
            async with AsyncClient(brokers["g1"].address) as c:
                assert (await c.describe_topic("z")).info.compression == "lz4"
                await produce_to_both(brokers["g2"].address, 2)
                assert codecs(brokers, owners) == [Codec.LZ4, Codec.LZ4]
                assert (await c.alter_topic("z", compression="default")).compression is None
            for b in brokers.values():
                await wait_until(lambda b=b: b.store.topics["z"].compression is None, what="the reset materialized")
            await produce_to_both(brokers["g2"].address, 2)
            assert codecs(brokers, owners) == [Codec.NONE, Codec.NONE]  # the brokers' default: as sent
