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
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.broker import storage as st
from equeue.broker.appender import Appender
from equeue.client import AsyncClient
from equeue.codec import HEADER, NEED_DATA, Connection, Hello, Request, Response, Role
from equeue.errors import BrokerShuttingDown, ErrorCode, OperationTimeout
from equeue.producer import AsyncProducer, Producer
from equeue.protocol import RequestCode
from tests.conftest import wait_until

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
        assert store.view.queue(info.topic_id, 0).next_offset == 200
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
        assert store.view.queue(info.topic_id, 0).next_offset == len(stored)
        with pytest.raises(BrokerShuttingDown):
            app.enqueue(_produce_op(info, 0, b"late"))
    finally:
        store.close()


# ---------------------------------------------------------------------- broker output


def _raw_connect(address: str, rcvbuf: int = 0) -> tuple[socket.socket, Connection]:
    host, port = address.rsplit(":", 1)
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
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


def _pipelined_to_new_topics(address: str, topics: list[str], per_topic: int) -> dict[str, list[int]]:
    """On one raw connection, ``per_topic`` produces to queue 0 of each topic (none
    exists yet: each is auto-created by its first produce), all in one write; the
    queue offsets the answers report, per topic, in request order."""
    s, c = _raw_connect(address)
    try:
        frames = b""
        rid = 0
        for t in topics:
            for i in range(per_topic):
                rid += 1
                req = wire.ProduceRequest(t, 0, [wire.encode_entry(Message(b"%s-%d" % (t.encode(), i)))])
                frames += c.send(Request(rid, RequestCode.PRODUCE, req.encode()))
        s.sendall(frames)
        answers = _read_responses(s, c, rid)
    finally:
        s.close()
    out: dict[str, list[int]] = {}
    rid = 0
    for t in topics:
        for _ in range(per_topic):
            rid += 1
            assert answers[rid].code == ErrorCode.OK, answers[rid]
            out.setdefault(t, []).append(wire.ProduceResponse.decode(answers[rid].payload).first_queue)
    return out


async def test_pipelined_produces_to_a_topic_being_auto_created_keep_their_order(broker: Broker) -> None:
    """The first produce to a missing topic waits for its creation; the produces
    pipelined behind it on the same connection are stored after it, in arrival order
    (they used to race it: trio wakes the waiters of one event in either order)."""
    topics = [f"auto-{i}" for i in range(20)]
    with trio.fail_after(30):
        got = await trio.to_thread.run_sync(_pipelined_to_new_topics, broker.address, topics, 3)
    assert got == {t: [0, 1, 2] for t in topics}


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


# ---------------------------------------------------------------------- parked pulls answered by the writer thread


def _request(s: socket.socket, c: Connection, rid: int, code: int, payload: bytes) -> Response:
    """Send one request and read the next response, which must be its answer."""
    s.sendall(c.send(Request(rid, code, payload)))
    got = _read_responses(s, c, 1)
    assert list(got) == [rid], f"expected the answer to {rid}, got {list(got)}"
    return got[rid]


def _count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[object]:
    """Record the results of ``cls.name`` calls (the real method still runs)."""
    results: list[object] = []
    real = getattr(cls, name)

    def wrapped(*a: object, **k: object) -> object:
        r = real(*a, **k)
        results.append(r)
        return r

    monkeypatch.setattr(cls, name, wrapped)
    return results


async def _park(broker: Broker, s: socket.socket, c: Connection, pulls: dict[int, wire.PullRequest]) -> None:
    """Send long-poll pulls (request id -> pull) and wait until the broker parked them all."""
    s.sendall(b"".join(c.send(Request(rid, RequestCode.PULL, p.encode())) for rid, p in pulls.items()))
    await wait_until(lambda: broker.parked.parked >= len(pulls), what=f"{len(pulls)} pulls parked")


