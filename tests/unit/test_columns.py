"""The Spark reader's Arrow columns of batch-layout answers against the consumer's decoder of the same records."""

from __future__ import annotations

import itertools

import pytest

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from equeue import Message, wire  # noqa: E402
from equeue.errors import CorruptRecord  # noqa: E402
from equeue.protocol import PullStatus  # noqa: E402
from equeue.spark.columns import _same_length_bounds, batches_batch  # noqa: E402
from equeue.wire import batches as layout  # noqa: E402
from equeue.wire.batches import Codec, encode_batch, encode_record, encode_stored, seal_records  # noqa: E402
from equeue.wire.batches import _uvarint as batches_uvarint  # noqa: E402

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


def batches_answer(
    msgs: list[Message], cuts: list[int], first: int, nxt: int, codec: str = "none", dropped: frozenset[int] = frozenset()
) -> bytes:
    """``msgs`` at queue offsets 40.. (global 1000..), stored as batches split at
    ``cuts``; the records at the indexes ``dropped`` masked out."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(msgs))), len(msgs)]
    batches = [
        (1000 + a, encode_stored(7, 2, 40 + a, 1_700_000_000_000, 1_700_000_000_000, None, 0,
                                 encode_batch(msgs[a:b], Codec.parse(codec))),
         wire.mask_of(b - a, [i - a for i in range(a, b) if i not in dropped]) if dropped else b"")
        for a, b in itertools.pairwise(bounds)
    ]  # fmt: skip
    return b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, nxt, batches))


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[object, ...]]:
    """The rows of the reader's batches, the timestamp as integer milliseconds (exact)."""
    table = pa.Table.from_batches(batches, SCHEMA)
    ms = [None if t is None else t // 1000 for t in table.column("timestamp").cast(pa.int64()).to_pylist()]
    return [(r["topic"], r["queue_id"], r["queue_offset"], r["global_offset"], r["key"], r["tags"], r["body"],
             dict(r["properties"]), t) for r, t in zip(table.to_pylist(), ms, strict=True)]  # fmt: skip


def decoded(msgs: list[Message]) -> list[tuple[object, ...]]:
    return [("orders", 2, m.queue_offset, m.global_offset, m.key, m.tags, m.body, m.properties, m.timestamp)
            for m in msgs]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(msgs=st.lists(messages, min_size=1, max_size=20), data=st.data())
def test_batches_batch_matches_the_decoder(msgs: list[Message], data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(1, 19), max_size=3))
    first = data.draw(st.integers(40, 40 + len(msgs) - 1))
    end = data.draw(st.integers(first + 1, 40 + len(msgs) + 2))
    nxt = data.draw(st.integers(first, 40 + len(msgs)))
    dropped = frozenset(data.draw(st.lists(st.integers(0, len(msgs) - 1), max_size=4)))
    codec = data.draw(st.sampled_from(["none", "zstd", "lz4"]))
    buf = batches_answer(msgs, cuts, first, nxt, codec, dropped)
    rows, reached = batches_batch(buf, "orders", 2, first, end, SCHEMA)
    assert reached == max(first, min(nxt, end))
    want = wire.decode_pull_batches("orders", buf, first, True, reached)[4]
    assert [m.queue_offset for m in want] == [o for o in range(first, reached) if o - 40 not in dropped]
    assert rows_of(rows) == decoded(want)
    assert [r[6] for r in rows_of(rows)] == [m.body for m in want]


@settings(max_examples=150, deadline=None)
@given(size=st.integers(0, 140), n=st.integers(1, 30), data=st.data())
def test_records_of_one_length_and_near_misses_match_the_decoder(size: int, n: int, data: st.DataObject) -> None:
    """Records of one length are bounded by one vectorised check of their prefixes
    (the walk otherwise); records whose lengths only add up as if they were (one
    shorter, one longer) are walked. Both give the decoder's rows."""
    bodies = [bytes([i % 256]) * size for i in range(n)]
    uneven = n >= 2 and size >= 1 and data.draw(st.booleans())
    if uneven:
        i, j = data.draw(st.permutations(range(n)))[:2]
        bodies[i], bodies[j] = bodies[i][:-1], bodies[j] + b"!"
    msgs = [Message(b) for b in bodies]
    cuts = data.draw(st.lists(st.integers(1, 29), max_size=3))
    buf = batches_answer(msgs, cuts, 40, 40 + n)
    rows, reached = batches_batch(buf, "orders", 2, 40, 40 + n, SCHEMA)
    want = wire.decode_pull_batches("orders", buf, 40, True, reached)[4]
    assert reached == 40 + n and rows_of(rows) == decoded(want)
    records = b"".join(encode_record(Message(b), ts_delta=0) for b in bodies)
    fast = _same_length_bounds(np.frombuffer(records, np.uint8), n)
    if uneven or len(records) // n > 128:  # two-byte prefixes: walked
        assert fast is None
    else:
        assert fast is not None and fast.tolist() == layout.record_bounds(records, n)


