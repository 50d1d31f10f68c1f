"""The client core shared by the producer, the consumer, the CLI and Spark.

:class:`AsyncClient` keeps one multiplexed TCP connection to a broker (request ids
let many requests share it; a parked pull never blocks a heartbeat), reconnects
on demand (trying each configured broker in turn), maps error codes to exceptions
through :func:`equeue.errors.error_for_code`, and exposes one typed method per
request. Its lifetime is ``async with``: the reader task lives in its nursery.
One live connection and its pending answers are a :class:`equeue.client.link._Link`.

With ``security.tls`` set the connection is TLS (``trio.SSLStream``, the context
from :mod:`equeue.client.tls`); every write then goes through ``send_all`` (the
non-blocking direct write of :meth:`AsyncClient.send_request_nowait` is for plain
TCP only, :meth:`AsyncClient.can_send_now` says False).

Errors: :class:`~equeue.errors.ConnectionBroken` when the connection cannot be
made or dies (transient: callers may retry), :class:`~equeue.errors.TlsError` when
a TLS handshake fails over a certificate (not transient), the mapped
:class:`~equeue.errors.BrokerError` for error answers,
:class:`~equeue.errors.ClientClosed` after :meth:`AsyncClient.aclose`.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import attrs
import trio

from equeue import control, wire
from equeue.client.handshake import authenticate
from equeue.client.lifetime import StackOwner
from equeue.client.link import PendingReply, _Link, _Slot, parse_brokers
from equeue.client.tls import client_context, handshake_error
from equeue.codec import DEFAULT_MAX_FRAME, NEED_DATA, Hello, HelloAck, Push, Response
from equeue.codec import Request as RequestEvent
from equeue.errors import (
    AuthenticationError,
    ClientClosed,
    ConfigError,
    ConnectionBroken,
    EQueueError,
    ErrorCode,
    RemoteProtocolError,
    TlsError,
    error_for_code,
)
from equeue.models import PullResult
from equeue.protocol import RequestCode
from equeue.retention import check_topic_settings
from equeue.security import ClientSecurity

log = logging.getLogger("equeue.client")

__all__ = ["AsyncClient", "PendingReply", "parse_brokers"]

T = TypeVar("T")
PushHandler = Callable[[int, bytes], None]


def _compression_setting(value: str | None) -> str | None:
    """A topic's ``compression=`` argument as sent: one of
    :data:`equeue.control.COMPRESSION_SETTINGS` (case-insensitive), or None for None
    and ``"default"`` (the broker's ``--compression``). Raises ConfigError for
    anything else, before anything is sent."""
    if value is None:
        return None
    setting = value.strip().lower()
    if setting == "default":
        return None
    control.check_compression(setting, ConfigError)
    return setting


class AsyncClient(StackOwner):
    """A trio client for one equeue cluster (a list of broker addresses)."""

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
        """Connect (TLS when ``security.tls``) and exchange Hello. Raises TlsError
        for a certificate problem, ConnectionBroken or OSError otherwise."""
        raw = await trio.open_tcp_stream(host, port)
        stream: trio.abc.Stream = raw
        tls = self.security.tls
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl_context is not None and tls is not None:
                stream = trio.SSLStream(raw, self._ssl_context, server_hostname=tls.server_hostname or host)
            link = _Link(stream, f"{host}:{port}", self.max_frame)
            try:
                # with TLS the handshake runs in the first send; with TLS 1.3 a refused
                # client certificate shows up in the first receive
                await stream.send_all(link.codec.send(Hello()))
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        hint = "" if tls is not None else " (does it speak TLS? set EQUEUE_TLS=1 or EQUEUE_TLS_CA)"
                        raise ConnectionBroken(f"broker {host}:{port} closed during the handshake{hint}")
                    link.codec.receive_data(data)
                    ev = link.codec.next_event()
                    if ev is NEED_DATA:
                        continue
                    if isinstance(ev, HelloAck):
                        if ev.code == ErrorCode.TOO_MANY_CONNECTIONS:
                            raise error_for_code(ev.code, f"broker {host}:{port} has too many connections")
                        await authenticate(link, ev, self.security.credentials)
                        return link
                    raise RemoteProtocolError(f"unexpected {type(ev).__name__} during handshake")
            except trio.BrokenResourceError as exc:
                if tls is not None:
                    raise handshake_error(exc, f"{host}:{port}") from None
                raise ConnectionBroken(f"broker {host}:{port}: {exc.__cause__ or exc}") from None
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

    async def call(self, req: Any, answer: type[T] | Any = None) -> T:
        """Send a control request (an equeue.control model); decode the answer."""
        payload = await self.request(req.CODE, control.encode(req))
        if answer is None:
            return None  # type: ignore[return-value]
        return control.decode(payload, answer)

    # ------------------------------------------------------------------ typed API
    async def produce(self, req: wire.ProduceRequest) -> wire.ProduceResponse:
        return wire.ProduceResponse.decode(await self.request(RequestCode.PRODUCE, req.encode()))

    async def pull(self, req: wire.PullRequest) -> PullResult:
        """Read one queue: at most ``req.max_messages`` messages from ``req.offset``
        (the answer carries whole stored batches: ``PULL_BATCHES`` is always set, and
        ``next_offset`` is past the last record delivered). Raises CorruptRecord for a
        batch that does not decode, RemoteProtocolError for a malformed answer."""
        if not req.flags & wire.PULL_BATCHES:
            req = attrs.evolve(req, flags=req.flags | wire.PULL_BATCHES)
        payload = await self.request(RequestCode.PULL, req.encode())
        return wire.decode_pull_response(req.topic, payload, req.offset, limit=req.max_messages)

    async def create_topic(
        self,
        name: str,
        queues: int = 4,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Create topic ``name`` with ``queues`` queues. Retention overrides: None =
        the broker's default, -1 = keep forever, > 0 = the limit (ms, bytes).
        ``compression``: how the topic stores batches (``producer``, ``none``, ``zstd``,
        ``lz4``; None or ``"default"``: the broker's ``--compression``).

        Raises ConfigError for any other retention value (0, -5...) or compression
        setting before anything is sent; TopicExists unless ``exist_ok``; BadRequest,
        InvalidName from the broker."""
        check_topic_settings(retention_ms, retention_bytes)
        codec = _compression_setting(compression)
        return await self.call(
            control.CreateTopic(name, queues, retention_ms, retention_bytes, exist_ok, codec), control.TopicInfo
        )

    async def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        reset: Iterable[str] = (),
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Grow ``name`` to ``queues`` queues and/or change its retention overrides:
        None leaves one unchanged, -1 = keep forever, > 0 = the limit; ``reset``
        names settings (``"retention_ms"``, ``"retention_bytes"``, ``"compression"``)
        to put back to the broker's default. ``compression``: the topic's new
        compression setting (``producer``, ``none``, ``zstd``, ``lz4``; None leaves it
        unchanged; ``"default"`` puts it back to the broker's ``--compression``, like
        naming it in ``reset``). Returns the topic as changed.

        Raises ConfigError before anything is sent for any other retention value or
        compression setting, an unknown name in ``reset`` or a setting both given and
        reset; TopicNotFound, BadRequest (fewer queues) from the broker."""
        names = [reset] if isinstance(reset, str) else list(reset)
        codec = _compression_setting(compression)
        if compression is not None and codec is None:  # "default"
            names.append("compression")
        if codec is not None and "compression" in names:
            raise ConfigError("compression is both set and reset: give one or the other")
        check_topic_settings(retention_ms, retention_bytes, [n for n in names if n != "compression"])
        names = list(dict.fromkeys(names))
        return await self.call(
            control.AlterTopic(name, queues, retention_ms, retention_bytes, names, codec), control.TopicInfo
        )

    async def delete_topic(self, name: str) -> None:
        await self.call(control.DeleteTopic(name))

    async def list_topics(self, include_internal: bool = True) -> list[control.TopicInfo]:
        return await self.call(control.ListTopics(include_internal), list[control.TopicInfo])

    async def describe_topic(self, name: str) -> control.TopicDescription:
        return await self.call(control.DescribeTopic(name), control.TopicDescription)

    async def get_route(self, topic: str, auto_create: bool = True) -> control.TopicInfo:
        return await self.call(control.GetRoute(topic, auto_create), control.TopicInfo)

    async def get_routes(self, topics: Sequence[str], auto_create: bool = False) -> control.RouteTable:
        """The route table of ``topics`` (GET_ROUTES): the owner group of each queue and
        each group's broker addresses (docs/cluster.md). A standalone broker answers
        ``cluster`` false, every queue owned by group ""."""
        return await self.call(control.GetRoutes(list(topics), auto_create), control.RouteTable)

    async def queue_offsets(self, topic: str, queue_id: int) -> control.QueueStats:
        return await self.call(control.QueueOffsets(topic, queue_id), control.QueueStats)

    async def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        ans: control.OffsetAnswer = await self.call(control.OffsetForTime(topic, queue_id, timestamp_ms), control.OffsetAnswer)
        return ans.offset

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, consumer_id: str = "") -> None:
        await self.call(control.CommitOffset(group, topic, queue_id, offset, consumer_id))

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        return (await self.call(control.QueryOffset(group, topic, queue_id), control.OffsetAnswer)).offset

    async def reset_offsets(
        self, group: str, topic: str, to: control.ResetTarget | str, timestamp_ms: int = 0, force: bool = False
    ) -> dict[int, int]:
        """Set ``group``'s committed offsets of ``topic`` to ``to`` (a
        :class:`~equeue.control.ResetTarget` or its string; ``time`` takes
        ``timestamp_ms``). Raises ValueError for another target, GroupHasMembers
        while members are live (unless ``force``)."""
        ans: control.ResetAnswer = await self.call(control.ResetOffsets(group, topic, to, timestamp_ms, force), control.ResetAnswer)
        return ans.offsets

    async def heartbeat(self, hb: control.Heartbeat) -> control.HeartbeatAnswer:
        return await self.call(hb, control.HeartbeatAnswer)

    async def leave_group(self, group: str, consumer_id: str) -> None:
        await self.call(control.LeaveGroup(group, consumer_id))

    async def release_queues(self, group: str, consumer_id: str, leases: list[str]) -> None:
        await self.call(control.ReleaseQueues(group, consumer_id, leases))

    async def list_groups(self) -> list[control.GroupSummary]:
        return await self.call(control.ListGroups(), list[control.GroupSummary])

    async def describe_group(self, group: str) -> control.GroupDescription:
        return await self.call(control.DescribeGroup(group), control.GroupDescription)

    async def stats(self) -> control.BrokerStats:
        return await self.call(control.Stats(), control.BrokerStats)

    async def pause_topic(self, name: str) -> control.PauseAnswer:
        """Refuse ``name``'s PRODUCE requests (TOPIC_PAUSED) until :meth:`resume_topic`
        (docs/operations.md, "Pause and resume"). Raises TopicNotFound, ReservedTopic,
        NotAuthorized (``admin`` on the topic)."""
        return await self.call(control.PauseTopic(name), control.PauseAnswer)

    async def resume_topic(self, name: str) -> control.PauseAnswer:
        """Accept ``name``'s produce again (``changed`` False: it was not paused)."""
        return await self.call(control.ResumeTopic(name), control.PauseAnswer)

    async def pause_group(self, group: str) -> control.PauseAnswer:
        """Hold consumer group ``group``'s pulls (nothing delivered, offsets and members
        kept) until :meth:`resume_group`. Raises InvalidName, NotAuthorized (``reset``
        on the group)."""
        return await self.call(control.PauseGroup(group), control.PauseAnswer)

    async def resume_group(self, group: str) -> control.PauseAnswer:
        """Deliver to ``group`` again; its held pulls read at once."""
        return await self.call(control.ResumeGroup(group), control.PauseAnswer)

    async def cluster_status(self) -> control.ClusterStatus:
        """The answering broker's view of the cluster (CLUSTER_STATUS)."""
        return await self.call(control.ClusterStatusRequest(), control.ClusterStatus)

    async def replication_status(self) -> control.ReplicationStatus:
        """The answering broker's replication state (REPLICATION_STATUS): a leader
        reports every follower's position and lag, a follower its own position."""
        return await self.call(control.ReplicationStatusRequest(), control.ReplicationStatus)

    async def replica_digest(self, range_size: int = 65536) -> control.ReplicaDigest:
        """Checksums of the answering replica's store at one log position
        (REPLICA_DIGEST, admin only), for comparing replicas (``equeue cluster verify``)."""
        return await self.call(control.ReplicaDigestRequest(range_size), control.ReplicaDigest)

    async def get_message(
        self, topic: str = "", queue_id: int = -1, queue_offset: int = -1, global_offset: int = -1
    ) -> PullResult:
        payload = await self.request(
            RequestCode.GET_MESSAGE, control.encode(control.GetMessage(topic, queue_id, queue_offset, global_offset))
        )
        return wire.decode_pull_response(topic, payload, end=-1)

    async def find_by_key(self, topic: str, key: str, limit: int = 32, before: int = -1) -> PullResult:
        """Messages of ``topic`` with ``key``, newest first, below global offset
        ``before`` (-1: all). The broker bounds the walk: a non-zero ``next_offset``
        in the result means it stopped early; pass it as ``before`` to go on."""
        req = control.FindByKey(topic, key, limit, before)
        payload = await self.request(RequestCode.FIND_BY_KEY, control.encode(req))
        return wire.decode_pull_response(topic, payload, end=-1)

    # ------------------------------------------------------------------ retry / dead letters
    async def send_back(
        self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int,
        max_reconsume_times: int = 16, retry_delays_ms: Sequence[int] = (),
    ) -> control.SendBackAnswer:  # fmt: skip
        """Hand back the message at (topic, queue_id, queue_offset) whose handler
        failed: the broker copies it to the group's retry topic (delayed) or, once
        ``reconsume_times >= max_reconsume_times``, to its dead-letter topic."""
        req = control.SendBack(
            group, topic, queue_id, queue_offset, reconsume_times, max_reconsume_times, list(retry_delays_ms)
        )
        return await self.call(req, control.SendBackAnswer)

    async def dlq_list(self, group: str, queue_id: int = 0, offset: int = 0, limit: int = 100) -> control.DlqPage:
        """One page of the group's dead letters from the cursor (queue_id, offset);
        continue with the page's ``next_queue_id``/``next_offset`` until ``done``."""
        return await self.call(control.DlqList(group, queue_id, offset, limit), control.DlqPage)

    async def dlq_resend(
        self, group: str, ids: Sequence[int] = (), all_letters: bool = False
    ) -> control.DlqResendAnswer:
        """Send dead letters back to their origin topic, each at most once (a letter
        resent before is reported in ``already_resent``, not sent again)."""
        return await self.call(control.DlqResend(group, list(ids), all_letters), control.DlqResendAnswer)

    # ------------------------------------------------------------------ corruption (admin)
    async def skip_message(self, topic: str, queue_id: int, queue_offset: int) -> control.SkipAnswer:
        """Make the broker stop serving the record at (topic, queue_id, queue_offset):
        pulls step over it, so consumers stuck on a corrupt record move past it."""
        return await self.call(control.SkipMessage(topic, queue_id, queue_offset), control.SkipAnswer)

    async def list_skipped(self, topic: str) -> dict[int, list[int]]:
        """The skipped queue offsets of ``topic``, by queue id."""
        return (await self.call(control.ListSkipped(topic), control.SkippedAnswer)).skipped
