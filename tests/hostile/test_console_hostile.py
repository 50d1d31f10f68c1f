"""Hostile clients on the web console (docs/console.md, "Limits"): an oversized head,
a slowloris, a thousand idle connections. The console answers them as its limits say
(:mod:`equeue.client.httpserve`, shared with the broker's HTTP port) and keeps serving
pages; the broker's own TCP clients keep producing and consuming meanwhile
(:class:`~tests.hostile.conftest.LatencyProbe`, judged by outcome); the console
prints no traceback. One broker process and one ``equeue console`` process for the
module (``--max-connections`` at its default, 256). The attacks are
:mod:`tests.hostile.http_scenarios` over :mod:`tests.hostile.http_attacks`, the
same as for the broker's HTTP port."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import attrs
import pytest

from equeue.broker.process import BrokerProcess
from equeue.cli.console import ConsoleConfig
from tests.conftest import ROOT
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
CAP = ConsoleConfig("").max_connections


@attrs.frozen
class Served:
    """The module's broker and the console in front of it (``host``, ``port``)."""

    broker: BrokerProcess
    host: str
    port: int


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # a thousand connections, both ends' descriptors: raised before the console
    # starts (it inherits the limit)
    assert raise_fd_limit() >= 2 * IDLE + 200, "RLIMIT_NOFILE's hard limit is too low for this test"
    tmp = tmp_path_factory.mktemp("console-hostile")
    with BrokerProcess(tmp / "data") as broker, (tmp / "console.err").open("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "equeue", "console", "--brokers", broker.address, "--port", "0", "--json"],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            url = urlsplit(json.loads(proc.stdout.readline())["url"])  # printed once the port is bound
            assert url.hostname and url.port
            yield Served(broker, url.hostname, url.port)
            assert proc.poll() is None, "the console ended"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        err.seek(0)
        logged = err.read()
        assert "Traceback" not in logged, logged[-2000:]
        assert not broker.error_lines


async def test_oversized_heads_are_refused_431_and_the_console_keeps_serving(served: Served) -> None:
    await oversized_heads_are_refused(served.host, served.port, served.broker.address, ["/"])


async def test_a_slowloris_is_closed_by_the_request_limit(served: Served) -> None:
    await a_slowloris_is_closed(served.host, served.port, served.broker.address, ["/healthz", "/", "/topics"])


async def test_idle_connections_past_the_cap_are_refused_and_the_console_recovers(served: Served) -> None:
    await idle_connections_past_the_cap_are_refused(
        served.host, served.port, served.broker.address, "/", idle=IDLE, cap=CAP
    )


async def test_http2_requests_with_bodies_end_only_their_connections(served: Served) -> None:
    """To a page that answers before reading the body (405) and to the sign-in form."""
    await http2_bodies_end_only_their_connections(
        served.host, served.port, served.broker.address, ["/healthz", "/login", "/topics"]
    )
