"""The Spark reader's Arrow columns of batch-layout answers against the consumer's decoder of the same records."""

from __future__ import annotations

import itertools

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from equeue import Message, wire  # noqa: E402
from equeue.errors import CorruptRecord  # noqa: E402
from equeue.protocol import PullStatus  # noqa: E402
from equeue.spark.columns import batches_batch  # noqa: E402
from equeue.wire.batches import Codec, encode_batch, encode_stored  # noqa: E402

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("global_offset", pa.int64()),
        ("key", pa.string()),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

texts = st.none() | st.text(max_size=12)
messages = st.builds(
    Message,
    body=st.binary(max_size=60),
    key=texts,
    tags=texts,
    properties=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


def batches_answer(msgs: list[Message], cuts: list[int], first: int, nxt: int, codec: str = "none") -> bytes:
    """``msgs`` at queue offsets 40.. (global 1000..), stored as batches split at ``cuts``."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(msgs))), len(msgs)]
    batches = [
        (1000 + a, encode_stored(7, 2, 40 + a, 1_700_000_000_000, 1_700_000_000_000, None, 0,
                                 encode_batch(msgs[a:b], Codec.parse(codec))), b"")
        for a, b in itertools.pairwise(bounds)
    ]  # fmt: skip
    return b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, nxt, batches))


@settings(max_examples=100, deadline=None)
@given(msgs=st.lists(messages, min_size=1, max_size=20), data=st.data())
def test_batches_batch_matches_the_decoder(msgs: list[Message], data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(1, 19), max_size=3))
    first = data.draw(st.integers(40, 40 + len(msgs) - 1))
    end = data.draw(st.integers(first + 1, 40 + len(msgs) + 2))
    nxt = data.draw(st.integers(first, 40 + len(msgs)))
    buf = batches_answer(msgs, cuts, first, nxt, data.draw(st.sampled_from(["none", "zstd", "lz4"])))
    rows, reached = batches_batch(buf, "orders", 2, first, end, SCHEMA)
    assert reached == max(first, min(nxt, end))
    want = wire.decode_pull_batches("orders", buf, first, True, reached)[4]
    assert [m.queue_offset for m in want] == list(range(first, reached))
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["global_offset"], r["key"], r["tags"], r["body"],
             dict(r["properties"]), int(r["timestamp"].timestamp() * 1000)) for r in rows.to_pylist()] == [
        ("orders", 2, m.queue_offset, m.global_offset, m.key, m.tags, m.body, m.properties, m.timestamp)
        for m in want]  # fmt: skip
    assert [r["body"] for r in rows.to_pylist()] == [m.body for m in msgs[first - 40 : reached - 40]]


def test_batches_batch_refuses_another_queue_and_damage() -> None:
    buf = batches_answer([Message(b"a"), Message(b"b")], [], 40, 42)
    with pytest.raises(CorruptRecord, match="another queue"):
        batches_batch(buf, "t", 3, 40, 42, SCHEMA)
    with pytest.raises(CorruptRecord, match="malformed"):
        batches_batch(buf[:-1], "t", 2, 40, 42, SCHEMA)
    bad = bytearray(buf)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecord, match="checksum"):
        batches_batch(bytes(bad), "t", 2, 40, 42, SCHEMA)
