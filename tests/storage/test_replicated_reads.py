"""Reads of a replicated store stop at the published view (the high watermark):
lookups by global offset, by queue offset and by key, and pulls, never return a
message committed locally but not yet published (lookups: rleader 996d4bb;
pulls past the view's end, tag-filtered or from an offset beyond it: rfix)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue import Message, wire
from equeue.broker.storage import CreateTopicOp, ProduceOp, Store, messages_of
from equeue.control import TopicInfo


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "s", map_size=1 << 26, sync=False, replicated=True)
    yield s
    s.close()


def _produce(s: Store, info: TopicInfo, n: int) -> None:
    msgs = [wire.encode_entry(Message(f"m{i}".encode(), key="k", tags="t")) for i in range(n)]
    s.write([ProduceOp(info, 0, msgs)]).settled()


def test_lookups_and_pulls_stop_at_the_published_view(store: Store) -> None:
    (info,) = store.write([CreateTopicOp("t", 1)]).settled()
    assert isinstance(info, TopicInfo)
    _produce(store, info, 2)
    store.replication.publish_all()
    _produce(store, info, 3)  # committed, not published: globals 2..4, queue offsets 2..4
    assert store.head.next_global == 5 and store.view.next_global == 2

    assert store.get_global(1) is not None
    assert [store.get_global(g) for g in range(2, 5)] == [None] * 3
    assert store.get_queue_offset(info, 0, 1) is not None
    assert [store.get_queue_offset(info, 0, o) for o in range(2, 5)] == [None] * 3
    assert [h.global_offset for h in store.find_by_key(info, "k", 10).hits] == [1, 0]
    assert [h.global_offset for h in store.find_by_key(info, "k", 10, before=4).hits] == [1, 0]
    tagged = store.read_queue(info, 0, 0, 10, 1 << 20, tag_filter=frozenset({b"t"}))
    assert [g for g, _v, _m in tagged.batches] == [0] and tagged.next_offset == 2
    assert store.read_queue(info, 0, 0, 10, 1 << 20).batches == store.read_queue(info, 0, 0, 2, 1 << 20).batches
    assert store.read_queue(info, 0, 3, 10, 1 << 20).batches == []  # past the view's end

    store.replication.publish_all()
    assert [store.get_global(g) is not None for g in range(5)] == [True] * 5
    assert store.get_queue_offset(info, 0, 4) is not None
    assert [h.global_offset for h in store.find_by_key(info, "k", 10).hits] == [4, 3, 2, 1, 0]
    tagged = store.read_queue(info, 0, 0, 10, 1 << 20, tag_filter=frozenset({b"t"}))
    assert [g for g, _v, _m in tagged.batches] == [0, 2] and tagged.next_offset == 5
    assert [m.queue_offset for m in messages_of("t", store.read_queue(info, 0, 3, 10, 1 << 20).batches, 3)] == [3, 4]
