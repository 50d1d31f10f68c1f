"""Replication requests (docs/cluster.md, "Replicas, acks, failover"; layouts in docs/protocol.md):
REPLICA_FETCH, REPLICA_KEYS and REPLICA_SNAPSHOT (binary, a follower asks its
leader), REPLICA_DIGEST and REPLICATION_STATUS (JSON, any replica answers).

Every field a peer sends is checked before it reaches the store (a database index
that is not replicated, an empty or oversized key, absurd sizes): BAD_REQUEST, never
an internal error. A follower's well-formed requests (fetch, keys, snapshot) must
then prove who sent them (``identify``: a broker of this group registered under a live etcd
lease, with its registration's proof): a fetch is an acknowledgement that moves the
high watermark, so nothing else may send one (NOT_A_REPLICA). Reads that scan (keys, chunks, digests) run in a worker thread
(read transactions only), so the event loop keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from equeue import control
from equeue.broker.handlers.context import Parts, RequestContext
from equeue.broker.storage.layout import FORMAT_VERSION, REPLICATED_DATABASES
from equeue.errors import BadRequest, NotLeader, StaleEpoch
from equeue.wire.replica import (
    REPLICA_MAX_FRAME,
    FetchAnswer,
    FetchRequest,
    KeysAnswer,
    SnapshotAnswer,
    decode_fetch_request,
    decode_keys_request,
    decode_snapshot_request,
    encode_fetch_answer,
    encode_keys_answer,
    encode_snapshot_answer,
)

__all__ = ["HandOver", "Identify", "Recover", "ReplicaHandlers", "no_handover", "no_recovery", "no_replicas"]

#: LMDB's key size limit (a longer or empty key is no key of the store)
MAX_KEY = 511
#: keys one REPLICA_KEYS may ask for
MAX_KEYS = 65536
#: values one REPLICA_KEYS answer carries at most (the first always goes): the follower
#: asks again for the rest
KEYS_ANSWER_BYTES = 64 << 20
#: the largest chunk one REPLICA_SNAPSHOT may ask for
MAX_CHUNK_BYTES = 64 << 20
#: the largest fetch (entries past it still go whole: one at least)
MAX_FETCH_BYTES = REPLICA_MAX_FRAME // 2
#: the longest a fetch may wait for the leader's next commit
MAX_FETCH_WAIT_MS = 60_000
#: digest ranges: fewer global offsets per range would make answers of absurd size
MIN_DIGEST_RANGE = 1024
_REPLICATED = frozenset(REPLICATED_DATABASES)


class ReplicaLog(Protocol):
    """What the handlers read of the store's replication log
    (:class:`equeue.broker.storage.replicated.StoreReplication`)."""

    def read_keys(self, keys: Sequence[tuple[int, bytes]]) -> tuple[int, list[bytes | None]]: ...
    def snapshot_chunk(
        self, db: int, after: bytes | None, max_bytes: int
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes | None]: ...
    def digests(self, range_size: int) -> tuple[int, dict[str, str]]: ...
    @property
    def position(self) -> int: ...


class LeaderSide(Protocol):
    """What the handlers use of the leader's log (:class:`equeue.broker.replication.leader.LeaderLog`)."""

    async def fetch(self, req: FetchRequest) -> FetchAnswer: ...
    def pin(self, broker_id: str, position: int) -> None: ...


class Identify(Protocol):
    """``identify(broker_id, proof, peer)`` raises NotAReplica unless ``broker_id`` is
    a registered replica of this group whose registration ``proof`` matches
    (:meth:`equeue.broker.cluster.node.ClusterNode.check_replica`)."""

    def __call__(self, broker_id: str, proof: bytes, peer: str = "?", /) -> None: ...


def no_replicas(broker_id: str, proof: bytes, peer: str = "?") -> None:
    """The ``identify`` of a standalone broker: it has no replicas (BadRequest)."""
    raise BadRequest("this broker is standalone: it has no replicas")


class Recover(Protocol):
    """``recover(req)``: write the group's ISR record as the operator asked
    (:meth:`equeue.broker.cluster.node.ClusterNode.recover`); raises BadRequest when it may not."""

    async def __call__(self, req: control.ClusterRecover, /) -> None: ...


class HandOver(Protocol):
    """``hand_over(to)``: hand this leader's group to the in-sync follower ``to``
    (:meth:`equeue.broker.replication.role.ReplicaRole.hand_over`); returns the target."""

    async def __call__(self, to: str = "", /) -> str: ...


