"""The broker: a trio TCP server over the LMDB store -- its parts and its lifetime.

:class:`Broker` opens the store, builds the parts and hands each one the
collaborators it uses: the appender (the single writer), the group registry, the
parked pulls, the counters, the request handlers (:mod:`equeue.broker.handlers`), one
:class:`~equeue.broker.connection.ServerConnection` per client, and the HTTP endpoint.
Background tasks (appender, member expiry, scheduler, retention, async flush) live
in the broker's nursery.

Accepting (:meth:`Broker._accept`): past ``max_connections`` a new connection is
refused in its handshake answer (TOO_MANY_CONNECTIONS) and closed; when accept
fails for want of file descriptors (EMFILE, ENFILE, ...) the loop backs off (10 ms
doubling to 1 s, cut short as soon as one of the broker's connections closes) and
logs one line per 10 s, with no traceback.

Replication (``--cluster``, docs/cluster.md, "Replicas, acks, failover"): the store is replicated (a log
entry per transaction); the appender hands committed ops to the replica role
(``hold``) instead of answering them; readers see only what is below the high
watermark, so the writer thread's direct answer to parked pulls
(:mod:`equeue.broker.writer_answers`) is off and parked pulls are woken as the high
watermark passes their queues' writes; :class:`~equeue.broker.replication.role.ReplicaRole`
leads or follows, and runs the leader-only tasks (the lifecycle, the materializer).
A standalone broker runs none of it.

Lifetime: ``await broker.serve(task_status=...)`` runs until :meth:`Broker.stop`
(graceful: stop accepting, answer parked pulls, finish in-flight commits, close
LMDB) or until cancelled (in-flight commits still finish and are answered).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from equeue import control
from equeue.broker.appender import Appender, NoHooks, PendingOp
from equeue.broker.auth import BrokerSecurity
from equeue.broker.connection import ConnectionLimits, FrameBudget, Inflight, ServerConnection
from equeue.broker.groups import GroupRegistry
from equeue.broker.handlers import Handlers
from equeue.broker.handlers.context import Closing
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.replica import ReplicaHandlers, no_handover, no_recovery, no_replicas
from equeue.broker.http import Readiness, replica_readiness, serve_http
from equeue.broker.lifecycle import Lifecycle, subscribed_groups
from equeue.broker.longpoll import ParkedPulls
from equeue.broker.metrics import ReplicationSample
from equeue.broker.output import Output, Staging
from equeue.broker.stats import Counters, Statistics
from equeue.broker.storage import ScanBudget, Store, WriteOutcome
from equeue.broker.tls import TlsAcceptor, server_context
from equeue.broker.writer_answers import answer_parked_pulls
from equeue.client.lifetime import StackOwner
from equeue.codec import encode_handshake_answer
from equeue.config import BrokerConfig
from equeue.errors import ConfigError, ErrorCode, NotLeader, StartupError
from equeue.logs import RateLimitedLog

if TYPE_CHECKING:
    from equeue.broker.cluster.node import ClusterNode
    from equeue.broker.replication.role import ReplicaRole

log = logging.getLogger("equeue.broker")

__all__ = ["Broker", "BrokerConfig", "open_broker"]

#: accept errors that mean "out of resources", not "broken listener"
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
#: the accept loop's back-off after such an error: first and longest pause (seconds)
_ACCEPT_BACKOFF = (0.01, 1.0)
_accept_logs = RateLimitedLog(log, 10.0, time.monotonic)


def _cannot_listen(host: str, port: int, what: str, exc: OSError) -> StartupError:
    """The one-line refusal of a port the broker cannot listen on."""
    hint = " (another process listens there: pick another port, or 0 for a free one)" if exc.errno == errno.EADDRINUSE else ""
    return StartupError(f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}{hint}")


async def _listen(host: str, port: int, what: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners``; an address in use, an address of no interface or
    an unknown host raises StartupError naming ``what`` (the broker or HTTP port)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise _cannot_listen(host, port, what, exc) from None


def _open_store(path: Path, **kw: Any) -> Store:
    """Open the store at ``path``; a data directory that cannot be created or used
    (a file in its place, no permission, a read-only file system) raises StartupError
    naming it (the store's own errors, DataDirLocked and StoreDamaged, go through)."""
    try:
        return Store(path, **kw)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise StartupError(f"cannot use the data directory {path}{where}: {exc.strerror or exc}") from None


class _StandaloneHooks(NoHooks):
    """A standalone broker's commit hooks (:class:`equeue.broker.appender.CommitHooks`)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def written(self, committed: WriteOutcome) -> None:
        """Writer thread: parked pulls on the queues just written answer from there."""
        if committed.touched:
            answer_parked_pulls(self._broker.parked, committed.touched)

    def committed(self, committed: WriteOutcome) -> None:
        """Pulls parked since the commit wake; delayed moves are rescheduled."""
        if committed.touched:
            self._broker.parked.wake(committed.touched)
        if committed.scheduled:
            self._broker.lifecycle.schedule_changed()

    def answered(self) -> None:
        """The produce answers staged for the connections are written."""
        self._broker._staging.flush()


class _ReplicatedHooks(NoHooks):
    """A replicated broker's commit hooks: committed ops wait for the high watermark
    (the replica role answers them); nothing is answered from the writer thread."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def hold(self, batch: list[PendingOp], committed: WriteOutcome) -> bool:
        self._broker._hold(batch, committed)
        return True

    def answered(self) -> None:
        self._broker._staging.flush()


class Broker(StackOwner):
    """An equeue broker. Use ``async with Broker(cfg) as b`` or ``await b.serve()``.

    Its parts (``store``, ``appender``, ``groups``, ``parked``, ``stats``,
    ``lifecycle``) are public for tests and tools; they are built by :meth:`serve`.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.store: Store = None  # type: ignore[assignment]  # opened in serve()
        self.appender: Appender = None  # type: ignore[assignment]
        self.handlers: Handlers = None  # type: ignore[assignment]
        self._statistics: Statistics = None  # type: ignore[assignment]
        self.parked = ParkedPulls()
        self.groups = GroupRegistry(config.member_expiry)
        self.stats = Counters()
        self._closing = Closing()
        self.port: int = 0
        #: bound port of the /metrics + /stats endpoint (0: none, ``config.http_port`` None)
        self.http_port: int = 0
        self._stop = trio.Event()
        self._inflight = Inflight()
        self._staging = Staging()
        self._conns: set[ServerConnection] = set()
        self._no_conns = trio.Event()
        #: wraps accepted connections in TLS (None: plain TCP); built by serve()
        self._tls: TlsAcceptor | None = None
        #: authentication and ACLs (off without ``config.users_file``)
        self.security = BrokerSecurity(config.users_file)
        #: set (and replaced) whenever a connection's socket is closed: a file
        #: descriptor is free again (the accept loop's back-off ends early)
        self._fd_freed = trio.Event()
        #: connections in their TLS handshake (they count against max_connections)
        self._handshaking = 0
        #: the cluster role (None: a standalone broker); built by serve() with --cluster
        self.cluster: ClusterNode | None = None
        #: the replica role (None: standalone); built by serve() with --cluster
        self.role: ReplicaRole | None = None
        self._frames = FrameBudget(config.max_partial_frame_bytes)
        self._limits = ConnectionLimits(
            frame_timeout=config.frame_timeout, idle_timeout=config.idle_timeout,
            output_grace=config.output_buffer_grace, max_pulls=config.max_pulls_per_connection,
        )  # fmt: skip

    @property
    def closing(self) -> bool:
        return self._closing.closing

    def _replication_sample(self) -> ReplicationSample | None:
        """The replication series' state (None: standalone)."""
        if self.role is None or self.cluster is None:
            return None
        election = self.cluster.election
        return ReplicationSample(
            self.role.status(), self.role.promotions, election.fenced(),
            elections_attempted=election.campaigns, elections_won=election.takeovers,
            fences=election.fences, step_downs=self.role.step_downs,
        )  # fmt: skip

    def readiness(self) -> Readiness:
        """``/readyz``: whether this broker serves clients now (standalone; in a
        cluster, see :func:`equeue.broker.http.replica_readiness`)."""
        if self._stop.is_set() or self.closing:
            return Readiness(False, "stopping", "the broker is stopping")
        if self.role is None or self.cluster is None:
            return Readiness(True, "standalone")
        election = self.cluster.election
        return replica_readiness(
            self.role.status(), serving=election.serving(), reads_held=self.role.reads_held,
            cut_off=election.cut_off(),
        )  # fmt: skip

    # ------------------------------------------------------------------ lifetime
    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, listen, serve until :meth:`stop`; ``task_status.started(port)``."""
        cfg = self.config
        tls_context = server_context(cfg)  # ConfigError for an unreadable certificate
        self._tls = TlsAcceptor(tls_context, cfg.handshake_timeout) if tls_context is not None else None
        self.security.start(cfg.host, cfg.port)
        replicated = bool(cfg.cluster)
        self.store = await trio.to_thread.run_sync(
            functools.partial(_open_store, cfg.data_dir, map_size=cfg.map_size, sync=cfg.flush == "sync",
                              replicated=replicated)
        )  # fmt: skip
        self.store.scan_budget = ScanBudget(cfg.scan_records, cfg.scan_time)
        self.appender = Appender(
            self.store,
            # replicated: readers see what is below the high watermark, so the writer
            # thread answers no parked pull, and committed ops wait for replication
            _ReplicatedHooks(self) if replicated else _StandaloneHooks(self),
            # --flush async: small transactions commit on the loop (docs/storage.md)
            inline_bytes=cfg.inline_commit_bytes if cfg.flush == "async" else 0,
        )
        self._statistics = Statistics(
            self.stats, self.store, self.parked, self.appender, flush=cfg.flush
        )
        if replicated:  # imported only here: a standalone broker never loads httpx
            from equeue.broker.cluster.node import ClusterNode
            from equeue.broker.replication.role import eligible

            repl = self.store.replication
            assert repl is not None  # a replicated broker's store keeps the log
            self.cluster = ClusterNode(
                cfg, self.store, self.appender.submit, eligible=functools.partial(eligible, repl),
                floor_epoch=lambda: repl.last_epoch, led_epoch=lambda: repl.led_epoch,
            )
        token = trio.lowlevel.current_trio_token()
        lifecycle = self.lifecycle = Lifecycle(
            self.store, self.appender.submit, cfg, functools.partial(subscribed_groups, self.groups)
        )
        try:
            async with trio.open_nursery() as core:
                core.start_soon(self.appender.run)
                async with trio.open_nursery() as tasks, AsyncExitStack() as cluster_role:
                    listeners = await _listen(cfg.host, cfg.port, "the broker port")
                    self.port = listeners[0].socket.getsockname()[1]
                    if self.cluster is not None:  # register, load the view, take a role: then serve
                        try:
                            await cluster_role.enter_async_context(self.cluster.serving(self.port))
                            self.role = self._replica_role(self.cluster)
                            await cluster_role.enter_async_context(self.role)
                        except BaseException:
                            for listener in listeners:
                                await trio.aclose_forcefully(listener)
                            raise
                    self.handlers = self._handlers()
                    serve_scope = trio.CancelScope()

                    async def accept(listener: trio.SocketListener) -> None:
                        with serve_scope:
                            await self._accept(listener, tasks, token)

                    for listener in listeners:
                        tasks.start_soon(accept, listener)
                    tasks.start_soon(self.groups.run_expiry)
                    if self.role is None:  # a replica runs it while it leads
                        tasks.start_soon(lifecycle.run)
                    tasks.start_soon(self.security.watch)
                    if cfg.flush == "async":
                        tasks.start_soon(self._flusher)
                    if cfg.http_port is not None:  # 0: a free port
                        try:
                            self.http_port = await tasks.start(
                                functools.partial(
                                    serve_http, queue_limit=cfg.metrics_queue_limit, ssl_context=tls_context,
                                    max_connections=cfg.http_max_connections,
                                    readiness=self.readiness, shutdown=self._stop.wait,
                                    replication=self._replication_sample, counters=self.stats,
                                    ephemeral=self.groups.all_ephemeral_offsets, paused=self._paused,
                                ),
                                self._statistics.snapshot,
                                self.store,
                                cfg.host,
                                cfg.http_port,
                            )
                        except OSError as exc:
                            raise _cannot_listen(cfg.host, cfg.http_port, "the HTTP port", exc) from None
                    log.info(
                        "broker listening on %s:%d%s (data %s, flush %s)",
                        cfg.host,
                        self.port,
                        f", HTTP on {cfg.host}:{self.http_port}" if self.http_port else "",
                        cfg.data_dir,
                        cfg.flush,
                    )
                    if self.cluster is not None:
                        log.info(
                            "broker group %s, cluster %s, advertised as %s",
                            cfg.broker_group, ",".join(cfg.cluster), self.cluster.address,
                        )  # fmt: skip
                    task_status.started(self.port)
                    await self._stop.wait()
                    # graceful shutdown
                    serve_scope.cancel()
                    if self.role is not None:  # a leader hands its group to an in-sync follower first
                        await self.role.hand_over_at_stop()
                    await cluster_role.aclose()  # leave the cluster at once (lease revoked)
                    self._closing.closing = True
                    self.parked.close()
                    self.handlers.pauses.close()  # pulls of paused groups answer now
                    with trio.move_on_after(cfg.shutdown_grace):
                        await self._inflight.wait_none()
                        # every answer is queued: stop reading, let writers flush, close
                        for conn in list(self._conns):
                            conn.shutdown()
                        while self._conns:
                            self._no_conns = trio.Event()
                            await self._no_conns.wait()
                    tasks.cancel_scope.cancel()
                self.appender.close()
        finally:
            self._closing.closing = True
            await trio.to_thread.run_sync(self.store.close)
            log.info("broker stopped")

    def stop(self) -> None:
        """Begin a graceful shutdown (safe to call from the trio thread)."""
        self._stop.set()

    def reload_tls(self) -> None:
        """Read the TLS certificate, key and CA files again (``broker start``: on
        SIGHUP); new connections use them. Raises ConfigError when TLS is off or a
        file is bad (then the current certificate stays)."""
        if self._tls is None:
            raise ConfigError("TLS is off (no tls_cert): nothing to reload")
        self._tls.reload(self.config)

    async def _enter(self, stack: AsyncExitStack) -> None:
        """Serve in a nursery of the stack until exit, which stops gracefully and waits.
        A failed start raises its own error (the nursery is closed first)."""
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(self.serve)
        stack.callback(self.stop)

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def statistics(self) -> control.BrokerStats:
        """The broker's statistics now (as the STATS request answers them)."""
        return self._statistics.snapshot()

    # ------------------------------------------------------------------ internals
    def _handlers(self) -> Handlers:
        cfg, role = self.config, self.role
        replication = ReplicaHandlers(
            log=self.store.replication,
            leader_log=(lambda: role.leader_log) if role is not None else (lambda: None),
            status=role.status if role is not None else self._standalone_status,
            identify=self.cluster.check_replica if self.cluster is not None else no_replicas,
            recover=self.cluster.recover if self.cluster is not None else no_recovery,
            hand_over=role.hand_over if role is not None else no_handover,
        )
        return Handlers(
            store=self.store, appender=self.appender, submit=self.appender.submit, groups=self.groups,
            parked=self.parked, counters=self.stats, closing=self._closing, statistics=self._statistics.snapshot,
            limits=Limits.from_config(cfg), replication=replication, security=self.security, cluster=self.cluster,
            replica=role,
        )  # fmt: skip

    def _replica_role(self, node: ClusterNode) -> ReplicaRole:
        from equeue.broker.replication.follower import Follower, replica_connector
        from equeue.broker.replication.role import ReplicaRole

        cfg = self.config
        try:
            connect = replica_connector(cfg)
        except ConfigError as exc:  # no replica credentials: it may lead (a lone replica), not follow
            log.warning("%s; until then this broker cannot follow its group's leader", exc)
            connect = functools.partial(_cannot_follow, exc)
        repl = self.store.replication
        assert repl is not None  # a replicated broker's store keeps the log
        follower = Follower(
            replication=repl, call=self.appender.call, connect=connect,
            broker_id=node.broker_id, address=node.address, config=cfg, proof=node.replica_secret,
        )  # fmt: skip
        return ReplicaRole(
            store=self.store, appender=self.appender, election=node.election, follower=follower, parked=self.parked,
            leases=self.groups, lifecycle=self.lifecycle, leader_duties=node.run_leader_duties, config=cfg,
            broker_id=node.broker_id, replicas=node.replicas,
        )  # fmt: skip

    def _paused(self) -> tuple[frozenset[str], frozenset[str]]:
        """The paused topics and consumer groups (the metrics' ``equeue_*_paused``)."""
        pauses = self.handlers.pauses
        return pauses.topics(), pauses.groups()

    def _standalone_status(self) -> control.ReplicationStatus:
        cfg, store = self.config, self.store
        return control.ReplicationStatus(
            "standalone", "", "", 0, "", 0, 0, store.next_global, [], cfg.acks,
            cfg.min_insync,
        )  # fmt: skip

    def _hold(self, batch: list[PendingOp], committed: WriteOutcome) -> None:
        """Replicated: a committed transaction's ops wait for the high watermark."""
        role = self.role
        if role is None:
            self.appender.fail(batch, NotLeader("this broker has not taken its role in its group yet"))
            return
        role.hold(batch, committed)

    async def _flusher(self) -> None:
        """``async`` flush policy: fsync committed data every ``flush_interval``."""
        while True:
            await trio.sleep(self.config.flush_interval)
            await trio.to_thread.run_sync(self.store.sync)

    async def _accept(
        self, listener: trio.SocketListener, nursery: trio.Nursery, token: trio.lowlevel.TrioToken
    ) -> None:
        """Accept connections until cancelled, each served in ``nursery``. Out of file
        descriptors (or kernel memory), back off and retry: the wait ends at once
        when one of the broker's connections closes, and after at most 1 s."""
        first, longest = _ACCEPT_BACKOFF
        pause = first
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    _accept_logs.log(
                        logging.ERROR, "accept", "cannot accept connections: %s (%s) with %d open; retrying",
                        errno.errorcode.get(exc.errno or 0, "?"), os.strerror(exc.errno or 0), len(self._conns),
                    )  # fmt: skip
                    with trio.move_on_after(pause):
                        await self._fd_freed.wait()
                    pause = min(pause * 2, longest)
                    continue
                pause = first
                nursery.start_soon(self._connection, stream, token)

    def _fd_closed(self) -> None:
        """A connection's socket is closed: its descriptor is free for accept."""
        self._fd_freed.set()
        self._fd_freed = trio.Event()

    async def _refuse(self, stream: trio.abc.Stream) -> None:
        """Past max_connections: read the client's handshake (it speaks first, so
        closing never resets what it sent), answer TOO_MANY_CONNECTIONS, close."""
        self.stats.connections_refused += 1
        _accept_logs.log(
            logging.WARNING, "refused", "refusing a connection: %d connections open (--max-connections)",
            len(self._conns),
        )  # fmt: skip
        try:
            with trio.move_on_after(min(self.config.handshake_timeout, 1.0)):
                await stream.receive_some(8)
            with trio.move_on_after(1.0):
                await stream.send_all(encode_handshake_answer(ErrorCode.TOO_MANY_CONNECTIONS))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
            self._fd_closed()

    async def _connection(self, stream: trio.SocketStream, token: trio.lowlevel.TrioToken) -> None:
        cfg = self.config
        refuse = len(self._conns) + self._handshaking >= cfg.max_connections
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn_stream: trio.abc.Stream = stream
        if self._tls is not None:  # TLS: handshake first (bounded, a failure is one log line)
            self._handshaking += 1  # counts against max_connections meanwhile
            try:
                tls = await self._tls.handshake(stream)
            finally:
                self._handshaking -= 1
            if tls is None or self._closing.closing:  # failed, or the broker began to stop
                await trio.aclose_forcefully(stream)
                self._fd_closed()
                return
            conn_stream = tls
        if refuse:  # the refusal goes through TLS too, or the client sees a TLS error
            await self._refuse(conn_stream)
            return
        self.stats.connections += 1
        output = Output(conn_stream, self.stats, self._staging, token, cfg.output_buffer_soft, cfg.output_buffer_hard)
        conn = ServerConnection(
            conn_stream, output, self.handlers, self._inflight,
            max_frame=cfg.max_frame, handshake_timeout=cfg.handshake_timeout, counters=self.stats,
            limits=self._limits, frames=self._frames,
        )  # fmt: skip
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
            self._fd_closed()


def _cannot_follow(exc: ConfigError, address: str) -> Any:
    """The follower's ``connect`` without replica credentials: raises ``exc`` (the
    follower logs it, rate-limited, and tries again later)."""
    raise exc


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
