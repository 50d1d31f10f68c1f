"""One client connection: the handshake, the reader, one handler task per request.

The reader decodes frames with the sans-I/O codec and starts one handler task per
request, so a parked pull never blocks a heartbeat on the same connection. A
produce is enqueued for the appender by the reader itself (no task, no checkpoint)
so one connection's produces commit in arrival order; its answer is staged from the
appender's commit callback. A produce to a topic that must be auto-created (or, in a
cluster, learned from etcd) first holds the reader until it is enqueued, so the
produces behind it keep that order too. Answers leave through the connection's
:class:`~equeue.broker.output.Output`; every frame is built by :mod:`equeue.codec`.
A produce's latency (``Counters.produce_latency``) runs from its chunk's arrival (one
clock read per chunk received) to its answer staged by the commit callback.

Limits (:class:`ConnectionLimits`, docs/operations.md "Limits"): the reader stops
reading while the output is above its soft limit, or while
:data:`MAX_REQUESTS_IN_PROGRESS` requests are being handled; at most
``max_pulls`` pulls are parked (:class:`equeue.broker.longpoll.PullSlots`; one more is
answered at once with TOO_MANY_PULLS); a frame must arrive
whole within ``frame_timeout``, and one larger than :data:`FREE_PARTIAL_FRAME`
reserves its size in the broker-wide :class:`FrameBudget` before more of it is
read; a connection with no request and none in flight for ``idle_timeout`` is
closed; a guard task closes it when the output stays above the soft limit longer
than ``output_grace`` or goes above the hard limit.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any

import attrs
import trio

from equeue import control
from equeue.broker.handlers import Handlers
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handshake import Session, serve_handshake
from equeue.broker.longpoll import PULL_SLOTS, PullSlots
from equeue.broker.output import Output
from equeue.broker.stats import Counters
from equeue.codec import (
    NEED_DATA,
    Connection,
    Request,
    Role,
    encode_handshake_answer,
    encode_push,
    encode_response,
)
from equeue.errors import EQueueError, ErrorCode, ProtocolError, RemoteProtocolError
from equeue.logs import RateLimitedLog
from equeue.protocol import PushCode, RequestCode

log = logging.getLogger("equeue.broker")

__all__ = [
    "FAIR_BATCH",
    "FREE_PARTIAL_FRAME",
    "MAX_REQUESTS_IN_PROGRESS",
    "ConnectionLimits",
    "FrameBudget",
    "Inflight",
    "ServerConnection",
]

_RECV = 256 * 1024

#: a partly received frame up to this size needs no reservation in the FrameBudget
#: (a request split across segments never waits on other connections' frames)
FREE_PARTIAL_FRAME = 64 * 1024
#: requests of one connection being handled at once, produces waiting for their
#: commit included (parked pulls aside): past it the reader waits for one to finish or
#: park (backpressure, nothing is refused), so a client that pipelines produces
#: faster than the store commits them cannot grow the appender's queue
MAX_REQUESTS_IN_PROGRESS = 128
#: what a finished request was (ServerConnection._done)
_PULL, _TASK, _PRODUCE = 0, 1, 2
#: the reader yields to other tasks after this many requests of one received chunk,
#: so a burst of small requests on one connection does not hold the loop
FAIR_BATCH = 64


@attrs.frozen
class ConnectionLimits:
    """The per-connection limits (from BrokerConfig), in seconds and counts."""

    frame_timeout: float = math.inf
    idle_timeout: float = math.inf
    output_grace: float = math.inf
    max_pulls: int = 1 << 30


class FrameBudget:
    """Bytes reserved, broker-wide, for frames still arriving (loop only).

    A connection that has the length prefix of a frame larger than
    :data:`FREE_PARTIAL_FRAME` reserves the frame's size before it reads more of
    it, and releases it once the frame is whole (or the connection ends). When the
    budget is spent it waits, unread, so the memory held in unfinished frames stays
    under ``limit`` plus :data:`FREE_PARTIAL_FRAME` per connection. A reservation
    is always granted in the end: unfinished frames are closed by the frame timeout.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0
        self._freed = trio.Event()

    async def reserve(self, n: int) -> None:
        """Wait until ``n`` bytes (at most the limit) fit, then take them."""
        n = min(n, self.limit)
        while self.reserved + n > self.limit:
            await self._freed.wait()
        self.reserved += n

    def release(self, n: int) -> None:
        """Give back a reservation of ``n`` bytes (as passed to :meth:`reserve`)."""
        self.reserved -= min(n, self.limit)
        self._freed.set()
        self._freed = trio.Event()


