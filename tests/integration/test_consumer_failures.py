"""Failures that must never stall a queue: a failed message the broker refuses
to take back for good, and a corrupt stored record."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from tests.conftest import make_config

FAST: dict[str, Any] = dict(heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.1, pull_hold=1.0)


async def wait_committed(c: AsyncClient, group: str, topic: str, offset: int) -> None:
    """Wait until ``group`` committed ``offset`` on queue 0 of ``topic``."""
    while await c.query_offset(group, topic, 0) != offset:
        await trio.sleep(0.05)


async def test_send_back_refused_for_good_moves_on(tmp_path: Path) -> None:
    """A message whose retry copy the broker refuses (MESSAGE_TOO_LARGE: the limit was
    lowered after it was stored) is counted and skipped; the queue goes on."""
    data = tmp_path / "data"
    async with open_broker(make_config(data)) as b, AsyncClient(b.address) as c:
        await c.create_topic("big", 1)
        entries = [wire.encode_entry(Message(body)) for body in (b"x" * 2000, b"small-1", b"small-2")]
        await c.produce(wire.ProduceRequest("big", 0, entries))
    async with open_broker(make_config(data, max_message_bytes=1000)) as b, AsyncClient(b.address) as c:
        seen: list[int] = []
        with trio.fail_after(20):
            async with AsyncConsumer(b.address, "g", "big", start_from="earliest", **FAST) as con:

                async def handler(m: Message) -> None:
                    seen.append(m.queue_offset)
                    if len(m.body) > 1000:
                        raise RuntimeError("cannot handle a big one")

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_committed(c, "g", "big", 3)
                    st = con.statistics()
                    con.stop()
        assert sorted(set(seen)) == [0, 1, 2]
        assert (st.failed, st.retried, st.dead_lettered, st.dropped) == (1, 0, 0, 1)


@pytest.mark.parametrize("verify", [False, True])
async def test_corrupt_record_is_quarantined(broker: Broker, verify: bool) -> None:
    """A record failing its checksum is logged, counted and skipped (like nsqd's
    quarantine): the messages after it are handled and the offset moves past it.
    ``verify``: the consumer checks checksums itself (the broker then does not), finds
    a bad batch and pulls it again one record at a time to skip only the bad one."""
    async with AsyncClient(broker.address) as c:
        await c.create_topic("bad", 1)
        # one stored batch per message: a damaged batch holds back each of its records
        answers = [await c.produce(wire.ProduceRequest("bad", 0, [wire.encode_entry(Message(f"m{i}".encode() * 20))]))
                   for i in range(10)]  # fmt: skip
        key = struct.pack(">Q", answers[4].first_global)  # the batch of queue offset 4
        store = broker.store
        with store.env.begin(write=True) as txn:  # flip a body byte behind the store's back
            rec = bytearray(txn.get(key, db=store.db[b"messages"]))
            rec[-3] ^= 0x40
            txn.put(key, bytes(rec), db=store.db[b"messages"])
        seen: list[int] = []
        with trio.fail_after(20):
            async with AsyncConsumer(
                broker.address, "g", "bad", start_from="earliest", verify_checksums=verify, **FAST
            ) as con:

                async def handler(m: Message) -> None:
                    seen.append(m.queue_offset)

                async with trio.open_nursery() as n:
                    n.start_soon(con.run, handler)
                    await wait_committed(c, "g", "bad", 10)
                    st = con.statistics()
                    con.stop()
        assert sorted(seen) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert st.quarantined == 1
