"""equeue.wire.replog: the replication log entry's one encoder and decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue.errors import CorruptRecord
from equeue.wire.replog import (
    DELETE,
    HEADER_SIZE,
    PUT,
    EntryHeader,
    decode_entry,
    encode_entry,
    entry_header,
)

headers = st.builds(
    EntryHeader, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)
)
keys = st.lists(st.binary(max_size=40), max_size=8)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[int, int, list[bytes], list[bytes] | None]]:
    out: list[tuple[int, int, list[bytes], list[bytes] | None]] = []
    for _ in range(draw(st.integers(0, 5))):
        ks = draw(keys)
        db = draw(st.integers(0, 255))
        if draw(st.booleans()):
            out.append((PUT, db, ks, draw(st.lists(st.binary(max_size=80), min_size=len(ks), max_size=len(ks)))))
        else:
            out.append((DELETE, db, ks, None))
    return out


@settings(max_examples=300)
@given(header=headers, changes=runs())
def test_decode_inverts_encode(header: EntryHeader, changes: list[tuple[int, int, list[bytes], list[bytes] | None]]) -> None:
    data = encode_entry(header, changes)
    assert decode_entry(data) == (header, changes)
    assert entry_header(data) == header


@settings(max_examples=300)
@given(header=headers, changes=runs(), data=st.data())
def test_truncated_entry_is_corrupt(
    header: EntryHeader, changes: list[tuple[int, int, list[bytes], list[bytes] | None]], data: st.DataObject
) -> None:
    full = encode_entry(header, changes)
    cut = data.draw(st.integers(0, len(full) - 1))
    short = full[:cut]
    if cut < HEADER_SIZE:
        with pytest.raises(CorruptRecord):
            entry_header(short)
    try:
        got = decode_entry(short)
    except CorruptRecord:
        return
    # a cut exactly between runs is a shorter, valid entry: a prefix of the runs
    assert got[0] == header
    assert got[1] == changes[: len(got[1])]


@settings(max_examples=500)
@given(blob=st.binary(max_size=200))
def test_garbage_raises_only_corrupt_record(blob: bytes) -> None:
    try:
        decode_entry(blob)
    except CorruptRecord:
        pass


@settings(max_examples=300)
@given(header=headers, changes=runs(), data=st.data())
def test_garbled_entry_raises_only_corrupt_record(
    header: EntryHeader, changes: list[tuple[int, int, list[bytes], list[bytes] | None]], data: st.DataObject
) -> None:
    full = bytearray(encode_entry(header, changes))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(full) - 1))
        full[i] = data.draw(st.integers(0, 255))
    try:
        decode_entry(bytes(full))
    except CorruptRecord:
        pass


def test_huge_counts_are_refused_without_allocating() -> None:
    head = encode_entry(EntryHeader(1, 2, 3), [])
    for kind in (PUT, DELETE):
        with pytest.raises(CorruptRecord):
            decode_entry(head + bytes([kind, 0]) + b"\xff\xff\xff\xff" + b"\0" * 10)
    with pytest.raises(CorruptRecord):
        decode_entry(head + bytes([3, 0, 0, 0, 0, 0]))  # unknown kind


def test_encoder_refuses_what_it_cannot_encode() -> None:
    h = EntryHeader(1, 2, 3)
    with pytest.raises(ValueError):
        encode_entry(h, [(PUT, 0, [b"k"], None)])
    with pytest.raises(ValueError):
        encode_entry(h, [(PUT, 0, [b"k"], [b"a", b"b"])])
    with pytest.raises(ValueError):
        encode_entry(h, [(DELETE, 0, [b"k"], [b"v"])])
    with pytest.raises(ValueError):
        encode_entry(h, [(7, 0, [b"k"], None)])
    with pytest.raises(ValueError):
        encode_entry(h, [(DELETE, 256, [b"k"], None)])
    with pytest.raises(ValueError):
        encode_entry(h, [(DELETE, 0, [b"k" * 65536], None)])
    with pytest.raises(ValueError):
        encode_entry(EntryHeader(1 << 32, 0, 0), [])


def test_layout_is_big_endian_and_compact() -> None:
    data = encode_entry(EntryHeader(1, 2, 3), [(PUT, 2, [b"ab"], [b"xyz"]), (DELETE, 1, [b"k"], None)])
    assert data == (
        b"\0\0\0\x01" + (2).to_bytes(8, "big") + (3).to_bytes(8, "big")
        + b"\x01\x02\0\0\0\x01" + b"\0\x02" + b"\0\0\0\x03" + b"ab" + b"xyz"
        + b"\x02\x01\0\0\0\x01" + b"\0\x01" + b"k"
    )  # fmt: skip
