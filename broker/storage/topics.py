"""Topic administration: create, alter and delete topics (the ``topics`` database
and the ``deleting`` list in ``meta``). A deleted topic disappears at once; its
stored data is removed afterwards in bounded steps by
:class:`~equeue.broker.storage.retention.RetentionOp`.

A topic record is its :class:`~equeue.control.TopicInfo` as JSON, written by
:func:`encode_topic_record` and read by :func:`decode_topic_record` only: a
retention of -1 (keep forever) is stored as 0, which every earlier version reads as
"no limit"; 0 and negative values read back as -1 (:mod:`equeue.retention`)."""

from __future__ import annotations

import json
from typing import Any

import attrs

from equeue import control
from equeue.broker.storage.pauses import stage_pause
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import BadRequest, TopicExists, TopicNotFound
from equeue.retention import SETTINGS, from_record, is_legacy_record, to_record


def encode_topic_record(info: control.TopicInfo) -> bytes:
    """The stored form of ``info`` (the one encoder of the ``topics`` database). A
    pause is not part of it (it has its own marker, :mod:`equeue.broker.storage.pauses`)."""
    obj = control.converter.unstructure(
        attrs.evolve(info, retention_ms=to_record(info.retention_ms), retention_bytes=to_record(info.retention_bytes))
    )
    obj.pop("paused", None)
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_topic_record(raw: bytes) -> tuple[control.TopicInfo, dict[str, int]]:
    """A stored topic record → its TopicInfo (the one decoder), and the retention
    values no version of the current rule writes (negative: an earlier version took
    them from a client and deleted every message on them), by field name: they read
    as -1, keep forever, and the caller warns. Raises RemoteProtocolError for a
    record that does not decode."""
    info: control.TopicInfo = control.decode(raw, control.TopicInfo)
    legacy = {
        name: value
        for name, value in (("retention_ms", info.retention_ms), ("retention_bytes", info.retention_bytes))
        if value is not None and is_legacy_record(value)
    }
    return attrs.evolve(
        info, retention_ms=from_record(info.retention_ms), retention_bytes=from_record(info.retention_bytes)
    ), legacy


@attrs.define
class CreateTopicOp(WriteOp):
    """Create a topic; returns its :class:`~equeue.control.TopicInfo`. Retention
    overrides as checked by the caller (None: the broker's default, -1: forever,
    > 0: the limit). Raises TopicExists unless ``exist_ok`` (then the existing
    topic is returned)."""

    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    exist_ok: bool = False
    compression: str | None = None

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
            self.name, tid, self.queues, w.now, self.retention_ms, self.retention_bytes,
            compression=self.compression,
        )
        w.txn.put(self.name.encode(), encode_topic_record(info), db=w.db[b"topics"])
        w.topics[self.name] = info
        for q in range(self.queues):
            w.queue(tid, q)
        return info


#: the settings ``reset`` may name
_RESETTABLE = (*SETTINGS, "compression")


@attrs.define
class AlterTopicOp(WriteOp):
    """Grow a topic's queue count or change its retention overrides or its
    compression: a value (-1: forever, > 0: the limit; a compression setting)
    replaces one, None leaves it, a name in ``reset`` (``"retention_ms"``,
    ``"retention_bytes"``, ``"compression"``) puts it back to the broker's default.
    Raises TopicNotFound, or BadRequest for fewer queues."""

    name: str
    queues: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    reset: tuple[str, ...] = ()
    compression: str | None = None

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
            changes["retention_ms"] = self.retention_ms
        if self.retention_bytes is not None:
            changes["retention_bytes"] = self.retention_bytes
        if self.compression is not None:
            changes["compression"] = self.compression
        for name in self.reset:
            if name not in _RESETTABLE:
                raise BadRequest(f"reset: {name!r} is not a setting that can be reset")
            changes[name] = None
        new = attrs.evolve(info, **changes)
        w.wrote = True
        w.txn.put(self.name.encode(), encode_topic_record(new), db=w.db[b"topics"])
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
        if w.is_paused("topic", self.name):  # a topic created again under the name starts unpaused
            stage_pause(w, "topic", self.name, False)
        deleting = w.deleting_now()
        deleting.append(info.topic_id)
        set_deleting(w, deleting)


def set_deleting(w: WriteContext, deleting: list[int]) -> None:
    """Stage and write the list of deleted topics whose data is still being removed."""
    w.deleting = deleting
    w.txn.put(b"deleting", json.dumps(deleting).encode(), db=w.db[b"meta"])
