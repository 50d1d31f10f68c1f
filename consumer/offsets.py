"""Sliding-window offsets: which offset of a queue is safe to commit.

Messages of one queue are handled concurrently and finish in any order. The
committable offset is the lowest offset not yet done (so a restart redelivers it
and everything after it), or, when everything pulled is done, the offset the next
pull starts from (past messages a tag filter skipped). A message that failed and was
sent to the retry topic counts as done, so it never holds back later offsets.

After a seek back (:meth:`equeue.consumer.AsyncConsumer.seek`) an offset may be pending
twice: once for a message still in a handler's hands, once pulled again. Each is done
once; a second done mark of an offset already marked waits in ``_extra`` (rare: the hot
path pays one set lookup per out-of-order mark).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OffsetWindow"]


class OffsetWindow:
    """Offsets pulled but not yet done, for one queue.

    ``add`` the offsets of each pulled batch (increasing), ``done`` each offset once
    when its message is finished; :meth:`committable` is the offset to commit.
    Amortised O(1) per message; O(1) per chunk for a chunk done in pull order (the
    common case: :meth:`done_many` of the oldest outstanding offsets only moves a head).
    """

    __slots__ = ("_done", "_extra", "_head", "_pending", "end")

    def __init__(self, start: int) -> None:
        #: offsets pulled, in pull order; those before ``_head`` are done and gone
        self._pending: list[int] = []
        self._head = 0
        #: offsets done out of order (at or after ``_head``)
        self._done: set[int] = set()
        #: further done marks of offsets already in ``_done`` (an offset pending twice)
        self._extra: dict[int, int] = {}
        #: where the next pull starts (exclusive end of what was pulled)
        self.end = start

    def add(self, offsets: Iterable[int], end: int) -> None:
        """Record a pulled batch (offsets increasing, all below ``end``)."""
        self._pending.extend(offsets)
        if end > self.end:
            self.end = end

    def advance(self, end: int) -> None:
        """The next pull starts at ``end`` (nothing pulled: e.g. tag-filtered messages)."""
        if end > self.end:
            self.end = end

    def jump(self, offset: int) -> None:
        """The next pull starts at ``offset`` (start, offset too small / overflow).

        Messages still outstanding stay tracked (they may be below ``offset``).
        """
        self.end = offset

    def done(self, offset: int) -> None:
        """Mark one pulled offset done (call once per offset pulled)."""
        if offset in self._done:
            self._extra[offset] = self._extra.get(offset, 0) + 1
        else:
            self._done.add(offset)

    def forget(self, offsets: list[int]) -> None:
        """Offsets pulled and never handed out leave the window (a seek dropped them):
        they neither hold back the committable offset nor count as outstanding."""
        drop = dict.fromkeys(offsets, 0)
        for off in offsets:
            drop[off] += 1
        kept = []
        for off in self._pending[self._head :]:
            if drop.get(off):
                drop[off] -= 1
            else:
                kept.append(off)
        self._pending, self._head = kept, 0
        if not kept:
            self._done.clear()
            self._extra.clear()

    def done_many(self, offsets: list[int]) -> None:
        """Mark pulled offsets done (each once)."""
        h, n = self._head, len(offsets)
        pending = self._pending
        if n and pending[h : h + n] == offsets:  # the oldest outstanding, in order
            self._advance_head(h + n)
        elif self._done.isdisjoint(offsets):
            self._done.update(offsets)
        else:
            for off in offsets:
                self.done(off)
        h = self._head
        if self._done and h < len(pending) and pending[h] in self._done:
            self.committable()  # out-of-order ones now at the head: drop them too

    def committable(self) -> int:
        """The lowest offset not yet done, or :attr:`end` when all is done."""
        pending, done, h = self._pending, self._done, self._head
        if done:
            size = len(pending)
            extra = self._extra
            while h < size and pending[h] in done:
                off = pending[h]
                if extra and off in extra:  # one of several marks of an offset pending twice
                    extra[off] -= 1
                    if not extra[off]:
                        del extra[off]
                else:
                    done.discard(off)
                h += 1
            self._advance_head(h)
            h = self._head
        return pending[h] if h < len(pending) else self.end

    def _advance_head(self, h: int) -> None:
        if h >= len(self._pending):
            self._pending.clear()
            self._done.clear()  # every done offset was pulled: none is left outstanding
            self._extra.clear()
            h = 0
        elif h > 4096 and 2 * h > len(self._pending):
            del self._pending[:h]
            h = 0
        self._head = h

    def __len__(self) -> int:
        """Messages pulled and not yet done (what flow control counts)."""
        return len(self._pending) - self._head - len(self._done) - sum(self._extra.values())
