"""The store's pause markers (``meta`` "pause/<kind>/<name>"): one encoder, one decoder."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from equeue.broker.storage import layout
from equeue.names import validate_group

names = st.from_regex(r"[A-Za-z0-9_.\-]{1,128}", fullmatch=True)


@given(kind=st.sampled_from(layout.PAUSE_KINDS), name=names)
def test_pause_key_round_trip(kind: str, name: str) -> None:
    validate_group(name)  # the names a topic or group can have
    key = layout.pause_key(kind, name)
    assert key.startswith(layout.PAUSE_PREFIX) and not key.startswith(layout.SKIP_PREFIX)
    assert layout.unpack_pause_key(key) == (kind, name)


def test_pause_keys_of_the_two_kinds_never_collide() -> None:
    assert layout.pause_key("topic", "a") != layout.pause_key("group", "a")
    assert layout.pause_key("topic", "a") == b"pause/topic/a"
