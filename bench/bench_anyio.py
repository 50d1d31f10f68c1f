"""The cores on anyio, measured: a minimal client core written on anyio alone, run on
anyio's trio backend, its asyncio backend and asyncio with uvloop, against the trio SDK
and the asyncio front (``equeue.aio``, the thread bridge) in one run on one broker
process (``--flush async``, loopback).

The prototype (:class:`Conn`, :class:`Producer`, :class:`Consumer`) uses only anyio's
API (no asyncio or trio import): one connection (``anyio.connect_tcp``) driven through
the project's sans-I/O codec and handshake (``ClientHandshake``), a reader task matching
answers to request ids, frames queued and written together by whichever task is
writing, PRODUCE requests carrying record batches (a record encoded per message with
``produced_record``, sealed with ``seal_records``) and PULL requests decoded with the
consumer's decoder (``decode_pull_batches``: a Message per record). It does per message
what the SDK does, and nothing else: no idempotence, no routing (queue ids are given,
the producer picks queues round robin), no consumer group (no lease, rebalance or
offset commits), no retries, no flow control beyond a bounded window. Its figures are
thus a lower bound of what the cores ported to anyio would cost on each backend.

Workloads, as ``bench/bench_aio.py`` (whose functions give the trio SDK and equeue.aio
columns): P1 streams ``--messages`` x 100 B to a 4-queue topic (the prototype: batches of
100 per queue, 4 requests in flight per queue); C1 drains that backlog (pulls of up to
512, a no-op async handler awaited per message); L1 sends one message at a time at
``--rate`` msg/s for ``--seconds`` s to a long-polling consumer (send -> handler
latency, p50/p99). Each front runs in its own process, in turn, ``--runs`` times
alternating; the cpu columns are that process's CPU time (all its threads) per message.

    .venv/bin/python bench/bench_anyio.py [--messages 200000] [--rate 2000] [--seconds 3]
        [--runs 2] [--fronts trio,aio,anyio-trio,anyio-asyncio,anyio-uvloop]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue import wire  # noqa: E402
from equeue.client.handshake import ClientHandshake  # noqa: E402
from equeue.codec import NEED_DATA, Connection, Response  # noqa: E402
from equeue.codec import Request as RequestEvent  # noqa: E402
from equeue.errors import ConnectionBroken, ErrorCode, error_for_code  # noqa: E402
from equeue.models import Message  # noqa: E402
from equeue.protocol import PullStatus, RequestCode  # noqa: E402
from equeue.wire.batches import produced_record, seal_records  # noqa: E402

BODY = b"x" * 100
QUEUES = 4
MAX_CONTENT = 4 << 20  # the producer's default max_message_bytes
MAX_PULL_BYTES = 4 << 20
PULL_HOLD_MS = 15_000  # the consumer's default pull_hold
FRONTS = ("trio", "aio", "anyio-trio", "anyio-asyncio", "anyio-uvloop")


# ---------------------------------------------------------------- the prototype core
class _Slot:
    """One pending request: its answer (or the connection's failure), and an event."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: Response | BaseException | None = None

    def set(self, result: Response | BaseException) -> None:
        self.result = result
        self.event.set()


class Conn:
    """One connection: requests written through the codec, answers matched to their
    request ids by the reader task (:meth:`open` runs it)."""

    def __init__(self, stream: SocketStream, address: str, codec: Connection) -> None:
        self.stream = stream
        self.address = address
        self.codec = codec
        self.pending: dict[int, _Slot] = {}
        self._outbox: list[bytes] = []
        self._writing = False
        self._ids = itertools.count(1)
        self._broken: BaseException | None = None

    @classmethod
    @asynccontextmanager
    async def open(cls, address: str) -> AsyncIterator[Conn]:
        """Connect, drive the handshake, run the reader; close on exit. Raises
        ConnectionBroken (or what the handshake raises) when the broker refuses."""
        host, port = address.rsplit(":", 1)
        stream = await anyio.connect_tcp(host, int(port))
        async with stream:
            stream.extra(SocketAttribute.raw_socket).setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            shake = ClientHandshake(address, None)
            data = shake.start()
            while True:
                if data:
                    await stream.send(data)
                if shake.done:
                    break
                try:
                    received = await stream.receive(65536)
                except anyio.EndOfStream:
                    received = b""
                data = shake.receive_data(received)
            conn = cls(stream, address, shake.codec)
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn._reader)
                try:
                    yield conn
                finally:
                    tg.cancel_scope.cancel()

    async def _reader(self) -> None:
        codec = self.codec
        try:
            while True:
                while True:
                    ev = codec.next_event()
                    if ev is NEED_DATA:
                        break
                    if isinstance(ev, Response):
                        if ev.request_id == 0:
                            raise error_for_code(ev.code, ev.payload.decode("utf-8", "replace"))
                        slot = self.pending.pop(ev.request_id, None)
                        if slot is not None:
                            slot.set(ev)
                try:
                    data = await self.stream.receive(256 * 1024)
                except anyio.EndOfStream:
                    raise ConnectionBroken(f"broker {self.address} closed the connection") from None
                codec.receive_data(data)
        except BaseException as exc:
            self._fail(exc if isinstance(exc, ConnectionBroken) else ConnectionBroken(f"connection lost: {exc!r}"))
            raise

    def _fail(self, exc: BaseException) -> None:
        self._broken = exc
        pending, self.pending = self.pending, {}
        for slot in pending.values():
            slot.set(exc)

    async def send_request(self, code: int, payload: bytes) -> _Slot:
        """Queue one request and see it written: the task that is writing takes every
        frame queued meanwhile into its next write (requests issued together leave in
        one segment). Returns its pending answer."""
        if self._broken is not None:
            raise self._broken
        rid = next(self._ids) & 0xFFFFFFFF or next(self._ids)
        slot = _Slot()
        self.pending[rid] = slot
        self._outbox.append(self.codec.send(RequestEvent(rid, code, payload)))
        if not self._writing:
            self._writing = True
            try:
                # shielded: the frames taken may be other tasks' requests
                with anyio.CancelScope(shield=True):
                    while self._outbox:
                        data = b"".join(self._outbox)
                        self._outbox.clear()
                        await self.stream.send(data)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                self._fail(ConnectionBroken(f"connection to {self.address} lost: {exc!r}"))
                raise
            finally:
                self._writing = False
        return slot

    async def request(self, code: int, payload: bytes) -> bytes:
        """Send one request and return its answer's payload; raises the mapped error
        of an error answer, ConnectionBroken when the connection fails first."""
        slot = await self.send_request(code, payload)
        await slot.event.wait()
        res = slot.result
        if isinstance(res, BaseException):
            raise res
        assert res is not None
        if res.code != ErrorCode.OK:
            raise error_for_code(res.code, res.payload.decode("utf-8", "replace"))
        return res.payload