async def test_parked_pull_is_answered_once_from_the_writer_thread(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from equeue.broker.output import Output

    sent = _count_calls(monkeypatch, Output, "write_from_thread")
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("lp", 2)
        s, c = await trio.to_thread.run_sync(_raw_connect, broker.address)
        try:
            with trio.fail_after(10):
                await _park(broker, s, c, {1: wire.PullRequest("lp", 1, 0, 32, 1 << 20, 10_000)})
                await admin.produce(wire.ProduceRequest("lp", 1, [wire.encode_entry(Message(b"hello"))]))
                first = await trio.to_thread.run_sync(_read_responses, s, c, 1)
                # the next frame on the connection answers the next request: no second answer to 1
                nothing = wire.PullRequest("lp", 1, 1, 32, 1 << 20).encode()
                second = await trio.to_thread.run_sync(_request, s, c, 2, RequestCode.PULL, nothing)
        finally:
            s.close()
    r = wire.decode_pull_response("lp", first[1].payload)
    assert [m.body for m in r.messages] == [b"hello"] and r.next_offset == 1
    assert wire.decode_pull_response("lp", second.payload).status.name == "NO_NEW_MESSAGE"
    assert sent == [HEADER.size + len(first[1].payload)]  # the whole frame
    assert broker.stats.messages_out == 1
    assert broker.parked.parked == 0


async def test_pulls_expiring_as_commits_land_get_exactly_one_answer_each(broker: Broker) -> None:
    """Short holds racing a steady stream of commits: each pull is answered once
    (by the writer thread, or by its own task on expiry), and reading from the
    answers' next offsets sees every message once, in order."""
    total = 600
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("race", 1)

        def consume() -> list[bytes]:
            s, c = _raw_connect(broker.address)
            got: list[bytes] = []
            try:
                offset, rid = 0, 0
                while len(got) < total:
                    rid += 1
                    hold = 1 + rid % 3  # ms: expiries land among the commits
                    req = wire.PullRequest("race", 0, offset, 7, 1 << 20, hold).encode()
                    r = wire.decode_pull_response("race", _request(s, c, rid, RequestCode.PULL, req).payload, offset)
                    got += [m.body for m in r.messages]
                    offset = r.next_offset
            finally:
                s.close()
            return got

        async def produce() -> None:
            for i in range(total):
                await admin.produce(wire.ProduceRequest("race", 0, [wire.encode_entry(Message(b"%d" % i))]))
                if i % 3 == 0:
                    await trio.sleep(0.001)

        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                n.start_soon(produce)
                got = await trio.to_thread.run_sync(consume)
    assert got == [b"%d" % i for i in range(total)]


@pytest.mark.parametrize("tail_late", [False, True], ids=["tail-pushed-at-once", "tail-pushed-late"])
async def test_a_writer_answer_bigger_than_the_socket_buffer(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, tail_late: bool
) -> None:
    """The writer thread's write of a parked pull's answer only partly fits the
    socket: the writer task sends the rest, before the answer to a later request --
    also when the loop answers that request before the tail was handed over."""
    from equeue.broker.output import Output

    pushed = _count_calls(monkeypatch, Output, "_push_rest")
    bodies = [os.urandom(10_000) for _ in range(300)]
    async with trio.open_nursery() as nursery:
        if tail_late:
            real = Output._push_rest

            def deferred(self: Output) -> None:
                async def later() -> None:
                    await trio.sleep(0.3)
                    real(self)
                    pushed.append(None)

                nursery.start_soon(later)

            monkeypatch.setattr(Output, "_push_rest", deferred)
        async with AsyncClient(broker.address) as admin:
            await admin.create_topic("wide", 1)
            s, c = await trio.to_thread.run_sync(_raw_connect, broker.address)
            try:
                with trio.fail_after(20):
                    await _park(broker, s, c, {1: wire.PullRequest("wide", 0, 0, 1000, 8 << 20, 10_000)})
                    await admin.produce(wire.ProduceRequest("wide", 0, [wire.encode_entry(Message(b)) for b in bodies]))
                    s.sendall(c.send(Request(2, RequestCode.PULL, wire.PullRequest("wide", 0, 299, 1, 1 << 20).encode())))
                    # request 2 is answered (late tail: while the tail waits)
                    await wait_until(
                        lambda: broker.stats.messages_out >= len(bodies) + 1, what="request 2 answered"
                    )
                    answers = await trio.to_thread.run_sync(_read_responses, s, c, 2)
            finally:
                s.close()
    assert pushed, "the first write was not partial; the test did not exercise the tail"
    assert [m.body for m in wire.decode_pull_response("wide", answers[1].payload).messages] == bodies
    assert [m.body for m in wire.decode_pull_response("wide", answers[2].payload, 299).messages] == bodies[-1:]


async def test_parked_pull_of_a_closed_connection_is_dropped_quietly(broker: Broker) -> None:
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("gone", 1)
        s, c = await trio.to_thread.run_sync(_raw_connect, broker.address)
        with trio.fail_after(10):
            await _park(broker, s, c, {1: wire.PullRequest("gone", 0, 0, 32, 1 << 20, 10_000)})
            s.close()
            await admin.produce(wire.ProduceRequest("gone", 0, [wire.encode_entry(Message(b"x"))]))
            await wait_until(lambda: broker.parked.parked == 0, what="the pull of the closed connection dropped")
            r = await admin.pull(wire.PullRequest("gone", 0, 0, 32, 1 << 20))
    assert [m.body for m in r.messages] == [b"x"]


async def test_parked_pull_with_a_tag_filter_waits_past_filtered_commits(broker: Broker) -> None:
    """A commit with nothing for the parked pull's filter does not answer it (the
    writer thread leaves it to its task, which parks again); the next match does."""
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("tagged", 1)

        async def later() -> None:
            await wait_until(lambda: broker.parked.parked == 1, what="the pull is parked")
            await admin.produce(wire.ProduceRequest("tagged", 0, [wire.encode_entry(Message(b"no", tags="b"))]))
            # still waiting: the commit's wake-ups ran before its ack; a woken pull parks again
            await wait_until(lambda: broker.parked.parked == 1, what="the pull is parked again")
            await admin.produce(wire.ProduceRequest("tagged", 0, [wire.encode_entry(Message(b"yes", tags="a"))]))

        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(later)
                r = await admin.pull(wire.PullRequest("tagged", 0, 0, 32, 1 << 20, 10_000, tags="a"))
    assert [m.body for m in r.messages] == [b"yes"]
    assert r.next_offset == 2


class _PausingStream:
    """A server stream whose ``send_all`` pauses half way through (the connection's
    writer task busy while the socket buffer has room). ``paused`` is set once a
    large write (an answer, not a handshake) is paused."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self._inner = inner
        self.paused = trio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def send_all(self, data: bytes) -> None:
        half = len(data) // 2
        await self._inner.send_all(data[:half])
        if len(data) >= 64 << 10:
            self.paused.set()
        await trio.sleep(0.3)  # simulated slow peer: the writer task stays busy meanwhile
        await self._inner.send_all(data[half:])


async def test_writer_thread_never_writes_into_a_busy_writer_task(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from equeue.broker.output import Output

    real_init = Output.__init__
    streams: list[_PausingStream] = []

    def init(self: Output, stream: trio.SocketStream, *args: Any) -> None:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
        streams.append(_PausingStream(stream))
        real_init(self, streams[-1], *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Output, "__init__", init)
    bodies = [os.urandom(10_000) for _ in range(100)]
    result: dict[str, dict[int, Response]] = {}
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("busy", 2)
        await admin.produce(wire.ProduceRequest("busy", 1, [wire.encode_entry(Message(b)) for b in bodies]))
        s, c = await trio.to_thread.run_sync(_raw_connect, broker.address, 32 << 10)
        try:
            with trio.fail_after(20):
                await _park(broker, s, c, {1: wire.PullRequest("busy", 0, 0, 32, 1 << 20, 10_000)})
                s.sendall(c.send(Request(2, RequestCode.PULL, wire.PullRequest("busy", 1, 0, 1000, 8 << 20).encode())))
                reader = threading.Thread(target=lambda: result.update(a=_read_responses(s, c, 2)))
                reader.start()
                await wait_until(  # the writer task is half way through answer 2
                    lambda: any(p.paused.is_set() for p in streams), what="answer 2 paused half way"
                )
                await admin.produce(wire.ProduceRequest("busy", 0, [wire.encode_entry(Message(b"small"))]))
                await trio.to_thread.run_sync(reader.join)
        finally:
            s.close()
    answers = result["a"]
    assert [m.body for m in wire.decode_pull_response("busy", answers[1].payload).messages] == [b"small"]
    assert [m.body for m in wire.decode_pull_response("busy", answers[2].payload).messages] == bodies


async def test_a_crowd_of_parked_pulls_past_the_writer_thread_cap_is_answered_once_each(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from equeue.broker.output import Output
    from equeue.broker.writer_answers import MAX_THREAD_ANSWERS

    sent = _count_calls(monkeypatch, Output, "write_from_thread")
    crowd = MAX_THREAD_ANSWERS + 6
    async with AsyncClient(broker.address) as admin:
        await admin.create_topic("crowd", 1)
        s, c = await trio.to_thread.run_sync(_raw_connect, broker.address)
        try:
            pull = wire.PullRequest("crowd", 0, 0, 32, 1 << 20, 10_000)
            with trio.fail_after(20):
                await _park(broker, s, c, dict.fromkeys(range(1, crowd + 1), pull))
                await admin.produce(wire.ProduceRequest("crowd", 0, [wire.encode_entry(Message(b"all"))]))
                answers = await trio.to_thread.run_sync(_read_responses, s, c, crowd)
                # nothing more follows: the next frame answers the next request
                tail = wire.PullRequest("crowd", 0, 1, 32, 1 << 20).encode()
                await trio.to_thread.run_sync(_request, s, c, crowd + 1, RequestCode.PULL, tail)
        finally:
            s.close()
    assert sorted(answers) == list(range(1, crowd + 1))
    for ev in answers.values():
        assert [m.body for m in wire.decode_pull_response("crowd", ev.payload).messages] == [b"all"]
    assert len(sent) == MAX_THREAD_ANSWERS and all(sent)
    assert broker.stats.messages_out == crowd
