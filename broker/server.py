"""The broker: a trio TCP server over the LMDB store.

One task pair per connection: a reader that decodes frames and starts one handler
task per request (so a parked pull never blocks a heartbeat on the same
connection), and a writer fed by a channel that coalesces queued responses into
one ``send_all``. Background tasks (appender, member expiry, scheduler,
retention, async flush) live in the broker's nursery.

Lifetime: ``await broker.serve(task_status=...)`` runs until :meth:`Broker.stop`
(graceful: stop accepting, answer parked pulls, finish in-flight commits, close
LMDB) or until cancelled (in-flight commits still finish and are answered).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from broker.appender import Appender
from broker.groups import GroupRegistry
from broker.handlers import Handlers
from broker.http import serve_http
from broker.lifecycle import Lifecycle, subscribed_groups
from broker.longpoll import ParkedPulls
from broker.storage import Store, WriteOutcome
from equeue import __version__, control
from equeue.codec import (
    HEADER,
    KIND_PUSH,
    KIND_RESPONSE,
    MAGIC,
    NEED_DATA,
    PROTOCOL_VERSION,
    Connection,
    Hello,
    HelloAck,
    Request,
    Role,
)
from equeue.config import BrokerConfig
from equeue.errors import EQueueError, ErrorCode, ProtocolError, RemoteProtocolError
from equeue.protocol import PushCode, RequestCode

log = logging.getLogger("equeue.broker")

__all__ = ["Broker", "BrokerConfig"]

_RECV = 256 * 1024
_HANDSHAKE_REFUSAL = struct.Struct(">4sHH")


@attrs.define
class Counters:
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    connections: int = 0
    last_rate_t: float = 0.0
    last_in: int = 0
    last_out: int = 0
    produce_rate: float = 0.0
    pull_rate: float = 0.0


def frame(kind: int, code: int, request_id: int, parts: list[bytes]) -> list[bytes]:
    """Frame pieces of a response/push payload (see equeue.codec for the layout)."""
    size = sum(map(len, parts))
    return [HEADER.pack(7 + size, kind, code, request_id), *parts]


class Broker:
    """An equeue broker. Use ``async with Broker(cfg) as b`` or ``await b.serve()``."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.store: Store = None  # type: ignore[assignment]  # opened in serve()
        self.parked = ParkedPulls()
        self.groups = GroupRegistry(config.member_expiry)
        self.appender: Appender = None  # type: ignore[assignment]
        self.handlers = Handlers(self)
        self.stats = Counters()
        self.closing = False
        self.port: int = 0
        #: bound port of the /metrics + /stats endpoint (0 = off)
        self.http_port: int = 0
        #: the loop's token (set in serve); the writer thread posts callbacks with it
        self.token: trio.lowlevel.TrioToken = None  # type: ignore[assignment]
        self._stop = trio.Event()
        self._started = time.monotonic()
        self._inflight = 0
        self._no_inflight = trio.Event()
        self._conns: set[_ServerConnection] = set()
        self._no_conns = trio.Event()
        #: connections holding answers of the transaction being answered
        self._staged: list[_ServerConnection] = []

    # ------------------------------------------------------------------ lifetime
    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, listen, serve until :meth:`stop`; ``task_status.started(port)``."""
        cfg = self.config
        self.token = trio.lowlevel.current_trio_token()
        self.store = await trio.to_thread.run_sync(
            lambda: Store(cfg.data_dir, map_size=cfg.map_size, sync=cfg.flush == "sync")
        )
        self.appender = Appender(
            self.store, on_commit=self._on_commit, on_answered=self._flush_staged, on_written=self._on_written
        )
        lifecycle = self.lifecycle = Lifecycle(
            self.store, self.appender.submit, cfg, functools.partial(subscribed_groups, self.groups)
        )
        try:
            async with trio.open_nursery() as core:
                core.start_soon(self.appender.run)
                async with trio.open_nursery() as tasks:
                    listeners = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
                    self.port = listeners[0].socket.getsockname()[1]
                    serve_scope = trio.CancelScope()

                    async def accept() -> None:
                        with serve_scope:
                            await trio.serve_listeners(self._connection, listeners, handler_nursery=tasks)

                    tasks.start_soon(accept)
                    tasks.start_soon(self.groups.run_expiry)
                    tasks.start_soon(lifecycle.run)
                    if cfg.flush == "async":
                        tasks.start_soon(self._flusher)
                    if cfg.http_port:
                        self.http_port = await tasks.start(serve_http, self, cfg.host, cfg.http_port)
                    log.info(
                        "broker listening on %s:%d (data %s, flush %s)", cfg.host, self.port, cfg.data_dir, cfg.flush
                    )
                    task_status.started(self.port)
                    await self._stop.wait()
                    # graceful shutdown
                    serve_scope.cancel()
                    self.closing = True
                    self.parked.close()
                    with trio.move_on_after(cfg.shutdown_grace):
                        while self._inflight:
                            self._no_inflight = trio.Event()
                            await self._no_inflight.wait()
                        # every answer is queued: stop reading, let writers flush, close
                        for conn in list(self._conns):
                            conn.shutdown()
                        while self._conns:
                            self._no_conns = trio.Event()
                            await self._no_conns.wait()
                    tasks.cancel_scope.cancel()
                self.appender.close()
        finally:
            self.closing = True
            await trio.to_thread.run_sync(self.store.close)
            log.info("broker stopped")

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from the trio thread)."""
        self._stop.set()

    async def __aenter__(self) -> Broker:
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        try:
            await nursery.start(self.serve)
        except BaseException:
            await self._nursery_cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> bool | None:
        self.stop()
        return await self._nursery_cm.__aexit__(*exc)  # type: ignore[arg-type]

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    # ------------------------------------------------------------------ internals
    def _flush_staged(self) -> None:
        """The appender answered a transaction: write the staged answers, one write
        per connection."""
        staged, self._staged = self._staged, []
        for conn in staged:
            conn.flush_staged()

    def _on_written(self, outcome: WriteOutcome) -> None:
        # writer thread: parked pulls on the queues just written answer from here
        if outcome.touched:
            self.parked.answer(outcome.touched)

    def _on_commit(self, outcome: WriteOutcome) -> None:
        if outcome.touched:
            self.parked.wake(outcome.touched)  # pulls parked since the commit
        if outcome.scheduled:
            self.lifecycle.schedule_changed()

    async def _flusher(self) -> None:
        """``async`` flush policy: fsync committed data every ``flush_interval``."""
        while True:
            await trio.sleep(self.config.flush_interval)
            await trio.to_thread.run_sync(self.store.sync)

    def statistics(self) -> control.BrokerStats:
        s = self.stats
        now = time.monotonic()
        if now - s.last_rate_t >= 1.0:
            dt = now - s.last_rate_t if s.last_rate_t else now - self._started
            s.produce_rate = (s.messages_in - s.last_in) / max(dt, 1e-9)
            s.pull_rate = (s.messages_out - s.last_out) / max(dt, 1e-9)
            s.last_rate_t, s.last_in, s.last_out = now, s.messages_in, s.messages_out
        return control.BrokerStats(
            version=__version__,
            uptime_s=now - self._started,
            connections=s.connections,
            topics=len(self.store.topics),
            messages_in=s.messages_in,
            messages_out=s.messages_out,
            bytes_in=s.bytes_in,
            bytes_out=s.bytes_out,
            produce_rate=s.produce_rate,
            pull_rate=s.pull_rate,
            parked_pulls=self.parked.parked,
            next_global_offset=self.store.next_global,
            store_bytes=self.store.store_bytes(),
            map_size=self.store.map_size,
            flush=self.config.flush,
            transactions=self.appender.transactions,
            pending_delayed=sum(self.store.sched_pending.values()),
        )

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.stats.connections += 1
        conn = _ServerConnection(self, stream)
        self._conns.add(conn)
        try:
            await conn.run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # a peer reset (e.g. a SIGKILLed client) arrives wrapped in the nurseries' group
        finally:
            self._conns.discard(conn)
            if not self._conns:
                self._no_conns.set()
            self.stats.connections -= 1
            self.groups.forget_connection(conn.notify_group)
            await trio.aclose_forcefully(stream)

    def _enter(self) -> None:
        self._inflight += 1

    def _exit(self) -> None:
        self._inflight -= 1
        if not self._inflight:
            self._no_inflight.set()


