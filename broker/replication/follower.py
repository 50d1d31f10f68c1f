"""The follower side of replication (docs/cluster.md, "Following").

A :class:`Follower` copies its group leader's replication log into the local store
over one client connection (:class:`equeue.client.AsyncClient`, frames up to
:data:`~equeue.wire.replica.REPLICA_MAX_FRAME`):

- REPLICA_FETCH long-polls from the store's end; the entries are applied in one
  write transaction in the writer thread (``store.replication.apply_log`` through ``call``);
  the next fetch, from the new end, is the acknowledgement.
- DIVERGED: the local log has entries the leader lacks (an old leader back, or a
  follower that fetched further than the new leader): the keys those entries touched
  are asked of the leader (REPLICA_KEYS) and, in one transaction, the log is cut at
  ``diverge_at``, the keys repaired and ``consistent_at`` recorded (``store.replication.truncate``).
  A ``diverge_at`` at or past the local end (the leader never had the local last
  epoch, KIP-279) cuts that whole epoch instead; rounds repeat until the logs agree.
- TOO_OLD: the local end is below the leader's ``log_start``: the store is emptied
  and copied chunk by chunk (REPLICA_SNAPSHOT) over every replicated database, then
  followed from the first chunk's position.

The role (:mod:`equeue.broker.replication.role`) runs :meth:`Follower.follow` while the
election names another broker leader, and cancels it when that changes.
:meth:`~Follower.follow` raises NotLeader or StaleEpoch once the peer is not the
leader of the epoch followed (the role then waits for the election); it keeps the
connection up through transient failures itself, backing off (never spinning).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Protocol, TypeVar

import trio

from equeue.broker.storage.layout import FORMAT_VERSION, REPLICATED_DATABASES
from equeue.broker.storage.replicated import StoreReplication
from equeue.broker.storage.replication import UNREACHABLE
from equeue.client.async_client import AsyncClient
from equeue.config import BrokerConfig, TlsClientAuth
from equeue.errors import (
    AuthenticationError,
    BrokerError,
    ConfigError,
    ConnectionBroken,
    EQueueError,
    LogTrimmed,
    NotLeader,
    RemoteProtocolError,
    StaleEpoch,
)
from equeue.logs import RateLimitedLog
from equeue.protocol import RequestCode
from equeue.security import ClientSecurity, Credentials, TlsSettings
from equeue.wire.replica import (
    REPLICA_MAX_FRAME,
    FetchAnswer,
    FetchRequest,
    FetchStatus,
    KeysRequest,
    SnapshotRequest,
    decode_fetch_answer,
    decode_keys_answer,
    decode_snapshot_answer,
    encode_fetch_request,
    encode_keys_request,
    encode_snapshot_request,
)

__all__ = ["REPLICA_PASSWORD_ENV", "REPLICA_USER_ENV", "Follower", "ReplicaLink", "replica_connector",
           "replica_security"]  # fmt: skip

log = logging.getLogger("equeue.replication")

T = TypeVar("T")

#: the environment variables naming the user a follower authenticates as at its
#: leader when the brokers run with ``--users-file`` (an admin user: replication
#: reads the whole store)
REPLICA_USER_ENV = "EQUEUE_REPLICA_USER"
REPLICA_PASSWORD_ENV = "EQUEUE_REPLICA_PASSWORD"

#: how long one fetch waits at the leader when there is nothing new
FETCH_WAIT_MS = 500
#: the most one fetch asks for (the leader still sends one whole entry, however large)
MAX_FETCH_BYTES = REPLICA_MAX_FRAME // 2
#: snapshot chunk size asked for
SNAPSHOT_CHUNK_BYTES = 4 << 20
#: keys per REPLICA_KEYS request
KEYS_PER_REQUEST = 4096
#: seconds a request may go unanswered (beyond a fetch's wait) before the connection
#: is given up as dead
REQUEST_TIMEOUT = 30.0
#: back-off after a failure: from the first to the last, doubling
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
#: back-off after an error that needs an operator (authentication, a refusal)
BACKOFF_REFUSED = 5.0


class ReplicaLink(Protocol):
    """What the follower uses of its connection to the leader (an :class:`AsyncClient`)."""

    async def request(self, code: int, payload: bytes) -> bytes: ...


class WriterCall(Protocol):
    """``Appender.call``: run ``fn()`` in the writer thread, in order with queued
    writes; its result, or its exception raised."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