class Inflight:
    """Requests being answered, broker-wide: a graceful stop waits for none."""

    def __init__(self) -> None:
        self.count = 0
        self._none = trio.Event()

    def enter(self) -> None:
        self.count += 1

    def exit(self) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def wait_none(self) -> None:
        while self.count:
            self._none = trio.Event()
            await self._none.wait()


class ServerConnection:
    """Serve one connection until the peer leaves, a protocol error, or
    :meth:`shutdown`; :meth:`run` returns once every queued answer is handed to the
    writer task (its ``output``)."""

    def __init__(
        self, stream: trio.abc.Stream, output: Output, handlers: Handlers, inflight: Inflight, *,
        max_frame: int, handshake_timeout: float, counters: Counters,
        limits: ConnectionLimits = ConnectionLimits(), frames: FrameBudget | None = None,
    ) -> None:  # fmt: skip
        self._stream = stream
        self.output = output
        self._handlers = handlers
        self._produce = handlers.produce
        self._inflight = inflight
        self._codec = Connection(Role.SERVER, max_frame=max_frame)
        self._handshake_timeout = handshake_timeout
        self._counters = counters
        self._limits = limits
        self._frames = frames if frames is not None else FrameBudget(1 << 62)
        self.peer = _peer(stream)
        #: who is on this connection, once the handshake succeeded
        self.session: Session | None = None
        self._reader_scope = trio.CancelScope()
        #: the whole connection (reader, handlers, writer): cancelled to drop it
        self._scope = trio.CancelScope()
        #: pulls outstanding; other requests being handled by a task; produces
        #: enqueued for the appender (answered from its commit callback)
        self._pulls = 0
        self._requests = 0
        self._producing = 0
        #: trio time since which nothing is in flight (the idle clock; inf: busy)
        self._idle_since = math.inf
        #: this connection's parked pulls; signalled when a request finishes
        self._slots = PullSlots(limits.max_pulls)
        #: the receive's cancel scope, whose deadline the idle clock moves
        self._recv_scope: trio.CancelScope | None = None
        #: bytes of the FrameBudget held for the frame being received
        self._reserved = 0

    def shutdown(self) -> None:
        """Graceful close: stop reading requests; queued answers are still sent."""
        self._reader_scope.cancel()

    def notify_group(self, group: str) -> None:
        """Push GROUP_CHANGED (the group registry calls this)."""
        self.output.send(encode_push(PushCode.GROUP_CHANGED, control.encode({"group": group})))

    async def run(self) -> None:
        output = self.output
        with self._scope:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._write, outer.cancel_scope)
                outer.start_soon(self._guard)
                try:
                    async with trio.open_nursery() as handlers:
                        with self._reader_scope:
                            await self._reader(handlers)
                        # peer gone or protocol error: abandon requests still running
                        handlers.cancel_scope.cancel()
                finally:
                    # the writer sends what is queued (e.g. a protocol error), then ends
                    output.close()

    async def _write(self, outer: trio.CancelScope) -> None:
        await self.output.run_writer()
        outer.cancel()  # everything is sent: the guard ends too

    async def _guard(self) -> None:
        """Close the connection when its output goes above the hard limit, or stays
        above the soft limit longer than the grace period."""
        output, grace = self.output, self._limits.output_grace
        while not output.overflowed:
            since = output.over_soft_since
            with trio.move_on_at(math.inf if since is None else since + grace) as timer:
                await output.wait_changed()
            if timer.cancelled_caught:
                self._drop("output", "%d bytes of answers unread for %.0f s", output.queued, grace)
                return
        self._drop("output", "over %d bytes of answers unread", output.queued)

    def _drop(self, why: str, msg: str, *args: object) -> None:
        """Close the connection now (a limit was hit): its tasks are cancelled and
        whatever is queued for it is dropped. One log line per reason per 10 s."""
        self._counters.connections_dropped += 1
        _limit_logs.log(logging.WARNING, why, "client %s: " + msg + "; closing", self.peer, *args)
        self._scope.cancel()

    def _done(self, kind: int) -> None:
        """A request was answered (``kind``: _PULL, _TASK or _PRODUCE): when none is
        left in flight the idle clock starts."""
        if kind == _PULL:
            self._pulls -= 1
        elif kind == _TASK:
            self._requests -= 1
        else:
            self._producing -= 1
        self._slots.signal()
        if not self._pulls and not self._requests and not self._producing:
            self._idle_since = now = trio.current_time()
            if self._recv_scope is not None and not self._codec.buffered:
                self._recv_scope.deadline = now + self._limits.idle_timeout

    async def _reader(self, nursery: trio.Nursery) -> None:
        codec = self._codec
        stream = self._stream
        session = await serve_handshake(
            stream, codec, self.output, peer=self.peer, timeout=self._handshake_timeout,
            authenticator=self._handlers.authenticator, fatal=self._fatal,
        )  # fmt: skip
        if session is None:
            return
        self.session = session
        await self._serve(nursery)

    async def _serve(self, nursery: trio.Nursery) -> None:
        """After the handshake: read frames and start their handlers, within the
        connection's limits (see the module docstring)."""
        try:
            await self._serve_frames(nursery)
        finally:
            self._produce.kick()  # deferred produces are never left unwritten
            if self._reserved:
                self._frames.release(self._reserved)
                self._reserved = 0

    async def _serve_frames(self, nursery: trio.Nursery) -> None:
        codec, stream, output = self._codec, self._stream, self.output
        produce, inflight, limits, frames = self._produce, self._inflight, self._limits, self._frames
        slots = self._slots
        principal = None if self.session is None else self.session.principal
        PULL_SLOTS.set(slots)  # inherited by the handler tasks
        #: when the frame being received must be whole (inf: none partly received)
        frame_deadline = math.inf
        self._idle_since = trio.current_time()
        #: produces of this chunk were queued with ``defer``: kick before receiving more
        queued = False
        #: when the chunk being read arrived (perf_counter): the produce latency's start,
        #: one clock read per received chunk (Counters.produce_latency)
        arrived = time.perf_counter()
        while True:
            got = 0
            while True:
                # (every await below is preceded by a kick: no deferred produce waits)
                if got and not got % FAIR_BATCH:
                    produce.kick()
                    await trio.lowlevel.checkpoint()  # a burst of requests: let others run
                if output.over_soft_since is not None:
                    produce.kick()
                    await output.wait_below_soft()  # backpressure: the peer reads first
                while self._requests + self._pulls + self._producing - slots.parked >= MAX_REQUESTS_IN_PROGRESS:
                    produce.kick()
                    await slots.wait_changed()  # one finished, or a pull parked
                try:
                    ev = codec.next_event()
                except RemoteProtocolError as exc:
                    produce.kick()
                    await self._fatal(exc)
                    return
                if ev is NEED_DATA:
                    break
                got += 1
                if not isinstance(ev, Request):
                    continue
                if ev.code == RequestCode.PULL:  # its handler task parks it (or not)
                    self._pulls += 1
                    nursery.start_soon(self._handle, ev, None, _PULL)
                    continue
                prepared: Any = None
                if ev.code == RequestCode.PRODUCE:
                    # enqueue now: a connection's produces commit in arrival order
                    try:
                        prepared = produce.prepare(ev.payload, principal, defer=True)
                        if prepared is None:
                            # the topic must be created or learned first: the reader
                            # waits for it (reading nothing more of this connection, as
                            # Kafka does), so a later produce cannot be queued before it
                            produce.kick()
                            prepared = await produce.prepare_missing(ev.payload, principal, defer=True)
                    except Exception as exc:
                        prepared = exc
                    else:
                        queued = True
                        # answered straight from the commit callback: no task
                        self._producing += 1
                        inflight.enter()
                        prepared.callback = functools.partial(
                            self._produce_done, ev.request_id, len(ev.payload), arrived
                        )
                        continue
                self._requests += 1
                nursery.start_soon(self._handle, ev, prepared, _TASK)
            if queued:  # the chunk's produces: one transaction (inline when small)
                queued = False
                produce.kick()
            if codec.peer_closed:
                return
            now = trio.current_time()
            if got:  # a frame arrived whole: its reservation and deadline end
                self._idle_since = now
                frame_deadline = math.inf
                if self._reserved:
                    frames.release(self._reserved)
                    self._reserved = 0
            partial = codec.buffered
            if partial:
                size = codec.partial_frame_size
                if size > FREE_PARTIAL_FRAME and not self._reserved:
                    await frames.reserve(size)  # unread meanwhile: memory grows only as granted
                    self._reserved = size
                    frame_deadline = trio.current_time() + limits.frame_timeout
                elif frame_deadline == math.inf:
                    frame_deadline = now + limits.frame_timeout
                deadline = frame_deadline
            elif self._pulls or self._requests or self._producing:
                deadline = math.inf  # the idle clock starts when the last one is answered
            else:
                deadline = self._idle_since + limits.idle_timeout
            with trio.CancelScope(deadline=deadline) as scope:
                self._recv_scope = scope
                data = await stream.receive_some(_RECV)
            arrived = time.perf_counter()
            self._recv_scope = None
            if scope.cancelled_caught:
                self._counters.connections_dropped += 1
                if partial:
                    _limit_logs.log(
                        logging.INFO, "frame", "client %s: a frame (%d of %d bytes) not received whole in %.0f s; closing",
                        self.peer, codec.buffered, codec.partial_frame_size, limits.frame_timeout,
                    )  # fmt: skip
                else:
                    _limit_logs.log(
                        logging.INFO, "idle", "client %s: idle for %.0f s; closing", self.peer, limits.idle_timeout
                    )
                return
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
        if self._codec.handshake_done:
            self.output.queue(encode_response(exc.code, 0, [str(exc).encode()]))
        else:
            self.output.queue([encode_handshake_answer(exc.code)])

    async def _handle(self, req: Request, prepared: Any = None, kind: int = _TASK) -> None:
        self._inflight.enter()
        try:
            try:
                if isinstance(prepared, Exception):
                    raise prepared
                if self.output.over_soft_since is not None:
                    # requests read before the output went over: they wait too, so
                    # a burst cannot pile answers up to the hard limit
                    await self.output.wait_below_soft()
                ctx = RequestContext(req.request_id, self.notify_group, self.output, self.session)
                parts = await self._handlers.dispatch(req.code, req.payload, ctx)
                if parts is None:
                    return  # a parked pull the writer thread answered
                code: int = ErrorCode.OK
            except Exception as exc:
                code, parts = _error_answer(exc, req.request_id, req.code)
            self.output.send(encode_response(code, req.request_id, parts))
        finally:
            self._inflight.exit()
            self._done(kind)

    def _produce_done(self, request_id: int, nbytes: int, arrived: float, pending: Any) -> None:
        """A prepared produce was answered by the appender (loop thread, no task):
        the same answer as ``ProduceHandler.handle``, staged for the output; its
        latency since ``arrived`` (its chunk's arrival) goes to the histogram."""
        try:
            result = pending.result
            try:
                if isinstance(result, BaseException):
                    raise result
                parts = self._produce.answer(result, nbytes)
                code: int = ErrorCode.OK
            except Exception as exc:
                code, parts = _error_answer(exc, request_id, RequestCode.PRODUCE)
            self.output.stage(encode_response(code, request_id, parts))
            self._counters.produce_latency.observe(time.perf_counter() - arrived)
        finally:
            self._inflight.exit()
            self._done(_PRODUCE)


_internal_errors = RateLimitedLog(log, 10.0, time.monotonic)
#: connections closed by a limit: one line per reason per 10 s
_limit_logs = RateLimitedLog(log, 10.0, time.monotonic)


def _error_answer(exc: Exception, request_id: int, req_code: int) -> tuple[int, list[bytes]]:
    if isinstance(exc, EQueueError):
        code = getattr(exc, "code", ErrorCode.INTERNAL_ERROR)
        if code == ErrorCode.PROTOCOL_ERROR:
            code = ErrorCode.BAD_REQUEST  # a malformed payload: the framing is fine
        return code, [str(exc).encode()]
    # a bug: answer, log (a client can repeat the request: one traceback per request
    # code per 10 s, with a count of the ones left out), keep serving
    _internal_errors.log(
        logging.ERROR, f"code {req_code}", "request %d (code %d) failed", request_id, req_code, exc_info=exc
    )
    return ErrorCode.INTERNAL_ERROR, [f"internal error: {exc!r}".encode()]


def _peer(stream: trio.abc.Stream) -> str:
    if isinstance(stream, trio.SSLStream):  # TLS: the address is the transport's
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return "?"
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
