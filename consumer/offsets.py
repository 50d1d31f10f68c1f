"""Sliding-window offsets: which offset of a queue is safe to commit.

Messages of one queue are handled concurrently and finish in any order. The
committable offset is the lowest offset not yet done (so a restart redelivers it
and everything after it), or, when everything pulled is done, the offset the next
pull starts from (past messages a tag filter skipped). A message that failed and was
sent to the retry topic counts as done, so it never holds back later offsets.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["OffsetWindow"]


class OffsetWindow:
    """Offsets pulled but not yet done, for one queue.

    ``add`` the offsets of each pulled batch (increasing), ``done`` each offset once
    when its message is finished; :meth:`committable` is the offset to commit.
    Amortised O(1) per message.
    """

    __slots__ = ("_done", "_pending", "end")

    def __init__(self, start: int) -> None:
        self._pending: deque[int] = deque()
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

    def committable(self) -> int:
        """The lowest offset not yet done, or :attr:`end` when all is done."""
        pending, done = self._pending, self._done
        while pending and pending[0] in done:
            done.discard(pending.popleft())
        return pending[0] if pending else self.end

    def __len__(self) -> int:
        """Messages pulled and not yet done (what flow control counts)."""
        return len(self._pending) - len(self._done)
