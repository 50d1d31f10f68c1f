"""One client connection: the handshake, the reader, one handler task per request.

The reader decodes frames with the sans-I/O codec and starts one handler task per
request, so a parked pull never blocks a heartbeat on the same connection. A
produce is fed to the connection's produce pipeline
(:class:`equeue.broker.handlers.produce.ProducePipeline`) by the reader itself (no
task, no checkpoint) so one connection's produces commit in arrival order; the
pipeline defers them, commits them, and stages each answer from the appender's
commit callback. The reader takes requests in one synchronous step
(:meth:`ServerConnection._take`: no ``await`` can hide in it) and commits the
pipeline at its one point after that step, before any wait: the produces of one
received chunk form one transaction and none is left deferred while the reader
waits. A produce to a topic that must be auto-created (or, in a cluster, learned from
etcd) first holds the reader until it is queued, so the produces behind it keep that
order too. Answers leave through the connection's
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

import logging
import math
import time
from typing import Any

import attrs
import trio

from equeue import control
from equeue.broker.handlers import Handlers
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.produce import ProducePipeline
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
_PULL, _TASK = 0, 1
#: why the reader stopped taking requests (ServerConnection._take): the received data
#: is used up; FAIR_BATCH requests taken; the output is above its soft limit; too many
#: requests in progress; a produce's topic must be created first; a protocol error
_CHUNK_DONE, _YIELD, _BACKPRESSURE, _FULL, _MISSING, _FATAL = range(6)
#: request codes as plain ints: no enum lookup per request
_PRODUCE_CODE, _PULL_CODE = int(RequestCode.PRODUCE), int(RequestCode.PULL)
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
        #: fed to the pipeline (answered from the appender's commit callback)
        self._pulls = 0
        self._requests = 0
        self._producing = 0
        #: requests taken from the chunk being read (the fairness count of _take)
        self._got = 0
        #: what _take stopped on: (request, decoded produce) for _MISSING, the
        #: protocol error for _FATAL
        self._stalled: Any = None
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
        """A request handled by a task was answered (``kind``: _PULL or _TASK)."""
        if kind == _PULL:
            self._pulls -= 1
        else:
            self._requests -= 1
        self._slots.signal()
        if not self._pulls and not self._requests and not self._producing:
            self._idle()

    def _produce_answered(self) -> None:
        """The pipeline staged a produce's answer (loop thread, no task). The broker's
        in-flight count holds one entry while any produce of this connection is out."""
        self._producing -= 1
        if not self._producing:
            self._inflight.exit()
        self._slots.signal()
        if not self._pulls and not self._requests and not self._producing:
            self._idle()

    def _idle(self) -> None:
        """Nothing is in flight any more: the idle clock starts."""
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
        principal = None if self.session is None else self.session.principal
        try:
            # leaving the block commits what the pipeline deferred, however it is left
            with self._produce.pipeline(principal, self.output.stage, self._produce_answered, _error_answer) as pipe:
                await self._serve_frames(nursery, pipe)
        finally:
            if self._reserved:
                self._frames.release(self._reserved)
                self._reserved = 0

    async def _serve_frames(self, nursery: trio.Nursery, pipeline: ProducePipeline) -> None:
        codec, stream, output = self._codec, self._stream, self.output
        limits, frames, slots = self._limits, self._frames, self._slots
        PULL_SLOTS.set(slots)  # inherited by the handler tasks
        #: when the frame being received must be whole (inf: none partly received)
        frame_deadline = math.inf
        self._idle_since = trio.current_time()
        while True:
            self._got = 0
            while True:
                why = self._take(nursery, pipeline)
                # the reader's one point between taking requests and waiting: the
                # produces fed since the last one are committed (one transaction per
                # received chunk, inline when small); every await below follows it
                pipeline.commit()
                if why == _CHUNK_DONE:
                    break
                if why == _YIELD:
                    await trio.lowlevel.checkpoint()  # a burst of requests: let others run
                elif why == _BACKPRESSURE:
                    await output.wait_below_soft()  # backpressure: the peer reads first
                elif why == _FULL:
                    await slots.wait_changed()  # one finished, or a pull parked
                elif why == _MISSING:
                    await self._feed_missing(nursery, pipeline)
                else:
                    await self._fatal(self._stalled)
                    return
            if codec.peer_closed:
                return
            now = trio.current_time()
            if self._got:  # a frame arrived whole: its reservation and deadline end
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
            # the produce latency's start: one clock read per received chunk
            pipeline.arrived = time.perf_counter()
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

    def _take(self, nursery: trio.Nursery, pipeline: ProducePipeline) -> int:
        """Take the whole requests buffered: start a task for each (a pull, or any
        request but a produce), or feed a produce to ``pipeline``; until the received
        data is used up (_CHUNK_DONE) or the reader must wait first (why: _YIELD after
        each FAIR_BATCH requests, _BACKPRESSURE, _FULL, _MISSING or _FATAL with
        ``_stalled``). Synchronous on purpose: no ``await`` can come between feeding
        the pipeline and the reader's commit of it."""
        codec, output, slots = self._codec, self.output, self._slots
        got = self._got
        try:
            while True:
                if output.over_soft_since is not None:
                    return _BACKPRESSURE
                if self._requests + self._pulls + self._producing - slots.parked >= MAX_REQUESTS_IN_PROGRESS:
                    return _FULL
                try:
                    ev = codec.next_event()
                except RemoteProtocolError as exc:
                    self._stalled = exc
                    return _FATAL
                if ev is NEED_DATA:
                    return _CHUNK_DONE
                got += 1
                if isinstance(ev, Request):
                    code = ev.code
                    if code == _PRODUCE_CODE:  # queued now: a connection's produces commit in arrival order
                        try:
                            missing = pipeline.feed(ev.request_id, ev.payload)
                        except Exception as exc:
                            self._requests += 1
                            nursery.start_soon(self._handle, ev, exc, _TASK)
                        else:
                            if missing is not None:
                                # the topic must be created or learned first: the reader
                                # waits for it (reading nothing more of this connection, as
                                # Kafka does), so a later produce cannot be queued before it
                                self._stalled = (ev, missing)
                                return _MISSING
                            if not self._producing:
                                self._inflight.enter()
                            self._producing += 1
                    elif code == _PULL_CODE:  # its handler task parks it (or not)
                        self._pulls += 1
                        nursery.start_soon(self._handle, ev, None, _PULL)
                    else:
                        self._requests += 1
                        nursery.start_soon(self._handle, ev, None, _TASK)
                if not got % FAIR_BATCH:
                    return _YIELD  # a burst of requests: the reader lets others run
        finally:
            self._got = got

    async def _feed_missing(self, nursery: trio.Nursery, pipeline: ProducePipeline) -> None:
        """A produce whose topic must be created or learned first (``_stalled``): the
        reader waits until it is queued; its error is answered by a task."""
        ev, req = self._stalled
        self._stalled = None
        try:
            await pipeline.feed_missing(ev.request_id, ev.payload, req)
        except Exception as exc:
            self._requests += 1
            nursery.start_soon(self._handle, ev, exc, _TASK)
        else:
            if not self._producing:
                self._inflight.enter()
            self._producing += 1

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

    async def _handle(self, req: Request, prepared: Exception | None = None, kind: int = _TASK) -> None:
        self._inflight.enter()
        try:
            try:
                if prepared is not None:  # the reader's produce failed: answer its error
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