def _record_bytes(msgs: list[Message]) -> bytes:
    return b"".join(encode_record(m, ts_delta=i) for i, m in enumerate(msgs))


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(messages, min_size=1, max_size=6), data=st.data())
def test_a_damaged_record_is_refused_by_both_decoders_alike(msgs: list[Message], data: st.DataObject) -> None:
    """Records damaged inside a batch whose checksums hold (as a buggy or hostile
    writer would seal them): the columns refuse exactly what the decoder refuses,
    and agree on everything else."""
    records = bytearray(_record_bytes(msgs))
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if how == "flip" and records:
            at = data.draw(st.integers(0, len(records) - 1))
            records[at] = data.draw(st.integers(0, 255))
        elif how == "cut" and len(records) > 1:
            del records[data.draw(st.integers(0, len(records) - 1))]
        else:
            records.insert(data.draw(st.integers(0, len(records))), data.draw(st.integers(0, 255)))
    count = len(msgs) + data.draw(st.integers(-1, 1)) or 1
    mask = b""
    if data.draw(st.booleans()):
        mask = wire.mask_of(count, data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count)))
    first = 40 + data.draw(st.integers(0, count - 1))
    stored = encode_stored(7, 2, 40, 1_700_000_000_000, 1_700_000_000_000, None, 0, seal_records(bytes(records), count))
    buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 40 + count, [(1000, stored, mask)]))
    try:
        want = decoded(wire.decode_pull_batches("orders", buf, first, True)[4])
    except CorruptRecord:
        with pytest.raises(CorruptRecord, match="corrupt record in the pull answer"):
            batches_batch(buf, "orders", 2, first, 40 + count, SCHEMA)
    else:
        assert rows_of(batches_batch(buf, "orders", 2, first, 40 + count, SCHEMA)[0]) == want


def _rec(body: bytes) -> bytes:
    """A record of ``body`` (attributes onwards), its length prefix in front."""
    return bytes((len(body),)) + body


GOOD = _rec(b"\x00ok")
LONG = _rec(bytes((layout.A_KEY, 60)) + b"k" * 60 + b"b" * 60)  # a key and a body of plain text
DAMAGED = {
    "unknown attribute bit": (_rec(b"\x40ok"), 1),
    "empty record": (b"\x00", 1),
    "key overruns the record": (_rec(bytes((layout.A_KEY, 50)) + b"kk"), 1),
    "tags overrun the record": (_rec(bytes((layout.A_TAGS, 9)) + b"t"), 1),
    "properties overrun the record": (_rec(bytes((layout.A_PROPS, 7)) + b"\x01a"), 1),
    "a property overruns its block": (_rec(bytes((layout.A_PROPS, 3, 1)) + b"a" + b"\x05"), 1),
    "a varint cut off by the record's end": (_rec(bytes((layout.A_TS | layout.A_KEY,)) + b"\x80"), 1),
    "a varint cut off, the body next": (_rec(bytes((layout.A_DELIVER,)) + b"\x80"), 1),
    "key not UTF-8": (_rec(bytes((layout.A_KEY, 1)) + b"\xff"), 1),
    "tags not UTF-8": (_rec(bytes((layout.A_TAGS, 2)) + b"\xc3\x28"), 1),
    "property not UTF-8": (_rec(bytes((layout.A_PROPS, 4, 1)) + b"\xff" + b"\x01v"), 1),
    "more records than counted": (GOOD + GOOD, 1),
    "fewer records than counted": (GOOD, 2),
    "a record longer than the batch": (b"\x09\x00ok", 1),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_each_kind_of_damage_is_refused_by_both_decoders(case: str) -> None:
    """Damage inside a batch whose checksums hold, one kind at a time, after a good
    record: both decoders refuse it."""
    records, count = DAMAGED[case]
    if case not in ("fewer records than counted", "a record longer than the batch"):
        records += LONG * 2  # valid text after the damage: a read past a record finds no other fault
        count += 2
    stored = encode_stored(7, 2, 40, 0, 0, None, 0, seal_records(LONG + records, count + 1))
    buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 42 + count, [(1000, stored, b"")]))
    with pytest.raises(CorruptRecord):
        wire.decode_pull_batches("orders", buf, 40, True)
    with pytest.raises(CorruptRecord, match="corrupt record in the pull answer"):
        batches_batch(buf, "orders", 2, 40, 41 + count, SCHEMA)


@pytest.mark.parametrize("empty", [b"\x00", b"\x80\x00"])
@pytest.mark.parametrize("where", ["before the range", "masked out", "after the range"])
def test_an_empty_record_is_refused_wherever_it_is(empty: bytes, where: str) -> None:
    """A record of length 0 (one byte, or a longer varint of 0) is corrupt even when
    it is not delivered: both decoders refuse the batch, whatever offset the read
    starts from."""
    records = LONG + empty + LONG
    mask = wire.mask_of(3, [0, 2]) if where == "masked out" else b""
    first, end = {"before the range": (42, 43), "masked out": (40, 43), "after the range": (40, 41)}[where]
    stored = encode_stored(7, 2, 40, 0, 0, None, 0, seal_records(records, 3))
    buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, end, [(1000, stored, mask)]))
    with pytest.raises(CorruptRecord, match=r"empty record|overruns"):
        wire.decode_pull_batches("orders", buf, first, True)
    with pytest.raises(CorruptRecord, match="corrupt record in the pull answer"):
        batches_batch(buf, "orders", 2, first, end, SCHEMA)


