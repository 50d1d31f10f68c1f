"""Pausing a topic's produce or a consumer group's consumption, in a standalone
broker's store (``equeue topic pause``, ``equeue group pause``; in a cluster the pauses
live in etcd instead, docs/cluster.md).

A pause is a marker in ``meta`` ("pause/topic/" or "pause/group/" + the name, see
:mod:`~equeue.broker.storage.layout`) and a name in the view's ``paused_topics`` or
``paused_groups``. It is written through the appender like any change, so it is
committed with the ops around it, survives a restart, and (in a replicated store) is
recorded in the replication log. Deleting a topic drops its pause
(:class:`~equeue.broker.storage.topics.DeleteTopicOp`).
"""

from __future__ import annotations

import attrs

from equeue.broker.storage import layout
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.errors import BadRequest, TopicNotFound

__all__ = ["SetPausedOp", "stage_pause"]


def stage_pause(w: WriteContext, kind: str, name: str, paused: bool) -> None:
    """Write (or delete) the pause marker of ``kind`` ``name`` and stage it in ``w``."""
    key = layout.pause_key(kind, name)
    if paused:
        w.txn.put(key, layout.pack_u64(w.now), db=w.db[b"meta"])
    else:
        w.txn.delete(key, db=w.db[b"meta"])
    w.paused[(kind, name)] = paused
    w.wrote = True


@attrs.define
class SetPausedOp(WriteOp):
    """Pause (``paused``) or resume topic or group ``name`` (``kind``: "topic" or
    "group"); returns whether this changed anything (False: it was so already, nothing
    written). Raises TopicNotFound for a topic the store does not have (resuming one
    that is gone but still marked is allowed), BadRequest for another kind."""

    kind: str
    name: str
    paused: bool

    def apply(self, w: WriteContext) -> bool:
        if self.kind not in layout.PAUSE_KINDS:
            raise BadRequest(f"cannot pause a {self.kind!r}: topics and groups only")
        was = w.is_paused(self.kind, self.name)
        if self.kind == "topic" and self.paused and w.topic(self.name) is None:
            raise TopicNotFound(f"no topic {self.name!r}")
        if was == self.paused:
            return False
        stage_pause(w, self.kind, self.name, self.paused)
        return True
