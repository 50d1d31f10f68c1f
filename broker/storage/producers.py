"""Producer-state expiry: :class:`ExpireProducersOp` forgets the idempotence state
(``producers`` database) of producers silent for too long, in bounded batches."""

from __future__ import annotations

import attrs

from equeue.broker.storage import layout
from equeue.broker.storage.writes import WriteContext, WriteOp


@attrs.define
class ExpireProducersOp(WriteOp):
    """Forget the idempotence state of producers silent for longer than ``ttl_ms``.

    Examines at most ``limit`` entries from ``start`` (a key; b"" = the first) and
    returns ``(removed, next_start)``; ``next_start`` is None once the end was reached,
    so the caller walks the whole table in bounded transactions.
    """

    ttl_ms: int
    limit: int = 10_000
    start: bytes = b""

    def apply(self, w: WriteContext) -> tuple[int, bytes | None]:
        cur = w.txn.cursor(db=w.db[b"producers"])
        ok = cur.set_range(self.start) if self.start else cur.first()
        n = seen = 0
        horizon = w.now - self.ttl_ms
        while ok and seen < self.limit:
            seen += 1
            if layout.producer_last_seen(cur.value()) < horizon:
                w.wrote = True
                n += 1
                cur.delete()  # moves to the next entry (key b"" past the end)
                ok = bool(cur.key())
            else:
                ok = cur.next()
        return n, (bytes(cur.key()) or None) if ok else None
