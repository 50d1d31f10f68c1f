"""Consumer offsets: :class:`CommitOffsetOp` (the ``offsets`` database)."""

from __future__ import annotations

import attrs

from broker.storage import layout
from broker.storage.writes import WriteContext, WriteOp


@attrs.define
class CommitOffsetOp(WriteOp):
    """Record ``offset`` as ``group``'s committed offset of one queue (never raises)."""

    group: str
    topic: str
    queue_id: int
    offset: int

    def inline_size(self) -> int:
        """One small put."""
        return 64

    def apply(self, w: WriteContext) -> None:
        w.wrote = True
        w.txn.put(
            layout.offset_key(self.group, self.topic, self.queue_id), layout.pack_u64(self.offset),
            db=w.db[b"offsets"],
        )  # fmt: skip
        w.offsets[(self.group, self.topic, self.queue_id)] = self.offset
