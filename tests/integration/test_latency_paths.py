"""The low-latency paths: the appender's long-lived writer thread, the broker's
direct answer writes, the client's non-blocking request write and the producer
lane's write-from-the-kick path. Correctness only (speed is for bench/)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import trio

from broker import Broker, EmbeddedBroker
from broker import store as st
from broker.appender import Appender
from equeue import Message, wire
from equeue.codec import NEED_DATA, Connection, Hello, Request, Response, Role
from equeue.errors import BrokerShuttingDown, ErrorCode, OperationTimeout
from equeue.protocol import RequestCode
from producer import AsyncClient, AsyncProducer, Producer

# ---------------------------------------------------------------------- appender


def _produce_op(info: st.TopicInfo, q: int, body: bytes) -> st.ProduceOp:
    return st.ProduceOp(info, q, [wire.encode_entry(Message(body))], None, -1, 4 << 20, 86_400_000)


async def test_appender_group_commits_concurrent_ops_in_order(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store)
        results: list[wire.ProduceResponse] = []
        called: list[object] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                info = await app.submit(st.CreateTopicOp("t", 1))
                # enqueued back to back, without a checkpoint: one batch, in order
                pendings = [app.enqueue(_produce_op(info, 0, b"m%d" % i), called.append) for i in range(200)]
                for p in pendings:
                    results.append(await app.wait(p))
                app.close()
        assert [r.first_queue for r in results] == list(range(200))
        assert called == pendings  # every callback ran once, in commit order
        assert app.transactions < 200
        assert store.queues[(info.topic_id, 0)].next_offset == 200
    finally:
        store.close()


async def test_appender_close_answers_queued_ops_then_refuses(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=False)
    try:
        app = Appender(store)
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                info = await app.submit(st.CreateTopicOp("t", 1))
                pendings = [app.enqueue(_produce_op(info, 0, b"x")) for _ in range(50)]
                app.close()
                with pytest.raises(BrokerShuttingDown):
                    app.enqueue(_produce_op(info, 0, b"late"))
            # run() returned: every queued op was committed and answered
            assert all(p.done.is_set() for p in pendings)
            assert [p.result.first_queue for p in pendings] == list(range(50))
    finally:
        store.close()


async def test_appender_cancelled_answers_every_waiter(tmp_path: Path) -> None:
    store = st.Store(tmp_path / "data", map_size=1 << 28, sync=True)
    try:
        app = Appender(store)
        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(app.run)
                info = await app.submit(st.CreateTopicOp("t", 1))
                pendings = []
                for _ in range(30):
                    pendings += [app.enqueue(_produce_op(info, 0, b"y")) for _ in range(20)]
                    await trio.lowlevel.checkpoint()
                n.cancel_scope.cancel()
        assert all(p.done.is_set() for p in pendings)
        stored = [p for p in pendings if not isinstance(p.result, BaseException)]
        refused = [p for p in pendings if isinstance(p.result, BaseException)]
        assert all(isinstance(p.result, BrokerShuttingDown) for p in refused)
        # what was answered as stored is stored, in order, and nothing else
        assert [p.result.first_queue for p in stored] == list(range(len(stored)))
        assert store.queues[(info.topic_id, 0)].next_offset == len(stored)
        with pytest.raises(BrokerShuttingDown):
            app.enqueue(_produce_op(info, 0, b"late"))
    finally:
        store.close()


# ---------------------------------------------------------------------- broker output


def _raw_connect(address: str) -> tuple[socket.socket, Connection]:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    c = Connection(Role.CLIENT)
    s.sendall(c.send(Hello()))
    while True:
        c.receive_data(s.recv(65536))
        if c.next_event() is not NEED_DATA:
            return s, c


def _read_responses(s: socket.socket, c: Connection, n: int) -> dict[int, Response]:
    out: dict[int, Response] = {}
    while len(out) < n:
        ev = c.next_event()
        if ev is NEED_DATA:
            data = s.recv(1 << 20)
            assert data, "broker closed the connection"
            c.receive_data(data)
            continue
        assert isinstance(ev, Response)
        assert ev.request_id not in out
        out[ev.request_id] = ev
    return out


async def test_pipelined_mixed_requests_each_get_one_intact_answer(broker: Broker) -> None:
    """Produce answers (written directly or staged per transaction) and handler
    answers (big pulls through the writer task) interleave on one connection
    without corrupting the byte stream."""
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("mix", 2)
        big = [wire.encode_entry(Message(b"b" * 2000)) for _ in range(400)]
        await admin.produce(wire.ProduceRequest("mix", 1, big))

    def run() -> tuple[dict[int, Response], dict[int, int]]:
        s, c = _raw_connect(broker.address)
        try:
            kinds: dict[int, int] = {}
            out = bytearray()
            rid = 0
            for _ in range(300):
                rid += 1
                if rid % 7 == 0:  # a ~800 KB pull answer
                    payload = wire.PullRequest("mix", 1, 0, 1000, 16 << 20).encode()
                    kinds[rid] = RequestCode.PULL
                else:
                    payload = wire.ProduceRequest("mix", 0, [wire.encode_entry(Message(b"r%d" % rid))]).encode()
                    kinds[rid] = RequestCode.PRODUCE
                out += c.send(Request(rid, kinds[rid], payload))
                if rid % 25 == 0:
                    s.sendall(out)
                    out.clear()
            s.sendall(out)
            return _read_responses(s, c, rid), kinds
        finally:
            s.close()

    with trio.fail_after(30):
        answers, kinds = await trio.to_thread.run_sync(run)
    offsets = []
    for rid, ev in answers.items():
        assert ev.code == ErrorCode.OK, ev.payload
        if kinds[rid] == RequestCode.PULL:
            r = wire.decode_pull_response("mix", ev.payload)
            assert len(r.messages) == 400
        else:
            offsets.append(wire.ProduceResponse.decode(ev.payload).first_queue)
    assert sorted(offsets) == list(range(len(offsets)))


async def test_bad_produce_among_good_ones_on_one_connection(broker: Broker) -> None:
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("bad", 1)

    def run() -> dict[int, Response]:
        s, c = _raw_connect(broker.address)
        try:
            good = wire.ProduceRequest("bad", 0, [wire.encode_entry(Message(b"ok"))]).encode()
            wrong_queue = wire.ProduceRequest("bad", 5, [wire.encode_entry(Message(b"no"))]).encode()
            frames = b"".join(
                c.send(Request(i, RequestCode.PRODUCE, wrong_queue if i % 3 == 0 else good)) for i in range(1, 31)
            )
            s.sendall(frames + c.send(Request(31, RequestCode.PRODUCE, b"\x00garbage")))
            return _read_responses(s, c, 31)
        finally:
            s.close()

    with trio.fail_after(20):
        answers = await trio.to_thread.run_sync(run)
    assert {i for i, ev in answers.items() if ev.code != ErrorCode.OK} == {*range(3, 31, 3), 31}
    assert answers[3].code == ErrorCode.QUEUE_NOT_FOUND
    assert answers[31].code == ErrorCode.BAD_REQUEST


# ---------------------------------------------------------------------- client / producer


async def test_send_request_nowait_larger_than_the_socket_buffer(broker: Broker) -> None:
    """A non-blocking write that the socket cannot take at once: the rest is
    written by a task, before any later request."""
    async with AsyncClient(broker.address) as c:
        await c.create_topic("big", 1)
        assert c.can_send_now()
        bodies = [os.urandom(1 << 20) for _ in range(3)]
        entries = [wire.encode_entry(Message(x)) for x in bodies]
        big = c.send_request_nowait(RequestCode.PRODUCE, wire.ProduceRequest("big", 0, entries).encode())
        small = await c.send_request(
            RequestCode.PRODUCE, wire.ProduceRequest("big", 0, [wire.encode_entry(Message(b"s"))]).encode()
        )
        with trio.fail_after(20):
            await big.done.wait()
            await small.done.wait()
        a = wire.ProduceResponse.decode(AsyncClient.answer(big))
        b = wire.ProduceResponse.decode(AsyncClient.answer(small))
        assert (a.first_queue, a.stored, b.first_queue) == (0, 3, 3)
        r = await c.pull(wire.PullRequest("big", 0, 0, 10, 16 << 20))
        assert [m.body for m in r.messages] == [*bodies, b"s"]


async def test_blocking_sends_in_a_row_keep_order_per_queue(broker: Broker) -> None:
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("seq", 4)
    with trio.fail_after(30):
        async with AsyncProducer(broker.address) as p:
            results = [await p.send("seq", b"m%d" % i, key=f"k{i % 8}") for i in range(400)]
            # a burst while sends are in flight takes the general path, same order
            handles = [await p.send_async("seq", b"a%d" % i, key=f"k{i % 8}") for i in range(400)]
            await p.flush()
            results += [await h for h in handles]
    per_queue: dict[int, list[int]] = {}
    for r in results:
        per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    for q, offs in per_queue.items():
        assert offs == list(range(len(offs))), f"queue {q}"


def test_sync_send_from_threads(embedded_broker: EmbeddedBroker) -> None:
    address = embedded_broker.address

    with Producer(address) as p:
        p.send("thr", b"first", key="a")
        out: list[int] = []
        lock = threading.Lock()

        def worker(t: int) -> None:
            for i in range(100):
                r = p.send("thr", b"%d-%d" % (t, i), key=f"t{t}")
                with lock:
                    out.append(r.global_offset)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(out) == 400 and len(set(out)) == 400


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_send_times_out_when_a_directly_written_request_gets_no_answer(broker_process: object) -> None:
    """The lane task is parked when a send writes its request directly; the
    send_timeout of that request must still be enforced."""
    b = broker_process("--flush", "async")  # type: ignore[operator]
    with Producer(b.address, send_timeout=1.0, retries=0) as p:
        p.send("stall", b"warm", key="k")
        time.sleep(1.5)  # past the warm-up's deadline: the lane task is parked with no timer
        os.kill(b.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(OperationTimeout):
                p.send("stall", b"lost?", key="k")
            assert time.monotonic() - t0 < 10
        finally:
            os.kill(b.pid, signal.SIGCONT)
        # the lane recovers (fresh producer id) and sends again
        r = p.send("stall", b"after", key="k")
        assert r.queue_offset >= 1
