"""Which topics and consumer groups an operator paused, for the request handlers and
the metrics (docs/operations.md, "Pause and resume").

Standalone, a pause lives in the store (:mod:`equeue.broker.storage.pauses`: written
through the appender, so it survives a restart and reaches a replica through the
replication log); in a cluster it lives in etcd (:mod:`equeue.placement`, the
``paused/`` records), which every broker group watches through its view, so every
group honours it and it survives restarts and failovers. :class:`Pauses` hides which:
the produce path tests one set membership, a pull of a paused group waits in
:meth:`Pauses.wait_for` until the group is resumed (or its hold time ends).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from equeue.broker.storage import SetPausedOp, StoreReader
from equeue.broker.storage.writes import WriteOp

__all__ = ["ClusterPauses", "Pauses"]

class ClusterPauses(Protocol):
    """What :class:`Pauses` uses of the cluster role (:class:`equeue.broker.cluster.node.ClusterNode`)."""

    def paused(self, kind: str) -> frozenset[str]:
        """The paused names of ``kind`` ("topic" or "group") in the view of etcd."""

    async def set_paused(self, kind: str, name: str, paused: bool) -> bool:
        """Write the pause into etcd (or remove it); return once this broker's view
        shows it. True when it changed something."""

    def on_pauses(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after each change of the paused names (loop thread)."""


class Pauses:
    """The paused topics and groups of the store (standalone) or of etcd (``cluster``)."""

    def __init__(self, store: StoreReader, submit: Callable[[WriteOp], Awaitable[Any]], cluster: ClusterPauses | None = None) -> None:
        self._store = store
        self._submit = submit
        self._cluster = cluster
        self._changed = trio.Event()
        #: called (loop thread) after each change of the paused names
        self.listeners: list[Callable[[], None]] = []
        #: set at shutdown: held pulls are answered at once
        self.closed = False
        #: how many :meth:`wait_for` calls (held pulls) are waiting now (read-only)
        self.held = 0
        if cluster is not None:
            cluster.on_pauses(self.notify)

    def topics(self) -> frozenset[str]:
        """The topics whose produce is refused (TOPIC_PAUSED)."""
        cluster = self._cluster
        return self._store.view.paused_topics if cluster is None else cluster.paused("topic")

    def groups(self) -> frozenset[str]:
        """The consumer groups whose pulls are held."""
        cluster = self._cluster
        return self._store.view.paused_groups if cluster is None else cluster.paused("group")

    def topic_paused(self, name: str) -> bool:
        return name in self.topics()

    def group_paused(self, name: str) -> bool:
        return name in self.groups()

    async def set(self, kind: str, name: str, paused: bool) -> bool:
        """Pause or resume topic or group ``name`` (``kind``: "topic" or "group");
        True when this changed something. Raises TopicNotFound (pausing an unknown
        topic), ClusterUnavailable (etcd unreachable)."""
        cluster = self._cluster
        if cluster is not None:
            return await cluster.set_paused(kind, name, paused)
        changed = await self._submit(SetPausedOp(kind, name, paused))
        self.notify()
        return bool(changed)

    def notify(self) -> None:
        """The paused names changed: wake :meth:`wait_for`, call the listeners (loop thread)."""
        self._changed.set()
        self._changed = trio.Event()
        for listener in self.listeners:
            listener()

    def close(self) -> None:
        """Shutdown: end every :meth:`wait_for` now."""
        self.closed = True
        self.notify()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true (checked after each change of the paused
        names) or the broker is closing. Bound it with a cancel scope. Counted in
        :attr:`held` while it waits."""
        if predicate() or self.closed:
            return
        self.held += 1
        try:
            while not predicate() and not self.closed:
                await self._changed.wait()
        finally:
            self.held -= 1