def test_a_batch_of_another_queue_counts_only_when_it_delivers() -> None:
    """Like the consumer's decoder, the reader refuses an answer whose delivered
    records belong to another queue, and ignores such a batch when the mask keeps none
    of its records."""
    ours = encode_stored(7, 2, 40, 0, 0, None, 0, seal_records(LONG, 1))
    other = encode_stored(7, 3, 41, 0, 0, None, 0, seal_records(LONG, 1))
    for mask, refused in ((b"", True), (b"\x00", False)):
        buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 42, [(1000, ours, b""), (1001, other, mask)]))
        if refused:
            with pytest.raises(CorruptRecord, match="another queue"):
                batches_batch(buf, "orders", 2, 40, 42, SCHEMA)
        else:
            (batch,), reached = batches_batch(buf, "orders", 2, 40, 42, SCHEMA)
            assert (batch.num_rows, reached) == (1, 42)


def test_store_times_beyond_a_timestamp_column_are_refused() -> None:
    """A store-time delta that overflows the microsecond timestamp column is a corrupt
    record for the reader (the broker never writes one), not a wrapped-around time."""
    for delta, ok in ((1 << 20, True), (1 << 62, False)):
        varint = batches_uvarint(delta)
        rest = bytes((layout.A_TS,)) + varint + b"body"
        stored = encode_stored(7, 2, 40, 1_700_000_000_000, 1_700_000_000_000, None, 0,
                               seal_records(bytes((len(rest),)) + rest, 1))  # fmt: skip
        buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 41, [(1000, stored, b"")]))
        if ok:
            (msg,) = wire.decode_pull_batches("orders", buf, 40, True)[4]
            assert rows_of(batches_batch(buf, "orders", 2, 40, 41, SCHEMA)[0]) == decoded([msg])
        else:
            with pytest.raises(CorruptRecord, match="out of range"):
                batches_batch(buf, "orders", 2, 40, 41, SCHEMA)


def test_records_counted_into_the_wrong_batch_are_refused_by_both_decoders() -> None:
    """Two batches whose counts are off by one each way: the total matches, each
    batch does not."""
    one = encode_stored(7, 2, 40, 0, 0, None, 0, seal_records(GOOD + GOOD, 1))
    two = encode_stored(7, 2, 41, 0, 0, None, 0, seal_records(GOOD, 2))
    buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 43, [(1000, one, b""), (1001, two, b"")]))
    with pytest.raises(CorruptRecord):
        wire.decode_pull_batches("orders", buf, 40, True)
    with pytest.raises(CorruptRecord, match="corrupt record in the pull answer"):
        batches_batch(buf, "orders", 2, 40, 43, SCHEMA)


def test_a_varint_of_ten_bytes_is_refused_by_both_decoders() -> None:
    """At most 9 bytes (63 bits): the decoder and the columns' int64 arrays agree."""
    for size, ok in ((9, True), (10, False)):
        varint = b"\x81" * (size - 1) + b"\x01"
        rest = bytes((layout.A_RECONSUME,)) + varint + b"body"
        records = bytes((len(rest),)) + rest
        stored = encode_stored(7, 2, 40, 0, 0, None, 0, seal_records(records, 1))
        buf = b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 41, [(1000, stored, b"")]))
        if ok:
            (msg,) = wire.decode_pull_batches("orders", buf, 40, True)[4]
            assert rows_of(batches_batch(buf, "orders", 2, 40, 41, SCHEMA)[0]) == decoded([msg])
        else:
            with pytest.raises(CorruptRecord, match="9 bytes"):
                wire.decode_pull_batches("orders", buf, 40, True)
            with pytest.raises(CorruptRecord, match="9 bytes"):
                batches_batch(buf, "orders", 2, 40, 41, SCHEMA)


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


def test_an_answer_larger_than_a_chunk_becomes_several_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records that decompress to more than one Arrow batch's int32 offsets can hold
    (a chunk, 1 GiB; 200 bytes here) come back as several batches, each whole stored
    batch in one of them, the rows those of the decoder."""
    from equeue.spark import columns

    monkeypatch.setattr(columns, "_CHUNK_BYTES", 200)
    msgs = [Message(bytes([i]) * 30, key=f"k{i}") for i in range(12)]
    buf = batches_answer(msgs, [3, 6, 9], 40, 52)
    got, reached = batches_batch(buf, "orders", 2, 41, 52, SCHEMA)
    assert reached == 52 and len(got) > 1
    assert rows_of(got) == decoded(wire.decode_pull_batches("orders", buf, 41, True)[4])
