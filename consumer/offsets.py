"""Sliding-window offsets: which offset of a queue is safe to commit.

Messages of one queue are handled concurrently and finish in any order. The
committable offset is the lowest offset not yet done (so a restart redelivers it
and everything after it), or, when everything pulled is done, the offset the next
pull starts from (past messages a tag filter skipped). A message that failed and was
sent to the retry topic counts as done, so it never holds back later offsets.
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

    __slots__ = ("_done", "_head", "_pending", "end")

    def __init__(self, start: int) -> None:
        #: offsets pulled, in pull order; those before ``_head`` are done and gone
        self._pending: list[int] = []
        self._head = 0
        #: offsets done out of order (at or after ``_head``)
        self._done: set[int] = set()
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
        """Mark one pulled offset done (call once per offset)."""
        self._done.add(offset)

    def done_many(self, offsets: list[int]) -> None:
        """Mark pulled offsets done (each once)."""
        h, n = self._head, len(offsets)
        pending = self._pending
        if n and pending[h : h + n] == offsets:  # the oldest outstanding, in order
            self._advance_head(h + n)
        else:
            self._done.update(offsets)
        h = self._head
        if self._done and h < len(pending) and pending[h] in self._done:
            self.committable()  # out-of-order ones now at the head: drop them too

    def committable(self) -> int:
        """The lowest offset not yet done, or :attr:`end` when all is done."""
        pending, done, h = self._pending, self._done, self._head
        if done:
            size = len(pending)
            while h < size and pending[h] in done:
                done.discard(pending[h])
                h += 1
            self._advance_head(h)
            h = self._head
        return pending[h] if h < len(pending) else self.end

    def _advance_head(self, h: int) -> None:
        if h >= len(self._pending):
            self._pending.clear()
            self._done.clear()  # every done offset was pulled: none is left outstanding
            h = 0
        elif h > 4096 and 2 * h > len(self._pending):
            del self._pending[:h]
            h = 0
        self._head = h

    def __len__(self) -> int:
        """Messages pulled and not yet done (what flow control counts)."""
        return len(self._pending) - self._head - len(self._done)
