"""Producer batches through a real broker: each codec round-trips, idempotent
batches keep their dedup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from equeue import Message, wire
from equeue.broker import open_broker
from equeue.client import AsyncClient
from equeue.wire.batches import Codec, encode_batch
from tests.conftest import make_config

_MSGS = [
    Message(b"a" * 300, "k1", "t1", {"p": "v"}),
    Message(b"", None, None, {}),
    Message(b"b" * 50, "k2", None, {}),
]


@pytest.mark.parametrize("codec", list(Codec))
async def test_a_batch_round_trips_and_a_resent_one_is_a_duplicate(
    codec: Codec, tmp_path: Path
) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        pid = os.urandom(16)
        req = wire.ProduceRequest("t", 0, (), pid, 0, batch=encode_batch(_MSGS, codec))
        first = await c.produce(req)
        assert (first.first_queue, first.stored, first.duplicate) == (0, 3, False)
        again = await c.produce(req)
        assert again.duplicate and again.first_queue == 0
        r = await c.pull(wire.PullRequest("t", 0, 0, 10))
        got = [(m.body, m.key, m.tags, m.properties) for m in r.messages]
        assert got == [(m.body, m.key, m.tags, m.properties) for m in _MSGS]
        assert (await c.queue_offsets("t", 0)).max_offset == 3