class Producer:
    """Streaming produce to one topic: each message encoded into its record at once,
    round robin over the queues; a queue's batch of ``batch`` records is sealed and sent
    by one of its ``window`` lane tasks (so at most ``window`` requests in flight per
    queue; :meth:`send` waits when all are out)."""

    def __init__(self, conn: Conn, topic: str, queues: int, batch: int, window: int) -> None:
        self.conn, self.topic, self.queues, self.batch, self.window = conn, topic, queues, batch, window
        self._records: list[list[bytes]] = [[] for _ in range(queues)]
        self._lanes: list[MemoryObjectSendStream[bytes]] = []
        self._next = 0
        self.stored = 0

    @classmethod
    @asynccontextmanager
    async def open(
        cls, conn: Conn, topic: str, queues: int = QUEUES, batch: int = 100, window: int = 4
    ) -> AsyncIterator[Producer]:
        """The producer; on exit every buffered message is sent and acknowledged."""
        p = cls(conn, topic, queues, batch, window)
        async with anyio.create_task_group() as tg:
            for q in range(queues):
                send, receive = anyio.create_memory_object_stream[bytes](0)
                p._lanes.append(send)
                for _ in range(window):
                    tg.start_soon(p._lane, q, receive.clone())
                receive.close()
            yield p
            for q in range(queues):
                if p._records[q]:
                    await p._seal(q)
            for lane in p._lanes:
                lane.close()

    async def send(self, body: bytes) -> None:
        """Buffer one message (its record encoded now); a full batch goes out."""
        q = self._next % self.queues
        self._next += 1
        records = self._records[q]
        records.append(produced_record(body, None, None, None, 0, MAX_CONTENT))
        if len(records) >= self.batch:
            await self._seal(q)

    async def _seal(self, q: int) -> None:
        records, self._records[q] = self._records[q], []
        await self._lanes[q].send(seal_records(b"".join(records), len(records)))

    async def _lane(self, q: int, batches: MemoryObjectReceiveStream[bytes]) -> None:
        async with batches:
            async for batch in batches:
                payload = wire.ProduceRequest(self.topic, q, (), batch=batch).encode()
                answer = wire.ProduceResponse.decode(await self.conn.request(RequestCode.PRODUCE, payload))
                self.stored += answer.stored


