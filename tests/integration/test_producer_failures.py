"""Producer retries and idempotence: a lost ack (TCP proxy), a broker restart."""

from __future__ import annotations

import struct
import threading
from typing import Any

import pytest
import trio

from equeue import EQueueError, Message, PullStatus, wire
from equeue.broker import Broker
from equeue.client import AsyncClient, Client
from equeue.codec import HEADER, encode_response
from equeue.errors import ConnectionBroken, ErrorCode
from equeue.models import SendResult
from equeue.producer import AsyncProducer, Producer
from equeue.protocol import RequestCode
from tests.conftest import wait_until, wait_until_sync


class AckDropper:
    """A TCP proxy to the broker that forwards everything, except that after
    forwarding the ``nth`` produce request it drops the connection instead of
    passing on that request's answer (the broker stored it; the client never
    hears so)."""

    def __init__(self, upstream: str, nth: int = 1) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.nth = nth
        self.produces = 0
        self.target: int | None = None
        self.dropped = 0
        self.connections = 0
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
        self.connections += 1
        upstream = await trio.open_tcp_stream(*self.upstream)
        async with trio.open_nursery() as n:
            n.start_soon(self._pump, client, upstream, True, n.cancel_scope)
            n.start_soon(self._pump, upstream, client, False, n.cancel_scope)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(upstream)

    def _forward(self, kind: int, code: int, rid: int) -> bool:
        """A request frame on its way to the broker: count it; False drops it."""
        if kind == 0 and code == RequestCode.PRODUCE:
            self.produces += 1
            if self.produces == self.nth:
                self.target = rid
        return True

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, to_broker: bool, scope: trio.CancelScope) -> None:
        buf = b""
        handshake = 8
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    break
                buf += data
                out = b""
                if handshake:
                    take = min(handshake, len(buf))
                    out, buf, handshake = buf[:take], buf[take:], handshake - take
                while handshake == 0 and len(buf) >= 4:
                    (length,) = struct.unpack_from(">I", buf)
                    if len(buf) < 4 + length:
                        break
                    frame, buf = buf[: 4 + length], buf[4 + length :]
                    _, kind, code, rid = HEADER.unpack_from(frame)
                    if to_broker and not self._forward(kind, code, rid):
                        continue
                    if not to_broker and kind == 1 and rid == self.target:
                        self.target = None
                        self.dropped += 1
                        await dst.send_all(out)
                        scope.cancel()  # drop both sides: the answer never arrives
                        return
                    out += frame
                if out:
                    await dst.send_all(out)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()


async def read_all(c: AsyncClient, topic: str, queues: int) -> dict[int, Message]:
    """Every stored message of ``topic`` by global offset."""
    out: dict[int, Message] = {}
    for q in range(queues):
        offset = 0
        while True:
            r = await c.pull(wire.PullRequest(topic, q, offset, 1000))
            if r.status is not PullStatus.FOUND:
                break
            out.update((m.global_offset, m) for m in r.messages)
            offset = r.next_offset
    return out


async def test_lost_ack_is_retried_without_a_duplicate(broker: Broker) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            proxy = AckDropper(broker.address, nth=1)
            await n.start(proxy.serve)
            async with AsyncClient(broker.address) as c:
                await c.create_topic("idem", 1)
                async with AsyncProducer(proxy.address, retry_backoff=0.05) as p:
                    r = await p.send("idem", b"once", key="k")
                    assert proxy.dropped == 1 and proxy.connections == 2
                    assert r.duplicate  # the broker recognised the resend ...
                    assert (r.queue_id, r.queue_offset) == (0, 0)  # ... and gave the original offsets
                    r2 = await p.send("idem", b"twice", key="k")
                    assert (r2.queue_offset, r2.duplicate) == (1, False)
                stored = await read_all(c, "idem", 1)
                assert [m.text for m in stored.values()] == ["once", "twice"]
                assert stored[r.global_offset].text == "once"
            n.cancel_scope.cancel()


