"""The pull answer's batch layout (equeue.wire.pull, PULL_BATCHES): its encoder and
decoder, property-tested against stored batches built by equeue.wire.batches."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from equeue.errors import CorruptRecord, RemoteProtocolError
from equeue.models import Message, PullResult
from equeue.protocol import PullStatus
from equeue.wire import (
    PULL_BATCHES,
    PULL_CLIENT_VERIFIES,
    PullRequest,
    decode_pull_answer,
    decode_pull_batches,
    decode_pull_head,
    decode_pull_response,
    decode_pull_rest,
    delivered_records,
    encode_pull_batches,
    mask_of,
)
from equeue.wire.batches import STORED_HEAD, Codec, encode_batch, encode_stored

text = st.text(max_size=12)
messages = st.builds(
    Message,
    body=st.binary(max_size=60),
    key=st.none() | text,
    tags=st.none() | text,
    properties=st.dictionaries(text, text, max_size=2),
    deliver_at=st.integers(0, 2**63 - 1),
    reconsume_times=st.integers(0, 2**31),
)
FIRST_MS = 1_700_000_000_000


def _stored(msgs: list[Message], base: int, codec: Codec = Codec.NONE, queue_id: int = 3) -> bytes:
    return encode_stored(7, queue_id, base, FIRST_MS, FIRST_MS, None, 0, encode_batch(msgs, codec))


def _expected(topic: str, m: Message, qid: int, qoff: int, g: int) -> Message:
    return Message(m.body, m.key, m.tags, m.properties, m.deliver_at, topic, qid, qoff, g, FIRST_MS,
                   m.reconsume_times)  # fmt: skip


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[tuple[int, bytes, bytes]], list[Message], int, int, list[Message]]:
    """Consecutive batches of one queue (some compressed, some masked), the offset
    asked for (possibly inside the first batch) and the next offset (possibly inside
    the last): the batches, and the messages a reader must see."""
    qoff = draw(st.integers(0, 1 << 40))
    g = draw(st.integers(0, 1 << 50))
    batches: list[tuple[int, bytes, bytes]] = []
    every: list[tuple[Message, int, int, bool]] = []  # message, queue offset, global, kept
    for _ in range(draw(st.integers(0, 4))):
        msgs = draw(st.lists(messages, min_size=1, max_size=12))
        keep = draw(st.none() | st.lists(st.booleans(), min_size=len(msgs), max_size=len(msgs)))
        mask = b"" if keep is None else mask_of(len(msgs), [i for i, k in enumerate(keep) if k])
        batches.append((g, _stored(msgs, qoff, draw(st.sampled_from(list(Codec)))), mask))
        every += [(m, qoff + i, g + i, keep is None or keep[i]) for i, m in enumerate(msgs)]
        qoff += len(msgs)
        g += len(msgs) + draw(st.integers(0, 5))  # other queues' records between batches
    lo = every[0][1] if every else qoff
    start = lo + draw(st.integers(0, 3))
    nxt = max(start, qoff - draw(st.integers(0, 3)))
    want = [_expected("t", m, 3, o, gg) for m, o, gg, k in every if k and start <= o < nxt]
    return batches, [m for m, *_ in every], start, nxt, want


@settings(max_examples=200)
@given(answers(), st.lists(st.integers(1, 7), min_size=1, max_size=40), st.booleans())
def test_the_rest_of_a_capped_answer_serves_the_next_pulls_in_order(
    answer: tuple[list[tuple[int, bytes, bytes]], list[Message], int, int, list[Message]],
    limits: list[int],
    verify: bool,
) -> None:
    """Decoding at most ``limit`` messages and then the rest, ``limit`` at a time,
    delivers what one uncapped decode does, in order, each step's next offset where
    the following one starts; the last step's is the answer's."""
    batches, _, start, nxt, want = answer
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 5, nxt + 9, nxt, batches))
    status, lo, hi, step_next, got, rest = decode_pull_answer("t", buf, start, verify, None, limits[0])
    assert (status, lo, hi) == (PullStatus.FOUND, 5, nxt + 9)
    steps = 1
    while rest is not None:
        assert rest.start == step_next
        status, lo, hi, step_next, more, rest = decode_pull_rest(rest, limits[steps % len(limits)], verify)
        assert (status, lo, hi) == (PullStatus.FOUND, 5, nxt + 9)
        assert more or rest is None  # a rest that delivers nothing is the masked-out tail
        got += more
        steps += 1
    assert got == want
    assert step_next == nxt  # the whole answer was read: the next pull starts at its next offset
    assert all(type(m) is Message for m in got)


@settings(max_examples=200)
@given(answers(), st.sampled_from(list(PullStatus)), st.integers(0, 2**64 - 1), st.booleans())
def test_a_batch_answer_delivers_the_kept_records_in_the_asked_range(
    answer: tuple[list[tuple[int, bytes, bytes]], list[Message], int, int, list[Message]],
    status: PullStatus,
    hi: int,
    verify: bool,
) -> None:
    batches, _, start, nxt, want = answer
    buf = b"".join(encode_pull_batches(status, 5, hi, nxt, batches))
    head = decode_pull_head(buf)
    assert (head.status, head.max_offset, head.next_offset, head.count) == (status, hi, nxt, len(batches))
    got = decode_pull_batches("t", buf, start, verify)
    assert got == (status, 5, hi, nxt, want)
    assert delivered_records(batches, start, nxt) == len(want)
    assert decode_pull_batches("t", bytearray(buf), start, verify) == got
    assert decode_pull_batches("t", buf, start, verify, nxt + 3) == got  # never past the next offset
    cut = start + 2
    assert decode_pull_batches("t", buf, start, verify, cut)[4] == [m for m in want if m.queue_offset < cut]
    for limit in (1, 2, 5):  # at most the messages asked for (masked records do not count): the rest is next
        bounded = decode_pull_response("t", buf, start, limit=limit)
        assert bounded.messages == want[:limit]
        assert bounded.next_offset == (want[limit - 1].queue_offset + 1 if len(want) >= limit else nxt)
    assert decode_pull_response("t", memoryview(buf), start) == PullResult(status, want, 5, hi, nxt)
    for m in got[4]:  # what the Message converters would have made
        assert type(m.body) is bytes and type(m.properties) is dict


@given(st.lists(messages, min_size=1, max_size=20), st.data())
def test_end_minus_one_is_bounded_by_the_mask_only(msgs: list[Message], data: st.DataObject) -> None:
    """GET_MESSAGE / FIND_BY_KEY answers: the mask alone selects the records."""
    i = data.draw(st.integers(0, len(msgs) - 1))
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 0, 0, [(100, _stored(msgs, 40), mask_of(len(msgs), [i]))]))
    assert decode_pull_batches("t", buf, 0, True, -1)[4] == [_expected("t", msgs[i], 3, 40 + i, 100 + i)]
    assert decode_pull_batches("t", buf)[4] == []  # bounded by next offset 0


def test_a_truncated_answer_is_a_protocol_error() -> None:
    msgs = [Message(b"x" * 10, key="k"), Message(b"y")]
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 9, 2, [(0, _stored(msgs, 0), b"\x03")]))
    assert len(decode_pull_batches("t", buf)[4]) == 2
    for cut in range(len(buf)):
        with pytest.raises(RemoteProtocolError):
            decode_pull_batches("t", buf[:cut])
    with pytest.raises(RemoteProtocolError, match="after"):
        decode_pull_batches("t", buf + b"\x00")
    wrong_mask = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 9, 2, [(0, _stored(msgs, 0), b"\x03\x00")]))
    with pytest.raises(RemoteProtocolError, match="mask"):
        decode_pull_batches("t", wrong_mask)


@pytest.mark.parametrize("codec", list(Codec))
def test_a_corrupt_batch_is_corrupt_record_naming_its_position(codec: Codec) -> None:
    msgs = [Message(b"hello" * 20, key="k", tags="a"), Message(b"world" * 20)]
    value = bytearray(_stored(msgs, 40, codec))
    value[-3] ^= 0xFF  # inside the records
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 99, 42, [(500, bytes(value), b"")]))
    with pytest.raises(CorruptRecord, match=r"t/3 at offset 40 \(global offset 500\)"):
        decode_pull_batches("t", buf, 40, True)
    head = bytearray(_stored(msgs, 40, codec))
    head[10] ^= 1  # the stored header: its crc catches it, verify or not
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 99, 42, [(500, bytes(head), b"")]))
    with pytest.raises(CorruptRecord, match="global offset 500"):
        decode_pull_batches("t", buf, 40, False)


def test_unverified_records_that_do_not_decode_are_corrupt_record() -> None:
    value = bytearray(_stored([Message(b"abc", key="k")], 0))
    at = STORED_HEAD.size + 14 + 2  # the record's key length varint
    value[at] = 0x7F  # the key now overruns the record
    buf = b"".join(encode_pull_batches(PullStatus.FOUND, 0, 9, 1, [(0, bytes(value), b"")]))
    with pytest.raises(CorruptRecord, match="global offset 0"):
        decode_pull_batches("t", buf, 0, False)


def test_the_batches_flag_rides_the_pull_request() -> None:
    req = PullRequest("t", 1, 2, flags=PULL_BATCHES | PULL_CLIENT_VERIFIES)
    assert PullRequest.decode(req.encode()).flags == PULL_BATCHES | PULL_CLIENT_VERIFIES
    assert struct.unpack(">B", req.encode()[-1:])[0] == 6


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_garbage_answers_raise_only_decode_errors(buf: bytes) -> None:
    try:
        decode_pull_batches("t", buf, 0, True, -1)
    except (RemoteProtocolError, CorruptRecord):
        pass


@settings(max_examples=200)
@given(answers(), st.data())
def test_mutated_answers_raise_only_decode_errors(
    answer: tuple[list[tuple[int, bytes, bytes]], list[Message], int, int, list[Message]], data: st.DataObject
) -> None:
    batches, _, start, nxt, _ = answer
    buf = bytearray(b"".join(encode_pull_batches(PullStatus.FOUND, 0, 9, nxt, batches)))
    i = data.draw(st.integers(0, len(buf) - 1), label="index")
    buf[i] ^= data.draw(st.integers(1, 255), label="mask")
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    for candidate in (bytes(buf), bytes(buf[:cut])):
        for verify in (True, False):
            try:
                decode_pull_batches("t", candidate, start, verify)
            except (RemoteProtocolError, CorruptRecord):
                pass