def replica_security(config: BrokerConfig, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """How this broker connects to its group's leader: TLS when it serves TLS itself
    (trusting its ``tls_ca``, or the system's CAs without one; offering its own
    certificate when the brokers ask clients for one), and with ``users_file`` the
    credentials of :data:`REPLICA_USER_ENV` / :data:`REPLICA_PASSWORD_ENV`.

    Raises ConfigError when the brokers authenticate and the variables are unset.
    """
    env = os.environ if environ is None else environ
    tls = None
    if config.tls_cert is not None:
        mutual = config.tls_client_auth is not TlsClientAuth.NONE
        tls = TlsSettings(
            ca_file=config.tls_ca,
            cert_file=config.tls_cert if mutual else None,
            key_file=config.tls_key if mutual else None,
        )
    credentials = None
    if config.users_file is not None:
        user, password = env.get(REPLICA_USER_ENV, ""), env.get(REPLICA_PASSWORD_ENV, "")
        if not user or not password:
            raise ConfigError(
                f"a replicated broker with --users-file authenticates to its group's leader: set "
                f"{REPLICA_USER_ENV} and {REPLICA_PASSWORD_ENV} to a user with the replica role (equeue user add "
                "NAME --replica; the admin role is not enough)"
            )
        credentials = Credentials(user, password)
    return ClientSecurity(tls=tls, credentials=credentials)


def replica_connector(
    config: BrokerConfig, environ: Mapping[str, str] | None = None
) -> Callable[[str], AbstractAsyncContextManager[AsyncClient]]:
    """The ``connect`` of a :class:`Follower`: ``connect(address)`` is a client of the
    leader at ``address`` reading frames up to :data:`REPLICA_MAX_FRAME`, with
    :func:`replica_security` (whose ConfigError is raised here, at start)."""
    security = replica_security(config, environ)

    def connect(address: str) -> AbstractAsyncContextManager[AsyncClient]:
        return AsyncClient(address, security=security, max_frame=REPLICA_MAX_FRAME)

    return connect


class _Refused(Exception):
    """The leader refused the follower in a way retrying soon will not fix."""


class Follower:
    """Copies the leader's log into ``replication`` (the local store's,
    ``store.replication``); see the module docstring.

    ``call(fn)`` runs ``fn()`` in the writer thread (``Appender.call``);
    ``connect(address)`` opens a :class:`ReplicaLink` to a leader (an ``async with``);
    ``broker_id`` / ``address`` name this broker to the leader; ``proof`` is this
    process's replica secret (its digest is in the broker's etcd record), sent with
    every request so the leader counts it as this replica's.
    """

    def __init__(
        self, *, replication: StoreReplication, call: WriterCall, connect: Callable[[str], AbstractAsyncContextManager[ReplicaLink]],
        broker_id: str, address: str, config: BrokerConfig, proof: bytes = b"",
    ) -> None:  # fmt: skip
        self._repl = replication
        self._call = call
        self._connect = connect
        self._broker_id = broker_id
        self._address = address
        self._proof = proof
        self._fetch_bytes = max(1, min(config.replica_fetch_bytes, MAX_FETCH_BYTES))
        #: the next log position this replica needs (everything below is durable here)
        self.position: int = replication.position
        #: the leader's high watermark in its last answer
        self.high_watermark: int = 0
        #: trio time of the last answered fetch (-inf: none yet)
        self.last_ok: float = -math.inf
        #: the leader followed now (None: none)
        self.leader: str | None = None
        self._logs = RateLimitedLog(log, 10.0, time.monotonic)
        #: copy the store before fetching (set by :meth:`follow`)
        self._recopy = False

    async def follow(self, leader_address: str, epoch: int) -> None:
        """Fetch from the leader at ``leader_address`` (of leader epoch ``epoch``) and
        apply, until cancelled.

        Connection failures, the leader's refusals and store errors are logged
        (rate-limited) and retried after a back-off, over a new connection. Raises
        NotLeader when the peer is not the group's serving leader, StaleEpoch when its
        epoch is not ``epoch``: the role waits for the election, then follows again.
        """
        self.leader = leader_address
        # a repair (truncate's consistent_at) not reached yet came from an earlier
        # session's leader: its values may hold that leader's unreplicated writes, which
        # this leader never had. Only a fresh copy of this leader's store is safe.
        self._recopy = self._repl.position < self._repl.consistent_at
        self._logs.log(logging.INFO, "follow", "following %s (epoch %d) from position %d",
                       leader_address, epoch, self._repl.position)  # fmt: skip
        backoff = BACKOFF_FIRST
        try:
            while True:
                try:
                    await self._connected(leader_address, epoch)
                except (NotLeader, StaleEpoch):
                    raise
                except _Refused as exc:
                    self._logs.log(logging.ERROR, "refused", "replication from %s refused: %s", leader_address, exc)
                    await trio.sleep(BACKOFF_REFUSED)
                    continue
                except ConfigError as exc:  # e.g. no replica credentials (see replica_connector)
                    self._logs.log(logging.ERROR, "config", "cannot follow %s: %s", leader_address, exc)
                    await trio.sleep(BACKOFF_REFUSED)
                    continue
                except (ConnectionBroken, RemoteProtocolError, OSError) as exc:
                    self._logs.log(logging.WARNING, "connection", "replication from %s: %s; reconnecting",
                                   leader_address, exc)  # fmt: skip
                except BrokerError as exc:  # transient refusals (busy, shutting down...)
                    self._logs.log(logging.WARNING, "leader", "replication from %s: %s (%s)",
                                   leader_address, exc, exc.code.name)  # fmt: skip
                except EQueueError as exc:  # applying failed: the store (disk full...) or an entry (corrupt)
                    self._logs.log(logging.ERROR, "store", "replication from %s: applying the leader's log "
                                   "failed: %s (%s)", leader_address, exc, type(exc).__name__)  # fmt: skip
                await trio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        finally:
            self.leader = None

    async def _connected(self, leader_address: str, epoch: int) -> None:
        """One connection and its session. The connection's nursery (the client's
        reader task) hands errors out in an exception group: the one error inside it
        is raised on its own, so the callers' ``except`` clauses see it."""
        try:
            async with self._connect(leader_address) as link:
                await self._session(link, epoch)
        except BaseExceptionGroup as group:
            error = _sole_error(group)
            if error is None:
                raise
            raise error from None

    async def _session(self, link: ReplicaLink, epoch: int) -> None:
        """Follow over one connection until it fails (raises)."""
        repl = self._repl
        if repl.consistent_at == UNREACHABLE or self._recopy:  # a copy interrupted, or an earlier leader's repair
            await self._snapshot(link, epoch)
            self._recopy = False
        while True:
            position = self.position = repl.position
            req = FetchRequest(
                self._broker_id, self._address, epoch, position, repl.last_epoch, self._fetch_bytes, FETCH_WAIT_MS,
                FORMAT_VERSION, self._proof, position >= repl.consistent_at,
            )
            ans = decode_fetch_answer(await self._request(link, RequestCode.REPLICA_FETCH, encode_fetch_request(req)))
            if ans.epoch != epoch:
                raise StaleEpoch(f"the leader answered epoch {ans.epoch}, following {epoch}")
            self.high_watermark = ans.high_watermark
            self.last_ok = trio.current_time()
            if ans.status is FetchStatus.OK:
                await self._apply(ans, position)
            elif ans.status is FetchStatus.DIVERGED:
                await self._truncate(link, epoch, ans, position)
            else:
                await self._snapshot(link, epoch, ans.log_start)

    async def _request(self, link: ReplicaLink, code: int, payload: bytes) -> bytes:
        """One request to the leader; raises ConnectionBroken when it is not answered
        within :data:`REQUEST_TIMEOUT` (past a fetch's wait): a silent peer."""
        try:
            with trio.fail_after(REQUEST_TIMEOUT + (FETCH_WAIT_MS / 1000 if code == RequestCode.REPLICA_FETCH else 0)):
                return await link.request(code, payload)
        except trio.TooSlowError:
            raise ConnectionBroken(f"no answer to request {RequestCode(code).name} within {REQUEST_TIMEOUT:g} s") from None
        except AuthenticationError as exc:
            raise _Refused(f"authentication failed ({exc}): check {REPLICA_USER_ENV} / {REPLICA_PASSWORD_ENV}") from exc
        except BrokerError as exc:
            if exc.code.name in ("NOT_AUTHORIZED", "BAD_REQUEST", "UNKNOWN_REQUEST"):
                raise _Refused(f"{exc} ({exc.code.name})") from exc
            raise

    async def _apply(self, ans: FetchAnswer, position: int) -> None:
        entries = ans.entries
        if not entries:
            return
        if entries[0][0] != position:
            raise RemoteProtocolError(f"the leader sent entries from {entries[0][0]}, asked from {position}")
        repl = self._repl
        self.position = await self._call(partial(repl.apply_log, entries))

    async def _truncate(self, link: ReplicaLink, epoch: int, ans: FetchAnswer, position: int) -> None:
        """Cut the local log at ``ans.diverge_at`` and repair the keys its entries
        from there touched with the leader's values (docs/cluster.md, "Truncation")."""
        repl = self._repl
        start = ans.diverge_at
        if start >= position:
            # the leader never had our last epoch and cannot place it (KIP-279): drop
            # that whole epoch (truncating further than needed is safe: the keys are
            # repaired and the entries fetched again); the next fetch names an older one
            start = dict(repl.epochs()).get(repl.last_epoch, position)
            if start >= position:
                raise RemoteProtocolError(f"the leader says the log diverged at {ans.diverge_at}, past our end "
                                          f"{position}, and epoch {repl.last_epoch} has no start here")  # fmt: skip
        try:
            if start < repl.log_start:
                raise LogTrimmed(f"diverged at {start}, below this replica's log start {repl.log_start}")
            keys = await trio.to_thread.run_sync(repl.divergent_keys, start)
        except LogTrimmed:
            self._logs.log(logging.WARNING, "diverged", "log diverged from the leader's at %d, below this "
                           "replica's log start: copying the store", start)  # fmt: skip
            await self._snapshot(link, epoch)
            return
        repairs: list[tuple[int, bytes, bytes | None]] = []
        # an earlier truncation whose consistent_at is not reached yet repaired keys
        # with values at that position: the store matches the leader's only from there
        prior = repl.consistent_at
        consistent_at = max(start, prior if repl.position < prior < UNREACHABLE else 0)
        at = 0
        while at < len(keys):
            batch = keys[at : at + KEYS_PER_REQUEST]
            got = decode_keys_answer(
                await self._request(link, RequestCode.REPLICA_KEYS, encode_keys_request(KeysRequest(epoch, batch, self._broker_id, self._proof)))
            )
            if not got.values or len(got.values) > len(batch):
                raise RemoteProtocolError(f"the leader answered {len(got.values)} values for {len(batch)} keys")
            repairs.extend((db, key, value) for (db, key), value in zip(batch, got.values, strict=False))
            consistent_at = max(consistent_at, got.position)
            at += len(got.values)
        await self._call(partial(repl.truncate, start, repairs, consistent_at))
        self.position = start
        self._logs.log(logging.WARNING, "diverged", "log diverged from the leader's at %d (end was %d): "
                       "truncated, %d keys repaired, consistent from %d", start, position, len(repairs),
                       consistent_at)  # fmt: skip

    async def _snapshot(self, link: ReplicaLink, epoch: int, log_start: int | None = None) -> None:
        """Empty the store and copy the leader's, chunk by chunk (a fuzzy copy that the
        log from the first chunk's position on makes exact). ``log_start``: the
        leader's, when it answered TOO_OLD."""
        repl = self._repl
        why = "an interrupted copy" if log_start is None else f"behind the leader's log (it starts at {log_start})"
        if repl.converted_epoch and repl.last_epoch == repl.converted_epoch:
            log.warning("this replica holds data written before replication that its group's leader does not "
                        "have (epoch %d, position %d): it is replaced by a copy of the leader's store (start a "
                        "group from one converted store; the others join empty)", repl.converted_epoch,
                        repl.position)  # fmt: skip
        self._logs.log(logging.WARNING, "snapshot", "position %d: %s: copying the store",
                       repl.position, why)  # fmt: skip
        await self._call(repl.reset_for_snapshot)
        self.position = 0
        first: int | None = None
        last = 0
        items_copied = 0
        for db in REPLICATED_DATABASES:
            after: bytes | None = None
            while True:
                req = SnapshotRequest(
                    epoch, self._broker_id, db, after, SNAPSHOT_CHUNK_BYTES, FORMAT_VERSION, self._proof
                )
                chunk = decode_snapshot_answer(
                    await self._request(link, RequestCode.REPLICA_SNAPSHOT, encode_snapshot_request(req))
                )
                if first is None:
                    first = chunk.position
                last = max(last, chunk.position)
                if chunk.items:
                    items = chunk.items
                    await self._call(partial(repl.apply_snapshot_chunk, db, items))
                    items_copied += len(items)
                if chunk.last is None:
                    break
                if after is not None and chunk.last <= after:
                    raise RemoteProtocolError("the leader's snapshot cursor did not move forward")
                after = chunk.last
        assert first is not None
        await self._call(partial(repl.finish_snapshot, first, last, epoch))
        self.position = first
        self._logs.log(logging.WARNING, "snapshot", "copied the leader's store (%d items) at position %d; "
                       "consistent from %d", items_copied, first, last)  # fmt: skip



def _sole_error(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The error a connection's exception group carries: its first leaf, the
    leader's NotLeader / StaleEpoch preferred; None when a leaf is not an
    ``Exception`` (a cancellation: the group must propagate as it is)."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(reversed(exc.exceptions))
        else:
            leaves.append(exc)
    errors = [e for e in leaves if isinstance(e, Exception)]
    if len(errors) != len(leaves) or not errors:
        return None
    return next((e for e in errors if isinstance(e, (NotLeader, StaleEpoch))), errors[0])
