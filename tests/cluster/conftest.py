"""Cluster tests: a REAL etcd (``/usr/bin/etcd``, Debian's etcd-server 3.4) on free
loopback ports, never the system service or ports 2379/2380.

- ``etcd`` (per test) is one etcd process shared by the session, wiped clean (every
  key deleted) before each test, and started again if a test stopped or froze it.
- ``own_etcd`` (per test) is a private etcd for tests that restart it with another
  data directory or must not disturb the shared one.
- Waiting is on conditions (``tests.conftest.wait_until``), never on time.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from equeue.broker.cluster.etcdproc import EtcdProcess


def wipe(endpoint: str) -> None:
    """Delete every key (range "\\0".."\\0" is the whole keyspace)."""
    zero = base64.b64encode(b"\0").decode()
    body = json.dumps({"key": zero, "range_end": zero}).encode()
    with urllib.request.urlopen(
        urllib.request.Request(endpoint + "/v3/kv/deleterange", data=body), timeout=10
    ):
        pass


@pytest.fixture(scope="session")
def _shared_etcd() -> Iterator[EtcdProcess]:
    with EtcdProcess() as e:
        yield e


@pytest.fixture
def etcd(_shared_etcd: EtcdProcess) -> EtcdProcess:
    _shared_etcd.thaw()
    if not _shared_etcd.running:
        _shared_etcd.start()
    wipe(_shared_etcd.endpoint)
    return _shared_etcd


@pytest.fixture
def own_etcd() -> Iterator[EtcdProcess]:
    with EtcdProcess() as e:
        yield e


async def recover_alone(client: Any, broker: Any) -> None:
    """The operator's step after etcd lost its data (docs/cluster.md, "When etcd loses
    its data: recovery"): CLUSTER_RECOVER naming ``broker`` (an in-process Broker, the
    only replica of its group) alone, at its store's last epoch, through ``client``
    (an AsyncClient connected to it); returns once it leads again."""
    from equeue import control
    from tests.conftest import wait_until

    assert broker.cluster is not None
    group, me = broker.config.broker_group, broker.cluster.broker_id
    await client.call(
        control.ClusterRecover(group, broker.store.replication.last_epoch, [me]), control.ReplicationStatus
    )
    await wait_until(lambda: broker.role is not None and broker.role.leader_log is not None, timeout=20,
                     what=f"{me} leads group {group} again")  # fmt: skip


async def open_groups(
    stack: Any, root: Any, etcd: EtcdProcess, groups: tuple[str, ...], **config: Any
) -> dict[str, Any]:
    """One in-process broker per broker group of ``groups`` (``root/<group>`` each, on
    ``etcd``), entered on ``stack`` (an AsyncExitStack); returns them by group once each
    one's view sees every group live. ``config``: more :func:`tests.conftest.make_config`
    settings."""
    from equeue.broker import open_broker
    from tests.conftest import make_config, wait_until

    brokers = {
        g: await stack.enter_async_context(
            open_broker(make_config(root / g, cluster=etcd.endpoint, broker_group=g, **config))
        )
        for g in groups
    }
    for b in brokers.values():
        await wait_until(
            lambda b=b: set(b.cluster.view.live_groups()) == set(groups), what="every group live"
        )
    return brokers
