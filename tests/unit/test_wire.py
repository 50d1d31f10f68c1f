"""Packed binary layouts (equeue.wire): entries, stored records, produce and pull."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue import wire
from equeue.errors import ConfigError, CorruptRecord, EQueueError, RemoteProtocolError
from equeue.models import Message, SendResult
from equeue.wire import (
    ENTRY_HEADER,
    PRODUCE_BATCH,
    RECORD_HEADER,
    EntryMeta,
    ProduceRequest,
    ProduceResponse,
    PullRequest,
    decode_entries,
    decode_record,
    encode_entry,
    encode_record,
    entry_meta,
    pack_entry,
    parse_tag_filter,
    record_entry_meta,
    record_header,
    split_entries,
)
from equeue.wire.batches import Codec, encode_batch

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
i63 = st.integers(0, (1 << 63) - 1)
short_text = st.text(max_size=40)

messages = st.builds(
    Message,
    body=st.binary(max_size=300),
    key=st.none() | short_text,
    tags=st.none() | short_text,
    properties=st.dictionaries(short_text, short_text, max_size=5),
    deliver_at=u64,
    reconsume_times=u16,
)

#: what the decoders may raise on hostile input
DECODE_ERRORS = (RemoteProtocolError, CorruptRecord)


def produce_side(m: Message) -> Message:
    """The fields of ``m`` an entry carries."""
    return Message(
        m.body, m.key, m.tags, m.properties, m.deliver_at, reconsume_times=m.reconsume_times
    )


def consumer_side(
    m: Message, topic: str, queue_id: int, queue_offset: int, global_offset: int, ts: int
) -> Message:
    """What a consumer gets back for ``m`` stored at those coordinates."""
    return Message(
        m.body,
        m.key,
        m.tags,
        m.properties,
        0,
        topic,
        queue_id,
        queue_offset,
        global_offset,
        ts,
        m.reconsume_times,
    )


# ------------------------------------------------------------------------- entries
@settings(max_examples=200)
@given(msg=messages)
def test_entry_round_trip(msg: Message) -> None:
    entry = encode_entry(msg)
    assert struct.unpack_from(">I", entry)[0] == len(entry) - 4
    assert decode_entries(entry, 0, 1) == [produce_side(msg)]


@settings(max_examples=100)
@given(msgs=st.lists(messages, max_size=10))
def test_many_entries_round_trip(msgs: list[Message]) -> None:
    entries = [encode_entry(m) for m in msgs]
    buf = b"".join(entries)
    assert split_entries(buf, 0, len(msgs)) == entries
    assert decode_entries(buf, 0, len(msgs)) == [produce_side(m) for m in msgs]


@settings(max_examples=100)
@given(msg=messages)
def test_entry_meta(msg: Message) -> None:
    entry = encode_entry(msg)
    meta = entry_meta(entry)
    assert meta == EntryMeta(
        msg.deliver_at,
        msg.key.encode() if msg.key is not None else None,
        msg.tags.encode() if msg.tags is not None else None,
        len(msg.body),
    )
    # at an offset inside a larger buffer too
    assert entry_meta(b"\xff" * 9 + entry, 9) == meta


def reference_entry(
    body: bytes, key: bytes | None, tags: bytes | None, props: dict[str, str], deliver_at: int, reconsume: int
) -> bytes:
    """The entry layout written out field by field (docs/protocol.md), the slow way."""
    prop_block = b"".join(
        struct.pack(">H", len(k.encode())) + k.encode() + struct.pack(">I", len(v.encode())) + v.encode()
        for k, v in props.items()
    )
    flags = (1 if key is not None else 0) | (2 if tags is not None else 0)
    rest = (
        struct.pack(">B", flags)
        + struct.pack(">Q", deliver_at)
        + struct.pack(">H", reconsume)
        + struct.pack(">H", len(key or b""))
        + struct.pack(">H", len(tags or b""))
        + struct.pack(">I", len(prop_block))
        + (key or b"")
        + (tags or b"")
        + prop_block
        + body
    )
    return struct.pack(">I", len(rest)) + rest


raw_bytes = st.none() | st.binary(max_size=60)


@settings(max_examples=300)
@given(
    body=st.binary(max_size=300),
    key=raw_bytes,
    tags=raw_bytes,
    props=st.dictionaries(short_text, short_text, max_size=4),
    deliver_at=u64,
    reconsume=u16,
)
def test_pack_entry_equals_the_reference(
    body: bytes, key: bytes | None, tags: bytes | None, props: dict[str, str], deliver_at: int, reconsume: int
) -> None:
    """The one (fast) entry encoder, every shortcut included, writes the documented layout."""
    assert pack_entry(body, key, tags, props, deliver_at, reconsume) == reference_entry(
        body, key, tags, props, deliver_at, reconsume
    )


@settings(max_examples=200)
@given(msg=messages)
def test_encode_entry_is_pack_entry_of_the_message(msg: Message) -> None:
    key = msg.key.encode() if msg.key is not None else None
    tags = msg.tags.encode() if msg.tags is not None else None
    ref = reference_entry(msg.body, key, tags, msg.properties, msg.deliver_at, msg.reconsume_times)
    assert encode_entry(msg) == ref


@pytest.mark.parametrize("field", ["key", "tags"])
def test_pack_entry_refuses_overlong_key_or_tags(field: str) -> None:
    with pytest.raises(ConfigError):
        pack_entry(b"x", **{field: b"k" * 0x10000})  # type: ignore[arg-type]
    assert pack_entry(b"x", **{field: b"k" * 0xFFFF})  # type: ignore[arg-type]


def test_empty_key_and_tags_differ_from_none() -> None:
    a = decode_entries(encode_entry(Message(b"x", "", "")), 0, 1)[0]
    b = decode_entries(encode_entry(Message(b"x", None, None)), 0, 1)[0]
    assert (a.key, a.tags) == ("", "")
    assert (b.key, b.tags) == (None, None)


def test_entry_byte_layout() -> None:
    entry = encode_entry(Message(b"BODY", "k", "t", {"a": "b"}, deliver_at=5, reconsume_times=2))
    props = b"\x00\x01a\x00\x00\x00\x01b"
    header = ENTRY_HEADER.pack(ENTRY_HEADER.size - 4 + 1 + 1 + len(props) + 4, 3, 5, 2, 1, 1, 8)
    assert entry == header + b"k" + b"t" + props + b"BODY"


def test_reconsume_times_saturates() -> None:
    entry = encode_entry(Message(b"x", reconsume_times=1 << 20))
    assert decode_entries(entry, 0, 1)[0].reconsume_times == 0xFFFF


def test_overlong_key_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        encode_entry(Message(b"x", key="k" * 0x10000))
    with pytest.raises(ValueError):
        encode_entry(Message(b"x", tags="t" * 0x10000))


def test_split_entries_validates_outer_lengths() -> None:
    e = encode_entry(Message(b"abc"))
    with pytest.raises(RemoteProtocolError):
        split_entries(e, 0, 2)  # fewer entries than announced
    with pytest.raises(RemoteProtocolError):
        split_entries(e + b"x", 0, 1)  # trailing bytes
    with pytest.raises(RemoteProtocolError):
        split_entries(e[:-1], 0, 1)  # overruns
    with pytest.raises(RemoteProtocolError):
        split_entries(struct.pack(">I", 3) + b"abc", 0, 1)  # shorter than an entry header
    assert split_entries(b"", 0, 0) == []


def test_entry_meta_rejects_inconsistent_lengths() -> None:
    e = bytearray(encode_entry(Message(b"abc", "key")))
    with pytest.raises(RemoteProtocolError):
        entry_meta(bytes(e[:10]))
    struct.pack_into(">H", e, 4 + 1 + 8 + 2, 200)  # key length beyond the entry
    with pytest.raises(RemoteProtocolError):
        entry_meta(bytes(e))


def test_malformed_properties_in_an_entry() -> None:
    good = encode_entry(Message(b"", properties={"k": "v"}))
    bad = bytearray(good)
    bad[ENTRY_HEADER.size + 2] = 0xFF  # the key byte "k" -> invalid UTF-8
    with pytest.raises(CorruptRecord):  # a property block reaches a decoder only from the store
        decode_entries(bytes(bad), 0, 1)


@settings(max_examples=200)
@given(buf=st.binary(max_size=200), count=st.integers(0, 5))
def test_garbage_entries_raise_only_decode_errors(buf: bytes, count: int) -> None:
    try:
        decode_entries(buf, 0, count)
    except DECODE_ERRORS:
        pass
    try:
        entry_meta(buf)
    except DECODE_ERRORS:
        pass


# ------------------------------------------------------------------------- records
record_coords = st.tuples(u32, u32, u64, u64)  # topic id, queue id, queue offset, timestamp


@settings(max_examples=200)
@given(msg=messages, coords=record_coords, g=u64, topic=short_text)
def test_record_round_trip(
    msg: Message, coords: tuple[int, int, int, int], g: int, topic: str
) -> None:
    topic_id, queue_id, qoff, ts = coords
    entry = encode_entry(msg)
    rec = encode_record(topic_id, queue_id, qoff, ts, entry)
    assert len(rec) == RECORD_HEADER.size + len(entry)
    assert rec[RECORD_HEADER.size :] == entry
    assert struct.unpack_from(">I", rec)[0] == zlib.crc32(rec[4:])
    h = record_header(rec)
    assert (h.topic_id, h.queue_id, h.queue_offset, h.timestamp) == coords
    assert record_entry_meta(rec) == entry_meta(entry)
    expected = consumer_side(msg, topic, queue_id, qoff, g, ts)
    assert decode_record(topic, g, rec) == expected
    assert decode_record(topic, g, memoryview(rec)) == expected


@settings(max_examples=200)
@given(msg=messages, data=st.data())
def test_flipping_any_record_byte_is_detected(msg: Message, data: st.DataObject) -> None:
    rec = encode_record(1, 2, 3, 4, encode_entry(msg))
    i = data.draw(st.integers(0, len(rec) - 1), label="index")
    mask = data.draw(st.integers(1, 255), label="mask")
    bad = bytearray(rec)
    bad[i] ^= mask
    with pytest.raises(EQueueError) as info:
        decode_record("t", 0, bytes(bad))
    # every byte is under the checksum (or is the checksum/version): always CorruptRecord
    assert isinstance(info.value, CorruptRecord)
    with pytest.raises(CorruptRecord):
        record_header(bytes(bad))


def test_every_single_byte_flip_of_one_record() -> None:
    rec = encode_record(7, 1, 99, 1234, encode_entry(Message(b"hello", "k", "t", {"p": "q"})))
    for i in range(len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecord):
            decode_record("t", 0, bytes(bad))


@settings(max_examples=100)
@given(msg=messages, data=st.data())
def test_truncated_records_are_corrupt(msg: Message, data: st.DataObject) -> None:
    rec = encode_record(1, 2, 3, 4, encode_entry(msg))
    cut = data.draw(st.integers(0, len(rec) - 1))
    with pytest.raises(CorruptRecord):
        decode_record("t", 0, rec[:cut])


def test_record_header_without_verification() -> None:
    rec = bytearray(encode_record(1, 2, 3, 4, encode_entry(Message(b"body"))))
    rec[-1] ^= 0xFF
    assert record_header(bytes(rec), verify=False).queue_offset == 3
    with pytest.raises(CorruptRecord):
        record_header(bytes(rec))


def test_unknown_record_version_is_corrupt() -> None:
    rec = bytearray(encode_record(1, 2, 3, 4, encode_entry(Message(b"body"))))
    rec[4] = 2
    rec[0:4] = struct.pack(">I", zlib.crc32(bytes(rec[4:])))
    with pytest.raises(CorruptRecord, match="version"):
        decode_record("t", 0, bytes(rec))


def test_valid_checksum_but_inconsistent_entry_is_corrupt() -> None:
    entry = bytearray(encode_entry(Message(b"body", "key")))
    struct.pack_into(">H", entry, 4 + 1 + 8 + 2, 500)  # key length overruns
    with pytest.raises(CorruptRecord):
        decode_record("t", 0, encode_record(1, 2, 3, 4, bytes(entry)))


def test_valid_checksum_but_malformed_properties_is_corrupt() -> None:
    entry = bytearray(encode_entry(Message(b"", properties={"k": "v"})))
    entry[ENTRY_HEADER.size + 2] = 0xFF
    with pytest.raises(CorruptRecord):
        decode_record("t", 0, encode_record(1, 2, 3, 4, bytes(entry)))


def test_record_key_with_invalid_utf8_is_replaced_not_fatal() -> None:
    entry = bytearray(encode_entry(Message(b"", key="k")))
    entry[ENTRY_HEADER.size] = 0xFF
    msg = decode_record("t", 0, encode_record(1, 2, 3, 4, bytes(entry)))
    assert msg.key == "\ufffd"


@settings(max_examples=200)
@given(buf=st.binary(max_size=200))
def test_garbage_records_raise_only_corrupt_record(buf: bytes) -> None:
    try:
        decode_record("t", 0, buf)
    except CorruptRecord:
        pass


# ------------------------------------------------------------------------- produce
producer_ids = st.binary(min_size=16, max_size=16)


@st.composite
def produce_requests(draw: st.DrawFn) -> ProduceRequest:
    msgs = draw(st.lists(messages, max_size=6))
    pid = draw(st.none() | producer_ids)
    return ProduceRequest(
        topic=draw(short_text),
        queue_id=draw(u32),
        entries=[encode_entry(m) for m in msgs],
        producer_id=pid,
        base_sequence=draw(u64) if pid is not None else 0,
        auto_create=draw(st.booleans()),
    )


@settings(max_examples=200)
@given(req=produce_requests())
def test_produce_request_round_trip(req: ProduceRequest) -> None:
    buf = req.encode()
    assert ProduceRequest.decode(buf) == req
    assert b"".join(ProduceRequest.decode(buf).entries) == b"".join(req.entries)


@st.composite
def batch_requests(draw: st.DrawFn) -> ProduceRequest:
    msgs = draw(st.lists(messages, min_size=1, max_size=6))
    pid = draw(st.none() | producer_ids)
    return ProduceRequest(
        topic=draw(short_text),
        queue_id=draw(u32),
        entries=(),
        producer_id=pid,
        base_sequence=draw(u64) if pid is not None else 0,
        auto_create=draw(st.booleans()),
        batch=encode_batch(msgs, draw(st.sampled_from(list(Codec)))),
    )


@settings(max_examples=200)
@given(req=batch_requests())
def test_produce_request_batch_form_round_trip(req: ProduceRequest) -> None:
    """The batch form: the flag, the batch carried byte for byte, the idempotent fields."""
    buf = req.encode()
    assert buf[len(req.topic.encode()) + 6] & PRODUCE_BATCH
    assert ProduceRequest.decode(buf) == req


@given(req=batch_requests(), cut=st.integers(1, 20))
def test_produce_request_batch_form_length_must_match(req: ProduceRequest, cut: int) -> None:
    """A batch whose announced length disagrees with what follows is refused."""
    buf = req.encode()
    with pytest.raises(RemoteProtocolError):
        ProduceRequest.decode(buf[:-cut] if cut <= len(req.batch or b"") else buf + bytes(cut))
    with pytest.raises(RemoteProtocolError):
        ProduceRequest.decode(buf + b"x")


def test_produce_request_refuses_entries_and_batch() -> None:
    with pytest.raises(ValueError, match="not both"):
        ProduceRequest("t", 0, [encode_entry(Message(b"x"))], batch=encode_batch([Message(b"y")])).encode()


def test_produce_request_with_and_without_producer_id() -> None:
    entries = [encode_entry(Message(b"a")), encode_entry(Message(b"b", "k"))]
    plain = ProduceRequest("orders", 3, entries)
    idem = ProduceRequest("orders", 3, entries, b"P" * 16, 41)
    assert len(idem.encode()) == len(plain.encode()) + 24
    got = ProduceRequest.decode(idem.encode())
    assert (got.producer_id, got.base_sequence) == (b"P" * 16, 41)
    got = ProduceRequest.decode(plain.encode())
    assert (got.producer_id, got.base_sequence, got.auto_create) == (None, 0, True)
    assert decode_entries(b"".join(got.entries), 0, 2) == [Message(b"a"), Message(b"b", "k")]
    no_create = ProduceRequest("orders", 3, entries, auto_create=False)
    assert ProduceRequest.decode(no_create.encode()).auto_create is False


def test_produce_request_topic_too_long() -> None:
    with pytest.raises(ValueError):
        ProduceRequest("t" * 0x10000, 0, []).encode()


@settings(max_examples=200)
@given(buf=st.binary(max_size=200))
def test_garbage_produce_request_raises_only_decode_errors(buf: bytes) -> None:
    try:
        ProduceRequest.decode(buf)
    except DECODE_ERRORS:
        pass


@settings(max_examples=200)
@given(req=produce_requests(), data=st.data())
def test_mutated_produce_request_raises_only_decode_errors(
    req: ProduceRequest, data: st.DataObject
) -> None:
    buf = bytearray(req.encode())
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    i = data.draw(st.integers(0, len(buf) - 1), label="index")
    buf[i] ^= data.draw(st.integers(1, 255), label="mask")
    for candidate in (bytes(buf), bytes(buf[:cut])):
        try:
            got = ProduceRequest.decode(candidate)
            decode_entries(b"".join(got.entries), 0, len(got.entries))
            for e in got.entries:
                entry_meta(e)
        except DECODE_ERRORS:
            pass


offsets_or_none = st.just(-1) | i63


@settings(max_examples=200)
@given(g=offsets_or_none, q=offsets_or_none, stored=u32, scheduled=u32, duplicate=st.booleans())
def test_produce_response_round_trip(
    g: int, q: int, stored: int, scheduled: int, duplicate: bool
) -> None:
    resp = ProduceResponse(g, q, stored, scheduled, duplicate)
    buf = resp.encode()
    assert len(buf) == 25
    assert ProduceResponse.decode(buf) == resp


@pytest.mark.parametrize("n", [0, 1, 24, 26])
def test_produce_response_wrong_size(n: int) -> None:
    with pytest.raises(RemoteProtocolError):
        ProduceResponse.decode(b"\x00" * n)


def test_produce_response_results_with_delayed_entries() -> None:
    resp = ProduceResponse(first_global=100, first_queue=10, stored=3, scheduled=2)
    delayed = [False, True, False, False, True]
    assert resp.results("t", 2, delayed) == [
        SendResult("t", 2, 10, 100),
        SendResult("t", 2, -1, -1, scheduled=True),
        SendResult("t", 2, 11, 101),
        SendResult("t", 2, 12, 102),
        SendResult("t", 2, -1, -1, scheduled=True),
    ]


def test_produce_response_results_for_forgotten_duplicate() -> None:
    resp = ProduceResponse(-1, -1, 0, 1, duplicate=True)
    assert resp.results("t", 0, [False, True, False]) == [
        SendResult("t", 0, -1, -1, duplicate=True),
        SendResult("t", 0, -1, -1, scheduled=True, duplicate=True),
        SendResult("t", 0, -1, -1, duplicate=True),
    ]


def test_produce_response_results_for_remembered_duplicate() -> None:
    resp = ProduceResponse(7, 3, 2, 0, duplicate=True)
    assert resp.results("t", 1, [False, False]) == [
        SendResult("t", 1, 3, 7, duplicate=True),
        SendResult("t", 1, 4, 8, duplicate=True),
    ]


def test_produce_response_results_all_delayed() -> None:
    resp = ProduceResponse.decode(ProduceResponse(-1, -1, 0, 2).encode())
    assert resp.results("t", 1, iter([True, True])) == [
        SendResult("t", 1, -1, -1, scheduled=True),
        SendResult("t", 1, -1, -1, scheduled=True),
    ]


@settings(max_examples=100)
@given(delayed=st.lists(st.booleans(), max_size=30), g=i63, q=i63)
def test_produce_response_results_property(delayed: list[bool], g: int, q: int) -> None:
    stored = delayed.count(False)
    resp = ProduceResponse(g, q, stored, len(delayed) - stored)
    results = resp.results("t", 5, delayed)
    assert len(results) == len(delayed)
    assert [r.scheduled for r in results] == delayed
    kept = [r for r in results if not r.scheduled]
    assert [r.global_offset for r in kept] == list(range(g, g + stored))
    assert [r.queue_offset for r in kept] == list(range(q, q + stored))
    assert all(r.global_offset == -1 for r in results if r.scheduled)
    assert not any(r.duplicate for r in results)


# ------------------------------------------------------------------------- pull
pull_requests = st.builds(
    PullRequest,
    topic=short_text,
    queue_id=u32,
    offset=u64,
    max_messages=u32,
    max_bytes=u32,
    max_wait_ms=u32,
    group=short_text,
    consumer_id=short_text,
    tags=short_text,
    flags=st.sampled_from([0, 4, 6, 2]),
)


@settings(max_examples=200)
@given(req=pull_requests)
def test_pull_request_round_trip(req: PullRequest) -> None:
    assert PullRequest.decode(req.encode()) == req


def test_pull_request_defaults_round_trip() -> None:
    req = PullRequest("orders", 1, 0)
    assert PullRequest.decode(req.encode()) == req


def test_pull_request_trailing_bytes() -> None:
    with pytest.raises(RemoteProtocolError):
        PullRequest.decode(PullRequest("t", 0, 0).encode() + b"\x00")
    with pytest.raises(RemoteProtocolError):
        PullRequest.decode(PullRequest("t", 0, 0, flags=1).encode() + b"\x01")


def test_pull_request_flags() -> None:
    bare = PullRequest("t", 0, 0, flags=0).encode()  # no flags byte: refused by the broker
    assert PullRequest("t", 0, 0).encode() == bare + b"\x04"  # PULL_BATCHES by default
    assert PullRequest.decode(bare + b"\x06").flags == wire.PULL_BATCHES | wire.PULL_CLIENT_VERIFIES
    assert PullRequest.decode(bare + b"\x0e").flags == wire.PULL_BATCHES | wire.PULL_CLIENT_VERIFIES | wire.PULL_WHOLE_BATCHES
    for retired_or_unknown in (b"\x01", b"\x05", b"\x10"):  # bit 0: the retired packed layout
        with pytest.raises(RemoteProtocolError):
            PullRequest.decode(bare + retired_or_unknown)


@settings(max_examples=200)
@given(buf=st.binary(max_size=120))
def test_garbage_pull_request_raises_only_decode_errors(buf: bytes) -> None:
    try:
        PullRequest.decode(buf)
    except DECODE_ERRORS:
        pass


@settings(max_examples=100)
@given(req=pull_requests, data=st.data())
def test_truncated_pull_request_is_rejected(req: PullRequest, data: st.DataObject) -> None:
    # (the optional flags byte is the one part whose absence is valid: frames carry their length)
    buf = req.encode()
    cut = data.draw(st.integers(0, len(buf) - 1 - (1 if req.flags else 0)))
    with pytest.raises(RemoteProtocolError):
        PullRequest.decode(buf[:cut])


def test_pull_request_invalid_utf8_topic() -> None:
    buf = bytearray(PullRequest("ab", 0, 0).encode())
    buf[2] = 0xFF
    with pytest.raises(RemoteProtocolError):
        PullRequest.decode(bytes(buf))


def test_decode_errors_are_eqeue_errors() -> None:
    assert all(issubclass(e, EQueueError) for e in DECODE_ERRORS)


# ------------------------------------------------------------------------- tag filters
@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (None, None),
        ("", None),
        ("*", None),
        ("  ||  ", None),
        ("a || *", None),
        ("a", frozenset({b"a"})),
        ("a || b", frozenset({b"a", b"b"})),
        ("a||b||a", frozenset({b"a", b"b"})),
        (" x  ||y ", frozenset({b"x", b"y"})),
        ("é", frozenset({"é".encode()})),
    ],
)
def test_parse_tag_filter(expr: str | None, expected: frozenset[bytes] | None) -> None:
    assert parse_tag_filter(expr) == expected


@settings(max_examples=100)
@given(msgs=st.lists(messages, min_size=1, max_size=6), codec=st.sampled_from(list(Codec)))
def test_entries_batch_is_the_batch_of_the_messages(msgs: list[Message], codec: Codec) -> None:
    """The producer's batch of its buffered entries equals the batch encoder's of the
    same messages (so a batch stored as sent reads back like one the broker built)."""
    expected = encode_batch([produce_side(m) for m in msgs], codec)
    assert wire.entries_batch([encode_entry(m) for m in msgs], codec) == expected
