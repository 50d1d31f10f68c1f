"""The pull answer's batch layout against a real broker: the flag is required, whole
batches come back and each reader delivers exactly the records asked for (from the
offset, masks applied), GET_MESSAGE and FIND_BY_KEY select their records by mask."""

from __future__ import annotations

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker
from equeue.client import AsyncClient
from equeue.errors import BadRequest
from equeue.protocol import PullStatus, RequestCode


async def test_a_pull_without_the_batches_flag_is_refused_naming_it(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"a"))]))
            for flags in (0, wire.PULL_CLIENT_VERIFIES):
                with pytest.raises(BadRequest, match=r"BATCHES flag \(4\)"):
                    await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 0, flags=flags).encode())
            with pytest.raises(BadRequest, match="bad pull flags 0x5"):  # bit 0: the retired packed layout
                await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 0, flags=5).encode())
            # the connection lives on, and the flag set by default reads
            assert [m.body for m in (await c.pull(wire.PullRequest("t", 0, 0))).messages] == [b"a"]


async def test_a_pull_inside_a_batch_delivers_from_its_offset_without_skipped_records(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            bodies = [b"m%d" % i for i in range(10)]
            await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b)) for b in bodies]))
            out = broker.stats.messages_out
            payload = await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 4, 3).encode())
            assert wire.decode_pull_head(payload).count == 1  # the stored batch, whole
            r = wire.decode_pull_response("t", payload, 4)  # the answer ends inside the batch
            assert (r.status, r.next_offset) == (PullStatus.FOUND, 7)
            assert [m.body for m in r.messages] == bodies[4:7]
            assert [m.queue_offset for m in r.messages] == [4, 5, 6]
            assert broker.stats.messages_out - out == 3  # the records delivered, not the batch's 10
            await c.skip_message("t", 0, 6)
            r = await c.pull(wire.PullRequest("t", 0, 5, 32))
            assert [m.body for m in r.messages] == [b"m5", b"m7", b"m8", b"m9"]  # masked out: 6
            assert broker.stats.messages_out - out == 3 + 4


async def test_lookups_answer_the_records_found_by_mask(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            msgs = [Message(b"a", key="k"), Message(b"b", key="other"), Message(b"c", key="k")]
            ans = await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(m) for m in msgs]))
            [m] = (await c.get_message("t", 0, 1)).messages
            assert (m.body, m.key, m.queue_offset, m.global_offset) == (b"b", "other", 1, ans.first_global + 1)
            found = await c.find_by_key("t", "k")
            assert [(m.body, m.queue_offset) for m in found.messages] == [(b"c", 2), (b"a", 0)]  # newest first
