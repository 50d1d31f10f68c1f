"""Record batches (equeue.wire.batches): the encoders and decoders, property-tested."""

from __future__ import annotations

import struct
import zlib

import attrs
import hypothesis.strategies as st
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings

from equeue.errors import CorruptRecord, InvalidMessage
from equeue.models import Message
from equeue.wire.batches import (
    BATCH_HEAD,
    Codec,
    batch_head,
    decode_batch,
    decode_stored,
    encode_batch,
    encode_record,
    encode_stored,
    record_bounds,
    records_from_entries,
    stored_head,
)
from equeue.wire.entries import check_entries, encode_entry, pack_entry

LIMIT = 1 << 20
text = st.text(max_size=20)
messages = st.builds(
    Message,
    body=st.binary(max_size=300),
    key=st.none() | text,
    tags=st.none() | text,
    properties=st.dictionaries(text, text, max_size=3),
    deliver_at=st.integers(0, 2**63 - 1),
    reconsume_times=st.integers(0, 2**31),
)
codecs = st.sampled_from(list(Codec))


def _fields(m: Message) -> tuple[object, ...]:
    return (m.body, m.key, m.tags, m.properties, m.deliver_at, m.reconsume_times)


@given(st.lists(messages, min_size=1, max_size=20), codecs)
def test_a_batch_decodes_to_what_was_encoded(msgs: list[Message], codec: Codec) -> None:
    batch = encode_batch(msgs, codec)
    records = decode_batch(batch, LIMIT)
    assert [(r.body, r.key, r.tags, r.properties, r.deliver_at, r.reconsume_times) for r in records] == [
        _fields(m) for m in msgs
    ]
    assert all(r.timestamp == 0 for r in records)  # the store-time delta


@given(st.lists(messages, min_size=1, max_size=10), codecs, st.integers(0, 2**32 - 1), st.integers(0, 2**40),
       st.integers(0, 2**50), st.none() | st.binary(min_size=16, max_size=16).filter(any), st.integers(0, 2**60))  # fmt: skip
def test_a_stored_batch_gives_every_message_its_offsets(
    msgs: list[Message], codec: Codec, topic_id: int, base: int, global_base: int, pid: bytes | None, seq: int
) -> None:
    value = encode_stored(topic_id, 3, base, 1_700_000_000_000, 1_700_000_000_005, pid, seq, encode_batch(msgs, codec))
    h = stored_head(value)
    assert (h.topic_id, h.queue_id, h.base_offset, h.producer_id, h.base_sequence) == (topic_id, 3, base, pid, seq)
    got = decode_stored("t", global_base, value, LIMIT)
    assert [_fields(m) for m in got] == [_fields(m) for m in msgs]
    assert [(m.queue_offset, m.global_offset) for m in got] == [(base + i, global_base + i) for i in range(len(msgs))]
    assert {m.timestamp for m in got} == {1_700_000_000_000} and {m.topic for m in got} == {"t"}


