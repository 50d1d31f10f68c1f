"""A producer lane against a slow broker: answers held back by a proxy while the
lane's window is full, the buffer full, or the producer closing."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from equeue.broker import Broker
from equeue.client import AsyncClient
from equeue.errors import ClientClosed
from equeue.producer import AsyncProducer, Producer, SendHandle
from tests.conftest import wait_until
from tests.integration.test_producer import read_queue


class AnswerGate:
    """A TCP proxy to the broker that forwards requests at once and holds the
    broker's answers back while :attr:`gate` is not set (a broker slow to answer)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.gate = trio.Event()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(*self.upstream)
        async with trio.open_nursery() as n:
            n.start_soon(self._pump, client, upstream, False, n.cancel_scope)
            n.start_soon(self._pump, upstream, client, True, n.cancel_scope)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(upstream)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, gated: bool, scope: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                if gated:
                    await self.gate.wait()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()


def _in_flight(p: AsyncProducer) -> int:
    """Requests written by the producer's lanes and not answered yet."""
    return sum(len(lane.window) for lane in p._routes.lanes())


async def test_order_holds_under_on_full_block_with_a_slow_broker(broker: Broker) -> None:
    """With the window full and the buffer full (``on_full="block"``), ``send_async``
    waits for room; once the broker answers, every message is stored once, in the
    order it was submitted, whether it went through the immediate path or waited."""
    n = 60
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with AsyncClient(broker.address) as c:
                await c.create_topic("slow", 1)
                proxy = AnswerGate(broker.address)
                await nursery.start(proxy.serve)
                proxy.gate.set()  # the route is fetched through the proxy too
                async with AsyncProducer(
                    proxy.address, max_buffered_bytes=1024, max_batch_bytes=256, max_in_flight=2, linger=0.001
                ) as p:
                    await p.send("slow", b"warm-up")  # the route, the lane, the connection
                    proxy.gate = trio.Event()  # from now on the answers wait
                    handles: list[SendHandle] = []

                    async def sender() -> None:
                        for i in range(n):
                            handles.append(await p.send_async("slow", f"m{i:03d}".encode() * 20, key="k"))

                    nursery.start_soon(sender)
                    await wait_until(lambda: _in_flight(p) == 2, what="the window is full")
                    await trio.testing.wait_all_tasks_blocked()
                    assert len(handles) < n, "the sender waits for buffer space"
                    assert p.statistics()["buffered_bytes"] > 0
                    proxy.gate.set()
                    await wait_until(lambda: len(handles) == n, what="every message was submitted")
                    assert await p.flush() == 0
                    results = [await h for h in handles]
                offsets = [r.queue_offset for r in results]
                assert offsets == list(range(1, n + 1))
                bodies = [m.body for m in await read_queue(c, "slow", 0)]
                assert bodies == [b"warm-up"] + [f"m{i:03d}".encode() * 20 for i in range(n)]
            nursery.cancel_scope.cancel()


async def test_blocking_sends_from_threads_keep_order_with_a_slow_broker(broker: Broker) -> None:
    """The blocking front's sends from two threads, with a buffer that holds about one
    batch (``on_full="block"``: a full buffer hops to the loop and waits there): each
    thread's messages are stored in its own order, each once."""
    n = 40
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async with AsyncClient(broker.address) as c:
                await c.create_topic("slow2", 1)
                proxy = AnswerGate(broker.address)
                await nursery.start(proxy.serve)
                proxy.gate.set()
                p = await trio.to_thread.run_sync(
                    lambda: Producer(proxy.address, max_buffered_bytes=512, max_batch_bytes=256, max_in_flight=2)
                )
                try:
                    await trio.to_thread.run_sync(lambda: p.send("slow2", b"warm-up"))
                    proxy.gate = trio.Event()

                    def sender(name: str) -> list[int]:
                        hs = [p.send_async("slow2", f"{name}{i:03d}".encode() * 10, key=name) for i in range(n)]
                        return [h.result(30).queue_offset for h in hs]

                    async def run(name: str, out: dict[str, list[int]]) -> None:
                        out[name] = await trio.to_thread.run_sync(sender, name)

                    out: dict[str, list[int]] = {}
                    async with trio.open_nursery() as senders:
                        senders.start_soon(run, "a", out)
                        senders.start_soon(run, "b", out)
                        await wait_until(lambda: p.pending_messages() > 0, what="messages wait for answers")
                        await trio.sleep(0)
                        proxy.gate.set()
                    for name in ("a", "b"):
                        assert out[name] == sorted(out[name])
                    assert sorted(out["a"] + out["b"]) == list(range(1, 2 * n + 1))
                finally:
                    await trio.to_thread.run_sync(p.close)
                stored = [m.body for m in await read_queue(c, "slow2", 0)][1:]
                for name in ("a", "b"):
                    assert [b for b in stored if b.startswith(name.encode())] == [
                        f"{name}{i:03d}".encode() * 10 for i in range(n)
                    ]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("flush", [False, True])
async def test_close_while_a_lane_is_mid_send(broker: Broker, flush: bool) -> None:
    """Closing while a lane's requests are written and their answers held: with
    ``flush=False`` the close returns at once and every handle fails with
    ClientClosed (delivery callbacks too); with ``flush=True`` it waits for the
    answers and every message is stored."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with AsyncClient(broker.address) as c:
                await c.create_topic("mid", 1)
                proxy = AnswerGate(broker.address)
                await nursery.start(proxy.serve)
                proxy.gate.set()
                p = AsyncProducer(proxy.address, max_in_flight=2, linger=0.001, max_batch_bytes=64)
                outcomes: list[BaseException | None] = []
                async with p:
                    await p.send("mid", b"warm-up")
                    proxy.gate = trio.Event()
                    handles = [
                        await p.send_async("mid", b"x" * 40, on_delivery=lambda r, e: outcomes.append(e))
                        for _ in range(6)
                    ]
                    await wait_until(lambda: _in_flight(p) == 2, what="two requests are in flight")
                    if flush:
                        done = trio.Event()

                        async def close() -> None:
                            await p.aclose()
                            done.set()

                        nursery.start_soon(close)
                        await trio.testing.wait_all_tasks_blocked()
                        assert not done.is_set(), "the close waits for the answers"
                        proxy.gate.set()
                        await done.wait()
                        results = [await h for h in handles]
                        assert [r.queue_offset for r in results] == list(range(1, 7))
                        assert outcomes == [None] * 6
                    else:
                        await p.aclose(flush=False)
                        for h in handles:
                            with pytest.raises(ClientClosed):
                                await h
                        assert len(outcomes) == 6 and all(isinstance(e, ClientClosed) for e in outcomes)
                        assert p.pending_messages() == 0
                proxy.gate.set()
                if flush:
                    assert len(await read_queue(c, "mid", 0)) == 7
            nursery.cancel_scope.cancel()
