"""Replication layouts (equeue.wire.replica): REPLICA_FETCH, REPLICA_KEYS and
REPLICA_SNAPSHOT requests and answers round-trip, and malformed input raises
RemoteProtocolError only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue.errors import RemoteProtocolError
from equeue.wire.replica import (
    ABSENT,
    STORE_FORMAT_UNSTATED,
    FetchAnswer,
    FetchRequest,
    FetchStatus,
    KeysAnswer,
    KeysRequest,
    SnapshotAnswer,
    SnapshotRequest,
    decode_fetch_answer,
    decode_fetch_request,
    decode_keys_answer,
    decode_keys_request,
    decode_snapshot_answer,
    decode_snapshot_request,
    encode_fetch_answer,
    encode_fetch_request,
    encode_keys_answer,
    encode_keys_request,
    encode_snapshot_answer,
    encode_snapshot_request,
)

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
text = st.text(max_size=30)
blob = st.binary(max_size=64)


@st.composite
def fetch_answers(draw: Any) -> FetchAnswer:
    datas = draw(st.lists(blob, max_size=8))
    first = draw(st.integers(0, (1 << 64) - 1 - len(datas)))
    return FetchAnswer(
        draw(st.sampled_from(FetchStatus)), draw(u32), draw(u64), draw(u64), draw(u64), draw(u64),
        [(first + i, d) for i, d in enumerate(datas)],
    )  # fmt: skip


fetch_requests = st.builds(FetchRequest, text, text, u32, u64, u32, u32, u32, u32, blob, st.booleans())
keys_requests = st.builds(KeysRequest, u32, st.lists(st.tuples(u8, blob), max_size=8), text, blob)
keys_answers = st.builds(KeysAnswer, u64, st.lists(st.none() | blob, max_size=8))
snapshot_requests = st.builds(SnapshotRequest, u32, text, u8, st.none() | blob, u32, u32, blob)
snapshot_answers = st.builds(SnapshotAnswer, u64, st.lists(st.tuples(blob, blob), max_size=8), st.none() | blob)


def joined(parts: bytes | list[bytes]) -> bytes:
    return parts if isinstance(parts, bytes) else b"".join(parts)


def older_forms(value: Any, buf: bytes) -> dict[int, Any]:
    """The prefixes of ``buf`` an older follower sends (cut length → what it
    decodes as): a request without its trailing consistent flag (fetch), proof (and
    broker id, for keys), and a fetch or snapshot request without its store format."""
    if not hasattr(value, "proof"):
        return {}
    forms: dict[int, Any] = {}
    if hasattr(value, "consistent"):  # a fetch: the flag comes last
        value = attrs.evolve(value, consistent=False)
        forms[len(buf) - 1] = value
        buf = buf[:-1]
    tail = 4 + len(value.proof)
    if not hasattr(value, "store_format"):  # keys: broker_id and proof come last
        tail += 2 + len(value.broker_id.encode())
        forms[len(buf) - tail] = attrs.evolve(value, broker_id="", proof=b"")
        return forms
    forms[len(buf) - tail] = attrs.evolve(value, proof=b"")
    forms[len(buf) - tail - 4] = attrs.evolve(value, proof=b"", store_format=STORE_FORMAT_UNSTATED)
    return forms


#: (strategy, encoder, decoder) of every layout
LAYOUTS: list[tuple[Any, Callable[[Any], Any], Callable[[bytes], Any]]] = [
    (fetch_requests, encode_fetch_request, decode_fetch_request),
    (fetch_answers(), encode_fetch_answer, decode_fetch_answer),
    (keys_requests, encode_keys_request, decode_keys_request),
    (keys_answers, encode_keys_answer, decode_keys_answer),
    (snapshot_requests, encode_snapshot_request, decode_snapshot_request),
    (snapshot_answers, encode_snapshot_answer, decode_snapshot_answer),
]
IDS = ["fetch_request", "fetch_answer", "keys_request", "keys_answer", "snapshot_request", "snapshot_answer"]


@pytest.mark.parametrize(("strategy", "encode", "decode"), LAYOUTS, ids=IDS)
def test_round_trip(strategy: Any, encode: Callable[[Any], Any], decode: Callable[[bytes], Any]) -> None:
    @given(strategy)
    def check(value: Any) -> None:
        assert decode(joined(encode(value))) == value

    check()


@pytest.mark.parametrize(("strategy", "encode", "decode"), LAYOUTS, ids=IDS)
def test_truncated_or_extended_input_is_refused(
    strategy: Any, encode: Callable[[Any], Any], decode: Callable[[bytes], Any]
) -> None:
    @given(strategy, st.data())
    def check(value: Any, data: Any) -> None:
        buf = joined(encode(value))
        cut = data.draw(st.integers(0, len(buf) - 1))
        older = older_forms(value, buf)
        if cut in older:  # an older follower's request: it lacks the trailing fields
            assert decode(buf[:cut]) == older[cut]
            return
        with pytest.raises(RemoteProtocolError):
            decode(buf[:cut])
        with pytest.raises(RemoteProtocolError):
            decode(buf + data.draw(st.binary(min_size=1, max_size=8)))

    check()


@pytest.mark.parametrize(("strategy", "encode", "decode"), LAYOUTS, ids=IDS)
def test_garbage_raises_only_the_protocol_error(
    strategy: Any, encode: Callable[[Any], Any], decode: Callable[[bytes], Any]
) -> None:
    @given(strategy, st.data())
    def check(value: Any, data: Any) -> None:
        buf = bytearray(joined(encode(value)))
        for _ in range(data.draw(st.integers(1, 4))):  # flip bytes of a valid payload
            if buf:
                buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(u8)
        try:
            decode(bytes(buf))
        except RemoteProtocolError:
            pass

    check()

    @given(st.binary(max_size=200))
    def noise(buf: bytes) -> None:
        try:
            decode(buf)
        except RemoteProtocolError:
            pass

    noise()


def test_fetch_answer_entries_are_dense() -> None:
    with pytest.raises(ValueError, match="consecutive"):
        encode_fetch_answer(FetchAnswer(FetchStatus.OK, 1, 0, 0, 0, 0, [(5, b"a"), (7, b"b")]))
    ans = decode_fetch_answer(b"".join(encode_fetch_answer(FetchAnswer(FetchStatus.OK, 1, 9, 9, 0, 0, []))))
    assert ans.entries == []


def test_unknown_fetch_status_and_absent_snapshot_items_are_refused() -> None:
    buf = bytearray(b"".join(encode_fetch_answer(FetchAnswer(FetchStatus.OK, 1, 0, 0, 0, 0, []))))
    buf[0] = 9
    with pytest.raises(RemoteProtocolError, match="unknown fetch status 9"):
        decode_fetch_answer(bytes(buf))
    # an item whose key is the ABSENT length
    bad = b"".join(encode_snapshot_answer(SnapshotAnswer(3, [], None)))
    bad = bad[:8] + (1).to_bytes(4, "big") + bad[12:] + ABSENT.to_bytes(4, "big") + (0).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="absent snapshot key"):
        decode_snapshot_answer(bad)


def test_huge_counts_are_refused_before_any_allocation() -> None:
    head = (0).to_bytes(4, "big") + (0xFFFFFFFF).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="announces"):
        decode_keys_request(head)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_fetch_answer(
            bytes([0]) + bytes(4) + bytes(8 * 5) + (0xFFFFFFFF).to_bytes(4, "big")
        )


def test_a_request_without_a_store_format_is_an_older_followers() -> None:
    """Fetch and snapshot requests of a follower from before store format 2 end
    before ``store_format``: they decode as format 1, which a leader then refuses
    by name (the encoders always write the field)."""
    fetch = FetchRequest("f", "h:1", 3, 10, 2, 1 << 20, 500, 2)
    old_fetch = encode_fetch_request(fetch)[:-9]  # (an empty proof is its u32 length alone; then the flag)
    assert decode_fetch_request(old_fetch) == attrs.evolve(fetch, store_format=1)
    snap = SnapshotRequest(3, "f", 1, b"k", 1 << 20, 2)
    old_snap = encode_snapshot_request(snap)[:-8]
    assert decode_snapshot_request(old_snap) == attrs.evolve(snap, store_format=1)
    for buf, decode in ((old_fetch, decode_fetch_request), (old_snap, decode_snapshot_request)):
        for extra in (b"\x00", b"\x00\x00\x00"):  # a partial format field is garbled
            with pytest.raises(RemoteProtocolError):
                decode(buf + extra)  # type: ignore[operator]
