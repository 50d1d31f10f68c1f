"""The client's transport: one multiplexed connection to a broker of a list, without
typed requests.

:class:`Transport` owns the connection: it connects on demand (trying each configured
broker in turn; :meth:`Transport.retarget` and :meth:`Transport.drop_connection` move it
to another), drives the connect handshake (the sans-I/O
:class:`equeue.client.handshake.ClientHandshake`: Hello, HelloAck, SCRAM) over its
stream, runs the reader task that matches answers to requests by request id (so many
requests share the connection; a parked pull never blocks a heartbeat) and hands
pushes to ``on_push``, and writes frames: coalesced through an outbox under a send
lock (:meth:`Transport.send_request`), or straight to the socket with one
non-blocking write (:meth:`Transport.send_request_nowait`, between :meth:`Transport.cork`
and :meth:`Transport.uncork` collected into one write). It knows request codes and
payload bytes only; :class:`equeue.client.async_client.AsyncClient` is the typed API
over it. One live connection and its pending answers are a
:class:`equeue.client.link._Link`. Its lifetime is ``async with``: the reader task
lives in its nursery.

With ``security.tls`` set the connection is TLS (``trio.SSLStream``, the context
from :mod:`equeue.client.tls`); every write then goes through ``send_all`` (the
non-blocking direct write of :meth:`Transport.send_request_nowait` is for plain
TCP only, :meth:`Transport.can_send_now` says False).

Errors: :class:`~equeue.errors.ConnectionBroken` when the connection cannot be
made or dies (transient: callers may retry), :class:`~equeue.errors.TlsError` when
a TLS handshake fails over a certificate (not transient), an
:class:`~equeue.errors.AuthenticationError` from the handshake (not transient, not
retried on another broker), the mapped :class:`~equeue.errors.BrokerError` for
error answers (:meth:`Transport.answer`, :func:`equeue.errors.error_for_code`),
:class:`~equeue.errors.ClientClosed` after :meth:`Transport.aclose`.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack

import trio

from equeue.client.handshake import ClientHandshake
from equeue.client.lifetime import StackOwner
from equeue.client.link import PendingReply, _Link, _Slot, parse_brokers
from equeue.client.tls import client_context
from equeue.codec import DEFAULT_MAX_FRAME, NEED_DATA, Push, Response
from equeue.codec import Request as RequestEvent
from equeue.errors import (
    AuthenticationError,
    ClientClosed,
    ConnectionBroken,
    EQueueError,
    ErrorCode,
    TlsError,
    error_for_code,
)
from equeue.security import ClientSecurity

log = logging.getLogger("equeue.client")

__all__ = ["PendingReply", "PushHandler", "Transport"]

#: called in the loop with each push's code and payload
PushHandler = Callable[[int, bytes], None]


class Transport(StackOwner):
    """One multiplexed connection to one of ``brokers`` (the module doc): framing,
    request ids, reconnects; no typed request. ``connect_timeout`` bounds each
    connect (TCP, TLS and the handshake); ``max_frame`` caps the frames read.
    Raises ConfigError here for an empty broker list or unreadable TLS files."""

    def __init__(
        self,
        brokers: str | Sequence[str] = "127.0.0.1:5800",
        *,
        connect_timeout: float = 5.0,
        on_push: PushHandler | None = None,
        security: ClientSecurity | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.brokers = parse_brokers(brokers)
        #: the largest frame read from the broker (a broker's follower connection to
        #: its leader reads larger ones: equeue.wire.replica.REPLICA_MAX_FRAME)
        self.max_frame = max_frame
        #: TLS settings and credentials (None: from the ``EQUEUE_*`` environment)
        self.security = ClientSecurity.from_env() if security is None else security
        #: the TLS context (its files read now: ConfigError here, not at connect)
        self._ssl_context = client_context(self.security.tls) if self.security.tls is not None else None
        self.connect_timeout = connect_timeout
        self.on_push = on_push
        self._ids = itertools.count(1)
        self._link: _Link | None = None
        self._connect_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._closed = False
        #: :meth:`cork` depth; while above 0, :meth:`send_request_nowait` collects
        #: frames in ``_corked`` and :meth:`uncork` writes them with one write
        self._cork_depth = 0
        self._corked: list[bytes] = []
        self._next_broker = 0
        #: incremented on every new connection (consumers re-register after a reconnect)
        self.connection_epoch = 0

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        # on exit, close the connection (which cancels the reader) before the nursery
        # waits; should that raise (Cancelled in a cancelled task), the nursery still closes
        stack.push_async_callback(self.aclose)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with ClientClosed."""
        if self._closed:
            return
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            link.fail(ClientClosed("client closed"))
            await trio.aclose_forcefully(link.stream)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    @property
    def connected(self) -> bool:
        """A connection is open and not broken (the next request does not connect)."""
        return self._link is not None and self._link.broken is None

    def drop_connection(self, reason: str) -> None:
        """Close the current connection (loop thread): its pending requests fail at once
        with ConnectionBroken (transient: their callers retry), and the next request
        connects again, to the next broker of the list. For a broker that stopped being
        the one to ask (a group's old leader) or that does not answer (frozen)."""
        link, self._link = self._link, None
        if link is None:
            return
        link.fail(ConnectionBroken(f"connection to {link.address} dropped: {reason}"))
        self._next_broker += 1
        if self._nursery is not None:
            self._nursery.start_soon(trio.aclose_forcefully, link.stream)

    def retarget(self, brokers: str | Sequence[str]) -> None:
        """Use ``brokers`` from now on (a broker group's new leader, loop thread). A
        connection to a broker no longer listed is dropped (:meth:`drop_connection`);
        one to a broker still listed is kept. Raises ConfigError for an empty list."""
        new = parse_brokers(brokers)
        if new == self.brokers:
            return
        self.brokers = new
        self._next_broker = 0
        link = self._link
        if link is not None and link.address not in {f"{h}:{p}" for h, p in new}:
            self.drop_connection("the route names another broker")
            self._next_broker = 0

    # ------------------------------------------------------------------ connection
    async def _connect(self) -> _Link:
        if self._closed:
            raise ClientClosed("client closed")
        if self._nursery is None:
            raise ClientClosed("use the client inside 'async with'")
        link = self._link
        if link is not None and link.broken is None:
            return link
        async with self._connect_lock:
            link = self._link
            if link is not None and link.broken is None:
                return link
            errors = []
            tls_refused = False
            for _ in range(len(self.brokers)):
                host, port = self.brokers[self._next_broker % len(self.brokers)]
                try:
                    with trio.fail_after(self.connect_timeout):
                        link = await self._open(host, port)
                except AuthenticationError:
                    raise  # the same credentials fail the same way everywhere: no retry
                except (OSError, trio.TooSlowError, EQueueError) as exc:
                    errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                    tls_refused = tls_refused or isinstance(exc, TlsError)
                    self._next_broker += 1
                    continue
                self._link = link
                self.connection_epoch += 1
                self._nursery.start_soon(self._reader, link)
                return link
            # a certificate problem is not retried (TlsError is not transient)
            error = TlsError if tls_refused else ConnectionBroken
            raise error("cannot connect to any broker (" + "; ".join(errors) + ")")

    async def _open(self, host: str, port: int) -> _Link:
        """Connect (TLS when ``security.tls``) and drive the handshake
        (:class:`~equeue.client.handshake.ClientHandshake`). Raises TlsError for a
        certificate problem, AuthenticationError, ConnectionBroken or OSError otherwise."""
        raw = await trio.open_tcp_stream(host, port)
        stream: trio.abc.Stream = raw
        tls = self.security.tls
        address = f"{host}:{port}"
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl_context is not None and tls is not None:
                stream = trio.SSLStream(raw, self._ssl_context, server_hostname=tls.server_hostname or host)
            shake = ClientHandshake(address, self.security.credentials, tls=tls is not None, max_frame=self.max_frame)
            try:
                # with TLS the TLS handshake runs in the first send; with TLS 1.3 a
                # refused client certificate shows up in the first receive
                data = shake.start()
                while True:
                    if data:
                        await stream.send_all(data)
                    if shake.done:
                        return _Link(stream, address, shake.codec)
                    data = shake.receive_data(await stream.receive_some(65536))
            except trio.BrokenResourceError as exc:
                raise shake.io_error(exc) from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def _reader(self, link: _Link) -> None:
        codec = link.codec
        try:
            while True:
                while True:
                    ev = codec.next_event()
                    if ev is NEED_DATA:
                        break
                    if isinstance(ev, Response):
                        if ev.request_id == 0:
                            raise error_for_code(ev.code, ev.payload.decode("utf-8", "replace"))
                        slot = link.pending.pop(ev.request_id, None)
                        if slot is not None:
                            slot.set(ev)
                    elif isinstance(ev, Push) and self.on_push is not None:
                        try:
                            self.on_push(ev.code, ev.payload)
                        except Exception:
                            log.exception("push handler failed")
                data = await link.stream.receive_some(256 * 1024)
                if not data:
                    raise ConnectionBroken(f"broker {link.address} closed the connection")
                codec.receive_data(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            link.fail(ConnectionBroken(f"connection to {link.address} lost: {exc}"))
        except EQueueError as exc:
            link.fail(exc if exc.transient else ConnectionBroken(f"connection to {link.address} failed: {exc}"))
        except BaseException as exc:
            link.fail(ConnectionBroken(f"connection to {link.address} closed: {exc!r}"))
            raise
        finally:
            if self._link is link:
                self._link = None
            await trio.aclose_forcefully(link.stream)

    # ------------------------------------------------------------------ requests
    async def request(self, code: int, payload: bytes) -> bytes:
        """Send one request and wait for its answer payload.

        Raises the mapped BrokerError for an error answer, ConnectionBroken when the
        connection fails before the answer arrives (the request may or may not have
        been processed), ClientClosed after close.
        """
        # Straight to the socket when nothing else is being written: no lock, no
        # task switch before the bytes leave (one loop iteration less per request).
        if self.can_send_now():
            slot = self.send_request_nowait(code, payload)
        else:
            slot = await self.send_request(code, payload)
        try:
            await slot.done.wait()
        finally:
            if not slot.done.is_set():
                link = self._link
                if link is not None:
                    for rid, s in list(link.pending.items()):
                        if s is slot:
                            del link.pending[rid]
        return self.answer(slot)

    async def send_request(
        self, code: int, payload: bytes, notify: Callable[[], None] | None = None
    ) -> PendingReply:
        """Write one request now and return its pending answer (read it with
        :meth:`answer` once ``reply.done`` is set). Requests written one after the
        other by one task leave in that order (pipelining). ``notify()`` runs in the
        loop when the answer or a failure arrives.

        Raises ConnectionBroken when no connection can be made or the write fails
        (then nothing is pending), ClientClosed after close.
        """
        link = await self._connect()
        rid = next(self._ids) & 0xFFFFFFFF or next(self._ids)
        slot = _Slot(notify)
        link.pending[rid] = slot
        # Coalesce: queue the frame; whoever holds the send lock writes everything
        # queued in one send_all. Requests issued together (e.g. one batch per queue)
        # then leave in one segment and the broker commits them in one transaction.
        link.outbox.append(link.codec.send(RequestEvent(rid, code, payload)))
        try:
            await self._write_outbox(link)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            err = ConnectionBroken(f"connection to {link.address} lost: {exc}")
            link.pending.pop(rid, None)
            link.fail(err)
            raise err from exc
        except BaseException:
            link.pending.pop(rid, None)
            raise
        return slot

    def can_send_now(self) -> bool:
        """Whether :meth:`send_request_nowait` can write at once (connected over
        plain TCP -- a TLS link writes through ``send_all`` only -- and no other
        write in progress or queued)."""
        link = self._link
        return (
            link is not None
            and link.socket is not None
            and link.broken is None
            and not self._closed
            and self._nursery is not None
            and not link.outbox
            and not link.send_lock.locked()
        )

    def send_request_nowait(
        self, code: int, payload: bytes, notify: Callable[[], None] | None = None
    ) -> PendingReply:
        """Like :meth:`send_request` but synchronous (loop thread only): writes the
        request straight to the socket with one non-blocking write, without a task
        switch or checkpoint. What the socket buffer does not take is queued and
        written (in order, before anything else) by a task.

        Raises trio.WouldBlock when :meth:`can_send_now` is false (use
        :meth:`send_request`), ConnectionBroken when the write fails (then nothing
        is pending), ClientClosed after close.
        """
        if self._closed:
            raise ClientClosed("client closed")
        if not self.can_send_now():
            raise trio.WouldBlock
        link = self._link
        assert link is not None and link.socket is not None and self._nursery is not None
        fd = link.socket.fileno()
        if fd < 0:
            raise trio.WouldBlock
        rid = next(self._ids) & 0xFFFFFFFF or next(self._ids)
        data = link.codec.send(RequestEvent(rid, code, payload))
        slot = _Slot(notify)
        link.pending[rid] = slot
        if self._cork_depth:
            self._corked.append(data)  # written by uncork, with the others
            return slot
        self._write_now(link, fd, data, rid)
        return slot

    def cork(self) -> None:
        """Loop thread: until the matching :meth:`uncork`, requests sent with
        :meth:`send_request_nowait` are collected and then written together: the
        requests a producer seals at once (one ``send_batch`` over several queues)
        leave in one segment, and the broker reads, commits and answers them as one
        chunk. Call only around synchronous code (no checkpoint in between)."""
        self._cork_depth += 1

    def uncork(self) -> None:
        """Loop thread: end a :meth:`cork`; the outermost one writes what was
        collected with one non-blocking write (the rest is queued for a task). A
        failed write fails the link (its pending requests get ConnectionBroken);
        never raises."""
        self._cork_depth -= 1
        if self._cork_depth or not self._corked:
            return
        data = b"".join(self._corked)
        self._corked.clear()
        link = self._link
        if link is None or link.broken is not None or link.socket is None:
            return  # the link failed meanwhile: its pending requests were failed with it
        fd = link.socket.fileno()
        if fd < 0:
            return
        try:
            self._write_now(link, fd, data, None)
        except ConnectionBroken:
            pass  # link.fail answered every pending request with the error

    def _write_now(self, link: _Link, fd: int, data: bytes, rid: int | None) -> None:
        """One non-blocking write of ``data``; what the socket does not take is
        queued for a task. Raises ConnectionBroken (the link is failed; request
        ``rid``, if given, is dropped from it first: its caller gets the error)."""
        assert self._nursery is not None
        try:
            sent = os.write(fd, data)  # trio's sockets are non-blocking
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            err = ConnectionBroken(f"connection to {link.address} lost: {exc}")
            if rid is not None:
                link.pending.pop(rid, None)
            link.fail(err)
            raise err from exc
        if sent < len(data):
            link.outbox.append(data[sent:] if sent else data)
            self._nursery.start_soon(self._flush_outbox, link)

    @staticmethod
    async def _write_outbox(link: _Link) -> None:
        """Write every queued frame in one ``send_all`` (under the send lock)."""
        async with link.send_lock:  # acquiring is a checkpoint: others queue meanwhile
            if link.outbox:
                data = b"".join(link.outbox)
                link.outbox.clear()
                # Shielded: the frames taken may be other tasks' requests (a
                # heartbeat...). Cancelling this task must not drop them unsent.
                with trio.CancelScope(shield=True):
                    await link.stream.send_all(data)

    async def _flush_outbox(self, link: _Link) -> None:
        """Write what a non-blocking write left over (and anything queued behind it)."""
        try:
            await self._write_outbox(link)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            link.fail(ConnectionBroken(f"connection to {link.address} lost: {exc}"))

    @staticmethod
    def answer(reply: PendingReply) -> bytes:
        """The payload of a finished reply; raises its mapped error or failure."""
        res = reply.result
        if isinstance(res, BaseException):
            raise res
        assert res is not None
        if res.code != ErrorCode.OK:
            raise error_for_code(res.code, res.payload.decode("utf-8", "replace"))
        return res.payload