@settings(max_examples=300)
@given(st.lists(messages, min_size=1, max_size=5), codecs, st.data())
def test_any_changed_byte_of_a_batch_is_refused(msgs: list[Message], codec: Codec, data: st.DataObject) -> None:
    batch = bytearray(encode_batch(msgs, codec))
    i = data.draw(st.integers(0, len(batch) - 1))
    batch[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        decode_batch(bytes(batch), LIMIT)


@given(st.lists(messages, min_size=1, max_size=5), codecs, st.data())
def test_a_cut_batch_is_refused(msgs: list[Message], codec: Codec, data: st.DataObject) -> None:
    batch = encode_batch(msgs, codec)
    with pytest.raises(CorruptRecord):
        decode_batch(batch[: data.draw(st.integers(0, len(batch) - 1))], LIMIT)


@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_any_changed_byte_of_a_stored_header_is_refused(msgs: list[Message], data: st.DataObject) -> None:
    value = bytearray(encode_stored(1, 2, 3, 4, 5, None, 0, encode_batch(msgs)))
    i = data.draw(st.integers(0, 60))
    value[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        stored_head(bytes(value))


def _bomb(codec: Codec, announced: int, real: int) -> bytes:
    """A well-formed batch header announcing ``announced`` bytes of records whose
    compressed records are ``real`` zero bytes (a valid checksum: only the size lies)."""
    raw = bytes(real)
    carried = zstandard.ZstdCompressor().compress(raw) if codec is Codec.ZSTD else lz4.frame.compress(raw)
    return BATCH_HEAD.pack(1, codec, 1, zlib.crc32(carried), announced) + carried


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_a_decompression_bomb_is_refused_without_inflating_it(codec: Codec) -> None:
    bomb = _bomb(codec, 1000, 512 << 20)  # 512 MiB of zeros in a few KiB, announced as 1,000 bytes
    assert len(bomb) < 3 << 20
    with pytest.raises(CorruptRecord, match="not the 1000 announced"):
        decode_batch(bomb, LIMIT)
    honest = _bomb(codec, 512 << 20, 512 << 20)  # the truth is refused by the cap before decompressing
    with pytest.raises(CorruptRecord, match="exceed the limit"):
        batch_head(honest, LIMIT)


def test_header_errors_say_what_is_wrong() -> None:
    good = encode_batch([Message(b"x")])
    cases = {
        "shorter than its": good[:5],
        "unknown batch magic": b"\x07" + good[1:],
        "unknown batch codec": good[:1] + b"\x09" + good[2:],
        "holds no record": good[:2] + struct.pack(">I", 0) + good[6:],
        "carries": good + b"extra",
    }
    for message, batch in cases.items():
        with pytest.raises(CorruptRecord, match=message):
            batch_head(batch, LIMIT)
    with pytest.raises(InvalidMessage):
        encode_batch([])


def test_codec_names() -> None:
    assert [Codec.parse(n) for n in ("none", "ZSTD", " lz4 ")] == [Codec.NONE, Codec.ZSTD, Codec.LZ4]
    with pytest.raises(ValueError, match="choose none, zstd or lz4"):
        Codec.parse("gzip")


def test_a_keyed_100_byte_record_costs_3_bytes_of_header() -> None:
    """The compactness the store format is judged by: a keyed 100-byte message with
    an 8-byte key is 100 + 8 + 3 bytes (length, attributes, key length)."""
    batch = encode_batch([Message(bytes(100), key="k0000001")])
    assert len(batch) - BATCH_HEAD.size == 111


@given(st.lists(messages, min_size=1, max_size=20))
def test_records_of_produced_entries_are_the_records_of_their_messages(msgs: list[Message]) -> None:
    """The produce path's records (from the entries, without decoding them) are what
    the record encoder makes of the messages (reconsume counts as an entry carries them)."""
    entries = [encode_entry(m) for m in msgs]
    sent = [attrs.evolve(m, reconsume_times=min(m.reconsume_times, 0xFFFF)) for m in msgs]
    assert records_from_entries(entries, check_entries(entries, 1 << 20)) == b"".join(map(encode_record, sent))


def test_a_key_or_tags_that_is_not_utf8_is_refused_at_produce() -> None:
    good = pack_entry(b"b", key=b"k")
    for bad in (pack_entry(b"b", key=b"\xff"), pack_entry(b"b", tags=b"\xc3")):
        with pytest.raises(InvalidMessage, match="message 1: its key or tags is not UTF-8"):
            records_from_entries([good, bad], check_entries([good, bad], 1 << 20))


@given(st.lists(messages, min_size=1, max_size=10))
def test_record_bounds_cut_a_section_into_its_records(msgs: list[Message]) -> None:
    parts = [encode_record(m) for m in msgs]
    records = b"".join(parts)
    b = record_bounds(records, len(parts))
    assert [records[b[i] : b[i + 1]] for i in range(len(parts))] == parts
    with pytest.raises(CorruptRecord):
        record_bounds(records + b"\x00", len(parts))
    with pytest.raises(CorruptRecord):
        record_bounds(records[:-1], len(parts))


def test_threads_compress_and_decompress_at_once() -> None:
    """zstd contexts are per thread: one shared compressor crashed the interpreter
    when two threads (a producer's loop, a broker's writer) used it together."""
    import threading

    msgs = [Message(bytes(range(256)) * 8, key=f"k{i}") for i in range(50)]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(200):
                for codec in (Codec.ZSTD, Codec.LZ4):
                    assert [r.body for r in decode_batch(encode_batch(msgs, codec), LIMIT)] == [m.body for m in msgs]
        except BaseException as exc:  # pragma: no cover - the failure this test is about
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@given(st.lists(messages, min_size=1, max_size=20), st.data())
def test_a_slice_of_a_stored_batch_holds_those_records_at_their_offsets(msgs: list[Message], data: st.DataObject) -> None:
    from equeue.wire.batches import slice_stored

    first = data.draw(st.integers(0, len(msgs) - 1))
    stop = data.draw(st.integers(first + 1, len(msgs)))
    value = encode_stored(4, 1, 100, 1_700_000_000_000, 1_700_000_000_000, bytes(range(16)), 50, encode_batch(msgs))
    cut = slice_stored(value, first, stop)
    assert cut is not None
    h = stored_head(cut)
    assert (h.base_offset, h.base_sequence) == (100 + first, 50 + first)
    got = decode_stored("t", 1000 + first, cut, LIMIT)
    assert [_fields(m) for m in got] == [_fields(m) for m in msgs[first:stop]]
    assert [(m.queue_offset, m.global_offset) for m in got] == [(100 + i, 1000 + i) for i in range(first, stop)]
    zipped = encode_stored(4, 1, 100, 1, 1, None, 0, encode_batch(msgs, Codec.ZSTD))
    assert slice_stored(zipped, first, stop) is None  # compressed: goes whole


def test_a_decoded_message_without_properties_gets_its_own_empty_dict_when_read() -> None:
    """The record decoder leaves ``properties`` of a record without any unset (no dict
    per message); reading it makes a fresh empty dict, kept on that message only, and
    the message still compares, pickles, copies and reads like any other."""
    import copy
    import pickle

    a, b, c = decode_batch(encode_batch([Message(b"x", key="k"), Message(b"y"), Message(b"z", properties={"p": "1"})]),
                           1 << 20)  # fmt: skip
    assert type(a) is Message and type(b) is Message
    with pytest.raises(AttributeError):
        Message.__dict__["properties"].__get__(a, Message)  # unset until read
    assert a.properties == {} and a.properties is a.properties and a.properties is not b.properties
    a.properties["mine"] = "1"
    assert b.properties == {} and c.properties == {"p": "1"}
    assert b == Message(b"y", queue_offset=1, global_offset=1)
    assert pickle.loads(pickle.dumps(b)) == b and copy.copy(b) == b and b.value == b"y" and b.key_value is None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        b.nope  # noqa: B018
