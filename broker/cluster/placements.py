"""The write side of topic placement: create, grow, delete topics in etcd.

etcd's ``/equeue/topics/<topic>`` is the one source of truth for which broker
group owns each queue. Every change is a transaction: a create-if-absent for a new
topic, a compare-and-swap on the record's mod_revision for a change (re-read and
retried when another broker changed it first, a bounded number of times), so two
brokers altering one topic at once never lose a queue. The rules (spread, grow)
are :mod:`equeue.placement`'s; the live groups and the load come from the
:class:`~equeue.broker.cluster.view.ClusterView`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TypeVar

import attrs

from equeue.broker.cluster.etcd import EtcdClient, compare_create, compare_exists, delete_op, put_op
from equeue.broker.cluster.view import ClusterView
from equeue.errors import BadRequest, ClusterUnavailable, TopicExists, TopicNotFound
from equeue.placement import (
    TopicPlacement,
    decode_topic,
    encode_topic,
    grow,
    load,
    pause_key,
    spread,
    topic_key,
)

__all__ = ["Placements"]

V = TypeVar("V")

#: compare-and-swap attempts before giving up on a topic others keep changing
_ATTEMPTS = 16


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _retention(value: V | None, current: V | None, reset: bool) -> V | None:
    """An ALTER's retention override or compression setting: None keeps ``current``,
    ``reset`` clears it (the brokers' default), a value (-1 forever, > 0 the limit; a
    compression setting) replaces it."""
    if reset:
        return None
    return current if value is None else value


class Placements:
    """Topic placement changes in etcd (see the module docstring).

    Every method raises ClusterUnavailable when etcd cannot be reached (or the view
    has not loaded yet), ClusterDataInvalid when the stored record does not decode,
    InvalidName for a name that cannot be a key. ``now_ms`` stamps ``created_ms``.
    """

    def __init__(
        self, etcd: EtcdClient, view: ClusterView, *, now_ms: Callable[[], int] = _wall_ms
    ) -> None:
        self._etcd = etcd
        self._view = view
        self._now_ms = now_ms

    def _loaded(self) -> ClusterView:
        if not self._view.ready.is_set():
            raise ClusterUnavailable("the cluster view has not loaded from etcd yet")
        return self._view

    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        compression: str | None = None,
    ) -> TopicPlacement:
        """Create ``name`` with ``queues`` queues spread over the live groups, least
        loaded first; retention None = the brokers' defaults, -1 = keep forever, > 0
        = the limit; ``compression`` a compression setting or None (the brokers'
        ``--compression``) (checked by the caller; the record refuses anything else
        with ValueError). Returns
        the placement stored. Raises TopicExists when the topic exists, unless
        ``exist_ok`` (then the existing placement is returned, unchanged);
        BadRequest for fewer than one queue; NoLiveGroups when no group is alive.
        The same transaction deletes any pause record left under the name (a topic
        created again under a name starts unpaused)."""
        key = topic_key(name)
        view = self._loaded()
        known = view.topic(name)
        if known is not None and exist_ok:
            return known
        for _ in range(_ATTEMPTS):
            placement = TopicPlacement(
                name=name,
                queues=queues,
                owners=spread(queues, view.live_groups(), view.load()),
                created_ms=self._now_ms(),
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                compression=compression,
            )
            created, _ = await self._etcd.txn(
                [compare_create(key, 0)],
                [put_op(key, encode_topic(placement)), delete_op(pause_key("topic", name))],
            )
            if created:
                return placement
            kv = await self._etcd.get(key)
            if kv is None:
                continue  # deleted in between: try again
            if not exist_ok:
                raise TopicExists(f"topic {name!r} already exists")
            return decode_topic(kv.value)
        raise ClusterUnavailable(f"topic {name!r} kept being created and deleted; try again")

    async def alter_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        reset: Collection[str] = (),
        compression: str | None = None,
    ) -> TopicPlacement:
        """Grow ``name`` to ``queues`` queues (None: unchanged; the new ones on the
        least loaded live groups, existing ones never move) and/or change its
        retention overrides (None: unchanged, -1: keep forever, > 0: the limit) or
        its compression setting (None: unchanged); a name in ``reset``
        (``"retention_ms"``, ``"retention_bytes"``, ``"compression"``) puts it back to
        the brokers' default. Returns the new placement. Raises TopicNotFound;
        BadRequest for fewer queues than now; NoLiveGroups when queues must be
        placed and no group is alive."""
        view = self._loaded()

        def change(current: TopicPlacement) -> TopicPlacement:
            new = current
            if queues is not None:
                if queues < current.queues:
                    raise BadRequest(
                        f"topic {name!r} has {current.queues} queues; queue counts only grow "
                        "(shrinking would strand stored messages)"
                    )
                others = [p for n, p in view.topics().items() if n != name]
                new = grow(
                    current, queues - current.queues, view.live_groups(), load([*others, current])
                )
            return attrs.evolve(
                new,
                retention_ms=_retention(retention_ms, current.retention_ms, "retention_ms" in reset),
                retention_bytes=_retention(retention_bytes, current.retention_bytes, "retention_bytes" in reset),
                compression=_retention(compression, current.compression, "compression" in reset),
            )

        return await self._update(name, change)

    async def ensure_queue_on(self, name: str, group: str) -> TopicPlacement:
        """Make sure ``group`` owns at least one queue of ``name`` (internal topics:
        a consumer group's ``%RETRY%``/``%DLQ%`` topic needs a queue on each group
        that sends back or dead-letters messages): if it owns none, append one
        queue owned by ``group``. Returns the placement. Raises TopicNotFound."""

        def change(current: TopicPlacement) -> TopicPlacement:
            if group in current.owners:
                return current
            return attrs.evolve(current, queues=current.queues + 1, owners=(*current.owners, group))

        return await self._update(name, change)

    async def delete_topic(self, name: str) -> bool:
        """Remove ``name``'s placement and its pause record in one transaction (never
        one without the other, even when etcd fails in between); False when there was
        no placement (then nothing is deleted)."""
        key = topic_key(name)
        deleted, _ = await self._etcd.txn([compare_exists(key)], [delete_op(key), delete_op(pause_key("topic", name))])
        return deleted

    async def pause_topic(self, name: str, record: bytes) -> bool:
        """Write ``record`` as the pause of topic ``name``, in a transaction that
        requires the placement read just before to still be there (a concurrent
        delete wins: no pause outlives its topic). True when written, False when the
        topic was already paused. Raises TopicNotFound when etcd has no placement."""
        key, pkey = topic_key(name), pause_key("topic", name)
        for _ in range(_ATTEMPTS):
            kv = await self._etcd.get(key)
            if kv is None:
                raise TopicNotFound(f"no topic {name!r}")
            written, _ = await self._etcd.txn(
                [compare_create(key, kv.create_revision), compare_create(pkey, 0)], [put_op(pkey, record)]
            )
            if written:
                return True
            if await self._etcd.get(pkey) is not None:
                again = await self._etcd.get(key)
                if again is not None and again.create_revision == kv.create_revision:
                    return False  # paused already
        raise ClusterUnavailable(f"topic {name!r} kept being created and deleted; try again")

    async def _update(
        self, name: str, change: Callable[[TopicPlacement], TopicPlacement]
    ) -> TopicPlacement:
        """Read, ``change``, compare-and-swap; again from the read when another
        writer got in first (bounded)."""
        key = topic_key(name)
        for _ in range(_ATTEMPTS):
            kv = await self._etcd.get(key)
            if kv is None:
                raise TopicNotFound(f"no topic {name!r}")
            current = decode_topic(kv.value)
            new = change(current)
            if new == current:
                return current
            if await self._etcd.replace(key, encode_topic(new), kv.mod_revision):
                return new
        raise ClusterUnavailable(
            f"topic {name!r} changed concurrently {_ATTEMPTS} times in a row; try again"
        )