class _ServerConnection:
    def __init__(self, broker: Broker, stream: trio.SocketStream) -> None:
        self.b = broker
        self.stream = stream
        self.codec = Connection(Role.SERVER, max_frame=broker.config.max_frame)
        self.send_ch, self.recv_ch = trio.open_memory_channel[list[bytes]](math.inf)
        self.peer = _peer(stream)
        self._reader_scope = trio.CancelScope()
        #: the writer task has frames to send (or is sending): write through it
        self._busy = False
        #: no more direct writes (closing, or a write failed: the writer drains)
        self._no_direct = False
        #: guards the output state above against the appender's writer thread, which
        #: writes answers to parked pulls (see answer_from_thread)
        self._out_lock = threading.Lock()
        #: the tail of a frame the writer thread could only partly write: it goes
        #: out before anything else (see _enqueue)
        self._rest: bytes | None = None
        #: answers of the transaction being answered, written once it is (see _stage)
        self._staged: list[bytes] = []

    def shutdown(self) -> None:
        """Graceful close: stop reading requests; queued answers are still sent."""
        self._reader_scope.cancel()

    def notify_group(self, group: str) -> None:
        payload = control.encode({"group": group})
        self._send(frame(KIND_PUSH, PushCode.GROUP_CHANGED, 0, [payload]))

    # ------------------------------------------------------------------ output
    # Frames leave in one of two ways. While the writer task is idle (nothing
    # queued, not sending) an answer is written at once, from the synchronous code
    # that produced it, with one non-blocking write to the socket: no wake-up of the
    # writer task, one loop iteration less per request. Otherwise -- or for what a
    # full socket buffer did not take -- it is queued for the writer task, which
    # coalesces everything queued into one ``send_all``. ``_busy`` keeps the two
    # from interleaving bytes: it is set before anything is queued and cleared by
    # the writer only once the queue is empty and its last write finished.

    def _send(self, parts: list[bytes]) -> None:
        """Send one frame (its pieces): now if the writer is idle, else via the writer."""
        with self._out_lock:
            if not self._busy and not self._no_direct:
                self._write_direct(b"".join(parts))
            else:
                self._enqueue(parts)

    def idle(self) -> bool:
        """Whether a direct write would be taken now (a hint when read off the loop)."""
        return not self._busy and not self._no_direct

    def answer_from_thread(self, request_id: int, parts: list[bytes]) -> int:
        """Writer thread: write the OK answer to request ``request_id`` now, if the
        writer task is idle. Returns the frame's size when the answer is written (or
        its tail handed to the writer task, first in line) or lost with a dead peer;
        0 when nothing was written (the caller answers through the loop instead).
        The caller counts the bytes (``stats`` belong to the loop thread)."""
        data = b"".join(frame(KIND_RESPONSE, ErrorCode.OK, request_id, parts))
        with self._out_lock:
            if self._busy or self._no_direct:
                return 0
            sent = self._os_write(data)
            if sent < 0:
                return len(data)  # lost with the peer
            if sent == 0:
                return 0
            if sent < len(data):
                self._busy = True
                self._rest = data[sent:]
                self.b.token.run_sync_soon(self._push_rest)
            return len(data)

    def _push_rest(self) -> None:
        with self._out_lock:
            self._enqueue([])

    def _stage(self, parts: list[bytes]) -> None:
        """Hold an answer until the appender finished answering its transaction
        (then :meth:`flush_staged` writes all of them at once)."""
        if not self._staged:
            self.b._staged.append(self)
        self._staged += parts

    def flush_staged(self) -> None:
        """Write the staged answers (one write when the writer is idle)."""
        staged, self._staged = self._staged, []
        if staged:
            self._send(staged)

    def _os_write(self, data: bytes) -> int:
        """One non-blocking write (``_out_lock`` held): the bytes the socket took, 0
        when it took none (full, or closed), -1 when the peer is gone (then no more
        direct writes: the reader sees the loss, the writer task fails quietly)."""
        fd = self.stream.socket.fileno()
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)  # the socket is non-blocking (trio's)
        except BlockingIOError:
            return 0
        except OSError:
            self._no_direct = True
            return -1

    def _write_direct(self, data: bytes) -> None:
        """One non-blocking write; the rest goes to the writer task (``_out_lock`` held)."""
        sent = max(self._os_write(data), 0)
        self.b.stats.bytes_out += sent
        if sent < len(data):
            self._enqueue([data[sent:]] if sent else [data])

    def _enqueue(self, parts: list[bytes]) -> None:
        """Queue pieces for the writer task, behind a partly written frame's tail
        (``_out_lock`` held, or no writer thread involved yet)."""
        rest, self._rest = self._rest, None
        if rest is not None:
            parts = [rest, *parts]
        if not parts:
            return
        self._busy = True
        try:
            self.send_ch.send_nowait(parts)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def run(self) -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(self._writer)
            try:
                async with trio.open_nursery() as handlers:
                    with self._reader_scope:
                        await self._reader(handlers)
                    # peer gone or protocol error: abandon requests still running
                    handlers.cancel_scope.cancel()
            finally:
                # the writer sends what is queued (e.g. a protocol error), then ends
                self.flush_staged()
                with self._out_lock:
                    self._no_direct = True
                    self._enqueue([])  # a partly written frame's tail, if any
                self.send_ch.close()

    async def _writer(self) -> None:
        recv = self.recv_ch
        try:
            async for parts in recv:
                buf = parts
                while buf:
                    while True:
                        try:
                            buf = buf + recv.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    data = b"".join(buf)
                    buf = []
                    self.b.stats.bytes_out += len(data)
                    await self.stream.send_all(data)
                    # frames queued during the write: send them before going idle
                    try:
                        buf = recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with self._out_lock:
                    self._busy = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # the peer went away; drain silently so handlers never block
            with self._out_lock:
                self._no_direct = True
            async for _ in recv:
                pass
        finally:
            # ended (or cancelled while idle): no direct write may start a frame now
            # that nobody would finish
            with self._out_lock:
                self._no_direct = True

    async def _reader(self, nursery: trio.Nursery) -> None:
        codec = self.codec
        stream = self.stream
        cfg = self.b.config
        with trio.move_on_after(cfg.handshake_timeout) as hs:
            while not codec.handshake_done:
                data = await stream.receive_some(_RECV)
                codec.receive_data(data)
                try:
                    ev = codec.next_event()
                except RemoteProtocolError as exc:
                    await self._fatal(exc)
                    return
                if isinstance(ev, Hello):
                    code = ErrorCode.OK if ev.version == PROTOCOL_VERSION else ErrorCode.UNSUPPORTED_VERSION
                    with self._out_lock:
                        self._enqueue([codec.send(HelloAck(PROTOCOL_VERSION, code))])
                    if code != ErrorCode.OK:
                        log.info("client %s: unsupported protocol version %d", self.peer, ev.version)
                        return
                elif not data:
                    return
        if hs.cancelled_caught:
            log.info("client %s: no handshake within %.0f s; closing", self.peer, cfg.handshake_timeout)
            return
        while True:
            while True:
                try:
                    ev = codec.next_event()
                except RemoteProtocolError as exc:
                    await self._fatal(exc)
                    return
                if ev is NEED_DATA:
                    break
                if isinstance(ev, Request):
                    prepared: Any = None
                    if ev.code == RequestCode.PRODUCE:
                        # enqueue now: a connection's produces commit in arrival order
                        try:
                            prepared = self.b.handlers.produce_prepare(ev.payload)
                        except Exception as exc:
                            prepared = exc
                        else:
                            if prepared is not None:
                                # answered straight from the commit callback: no task
                                self.b._enter()
                                prepared.callback = functools.partial(
                                    self._produce_done, ev.request_id, len(ev.payload)
                                )
                                continue
                    nursery.start_soon(self._handle, ev, prepared)
            if codec.peer_closed:
                return
            data = await stream.receive_some(_RECV)
            codec.receive_data(data)
            if not data:
                try:
                    codec.next_event()
                except RemoteProtocolError as exc:  # a frame cut short by the peer's EOF
                    await self._fatal(exc)
                return

    async def _fatal(self, exc: ProtocolError) -> None:
        """Report a protocol violation to the peer, then close.

        Before the handshake the answer is handshake-shaped (magic, version, error
        code), which is all a client expects to read then; afterwards it is a response
        frame with request id 0 and the error text.
        """
        log.info("client %s: protocol error (%s): %s; closing", self.peer, exc.code.name, exc)
        with self._out_lock:
            if self.codec.handshake_done:
                self._enqueue(frame(KIND_RESPONSE, exc.code, 0, [str(exc).encode()]))
            else:
                self._enqueue([_HANDSHAKE_REFUSAL.pack(MAGIC, PROTOCOL_VERSION, exc.code)])

    async def _handle(self, req: Request, prepared: Any = None) -> None:
        self.b._enter()
        try:
            try:
                if isinstance(prepared, Exception):
                    raise prepared
                if req.code == RequestCode.PULL:
                    # a parked pull may be answered by the writer thread (then None)
                    answer = await self.b.handlers.pull(req.payload, self, req.request_id)
                    if answer is None:
                        return
                    parts = answer
                else:
                    parts = await self.b.handlers.dispatch(req.code, req.payload, self)
                code: int = ErrorCode.OK
            except Exception as exc:
                code, parts = self._error_answer(exc, req.request_id, req.code)
            self._respond(code, req.request_id, parts)
        finally:
            self.b._exit()

    def _produce_done(self, request_id: int, nbytes: int, pending: Any) -> None:
        """A prepared produce was answered by the appender (loop thread, no task):
        the same answer as ``Handlers.produce_finish``, staged for the writer."""
        try:
            result = pending.result
            try:
                if isinstance(result, BaseException):
                    raise result
                parts = self.b.handlers.produce_answer(result, nbytes)
                code: int = ErrorCode.OK
            except Exception as exc:
                code, parts = self._error_answer(exc, request_id, RequestCode.PRODUCE)
            self._stage(frame(KIND_RESPONSE, code, request_id, parts))
        finally:
            self.b._exit()

    @staticmethod
    def _error_answer(exc: Exception, request_id: int, req_code: int) -> tuple[int, list[bytes]]:
        if isinstance(exc, EQueueError):
            code = getattr(exc, "code", ErrorCode.INTERNAL_ERROR)
            if code == ErrorCode.PROTOCOL_ERROR:
                code = ErrorCode.BAD_REQUEST  # a malformed payload: the framing is fine
            return code, [str(exc).encode()]
        # a bug: answer, log, keep serving
        log.error("request %d (code %d) failed", request_id, req_code, exc_info=exc)
        return ErrorCode.INTERNAL_ERROR, [f"internal error: {exc!r}".encode()]

    def _respond(self, code: int, request_id: int, parts: list[bytes]) -> None:
        self._send(frame(KIND_RESPONSE, code, request_id, parts))


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


@asynccontextmanager
async def open_broker(config: BrokerConfig) -> AsyncIterator[Broker]:
    """``async with open_broker(cfg) as broker:`` -- serve for the block's duration."""
    broker = Broker(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve)
        try:
            yield broker
        finally:
            broker.stop()
