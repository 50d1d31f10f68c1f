"""Shared helpers of the hostile-client suite: a real broker in a child
process, and a healthy client that measures its own latency during an attack.

- ``real_broker`` (fixture): factory ``real_broker(*args)`` -> a started
  :class:`~equeue.broker.process.BrokerProcess` (port 0, a temp data dir unless
  ``data_dir=`` is given), killed at teardown. It exposes ``pid``, ``address``,
  ``rss_bytes()`` (``VmRSS`` of ``/proc/PID/status``) and ``error_lines`` (every
  stderr line logged at ERROR or above: assert it stays empty after client input).
- :class:`LatencyProbe`: ``async with LatencyProbe(address) as probe: ...attack...``
  runs a healthy client doing produce + pull round trips in its own nursery; after
  the block, ``probe.max_ms``, ``probe.p99_ms`` and ``probe.rounds`` say how it was
  served (``probe.errors`` lists what failed). Assert generous bounds and put the
  measured figures in the failure message (``str(probe)``).
  Also a fixture, ``latency_probe(address)``, for test modules that do not import.

Test modules here import these as ``from tests.hostile.conftest import LatencyProbe``
or use the fixtures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker.process import BrokerProcess

__all__ = ["LatencyProbe"]


@pytest.fixture
def real_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Factory: ``real_broker(*args, data_dir=None)`` starts ``equeue broker start``
    in a child process with ``args`` and returns it started; all are killed at the end."""
    procs: list[BrokerProcess] = []

    def factory(*args: str, data_dir: Path | None = None) -> BrokerProcess:
        p = BrokerProcess(data_dir or tmp_path / f"data{len(procs)}", *args).start()
        procs.append(p)
        return p

    yield factory
    for p in procs:
        p.kill()


class LatencyProbe:
    """A healthy client's produce + pull round trips, timed, while the block runs.

    Each round produces one small message to ``topic`` (queue 0; created with one
    queue) and pulls it back; ``pause`` seconds separate rounds. Latencies are
    wall-clock (``time.perf_counter``) per round trip, in milliseconds.
    """

    def __init__(self, address: str, topic: str = "probe", *, pause: float = 0.005) -> None:
        self.address = address
        self.topic = topic
        self.pause = pause
        self.latencies_ms: list[float] = []
        self.errors: list[BaseException] = []
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None
        self._client: Any = None

    @property
    def rounds(self) -> int:
        return len(self.latencies_ms)

    @property
    def max_ms(self) -> float:
        return max(self.latencies_ms, default=0.0)

    @property
    def p99_ms(self) -> float:
        if not self.latencies_ms:
            return 0.0
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(len(s) * 0.99))]

    def __str__(self) -> str:
        return (
            f"healthy client: {self.rounds} round trips, p99 {self.p99_ms:.1f} ms, "
            f"max {self.max_ms:.1f} ms, errors {self.errors[:3]!r}"
        )

    async def _run(self, client: Any) -> None:
        entry = wire.encode_entry(Message(b"probe"))
        try:
            while True:
                t0 = time.perf_counter()
                a = await client.produce(wire.ProduceRequest(self.topic, 0, [entry]))
                r = await client.pull(wire.PullRequest(self.topic, 0, a.first_queue, 1))
                if not r.messages or r.messages[0].body != b"probe":
                    raise AssertionError(f"probe pull returned {r.status!r} {r.messages!r}")
                self.latencies_ms.append((time.perf_counter() - t0) * 1000)
                await trio.sleep(self.pause)
        except Exception as exc:
            self.errors.append(exc)

    async def __aenter__(self) -> LatencyProbe:
        from equeue.client import AsyncClient

        # The client lives in the caller's task (as in tests/integration/test_bad_input.py's
        # ``served``); only the round-trip loop runs in the probe's nursery.
        self._client = AsyncClient(self.address)
        await self._client.__aenter__()
        try:
            await self._client.create_topic(self.topic, 1, exist_ok=True)
            self._nursery_cm = trio.open_nursery()
            self._nursery = await self._nursery_cm.__aenter__()
        except BaseException:
            await self._client.__aexit__(None, None, None)
            raise
        self._nursery.start_soon(self._run, self._client)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._nursery is not None and self._client is not None
        self._nursery.cancel_scope.cancel()  # ends the round trips
        try:
            return await self._nursery_cm.__aexit__(et, ev, tb)  # type: ignore[no-any-return]
        finally:
            await self._client.__aexit__(None, None, None)


@pytest.fixture
def latency_probe() -> Callable[..., LatencyProbe]:
    """Factory: ``latency_probe(address, topic="probe")`` -> a :class:`LatencyProbe`."""
    return LatencyProbe
