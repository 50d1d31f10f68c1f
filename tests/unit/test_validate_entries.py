"""The broker's produce-time validation of entries (equeue.wire.check_entries): nothing
it accepts may be unservable -- every accepted entry, once stored in a record batch, is
read back by the consumer's decoder and by the Spark column parser without error."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue import Message, wire
from equeue.errors import InvalidMessage, MessageTooLarge
from equeue.protocol import PullStatus
from equeue.wire import batches
from equeue.wire.entries import ENTRY_HEADER

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from equeue.spark.columns import batches_batch  # noqa: E402

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
LIMIT = 200


def _props(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(struct.pack(">H", len(k)) + k + struct.pack(">I", len(v)) + v for k, v in pairs)


@st.composite
def raw_entries(draw: st.DrawFn) -> bytes:
    """Entries as a hostile client may send them: well-formed, or with any header
    field, the property block or the bytes after it bent."""
    key = draw(st.none() | st.binary(max_size=20))
    tags = draw(st.none() | st.binary(max_size=20))
    pairs = draw(st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=8)), max_size=3))
    pb = _props(pairs)
    if draw(st.booleans()):  # bend the property block
        pb = draw(st.sampled_from([pb[:-1], pb + b"\x00", b"\x00\x05ab", b"\x00\x01\xff\x00\x00\x00\x00", pb]))
    body = draw(st.binary(max_size=250))
    kl, tl = len(key or b""), len(tags or b"")
    flags = (1 if key is not None else 0) | (2 if tags is not None else 0)
    n = ENTRY_HEADER.size - 4 + kl + tl + len(pb) + len(body)
    fields = [n, flags, 0, 0, kl, tl, len(pb)]
    if draw(st.booleans()):  # bend one header field
        i = draw(st.sampled_from([0, 1, 4, 5, 6]))
        fields[i] = draw(st.integers(0, 0xFF if i == 1 else 0xFFFF))
    entry = ENTRY_HEADER.pack(*fields) + (key or b"") + (tags or b"") + pb + body
    if draw(st.booleans()):
        entry = entry[: draw(st.integers(0, len(entry)))]
    return entry


def _answer(entries: list[bytes], headers: list[tuple[int, ...]]) -> bytes:
    """The entries as the store keeps them (one stored batch, as ProduceOp writes it),
    in a pull answer from queue offset 40."""
    records = batches.records_from_entries(entries, headers)
    batch = batches.BATCH_HEAD.pack(batches.BATCH_MAGIC, batches.Codec.NONE, len(entries), zlib.crc32(records),
                                    len(records)) + records  # fmt: skip
    value = batches.encode_stored(7, 2, 40, 1_700_000_000_000, 1_700_000_000_000, None, 0, batch)
    return b"".join(wire.encode_pull_batches(PullStatus.FOUND, 0, 99, 40 + len(entries), [(1000, value, b"")]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(raw_entries(), min_size=1, max_size=5))
def test_whatever_the_validator_accepts_every_reader_serves(entries: list[bytes]) -> None:
    try:
        headers = wire.check_entries(entries, LIMIT)
        answer = _answer(entries, headers)  # the store refuses a key or tags not UTF-8
    except (InvalidMessage, MessageTooLarge):
        return
    assert len(headers) == len(entries)
    *_, msgs = wire.decode_pull_batches("t", answer, 40, True)
    assert len(msgs) == len(entries)
    assert [m.body for m in msgs] == [wire.entry_fields(e, 0, len(e))[3] for e in entries]
    batches, _ = batches_batch(answer, "t", 2, 40, 40 + len(entries), SCHEMA)
    rows = pa.Table.from_batches(batches, SCHEMA).to_pylist()
    assert [r["body"] for r in rows] == [m.body for m in msgs]
    assert [dict(r["properties"]) for r in rows] == [m.properties for m in msgs]


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=300),
    key=st.none() | st.text(max_size=20),
    tags=st.none() | st.text(max_size=20),
    props=st.dictionaries(st.text(max_size=10), st.text(max_size=30), max_size=4),
)
def test_every_encoded_message_is_accepted_up_to_the_content_limit(
    body: bytes, key: str | None, tags: str | None, props: dict[str, str]
) -> None:
    entry = wire.encode_entry(Message(body, key, tags, props))
    content = len(entry) - ENTRY_HEADER.size
    if content <= LIMIT:
        wire.check_entries([entry], LIMIT)
    else:
        with pytest.raises(MessageTooLarge, match="message 0 is"):
            wire.check_entries([entry], LIMIT)


def test_properties_count_against_the_limit() -> None:
    """The probe: 8 MiB of properties with a 1 KiB limit (only the body was counted)."""
    entry = wire.encode_entry(Message(b"x", properties={"p": "v" * (8 << 20)}))
    with pytest.raises(MessageTooLarge, match=r"properties 8388\d+ \+ body 1\); the broker's limit is 1024"):
        wire.check_entries([entry], 1024)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (ENTRY_HEADER.pack(19 + 6, 0, 0, 0, 0, 0, 6) + b"\x00\x09ab\x00\x00", "property overruns its block"),
        (ENTRY_HEADER.pack(19 + 7, 0, 0, 0, 0, 0, 7) + b"\x00\x01\xff\x00\x00\x00\x00", "bad property block"),
        (ENTRY_HEADER.pack(19 + 3, 4, 0, 0, 0, 0, 0) + b"abc", "unknown entry flags"),
        (ENTRY_HEADER.pack(19 + 3, 0, 0, 0, 2, 0, 0) + b"abc", "without its flag"),
        (ENTRY_HEADER.pack(19 + 3, 1, 0, 0, 9, 0, 0) + b"abc", "overrun the entry"),
        (ENTRY_HEADER.pack(19 + 9, 0, 0, 0, 0, 0, 0) + b"abc", "does not match"),
        (b"\x00\x00\x00\x01\x00", "shorter than its 23-byte header"),
    ],
)
def test_each_defect_is_named(entry: bytes, why: str) -> None:
    good = wire.encode_entry(Message(b"fine", "k", "t", {"a": "b"}))
    with pytest.raises(InvalidMessage, match=f"message 1: .*{why}"):
        wire.check_entries([good, entry, good], LIMIT)