async def test_lost_ack_in_a_pipelined_stream(broker: Broker) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            proxy = AckDropper(broker.address, nth=5)
            await n.start(proxy.serve)
            async with AsyncClient(broker.address) as c:
                await c.create_topic("pipe", 2)
                async with AsyncProducer(proxy.address, retry_backoff=0.05, linger=0.001, max_batch_bytes=512) as p:
                    handles = [await p.send_async("pipe", f"m{i}", key=str(i % 7)) for i in range(600)]
                    await p.flush()
                    results: list[SendResult] = [await h for h in handles]
                assert proxy.dropped == 1
                stored = await read_all(c, "pipe", 2)
                assert sorted(m.text for m in stored.values()) == sorted(f"m{i}" for i in range(600))
                for i, r in enumerate(results):
                    assert stored[r.global_offset].text == f"m{i}"
                    assert stored[r.global_offset].queue_offset == r.queue_offset
            n.cancel_scope.cancel()


@pytest.mark.parametrize("stable_id", [False, True])
async def test_a_lost_batch_retires_the_id_or_ends_a_stable_sequence(broker: Broker, stable_id: bool) -> None:
    """A written batch that fails for good (its ack lost, no retries left): by default
    the queue goes on under a fresh producer id; with ``stable_id`` it keeps its id
    and later sends fail with the same error (a replay under that id resends them)."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            proxy = AckDropper(broker.address, nth=1)
            await n.start(proxy.serve)
            async with AsyncClient(broker.address) as c:
                await c.create_topic("lost", 1)
                async with AsyncProducer(proxy.address, retries=0, stable_id=stable_id) as p:
                    with pytest.raises(ConnectionBroken):
                        await p.send("lost", b"first")
                    if stable_id:
                        with pytest.raises(ConnectionBroken):
                            await p.send("lost", b"second")
                    else:
                        assert (await p.send("lost", b"second")).queue_offset == 1
                stored = await read_all(c, "lost", 1)
                assert [m.text for m in stored.values()] == (["first"] if stable_id else ["first", "second"])
            n.cancel_scope.cancel()


def test_broker_restart_during_a_send_loop(broker_process: Any) -> None:
    bp = broker_process()
    port = bp.port
    with Client(bp.address) as c:
        c.create_topic("restart", 4)
    ok: list[tuple[int, SendResult]] = []
    failed: list[tuple[int, EQueueError]] = []
    stop = threading.Event()
    with Producer(bp.address, retries=8, retry_backoff=0.1, send_timeout=20) as p:

        def loop() -> None:
            i = 0
            while not stop.is_set():
                try:
                    ok.append((i, p.send("restart", f"m{i}", key=f"k{i % 5}")))
                except EQueueError as exc:
                    failed.append((i, exc))
                i += 1

        th = threading.Thread(target=loop)
        th.start()
        wait_until_sync(lambda: len(ok) >= 50, timeout=30, what="sends before the restart")
        bp.kill()
        bp2 = broker_process(port=port)
        before = len(ok)
        wait_until_sync(lambda: len(ok) >= before + 50, timeout=30, what="sends after the restart")
        stop.set()
        th.join(60)
        assert not th.is_alive()
    sent = len(ok) + len(failed)
    assert sent > 0 and sorted(i for i, _ in ok + failed) == list(range(sent))  # each send returned or raised
    with Client(bp2.address) as c:
        stored: dict[int, Message] = {}
        for q in range(4):
            offset = 0
            while True:
                res = c.pull(wire.PullRequest("restart", q, offset, 1000))
                if res.status is not PullStatus.FOUND:
                    break
                stored.update((m.global_offset, m) for m in res.messages)
                offset = res.next_offset
    for i, r in ok:
        m = stored[r.global_offset]
        assert (m.text, m.queue_id, m.queue_offset) == (f"m{i}", r.queue_id, r.queue_offset)
    texts = [m.text for m in stored.values()]
    assert len(texts) == len(set(texts))  # never stored twice


class Meddler(AckDropper):
    """A proxy that swallows the ``nth`` produce request (never forwarded, never
    answered: its send times out) and answers the next one NOT_LEADER itself (not
    forwarded either): what a producer sees when a leader is cut off mid-window."""

    def __init__(self, upstream: str, nth: int = 1, refusal: ErrorCode = ErrorCode.NOT_LEADER) -> None:
        super().__init__(upstream, nth)
        self.refusal = refusal
        self.swallowed = 0
        self.refused = 0

    def _forward(self, kind: int, code: int, rid: int) -> bool:
        if kind == 0 and code == RequestCode.PRODUCE:
            self.produces += 1
            if self.produces == self.nth:
                self.swallowed += 1
                return False
            if self.produces == self.nth + 1:
                self.refused += 1
                self.answers.append(b"".join(encode_response(self.refusal, rid, [b"refused (the test)"])))
                return False
        return True

    answers: list[bytes]

    async def _conn(self, client: trio.SocketStream) -> None:
        self.answers = []
        self.connections += 1
        upstream = await trio.open_tcp_stream(*self.upstream)
        async with trio.open_nursery() as n:
            n.start_soon(self._pump, client, upstream, True, n.cancel_scope)
            n.start_soon(self._pump, upstream, client, False, n.cancel_scope)
            n.start_soon(self._answer_refusals, client)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(upstream)

    async def _answer_refusals(self, client: trio.SocketStream) -> None:
        """The proxy's own answers go out through the client's stream, between the
        broker's (the pump to the client forwards whole frames only)."""
        while True:
            while self.answers:
                await client.send_all(self.answers.pop(0))
            await trio.sleep(0.005)


