"""Consumer offsets: :class:`CommitOffsetOp`, :class:`DeleteGroupOffsetsOp` (the
``offsets`` database)."""

from __future__ import annotations

import attrs

from equeue.broker.storage import layout
from equeue.broker.storage.writes import WriteContext, WriteOp


@attrs.define
class CommitOffsetOp(WriteOp):
    """Record ``offset`` as ``group``'s committed offset of one queue (never raises).

    ``forward_only`` (a lease-holding member's commit): an offset below the one
    committed is not written. Such a commit comes from a hold of the queue that ended
    (the member lost the lease, another member consumed further and committed, and the
    first member holds the queue again): moving the group back would deliver again what
    was consumed. Checked in the write transaction, so concurrent commits cannot race
    it. RESET_OFFSETS writes without it (moving back is its purpose)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    forward_only: bool = False

    def inline_size(self) -> int:
        """One small put."""
        return 64

    def apply(self, w: WriteContext) -> None:
        key = layout.offset_key(self.group, self.topic, self.queue_id)
        db = w.db[b"offsets"]
        if self.forward_only:
            held = w.txn.get(key, db=db)
            if held is not None and layout.unpack_u64(held) > self.offset:
                return
        w.wrote = True
        w.txn.put(key, layout.pack_u64(self.offset), db=db)
        where = (self.group, self.topic, self.queue_id)
        w.offsets[where] = self.offset
        w.offsets_removed.discard(where)


@attrs.define
class DeleteGroupOffsetsOp(WriteOp):
    """Delete every committed offset of ``group`` (DELETE_GROUP); the number deleted
    (never raises). The deletes are physical (a replica's log carries them)."""

    group: str

    def inline_size(self) -> None:
        """Never on the event loop: it scans every committed offset of the store."""
        return None

    def apply(self, w: WriteContext) -> int:
        db = w.db[b"offsets"]
        staged = {k for k in w.offsets if k[0] == self.group}
        held = {k for k in w.base.offsets if k[0] == self.group} - w.offsets_removed
        gone = 0
        for where in sorted(staged | held):
            if w.txn.delete(layout.offset_key(*where), db=db):
                gone += 1
            w.offsets.pop(where, None)
            w.offsets_removed.add(where)
        if gone:
            w.wrote = True
        return gone
