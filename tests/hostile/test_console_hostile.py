"""Hostile clients on the web console (docs/console.md, "Limits"): an oversized head,
a slowloris, a thousand idle connections. The console answers them as its limits say
(:mod:`equeue.httpserve`, shared with the broker's HTTP port) and keeps serving
pages; the broker's own TCP clients keep producing and consuming meanwhile
(:class:`~tests.hostile.conftest.LatencyProbe`, judged by outcome); the console
prints no traceback. One broker process and one ``equeue console`` process for the
module (``--max-connections`` at its default, 256). The attacks are
:mod:`tests.hostile.http_attacks`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import attrs
import httpx
import pytest
import trio

from equeue.broker.process import BrokerProcess
from equeue.console import ConsoleConfig
from equeue.httpserve import MAX_REQUEST_HEAD
from tests.conftest import ROOT, wait_until
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
    host, port = served.host, served.port
    with trio.fail_after(60):
        async with LatencyProbe(served.broker.address, "oversized") as probe:
            for size in (2 * MAX_REQUEST_HEAD, 64 * 1024, 1 << 20):
                answer = await oversized_headers(host, port, size)
                assert answer.startswith(b"HTTP/1.1 431"), (size, answer[:80])
                assert await http_status(host, port, "/") == 200
            while probe.rounds < 3:  # the broker's healthy client got served meanwhile too
                await trio.sleep(0.01)
        assert not probe.errors, str(probe)


async def test_a_slowloris_is_closed_by_the_request_limit(served: Served) -> None:
    """One byte a second: the head never completes and the console closes the
    connection (its 5 s request limit) long before the client would give up; it
    serves pages meanwhile, and the broker its clients."""
    host, port = served.host, served.port
    with trio.fail_after(60):
        async with LatencyProbe(served.broker.address, "slowloris") as probe:
            async with trio.open_nursery() as n:
                ended: list[object] = []

                async def attack() -> None:
                    ended.append(await slowloris(host, port, interval=1.0, give_up=40.0))

                n.start_soon(attack)
                for path in ("/healthz", "/", "/topics"):
                    assert await http_status(host, port, path) == 200
                await wait_until(lambda: ended, timeout=50, what="the slowloris connection ended")
        result = ended[0]
        assert result.closed, result  # type: ignore[attr-defined]
        assert not probe.errors, str(probe)
        assert probe.rounds > 0


async def test_idle_connections_past_the_cap_are_refused_and_the_console_recovers(served: Served) -> None:
    """A thousand connections that send nothing: those past the cap are answered 503
    and closed at once; the broker's clients keep producing and consuming; once the
    idle ones go, the console serves pages again."""
    host, port = served.host, served.port
    with trio.fail_after(90):
        async with LatencyProbe(served.broker.address, "idle") as probe:
            async with idle_connections(host, port, IDLE) as idle:
                await wait_until(
                    lambda: idle.refused >= IDLE - CAP, timeout=30, what=f"{IDLE - CAP} connections refused"
                )
                rounds = probe.rounds
                # the broker's clients are served while the console is full
                await wait_until(lambda: probe.rounds > rounds + 3, timeout=30, what="more round trips")
            assert idle.opened == IDLE

            async def serves_again() -> bool:
                return await http_status(host, port, "/") == 200

            await wait_until(serves_again, timeout=30, what="the overview answered again")
        assert not probe.errors, str(probe)


async def test_http2_requests_with_bodies_end_only_their_connections(served: Served) -> None:
    """An HTTP/2 client (prior knowledge) posting a streamed body, to a page that
    answers before reading it (405) and to the sign-in form: the console goes on."""
    host, port = served.host, served.port

    async def body() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"x" * 1024

    with trio.fail_after(30):
        for path in ("/healthz", "/login", "/topics"):
            async with httpx.AsyncClient(http1=False, http2=True) as c:
                try:
                    await c.post(f"http://{host}:{port}{path}", content=body())
                except httpx.HTTPError:
                    pass  # the connection ended under the request: all it may cost
        assert await http_status(host, port, "/healthz") == 200