async def _lose_one_then_refuse_one(
    broker: Broker, topic: str, refusal: ErrorCode, max_in_flight: int, pause: float
) -> tuple[Meddler, list[SendResult | EQueueError], list[str]]:
    """Six keyed sends through a :class:`Meddler`, sent apart as in the fault campaign:
    the first batch is lost (its deadline passes first), the second refused with
    ``refusal``, four more follow ``pause`` seconds later. The outcomes, and the
    bodies stored, in queue order."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            proxy = Meddler(broker.address, nth=1, refusal=refusal)
            await n.start(proxy.serve)
            async with AsyncClient(broker.address) as c:
                await c.create_topic(topic, 1)
                async with AsyncProducer(proxy.address, send_timeout=1.0, retry_backoff=0.01, linger=0,
                                         max_batch_bytes=64, max_in_flight=max_in_flight) as p:  # fmt: skip
                    handles = [await p.send_async(topic, "m0", key="k")]
                    await wait_until(lambda: proxy.swallowed == 1)
                    await trio.sleep(0.3)
                    handles.append(await p.send_async(topic, "m1", key="k"))
                    await wait_until(lambda: proxy.refused == 1)
                    await trio.sleep(pause)
                    handles += [await p.send_async(topic, f"m{i}", key="k") for i in range(2, 6)]
                    await p.flush()
                    outcomes: list[SendResult | EQueueError] = []
                    for h in handles:
                        try:
                            outcomes.append(await h)
                        except EQueueError as exc:
                            outcomes.append(exc)
                stored = await read_all(c, topic, 1)
            n.cancel_scope.cancel()
    return proxy, outcomes, [m.text for m in sorted(stored.values(), key=lambda m: m.queue_offset)]


async def test_a_batch_behind_a_lost_one_keeps_its_place_when_the_id_is_retired(broker: Broker) -> None:
    """The fault campaign's per-key order finding (seed 2611): one keyed batch is
    lost (its send times out), the next is refused NOT_LEADER (nothing written), the
    ones behind it reach the broker out of sequence. The lane retires its producer id
    and sends them all again under a new one: the refused batch must keep its place
    before the later ones (it was stored after them)."""
    proxy, outcomes, stored = await _lose_one_then_refuse_one(broker, "order", ErrorCode.NOT_LEADER, 8, 0.1)
    assert proxy.swallowed == 1 and proxy.refused == 1
    assert isinstance(outcomes[0], EQueueError)  # lost: never stored
    assert stored == [f"m{i}" for i in range(1, 6)]


async def test_a_batch_resent_under_a_retired_id_keeps_its_place_before_new_numbers(broker: Broker) -> None:
    """The fault campaign's second per-key order finding (seed 2611, 30 min, after a
    15 s etcd stop): one batch is lost (its send times out: the lane retires its id),
    the next was refused with a transient error that keeps its id and sequence (its
    fate could be unknown), and the ones behind it wait unnumbered (the window of 2
    is full). When the lane resends, the batch under the retired id goes first; the
    ones behind it must not be numbered under the new id and written in the same
    breath (the broker took them at once and refused the old-id batch as a gap, so it
    was stored after them)."""
    proxy, outcomes, stored = await _lose_one_then_refuse_one(broker, "order2", ErrorCode.BROKER_BUSY, 2, 0.3)
    assert proxy.swallowed == 1 and proxy.refused == 1
    assert isinstance(outcomes[0], EQueueError)  # lost: never stored
    assert isinstance(outcomes[0], EQueueError) and all(isinstance(o, SendResult) for o in outcomes[1:])
    assert stored == [f"m{i}" for i in range(1, 6)]