class Consumer:
    """Long-polling pull loops over the queues of one topic from offset 0, each pulled
    chunk handed to one dispatch task that awaits the handler on each message in turn
    (as the SDK's pull loops feed its workers). :meth:`run` returns after :meth:`stop`."""

    def __init__(self, conn: Conn, topic: str, queues: int = QUEUES, max_pull: int = 512) -> None:
        self.conn, self.topic, self.queues, self.max_pull = conn, topic, queues, max_pull
        self._tg: TaskGroup | None = None

    async def run(self, handler: Callable[[Message], Awaitable[None]]) -> None:
        send, receive = anyio.create_memory_object_stream[list[Message]](16)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for q in range(self.queues):
                tg.start_soon(self._pull, q, send.clone())
            send.close()
            tg.start_soon(self._dispatch, receive, handler)

    def stop(self) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    async def _pull(self, q: int, out: MemoryObjectSendStream[list[Message]]) -> None:
        offset, topic, n = 0, self.topic, self.max_pull
        async with out:
            while True:
                req = wire.PullRequest(topic, q, offset, n, MAX_PULL_BYTES, PULL_HOLD_MS)
                payload = await self.conn.request(RequestCode.PULL, req.encode())
                status, lo, _hi, nxt, msgs = wire.decode_pull_batches(topic, payload, offset, False, None, n)
                if msgs:
                    await out.send(msgs)
                    offset = nxt
                elif status is PullStatus.OFFSET_TOO_SMALL:
                    offset = lo
                elif nxt > offset:
                    offset = nxt

    @staticmethod
    async def _dispatch(
        chunks: MemoryObjectReceiveStream[list[Message]], handler: Callable[[Message], Awaitable[None]]
    ) -> None:
        async with chunks:
            async for msgs in chunks:
                for m in msgs:
                    await handler(m)


# ---------------------------------------------------------------- the prototype's workloads
async def proto_p1(addr: str, topic: str, n: int) -> float:
    async with Conn.open(addr) as conn:
        t0 = time.perf_counter()
        async with Producer.open(conn, topic) as p:
            for _ in range(n):
                await p.send(BODY)
        rate = n / (time.perf_counter() - t0)
        assert p.stored == n, (p.stored, n)
        return rate


async def proto_c1(addr: str, topic: str, n: int) -> float:
    async with Conn.open(addr) as conn:
        con = Consumer(conn, topic)
        count = 0

        async def handler(m: Message) -> None:
            nonlocal count
            count += 1
            if count == n:
                con.stop()

        t0 = time.perf_counter()
        with anyio.fail_after(120):
            await con.run(handler)
        return n / (time.perf_counter() - t0)


