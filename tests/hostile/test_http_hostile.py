"""Hostile clients on the broker's HTTP port (docs/operations.md, "HTTP port"): an
oversized head, a slowloris, a thousand idle connections, HTTP/2 bodies that outlive
their answers. The port answers them as its limits say and keeps serving; the broker's own TCP clients keep producing and
consuming meanwhile (:class:`~tests.hostile.conftest.LatencyProbe`); the broker logs
no error. One broker process for the module (``--http-max-connections`` at its
default, 256). The scenarios are :mod:`tests.hostile.http_scenarios`, shared with the
web console's tests, over the attacks of :mod:`tests.hostile.http_attacks` (reused by
``bench/bench_http_hostile.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from equeue.broker.process import BrokerProcess
from equeue.config import BrokerConfig
from tests.hostile.http_attacks import raise_fd_limit
from tests.hostile.http_scenarios import (
    a_slowloris_is_closed,
    http2_bodies_end_only_their_connections,
    idle_connections_past_the_cap_are_refused,
    oversized_heads_are_refused,
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
    await oversized_heads_are_refused(broker.host, broker.http_port, broker.address, ["/healthz", "/metrics"])


async def test_a_slowloris_is_closed_by_the_request_limit(broker: BrokerProcess) -> None:
    await a_slowloris_is_closed(broker.host, broker.http_port, broker.address, ["/healthz", "/metrics", "/metrics"])


async def test_idle_connections_past_the_cap_are_refused_and_the_port_recovers(broker: BrokerProcess) -> None:
    """The refusals are counted in ``equeue_http_connections_refused_total`` too."""
    port = broker.http_port
    refused_before = await metric(port, "equeue_http_connections_refused_total")
    idle = await idle_connections_past_the_cap_are_refused(
        broker.host, port, broker.address, "/healthz", idle=IDLE, cap=CAP
    )
    refused = await metric(port, "equeue_http_connections_refused_total") - refused_before
    assert refused >= idle.refused >= IDLE - CAP  # (polling /healthz may have added some)


async def test_an_http2_request_whose_body_outlives_its_answer_ends_only_its_connection(broker: BrokerProcess) -> None:
    await http2_bodies_end_only_their_connections(broker.host, broker.http_port, broker.address, ["/healthz"] * 3)
