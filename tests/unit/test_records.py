"""The stored-record codec's batch forms (equeue.wire.records): the one encoder
(``encode_records``) and the bulk checks the store's reads use, against the
single-record encoder and decoder."""

from __future__ import annotations

import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from equeue.models import Message
from equeue.wire import RECORD_HEADER, encode_entry, encode_record, record_header
from equeue.wire.records import encode_records, record_timestamp, records_intact

u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
entries = st.lists(
    st.builds(
        lambda body, key: encode_entry(Message(body, key=key)),
        st.binary(max_size=200),
        st.none() | st.text(max_size=20),
    ),
    max_size=20,
)


@settings(max_examples=200)
@given(topic_id=u32, queue_id=u32, first=st.integers(0, 1 << 62), ts=u64, batch=entries)
def test_batch_encoder_is_the_single_record_encoder(
    topic_id: int, queue_id: int, first: int, ts: int, batch: list[bytes]
) -> None:
    recs = encode_records(topic_id, queue_id, first, ts, batch)
    assert recs == [encode_record(topic_id, queue_id, first + i, ts, e) for i, e in enumerate(batch)]
    for i, (rec, entry) in enumerate(zip(recs, batch, strict=True)):
        assert rec[RECORD_HEADER.size :] == entry
        assert struct.unpack_from(">I", rec)[0] == zlib.crc32(rec[4:])
        h = record_header(rec)
        assert (h.topic_id, h.queue_id, h.queue_offset, h.timestamp) == (topic_id, queue_id, first + i, ts)
        assert record_timestamp(rec) == ts == record_timestamp(memoryview(rec))
    assert records_intact(recs)


@settings(max_examples=200)
@given(batch=entries.filter(bool), data=st.data())
def test_bulk_check_finds_any_damaged_record(batch: list[bytes], data: st.DataObject) -> None:
    recs = encode_records(1, 2, 3, 4, batch)
    which = data.draw(st.integers(0, len(recs) - 1), label="record")
    i = data.draw(st.integers(0, len(recs[which]) - 1), label="index")
    bad = bytearray(recs[which])
    bad[i] ^= data.draw(st.integers(1, 255), label="mask")
    damaged = [*recs[:which], bytes(bad), *recs[which + 1 :]]
    assert not records_intact(damaged)
    cut = data.draw(st.integers(0, len(recs[which]) - 1), label="cut")
    assert not records_intact([*recs[:which], recs[which][:cut], *recs[which + 1 :]])