async def proto_l1(addr: str, topic: str, rate: int, seconds: float) -> tuple[float, float]:
    lat: list[float] = []
    n = int(rate * seconds)
    async with Conn.open(addr) as pconn, Conn.open(addr) as cconn:
        con = Consumer(cconn, topic)

        async def handler(m: Message) -> None:
            lat.append(time.perf_counter() - float(m.body))
            if len(lat) == n:
                con.stop()

        with anyio.fail_after(seconds + 60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(con.run, handler)
                await anyio.sleep(1.0)  # as bench_aio: the pulls are parked
                t0 = time.perf_counter()
                for i in range(n):
                    await anyio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
                    record = produced_record(repr(time.perf_counter()).encode(), None, None, None, 0, MAX_CONTENT)
                    req = wire.ProduceRequest(topic, i % QUEUES, (), batch=seal_records(record, 1))
                    await pconn.send_request(RequestCode.PRODUCE, req.encode())  # its ack is not awaited
    return percentiles(lat)


def percentiles(xs: list[float]) -> tuple[float, float]:
    """(p50, p99) in ms."""
    xs = sorted(xs)
    return 1000 * xs[len(xs) // 2], 1000 * xs[int(len(xs) * 0.99)]


# ---------------------------------------------------------------- one front, in its own process
def measure(run: Callable[[], Any], n: int) -> tuple[Any, float]:
    """``run()``'s result and this process's CPU time per message in µs."""
    c0 = time.process_time()
    out = run()
    return out, 1e6 * (time.process_time() - c0) / n


def child(front: str, addr: str, tag: str, n: int, rate: int, seconds: float) -> dict[str, float]:
    p1t, l1t = f"p1-{tag}", f"l1-{tag}"
    nl = int(rate * seconds)
    if front.startswith("anyio-"):
        backend = "trio" if front == "anyio-trio" else "asyncio"
        opts = {"use_uvloop": True} if front == "anyio-uvloop" else {}

        def go(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
            return anyio.run(fn, *args, backend=backend, backend_options=opts)

        p1, p1_cpu = measure(lambda: go(proto_p1, addr, p1t, n), n)
        c1, c1_cpu = measure(lambda: go(proto_c1, addr, p1t, n), n)
        (p50, p99), l1_cpu = measure(lambda: go(proto_l1, addr, l1t, rate, seconds), nl)
    else:
        import asyncio

        import trio

        sys.path.insert(0, str(ROOT / "bench"))
        import bench_aio

        from equeue import aio
        from equeue.consumer import AsyncConsumer
        from equeue.producer import AsyncProducer

        if front == "trio":
            p1, p1_cpu = measure(lambda: trio.run(bench_aio.p1, AsyncProducer, addr, p1t, n), n)
            c1, c1_cpu = measure(lambda: trio.run(bench_aio.c1, AsyncConsumer, addr, p1t, "c1", n), n)
            text, l1_cpu = measure(lambda: trio.run(bench_aio.l1_trio, addr, l1t, rate, seconds, f"g-{tag}"), nl)
        else:
            p1, p1_cpu = measure(lambda: asyncio.run(bench_aio.p1(aio.AsyncProducer, addr, p1t, n)), n)
            c1, c1_cpu = measure(lambda: asyncio.run(bench_aio.c1(aio.AsyncConsumer, addr, p1t, "c1", n)), n)
            text, l1_cpu = measure(lambda: asyncio.run(bench_aio.l1_aio(addr, l1t, rate, seconds, f"g-{tag}")), nl)
        p50, p99 = (float(x) for x in re.findall(r"p\d+ ([\d.]+) ms", text))
    return dict(p1=p1, p1_cpu=p1_cpu, c1=c1, c1_cpu=c1_cpu, p50=p50, p99=p99, l1_cpu=l1_cpu)


# ---------------------------------------------------------------- the run
def table(results: dict[str, list[dict[str, float]]], fronts: list[str]) -> str:
    def cell(front: str, fmt: Callable[[dict[str, float]], str]) -> str:
        return " / ".join(fmt(r) for r in results[front])

    rows = [
        ("P1 streaming produce, msg/s", lambda r: f"{r['p1']:,.0f}"),
        ("P1 client CPU, µs/msg", lambda r: f"{r['p1_cpu']:.2f}"),
        ("C1 drain backlog, msg/s", lambda r: f"{r['c1']:,.0f}"),
        ("C1 client CPU, µs/msg", lambda r: f"{r['c1_cpu']:.2f}"),
        ("L1 p50, ms", lambda r: f"{r['p50']:.2f}"),
        ("L1 p99, ms", lambda r: f"{r['p99']:.2f}"),
        ("L1 client CPU, µs/msg", lambda r: f"{r['l1_cpu']:.0f}"),
    ]
    out = ["| workload | " + " | ".join(fronts) + " |", "| --- |" + " --- |" * len(fronts)]
    for name, fmt in rows:
        out.append(f"| {name} | " + " | ".join(cell(f, fmt) for f in fronts) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--fronts", default=",".join(FRONTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.address, a.tag, a.messages, a.rate, a.seconds)))
        return
    from equeue.broker.process import BrokerProcess
    from equeue.client import Client

    fronts = a.fronts.split(",")
    results: dict[str, list[dict[str, float]]] = {f: [] for f in fronts}
    with BrokerProcess(None, "--flush", "async") as b, Client(b.address) as admin:
        for run in range(1, a.runs + 1):
            for front in fronts:
                tag = f"r{run}-{front}"
                for t in (f"p1-{tag}", f"l1-{tag}"):
                    admin.create_topic(t, QUEUES)
                cmd = [sys.executable, __file__, "--child", front, "--address", b.address, "--tag", tag,
                       "--messages", str(a.messages), "--rate", str(a.rate), "--seconds", str(a.seconds)]  # fmt: skip
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if out.returncode:
                    sys.exit(f"{front} failed:\n{out.stderr}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results[front].append(r)
                print(f"run {run} {front:14}: P1 {r['p1']:,.0f} msg/s ({r['p1_cpu']:.2f} µs), "
                      f"C1 {r['c1']:,.0f} msg/s ({r['c1_cpu']:.2f} µs), "
                      f"L1 p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms", flush=True)  # fmt: skip
    print()
    print(table(results, fronts))


if __name__ == "__main__":
    main()
