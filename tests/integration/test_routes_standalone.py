"""GET_ROUTES and CLUSTER_STATUS on a standalone broker (no etcd): clients have one
code path, so a standalone broker answers both (docs/cluster.md, "Routing")."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from equeue import control
from equeue.broker import Broker, open_broker
from equeue.client import AsyncClient
from equeue.errors import BadRequest, InvalidName
from tests.conftest import make_config


async def test_get_routes_standalone_owner_is_empty_for_every_queue(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("a", 3)
            table = await c.get_routes(["a", "nope", "a"])
            assert (table.cluster, table.revision, table.groups, table.missing) == (False, 0, [], ["nope"])
            [route] = table.topics
            assert (route.info.name, route.info.queues, route.owners) == ("a", 3, ["", "", ""])
            assert "nope" not in {t.name for t in await c.list_topics()}  # nothing created without auto_create
            created = await c.get_routes(["nope"], auto_create=True)
            assert created.missing == [] and created.topics[0].owners == [""] * 4  # default_queues
            with pytest.raises(InvalidName):
                await c.get_routes(["bad name"])
            with pytest.raises(BadRequest, match="at most 1000"):
                await c.get_routes([f"t{i}" for i in range(1001)])


async def test_get_routes_auto_create_follows_the_broker_setting(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with open_broker(make_config(tmp_path / "d", auto_create_topics=False)) as b:
            async with AsyncClient(b.address) as c:
                table = await c.get_routes(["t"], auto_create=True)
                assert table.missing == ["t"] and table.topics == []


async def test_cluster_status_standalone_is_one_group_holding_every_queue(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("a", 2)
            await c.create_topic("b", 1)
            status = await c.cluster_status()
            assert (status.cluster, status.group, status.etcd_ok, status.revision) == (False, "", False, 0)
            [group] = status.groups
            assert group == control.GroupStatus("", [], 3, {"a": [0, 1], "b": [0]}, True)
    assert broker.cluster is None
