"""The hostile-HTTP scenarios that the broker's HTTP port and the web console must both
pass (``test_http_hostile.py``, ``test_console_hostile.py``): each runs the attacks of
:mod:`tests.hostile.http_attacks` against ``host:port`` while a healthy client of the
broker at ``broker`` produces and consumes (:class:`~tests.hostile.conftest.LatencyProbe`),
and checks the outcomes (never the timing): the server answers as its limits say,
serves ``pages`` meanwhile and afterwards, and the broker's clients see no error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import httpx
import trio

from equeue.client.httpserve import MAX_REQUEST_HEAD
from tests.conftest import wait_until
from tests.hostile.conftest import LatencyProbe
from tests.hostile.http_attacks import (
    IdleConnections,
    http_status,
    idle_connections,
    oversized_headers,
    slowloris,
)


async def oversized_heads_are_refused(host: str, port: int, broker: str, pages: Sequence[str]) -> None:
    """Heads of 16 KiB, 64 KiB and 1 MiB: each answered 431; ``pages`` answer 200."""
    with trio.fail_after(60):
        async with LatencyProbe(broker, "oversized") as probe:
            for size in (2 * MAX_REQUEST_HEAD, 64 * 1024, 1 << 20):
                answer = await oversized_headers(host, port, size)
                assert answer.startswith(b"HTTP/1.1 431"), (size, answer[:80])
                for page in pages:
                    assert await http_status(host, port, page) == 200, page
            await wait_until(lambda: probe.rounds >= 3, timeout=20, what="the broker's clients served meanwhile")
        assert not probe.errors, str(probe)


async def a_slowloris_is_closed(host: str, port: int, broker: str, pages: Sequence[str]) -> None:
    """One byte a second: the head never completes and the server closes the connection
    (its 5 s request limit) long before the client would give up; ``pages`` answer 200
    meanwhile and after."""
    with trio.fail_after(60):
        async with LatencyProbe(broker, "slowloris") as probe:
            async with trio.open_nursery() as n:
                ended: list[object] = []

                async def attack() -> None:
                    ended.append(await slowloris(host, port, interval=1.0, give_up=40.0))

                n.start_soon(attack)
                for page in pages:
                    assert await http_status(host, port, page) == 200, page
                await wait_until(lambda: ended, timeout=50, what="the slowloris connection ended")
        result = ended[0]
        assert result.closed, result  # type: ignore[attr-defined]
        assert not probe.errors, str(probe)
        assert probe.rounds > 0
        assert await http_status(host, port, pages[0]) == 200


async def idle_connections_past_the_cap_are_refused(
    host: str, port: int, broker: str, page: str, *, idle: int, cap: int
) -> IdleConnections:
    """``idle`` connections that send nothing: those past ``cap`` are answered 503 and
    closed at once; the broker's clients keep producing and consuming while the server
    is full; once the idle ones go, ``page`` answers 200 again. Returns the attack's
    tally."""
    with trio.fail_after(90):
        async with LatencyProbe(broker, "idle") as probe:
            async with idle_connections(host, port, idle) as held:
                await wait_until(lambda: held.refused >= idle - cap, timeout=30, what=f"{idle - cap} connections refused")
                rounds = probe.rounds
                await wait_until(lambda: probe.rounds > rounds + 3, timeout=30, what="more round trips while full")
            assert held.opened == idle

            async def serves_again() -> bool:
                return await http_status(host, port, page) == 200

            await wait_until(serves_again, timeout=30, what=f"{page} answered again")
        assert not probe.errors, str(probe)
    return held


async def http2_bodies_end_only_their_connections(host: str, port: int, broker: str, paths: Sequence[str]) -> None:
    """An HTTP/2 client (prior knowledge) posts a streamed body to each of ``paths``,
    some answering before they read it (405): a body still arriving after its answer
    trips Hypercorn, which must end that connection only, never the server."""

    async def body() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"x" * 1024

    with trio.fail_after(30):
        for path in paths:
            async with httpx.AsyncClient(http1=False, http2=True) as c:
                try:
                    await c.post(f"http://{host}:{port}{path}", content=body())
                except httpx.HTTPError:
                    pass  # the connection ended under the request: all it may cost
        assert await http_status(host, port, "/healthz") == 200
        async with LatencyProbe(broker, "http2") as probe:
            await wait_until(lambda: probe.rounds >= 3, timeout=20, what="the broker's clients served")
        assert not probe.errors, str(probe)
