"""Compression at the store: a due message's batch takes its topic's codec."""

from __future__ import annotations

from pathlib import Path

from equeue import Message, wire
from equeue.broker.storage import CreateTopicOp, MoveDueOp, ProduceOp, Store
from equeue.wire.batches import Codec, batch_head, stored_batch


def test_due_messages_move_compressed_with_the_topics_codec(tmp_path: Path) -> None:
    """The topic's compression setting (else the broker's, given to MoveDueOp) applies
    to the batches of moved due messages as to a produce's."""
    now = [1_000]
    s = Store(tmp_path / "s", map_size=64 << 20, clock=lambda: now[0])
    try:
        lz, dflt = s.write([CreateTopicOp("lz", 1, compression="lz4"), CreateTopicOp("dflt", 1)]).settled()
        for info in (lz, dflt):
            due = [wire.encode_entry(Message(f"d{i}".encode(), deliver_at=5_000)) for i in range(3)]
            s.write([ProduceOp(info, 0, due)]).settled()
        now[0] = 10_000
        assert s.write([MoveDueOp(compression="zstd")]).settled() == [6]
        for info, codec in ((lz, Codec.LZ4), (dflt, Codec.ZSTD)):
            msgs, r = s.read_messages(info, 0, 0, 100)
            assert [m.text for m in msgs] == ["d0", "d1", "d2"]
            assert [batch_head(stored_batch(v), 1 << 20).codec for _, v, _ in r.batches] == [codec]
    finally:
        s.close()
