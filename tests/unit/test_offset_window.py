"""The consumer's sliding offset window (``equeue.consumer.offsets``) around a seek:
offsets dropped by a seek leave it, and an offset pending twice (a message still in a
handler's hands, pulled again after a seek back) is done twice before it counts."""

from __future__ import annotations

from equeue.consumer.offsets import OffsetWindow


def test_forget_drops_buffered_offsets_from_the_window() -> None:
    w = OffsetWindow(0)
    w.add(range(0, 10), 10)
    w.done_many([0, 1, 2])
    w.forget([5, 6, 7, 8, 9])  # buffered, dropped by a seek
    assert len(w) == 2
    assert w.committable() == 3
    w.jump(20)
    w.done_many([3, 4])
    assert len(w) == 0
    assert w.committable() == 20


def test_an_offset_pending_twice_is_done_twice() -> None:
    w = OffsetWindow(0)
    w.add([0, 1, 2, 3], 4)
    w.done(2)  # out of order: 0 still in a handler's hands
    w.jump(1)  # seek back to 1: 1, 2, 3 pulled again
    w.forget([1, 3])
    w.add([1, 2, 3], 4)
    assert len(w) == 4  # pending 0, 2 (done), 1, 2, 3
    w.done_many([2, 3])  # the new 2 done while the old 2's mark waits too
    w.done(1)
    assert w.committable() == 0
    w.done(0)
    assert w.committable() == 4
    assert len(w) == 0