async def no_handover(to: str = "") -> str:
    """The ``hand_over`` of a standalone broker: it has no group (BadRequest)."""
    raise BadRequest("this broker is standalone: it has no broker group to hand over")


async def no_recovery(req: control.ClusterRecover) -> None:
    """The ``recover`` of a standalone broker: it has no group (BadRequest)."""
    raise BadRequest("this broker is standalone: it has no broker group to recover")


class ReplicaHandlers:
    """The replication requests. ``log`` is the store's replication log (None on a
    standalone broker); ``leader_log()`` is the leader's log while this
    broker leads (None otherwise: NOT_LEADER); ``status()`` its replication state
    (epoch, role, followers); ``identify`` checks a follower's identity (see
    :class:`Identify`; a standalone broker refuses every follower); ``recover``
    carries out CLUSTER_RECOVER (see :class:`Recover`)."""

    def __init__(
        self, *, log: ReplicaLog | None, leader_log: Callable[[], LeaderSide | None],
        status: Callable[[], control.ReplicationStatus], identify: Identify = no_replicas,
        recover: Recover = no_recovery, hand_over: HandOver = no_handover,
    ) -> None:  # fmt: skip
        self._log = log
        self._leader_log = leader_log
        self._status = status
        self._identify = identify
        self._recover = recover
        self._hand_over = hand_over

    def _replicated(self) -> control.ReplicationStatus:
        """This broker's replication state; raises BadRequest on a standalone broker
        (it keeps no replication log)."""
        status = self._status()
        if status.role == "standalone":
            raise BadRequest("this broker is standalone: it keeps no replication log")
        return status

    def _replica_log(self) -> ReplicaLog:
        """The store's replication log; raises BadRequest on a standalone broker."""
        if self._log is None:
            raise BadRequest("this broker is standalone: it keeps no replication log")
        return self._log

    def _leading(self, epoch: int) -> LeaderSide:
        """The leader's log when this broker leads ``epoch``; raises NotLeader or
        StaleEpoch (BadRequest on a standalone broker)."""
        leader = self._leader_log()
        status = self._replicated()
        if leader is None or status.role != "leader":
            who = f"; the leader is {status.leader}" if status.leader else ""
            raise NotLeader(f"broker {status.broker_id!r} is not the leader of group {status.group!r}{who}")
        if epoch != status.epoch:
            raise StaleEpoch(f"epoch {epoch} asked; the leader of group {status.group!r} is at epoch {status.epoch}")
        return leader

    async def fetch(self, payload: bytes, ctx: RequestContext | None = None) -> Parts:
        """REPLICA_FETCH: the leader's entries from the follower's position (long poll).
        Raises NotAReplica (not a verified replica of this group), NotLeader,
        StaleEpoch, BadRequest."""
        req = decode_fetch_request(payload)
        _check_name("broker_id", req.broker_id)
        _check_name("address", req.address)
        _check_format(req.broker_id, req.store_format)
        if not 0 < req.max_bytes <= MAX_FETCH_BYTES:
            raise BadRequest(f"max_bytes must be in 1..{MAX_FETCH_BYTES}, got {req.max_bytes}")
        if req.wait_ms > MAX_FETCH_WAIT_MS:
            raise BadRequest(f"wait_ms must be at most {MAX_FETCH_WAIT_MS}, got {req.wait_ms}")
        self._identify(req.broker_id, req.proof, _peer(ctx))
        leader = self._leader_log()
        if leader is None:
            status = self._replicated()
            raise NotLeader(f"broker {status.broker_id!r} is not the leader of group {status.group!r}")
        return encode_fetch_answer(await leader.fetch(req))

    async def keys(self, payload: bytes, ctx: RequestContext | None = None) -> Parts:
        """REPLICA_KEYS: the current values of the keys asked (a truncating replica's
        repairs), read at one position. Raises NotAReplica, NotLeader, StaleEpoch,
        BadRequest."""
        req = decode_keys_request(payload)
        keys = req.keys
        if len(keys) > MAX_KEYS:
            raise BadRequest(f"at most {MAX_KEYS} keys per request, got {len(keys)}")
        for db, key in keys:
            _check_db(db)
            _check_key(key)
        self._identify(req.broker_id, req.proof, _peer(ctx))
        self._leading(req.epoch)
        position, values = await trio.to_thread.run_sync(self._replica_log().read_keys, keys)
        total = 0
        for n, v in enumerate(values):  # bound the answer: the follower asks for the rest
            total += len(v) if v is not None else 0
            if total > KEYS_ANSWER_BYTES and n:
                values = values[:n]
                break
        return encode_keys_answer(KeysAnswer(position, values))

    async def snapshot(self, payload: bytes, ctx: RequestContext | None = None) -> Parts:
        """REPLICA_SNAPSHOT: one chunk of one replicated database; the leader keeps its
        log for the follower from this chunk's position on. Raises NotAReplica,
        NotLeader, StaleEpoch, BadRequest."""
        req = decode_snapshot_request(payload)
        _check_format(req.broker_id, req.store_format)
        _check_db(req.db)
        if req.after is not None:
            _check_key(req.after)
        if not 0 < req.max_bytes <= MAX_CHUNK_BYTES:
            raise BadRequest(f"max_bytes must be in 1..{MAX_CHUNK_BYTES}, got {req.max_bytes}")
        self._identify(req.broker_id, req.proof, _peer(ctx))
        leader = self._leading(req.epoch)
        # pinned before the read: the chunk's position is at or past it, so every
        # entry the follower needs after its copy stays in the log
        leader.pin(req.broker_id, self._replica_log().position)
        position, items, last = await trio.to_thread.run_sync(
            self._replica_log().snapshot_chunk, req.db, req.after, req.max_bytes
        )
        return encode_snapshot_answer(SnapshotAnswer(position, items, last))

    async def digest(self, req: control.ReplicaDigestRequest, ctx: RequestContext | None = None) -> control.ReplicaDigest:
        """REPLICA_DIGEST: checksums of the store at one log position (read in a worker
        thread: it scans the whole store). Raises BadRequest for an absurd range size
        or on a standalone broker."""
        status = self._replicated()
        if not MIN_DIGEST_RANGE <= req.range_size < 1 << 63:
            raise BadRequest(f"range_size must be in {MIN_DIGEST_RANGE}..2^63-1, got {req.range_size}")
        position, digests = await trio.to_thread.run_sync(self._replica_log().digests, req.range_size)
        return control.ReplicaDigest(status.broker_id, status.epoch, position, digests)

    async def replication_status(
        self, req: control.ReplicationStatusRequest, ctx: RequestContext | None = None
    ) -> control.ReplicationStatus:
        """REPLICATION_STATUS: this broker's replication state."""
        return self._status()

    async def hand_over(self, req: control.ClusterHandover, ctx: RequestContext | None = None) -> control.ReplicationStatus:
        """CLUSTER_HANDOVER: hand this leader's group to an in-sync follower; answers
        this broker's state after it (a follower of the target). Raises BadRequest
        (another group, not an in-sync follower, standalone), NotLeader, BrokerBusy
        (the target did not catch up in time: this broker keeps leading),
        ClusterUnavailable."""
        status = self._replicated()
        if req.group != status.group:
            raise BadRequest(f"this broker is a replica of group {status.group!r}, not {req.group!r}")
        await self._hand_over(req.to)
        return self._status()

    async def recover(self, req: control.ClusterRecover, ctx: RequestContext | None = None) -> control.ReplicationStatus:
        """CLUSTER_RECOVER: write the group's ISR record as the operator asked (after
        etcd lost the group's records); answers this replica's state after it.
        Raises BadRequest (standalone, another group, an epoch below this replica's,
        etcd already has a leader or a newer record), ClusterUnavailable."""
        await self._recover(req)
        return self._status()


def _peer(ctx: RequestContext | None) -> str:
    session = ctx.session if ctx is not None else None
    return session.peer if session is not None else "?"


def _check_db(db: int) -> None:
    if db not in _REPLICATED:
        raise BadRequest(f"database index {db} is not a replicated database")


def _check_key(key: bytes) -> None:
    if not 0 < len(key) <= MAX_KEY:
        raise BadRequest(f"a key must be 1..{MAX_KEY} bytes, got {len(key)}")


def _check_name(field: str, value: str) -> None:
    if not 0 < len(value) <= 255:
        raise BadRequest(f"{field} must be 1..255 characters, got {len(value)}")


def _check_format(broker_id: str, store_format: int) -> None:
    """Refuse a follower whose store format is not this broker's: log entries carry
    raw index keys in the writer's layout, so applying them to a store of another
    format would corrupt its indexes (an old follower sends no format: 1)."""
    if store_format != FORMAT_VERSION:
        raise BadRequest(
            f"follower {broker_id!r} has store format {store_format}, this leader {FORMAT_VERSION}: "
            "the replicas of a group must run the same store format (upgrade them together; "
            "docs/storage.md, \"The key index\")"
        )
