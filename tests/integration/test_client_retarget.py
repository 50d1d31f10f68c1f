"""A group's connection follows its leader (client/async_client.py ``retarget`` and
``drop_connection``, used by the router when the routes name a new leader): a request
still waiting at the old broker fails at once with ConnectionBroken (transient: its
caller retries at the new one), the next request goes to the new broker, and a
retarget that keeps the connected broker keeps the connection."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from equeue import wire
from equeue.broker import Broker, open_broker
from equeue.client import AsyncClient
from equeue.errors import ConnectionBroken, TopicNotFound
from tests.conftest import make_config, wait_until


async def _parked(c: AsyncClient) -> bool:
    return (await c.stats()).parked_pulls > 0


async def test_retarget_fails_what_waits_at_the_old_broker_and_moves_on(broker: Broker, tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_broker(make_config(tmp_path / "b2")) as other, AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            epoch = c.connection_epoch
            c.retarget([broker.address, other.address])  # still listed: the connection stays
            assert c.connected and c.connection_epoch == epoch
            failed: list[BaseException] = []

            async def parked_pull() -> None:
                try:
                    await c.pull(wire.PullRequest("t", 0, 0, 1, max_wait_ms=20_000))
                except ConnectionBroken as exc:
                    failed.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(parked_pull)
                async with AsyncClient(broker.address) as probe:
                    await wait_until(lambda: _parked(probe), what="the pull parked at the first broker")
                c.retarget(other.address)  # the routes name another broker
                assert not c.connected
            assert len(failed) == 1 and "the route names another broker" in str(failed[0])
            with pytest.raises(TopicNotFound):
                await c.describe_topic("t")  # asked of the other broker, which has no topic t
            assert c.connection_epoch == epoch + 1
