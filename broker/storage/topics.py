"""Topic administration: create, alter and delete topics (the ``topics`` database
and the ``deleting`` list in ``meta``). A deleted topic disappears at once; its
stored data is removed afterwards in bounded steps by
:class:`~broker.storage.retention.RetentionOp`."""

from __future__ import annotations

import json
from typing import Any

import attrs

from broker.storage.writes import WriteContext, WriteOp
from equeue import control
from equeue.errors import BadRequest, TopicExists, TopicNotFound


@attrs.define
class CreateTopicOp(WriteOp):
    """Create a topic; returns its :class:`~equeue.control.TopicInfo`. Raises
    TopicExists unless ``exist_ok`` (then the existing topic is returned)."""

    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    exist_ok: bool = False

    def apply(self, w: WriteContext) -> control.TopicInfo:
        existing = w.topic(self.name)
        if existing is not None:
            if self.exist_ok:
                return existing
            raise TopicExists(f"topic {self.name!r} already exists")
        w.wrote = True
        tid = w.next_topic_id if w.next_topic_id is not None else w.base.next_topic_id
        w.next_topic_id = tid + 1
        info = control.TopicInfo(
            self.name, tid, self.queues, w.now, self.retention_ms, self.retention_bytes
        )
        w.txn.put(self.name.encode(), control.encode(info), db=w.db[b"topics"])
        w.topics[self.name] = info
        for q in range(self.queues):
            w.queue(tid, q)
        return info


@attrs.define
class AlterTopicOp(WriteOp):
    """Grow a topic's queue count or change its retention overrides (a negative
    value clears one). Raises TopicNotFound, or BadRequest for fewer queues."""

    name: str
    queues: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None

    def apply(self, w: WriteContext) -> control.TopicInfo:
        info = w.topic(self.name)
        if info is None:
            raise TopicNotFound(f"no topic {self.name!r}")
        if self.queues is not None and self.queues < info.queues:
            raise BadRequest(
                f"topic {self.name!r} has {info.queues} queues; queue counts only grow "
                "(shrinking would strand stored messages)"
            )
        changes: dict[str, Any] = {}
        if self.queues is not None:
            changes["queues"] = self.queues
        if self.retention_ms is not None:
            changes["retention_ms"] = None if self.retention_ms < 0 else self.retention_ms
        if self.retention_bytes is not None:
            changes["retention_bytes"] = None if self.retention_bytes < 0 else self.retention_bytes
        new = attrs.evolve(info, **changes)
        w.wrote = True
        w.txn.put(self.name.encode(), control.encode(new), db=w.db[b"topics"])
        w.topics[self.name] = new
        for q in range(info.queues, new.queues):
            w.queue(new.topic_id, q)
        return new


@attrs.define
class DeleteTopicOp(WriteOp):
    """Remove a topic now; its stored data is removed in bounded background steps.
    Raises TopicNotFound."""

    name: str

    def apply(self, w: WriteContext) -> None:
        info = w.topic(self.name)
        if info is None:
            raise TopicNotFound(f"no topic {self.name!r}")
        w.wrote = True
        w.txn.delete(self.name.encode(), db=w.db[b"topics"])
        w.topics[self.name] = None
        deleting = w.deleting_now()
        deleting.append(info.topic_id)
        set_deleting(w, deleting)


def set_deleting(w: WriteContext, deleting: list[int]) -> None:
    """Stage and write the list of deleted topics whose data is still being removed."""
    w.deleting = deleting
    w.txn.put(b"deleting", json.dumps(deleting).encode(), db=w.db[b"meta"])
