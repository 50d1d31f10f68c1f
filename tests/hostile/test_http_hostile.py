"""Hostile clients on the broker's HTTP port (docs/operations.md, "HTTP port"): an
oversized head, a slowloris, a thousand idle connections. The port answers them as
its limits say and keeps serving; the broker's own TCP clients keep producing and
consuming meanwhile (:class:`~tests.hostile.conftest.LatencyProbe`); the broker logs
no error. One broker process for the module (``--http-max-connections`` at its
default, 256). The attacks are :mod:`tests.hostile.http_attacks` (reused by
``bench/bench_http_hostile.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from equeue.broker.http import MAX_REQUEST_HEAD
from equeue.broker.process import BrokerProcess
from equeue.config import BrokerConfig
from tests.conftest import wait_until
from tests.hostile.conftest import LatencyProbe
from tests.hostile.http_attacks import (
    http_status,
    idle_connections,
    oversized_headers,
    raise_fd_limit,
    slowloris,
)

# thousands of connections: `make test` runs them, `make test-fast` does not
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

IDLE = 1000
CAP = BrokerConfig(Path(".")).http_max_connections


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # a thousand connections, both ends' descriptors: raised before the broker starts
    # (it inherits the limit)
    assert raise_fd_limit() >= 2 * IDLE + 200, "RLIMIT_NOFILE's hard limit is too low for this test"
    with BrokerProcess(tmp_path_factory.mktemp("http-hostile"), "--http-port", "0") as b:
        yield b
        assert not b.error_lines


async def metric(port: int, name: str) -> float:
    """One sample of the broker's /metrics (no labels)."""
    s = await trio.open_tcp_stream("127.0.0.1", port)
    async with s:
        await s.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b""
        while chunk := await s.receive_some(65536):
            text += chunk
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_oversized_heads_are_refused_431_and_nothing_else_breaks(broker: BrokerProcess) -> None:
    host, port = broker.host, broker.http_port
    with trio.fail_after(60):
        async with LatencyProbe(broker.address, "oversized") as probe:
            for size in (2 * MAX_REQUEST_HEAD, 64 * 1024, 1 << 20):
                answer = await oversized_headers(host, port, size)
                assert answer.startswith(b"HTTP/1.1 431"), (size, answer[:80])
                assert await http_status(host, port, "/healthz") == 200
            while probe.rounds < 3:  # the healthy client got served meanwhile too
                await trio.sleep(0.01)
        assert not probe.errors, str(probe)
        assert await http_status(host, port, "/metrics") == 200


async def test_a_slowloris_is_closed_by_the_request_limit(broker: BrokerProcess) -> None:
    """One byte a second: the head never completes and the server closes the
    connection (its 5 s request limit) long before the client would give up; the
    port serves others meanwhile."""
    host, port = broker.host, broker.http_port
    with trio.fail_after(60):
        async with LatencyProbe(broker.address, "slowloris") as probe:
            async with trio.open_nursery() as n:
                ended: list[object] = []

                async def attack() -> None:
                    ended.append(await slowloris(host, port, interval=1.0, give_up=40.0))

                n.start_soon(attack)
                for path in ("/healthz", "/metrics", "/metrics"):
                    assert await http_status(host, port, path) == 200
                await wait_until(lambda: ended, timeout=50, what="the slowloris connection ended")
        result = ended[0]
        assert result.closed, result  # type: ignore[attr-defined]
        assert not probe.errors, str(probe)
        assert probe.rounds > 0
        assert await http_status(host, port, "/healthz") == 200


async def test_idle_connections_past_the_cap_are_refused_and_the_port_recovers(
    broker: BrokerProcess,
) -> None:
    """A thousand connections that send nothing: those past the cap are answered 503
    and closed at once; the broker's clients keep producing and consuming; once the
    idle ones go, the port serves ``/healthz`` again."""
    host, port = broker.host, broker.http_port
    refused_before = await metric(port, "equeue_http_connections_refused_total")
    with trio.fail_after(90):
        async with LatencyProbe(broker.address, "idle") as probe:
            async with idle_connections(host, port, IDLE) as idle:
                await wait_until(
                    lambda: idle.refused >= IDLE - CAP, timeout=30, what=f"{IDLE - CAP} connections refused"
                )
                rounds = probe.rounds
                # the broker's clients are served while its HTTP port is full
                await wait_until(lambda: probe.rounds > rounds + 3, timeout=30, what="more round trips")
            assert idle.opened == IDLE

            async def serves_again() -> bool:
                return await http_status(host, port, "/healthz") == 200

            await wait_until(serves_again, timeout=30, what="/healthz answered again")
        assert not probe.errors, str(probe)
        refused = await metric(port, "equeue_http_connections_refused_total") - refused_before
        assert refused >= idle.refused >= IDLE - CAP  # (polling /healthz may have added some)


async def test_an_http2_request_whose_body_outlives_its_answer_ends_only_its_connection(broker: BrokerProcess) -> None:
    """Hypercorn speaks HTTP/2 to a client that starts with it; a body still arriving
    after the answer (405 for a POST to /healthz) fails inside Hypercorn. That ends
    the connection, never the HTTP port or the broker."""
    host, port = broker.host, broker.http_port

    async def body() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"x" * 1024

    with trio.fail_after(30):
        for _ in range(3):
            async with httpx.AsyncClient(http1=False, http2=True) as c:
                try:
                    await c.post(f"http://{host}:{port}/healthz", content=body())
                except httpx.HTTPError:
                    pass  # the connection ended under the request: all it may cost
        assert await http_status(host, port, "/healthz") == 200
        async with LatencyProbe(broker.address) as probe:
            await wait_until(lambda: probe.rounds >= 3, timeout=20, what="the broker's clients served")
