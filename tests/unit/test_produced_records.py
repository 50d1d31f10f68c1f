"""The producer's record encoder and the broker's one-pass check of a produced batch
(equeue.wire.batches ``produced_record`` and ``scan_produced``), property-tested
against the one record encoder and decoder."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from equeue.errors import ConfigError, CorruptRecord, InvalidMessage, MessageTooLarge
from equeue.models import Message
from equeue.wire.batches import decode_records, encode_record, produced_record, scan_produced
from equeue.wire.entries import encode_props

LIMIT = 1 << 20
text = st.text(max_size=20)
#: what a producer sends: no store-time delta, no reconsume count
sent = st.builds(
    Message,
    body=st.binary(max_size=300),
    key=st.none() | text | st.text(min_size=120, max_size=200),
    tags=st.none() | text,
    properties=st.dictionaries(text, text, max_size=3),
    deliver_at=st.sampled_from([0, 0, 0, 1, 2**40]),
)


def _produced(m: Message, limit: int = LIMIT) -> bytes:
    return produced_record(
        m.body,
        None if m.key is None else m.key.encode(),
        None if m.tags is None else m.tags.encode(),
        m.properties,
        m.deliver_at,
        limit,
    )


@given(sent)
def test_a_produced_record_is_the_record_of_its_message(m: Message) -> None:
    assert _produced(m) == encode_record(m)


@given(st.lists(sent, min_size=1, max_size=20))
def test_the_scan_finds_the_keys_the_decoder_reads(msgs: list[Message]) -> None:
    records = b"".join(map(_produced, msgs))
    scanned = scan_produced(records, len(msgs), LIMIT)
    decoded = decode_records(records, len(msgs))
    assert scanned.keyed == [i for i, r in enumerate(decoded) if r.key is not None]
    assert [k.decode() for k in scanned.keys] == [r.key for r in decoded if r.key is not None]
    assert scanned.delayed == any(m.deliver_at for m in msgs)
    assert scanned.count == len(msgs) and scanned.records == records


@settings(max_examples=500)
@given(st.lists(sent, min_size=1, max_size=5), st.data())
def test_whatever_the_scan_accepts_the_decoder_reads(msgs: list[Message], data: st.DataObject) -> None:
    """Damage anywhere (a changed byte, a cut, bytes added): the scan refuses it with
    a coded error, or the decoder reads back every record it accepted."""
    records = bytearray(b"".join(map(encode_record, msgs)))
    how = data.draw(st.sampled_from(["byte", "cut", "extra", "count"]))
    count = len(msgs)
    if how == "byte":
        i = data.draw(st.integers(0, len(records) - 1))
        records[i] = data.draw(st.integers(0, 255))
    elif how == "cut":
        del records[data.draw(st.integers(0, len(records) - 1)) :]
    elif how == "extra":
        records += data.draw(st.binary(min_size=1, max_size=8))
    else:
        count = data.draw(st.integers(1, 8))
    try:
        scanned = scan_produced(bytes(records), count, LIMIT)
    except (CorruptRecord, InvalidMessage, MessageTooLarge):
        return
    assert len(decode_records(bytes(records), count)) == scanned.count == count


def test_the_produce_rules_are_held() -> None:
    def one(**fields: object) -> bytes:
        return encode_record(Message(b"body", **fields))  # type: ignore[arg-type]

    with pytest.raises(InvalidMessage, match="store-time delta"):
        scan_produced(encode_record(Message(b"x"), ts_delta=5), 1, LIMIT)
    with pytest.raises(InvalidMessage, match="reconsume count"):
        scan_produced(one(reconsume_times=70_000), 1, LIMIT)
    with pytest.raises(MessageTooLarge, match="message 1 is 8 bytes"):
        scan_produced(one() + one(key="k" * 4), 2, 7)
    with pytest.raises(CorruptRecord, match="not UTF-8"):
        scan_produced(b"\x07\x01\x02\xff\xfebody", 1, LIMIT)
    with pytest.raises(CorruptRecord, match="empty record"):
        scan_produced(b"\x00", 1, LIMIT)
    with pytest.raises(CorruptRecord, match="unknown record attributes"):
        scan_produced(b"\x02\x40x", 1, LIMIT)
    with pytest.raises(CorruptRecord, match="after the batch"):
        scan_produced(one() + b"\x01", 1, LIMIT)
    assert scan_produced(one(reconsume_times=3, tags="t", properties={"a": "b"}), 1, LIMIT).keyed == []


def test_the_producer_refuses_what_the_broker_would() -> None:
    with pytest.raises(ConfigError, match="65535"):
        produced_record(b"x", b"k" * 70_000, None, None, 0, 1 << 20)
    with pytest.raises(MessageTooLarge, match="key \\+ tags \\+ properties \\+ body"):
        produced_record(b"x" * 10, None, None, {"p": "v" * 100}, 0, 50)
    with pytest.raises(MessageTooLarge):
        produced_record(b"x" * 10, b"key", None, None, 0, 12)
    with pytest.raises(TypeError):
        produced_record(b"x", None, None, {"n": 1}, 0, 1 << 20)  # type: ignore[dict-item]


def test_properties_count_as_the_entry_layout_holds_them() -> None:
    """The size limit counts properties as an entry holds them (6 bytes per pair), so
    every stored message fits the retry and dead-letter copies (entries); a property
    name above 65535 bytes, which no entry can hold, is refused on both sides."""
    props = {f"p{i}": "" for i in range(100)}  # 100 × (6 + 2 or 3) bytes as entries
    as_entries = len(encode_props(props))
    body = b"x" * 10
    rec = produced_record(body, None, None, props, 0, as_entries + len(body))
    with pytest.raises(MessageTooLarge):
        produced_record(body, None, None, props, 0, as_entries + len(body) - 1)
    assert scan_produced(rec, 1, as_entries + len(body)).count == 1
    with pytest.raises(MessageTooLarge, match="message 0"):
        scan_produced(rec, 1, as_entries + len(body) - 1)
    long_name = {"n" * 70_000: "v"}
    with pytest.raises(ConfigError, match="property names"):
        produced_record(b"x", None, None, long_name, 0, 1 << 20)
    with pytest.raises(InvalidMessage, match="property names"):
        scan_produced(encode_record(Message(b"x", properties=long_name)), 1, 1 << 20)
