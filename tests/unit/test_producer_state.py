"""The idempotent producer's dedup decision (equeue.broker.storage.producers), as pure
functions of the stored value: a resent batch gets its first answer while it is in
the ring, an out-of-order sequence is refused and changes nothing, and the value
decodes to what was encoded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue import wire
from equeue.broker.storage import producers
from equeue.broker.storage.producers import (
    PRODUCER_RING,
    ProducerState,
    check_sequence,
    decode_state,
    encode_state,
    next_state,
)
from equeue.errors import OutOfOrderSequence

offsets = st.one_of(st.just(-1), st.integers(0, (1 << 63) - 1))
answers = st.builds(wire.ProduceResponse, offsets, offsets, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
#: ("send", batch size, its answer) | ("retry", which earlier batch) | ("skip", how far ahead)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 5), answers),
        st.tuples(st.just("retry"), st.integers(0, 1000)),
        st.tuples(st.just("skip"), st.integers(1, 1000)),
    ),
    max_size=60,
)


def stored(state: ProducerState | None) -> ProducerState | None:
    """``state`` as the store keeps it: encoded, then read back."""
    return None if state is None else decode_state(encode_state(state))


@given(actions)
def test_a_resent_batch_gets_its_first_answer_and_a_gap_is_refused(steps: list[tuple]) -> None:
    state: ProducerState | None = None
    sent: list[tuple[int, wire.ProduceResponse]] = []  # (base sequence, first answer), oldest first
    nxt = 0
    for step in steps:
        if step[0] == "send":
            _, count, answer = step
            assert check_sequence(state, nxt) is None  # the next batch: stored
            state = stored(next_state(state, nxt, count, answer, now_ms=len(sent)))
            sent.append((nxt, answer))
            nxt += count
        elif step[0] == "retry" and sent:
            k = step[1] % len(sent)
            base, first = sent[k]
            got = check_sequence(state, base)
            if k >= len(sent) - PRODUCER_RING:  # still in the ring: its first answer
                want = wire.ProduceResponse(first.first_global, first.first_queue, first.stored, first.scheduled, True)
            else:  # forgotten: a bare duplicate, still never stored twice
                want = wire.ProduceResponse(-1, -1, 0, 0, True)
            assert got == want
        elif step[0] == "skip":
            before = state
            with pytest.raises(OutOfOrderSequence):
                check_sequence(state, nxt + step[1])
            assert state == before
    if state is not None:
        assert state.last_sequence == nxt - 1 and state.last_seen_ms == len(sent) - 1
        assert len(state.ring) == 32 * min(len(sent), PRODUCER_RING)


def test_an_unknown_producer_starts_at_zero() -> None:
    assert check_sequence(None, 0) is None
    with pytest.raises(OutOfOrderSequence, match="does not know"):
        check_sequence(None, 3)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=32 * (PRODUCER_RING + 2)))
def test_the_value_decodes_to_what_was_encoded(last: int, seen: int, ring: bytes) -> None:
    ring = ring[: len(ring) - len(ring) % 32]
    value = encode_state(ProducerState(last, seen, ring))
    assert decode_state(value) == ProducerState(last, seen, ring[: 32 * PRODUCER_RING])
    assert producers.last_seen_ms(value) == seen
    assert producers.last_seen_ms(value[:15]) == 0
