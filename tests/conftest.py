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

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import Broker, BrokerConfig, EmbeddedBroker, open_broker

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


class BrokerProcess:
    """A broker subprocess (``python -m equeue broker start``) for crash tests."""

    def __init__(self, data_dir: Path, *args: str, port: int = 0) -> None:
        self.data_dir = data_dir
        self.args = args
        self.port = port
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable, "-m", "equeue", "broker", "start", "--data-dir", str(self.data_dir),
            "--port", str(self.port), "--log-level", "warning", *self.args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"broker exited early (rc={self.proc.poll()})")
            m = re.search(r"listening on [\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                return self
        raise RuntimeError("broker did not start in time")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait: the graceful path."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(30)
        return self.proc.returncode if self.proc else 0


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
