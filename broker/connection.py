"""One client connection: the handshake, the reader, one handler task per request.

The reader decodes frames with the sans-I/O codec and starts one handler task per
request, so a parked pull never blocks a heartbeat on the same connection. A
produce is enqueued for the appender by the reader itself (no task, no checkpoint)
so one connection's produces commit in arrival order; its answer is staged from the
appender's commit callback. Answers leave through the connection's
:class:`~broker.output.Output`; every frame is built by :mod:`equeue.codec`.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import trio

from broker.handlers import Handlers, RequestContext
from broker.handshake import Session, serve_handshake
from broker.output import Output
from equeue import control
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

__all__ = ["Inflight", "ServerConnection"]

_RECV = 256 * 1024


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
        max_frame: int, handshake_timeout: float,
    ) -> None:  # fmt: skip
        self._stream = stream
        self.output = output
        self._handlers = handlers
        self._produce = handlers.produce
        self._inflight = inflight
        self._codec = Connection(Role.SERVER, max_frame=max_frame)
        self._handshake_timeout = handshake_timeout
        self.peer = _peer(stream)
        #: who is on this connection, once the handshake succeeded
        self.session: Session | None = None
        self._reader_scope = trio.CancelScope()

    def shutdown(self) -> None:
        """Graceful close: stop reading requests; queued answers are still sent."""
        self._reader_scope.cancel()

    def notify_group(self, group: str) -> None:
        """Push GROUP_CHANGED (the group registry calls this)."""
        self.output.send(encode_push(PushCode.GROUP_CHANGED, control.encode({"group": group})))

    async def run(self) -> None:
        output = self.output
        async with trio.open_nursery() as outer:
            outer.start_soon(output.run_writer)
            try:
                async with trio.open_nursery() as handlers:
                    with self._reader_scope:
                        await self._reader(handlers)
                    # peer gone or protocol error: abandon requests still running
                    handlers.cancel_scope.cancel()
            finally:
                # the writer sends what is queued (e.g. a protocol error), then ends
                output.close()

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
        principal = session.principal
        produce = self._produce
        inflight = self._inflight
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
                            prepared = produce.prepare(ev.payload, principal)
                        except Exception as exc:
                            prepared = exc
                        else:
                            if prepared is not None:
                                # answered straight from the commit callback: no task
                                inflight.enter()
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
        if self._codec.handshake_done:
            self.output.queue(encode_response(exc.code, 0, [str(exc).encode()]))
        else:
            self.output.queue([encode_handshake_answer(exc.code)])

    async def _handle(self, req: Request, prepared: Any = None) -> None:
        self._inflight.enter()
        try:
            try:
                if isinstance(prepared, Exception):
                    raise prepared
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

    def _produce_done(self, request_id: int, nbytes: int, pending: Any) -> None:
        """A prepared produce was answered by the appender (loop thread, no task):
        the same answer as ``ProduceHandler.handle``, staged for the output."""
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
        finally:
            self._inflight.exit()


_internal_errors = RateLimitedLog(log, 10.0, time.monotonic)


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
