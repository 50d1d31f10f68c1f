"""Test policy.

- ``tests/unit``: pure and fast, no I/O (codec, wire, routing, allocation).
- ``tests/integration``: a REAL broker on 127.0.0.1 port 0 with LMDB in ``tmp_path``,
  talking real TCP. Never a mocked broker. Async tests run under pytest-trio
  (``trio_mode = true``); every network test is bounded (``trio.fail_after`` or the
  pytest-timeout limit) so a hang fails instead of blocking CI.
- ``tests/spark``: one local Spark session shared by the module (marker ``spark``).
- Crash tests run the broker as a subprocess (``broker_process``) and SIGKILL it.
- Slow tests carry ``@pytest.mark.slow``; CI still runs them.
Timing is measured by ``bench/``, never asserted here beyond generous bounds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import Broker, BrokerConfig, EmbeddedBroker, open_broker
from broker.process import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent


def make_config(data_dir: Path, **overrides: Any) -> BrokerConfig:
    """A broker config for tests: port 0 on loopback, small map, fast timers."""
    kw: dict[str, Any] = dict(
        data_dir=data_dir, host="127.0.0.1", port=0, map_size=1 << 30, member_expiry=15.0,
        handshake_timeout=2.0, retention_check_interval=3600.0, shutdown_grace=2.0,
    )  # fmt: skip
    kw.update(overrides)
    return BrokerConfig(**kw)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A live broker in this test's trio loop."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        yield b


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A live broker in a background thread, for blocking (sync) tests."""
    with EmbeddedBroker(make_config(tmp_path / "data")) as b:
        yield b


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``broker_process(*args)`` starts a broker subprocess on a fixed data dir."""
    procs: list[BrokerProcess] = []

    def factory(*args: str, data_dir: Path | None = None, port: int = 0) -> BrokerProcess:
        p = BrokerProcess(data_dir or tmp_path / "data", *args, port=port).start()
        procs.append(p)
        return p

    yield factory
    for p in procs:
        p.kill()
