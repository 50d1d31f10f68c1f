"""Every stored entry is servable, a message at the size
limit is served, one op's failure stays its own, commits past the end are refused."""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import attrs
import pytest
import trio

from equeue import Message, control, wire
from equeue.broker import Broker, open_broker
from equeue.broker.storage import CommitOffsetOp, ProduceOp, layout
from equeue.broker.storage.writes import WriteContext, WriteOp
from equeue.client import AsyncClient
from equeue.codec import DEFAULT_MAX_FRAME, HEADER
from equeue.config import SERVE_OVERHEAD, BrokerConfig
from equeue.consumer import AsyncConsumer
from equeue.errors import (
    ConfigError,
    CorruptRecord,
    InternalBrokerError,
    InvalidMessage,
    MessageTooLarge,
    OffsetOutOfRange,
)
from equeue.protocol import RequestCode
from equeue.wire import batches
from equeue.wire.entries import ENTRY_HEADER
from tests.conftest import make_config, wait_until


def _bad_props_entry() -> bytes:
    """An entry whose property block says 9 bytes of name where there are 2: the
    probe that stalled every consumer of its queue."""
    block = b"\x00\x09ab\x00\x00"
    return ENTRY_HEADER.pack(19 + len(block) + 2, 0, 0, 0, 0, 0, len(block)) + block + b"hi"


async def test_a_malformed_property_block_is_refused_and_nothing_of_the_batch_stored(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        good = wire.encode_entry(Message(b"before"))
        with pytest.raises(InvalidMessage, match=r"message 1: bad property block \(property overruns its block\)"):
            await c.produce(wire.ProduceRequest("t", 0, [good, _bad_props_entry(), good]))
        assert (await c.queue_offsets("t", 0)).max_offset == 0
        assert (await c.produce(wire.ProduceRequest("t", 0, [good]))).stored == 1  # the connection lives


async def test_properties_count_against_max_message(tmp_path: Path) -> None:
    """The probe: 8 MiB of properties passed with --max-message 1KiB."""
    async with open_broker(make_config(tmp_path / "d", max_message_bytes=1024)) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        fat = wire.encode_entry(Message(b"x", properties={"p": "v" * (8 << 20)}))
        with pytest.raises(MessageTooLarge, match=r"message 0 is 8388\d+ bytes .*limit is 1024"):
            await c.produce(wire.ProduceRequest("t", 0, [fat]))
        at_limit = wire.encode_entry(Message(b"x" * (1024 - 1 - 8), "k", None, {"a": "b"}))
        assert len(at_limit) - ENTRY_HEADER.size == 1024  # key 1 + properties 8 + body
        assert (await c.produce(wire.ProduceRequest("t", 0, [at_limit]))).stored == 1
        assert (await c.queue_offsets("t", 0)).max_offset == 1


def test_config_refuses_a_message_limit_that_cannot_be_served(tmp_path: Path) -> None:
    """The probe: a 16 MiB produce was accepted, its pull answer was over every client's cap."""
    with pytest.raises(ConfigError, match="must fit in a pull answer"):
        BrokerConfig(tmp_path, max_message_bytes=DEFAULT_MAX_FRAME)
    with pytest.raises(ConfigError, match="clients read frames up to"):
        BrokerConfig(tmp_path, max_frame=DEFAULT_MAX_FRAME + 1)
    BrokerConfig(tmp_path, max_message_bytes=DEFAULT_MAX_FRAME - SERVE_OVERHEAD)


@pytest.mark.slow
async def test_a_message_at_the_limit_reaches_a_consumer_and_get_message(tmp_path: Path) -> None:
    limit = DEFAULT_MAX_FRAME - SERVE_OVERHEAD
    body = b"m" * (limit - 1 - 8)  # key "k" and one property "a": "b" (8 bytes)
    cfg = make_config(tmp_path / "d", max_message_bytes=limit)
    with trio.fail_after(60):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("big", 1)
            entry = wire.encode_entry(Message(body, "k", None, {"a": "b"}))
            assert len(entry) - ENTRY_HEADER.size == limit
            await c.produce(wire.ProduceRequest("big", 0, [wire.encode_entry(Message(b"small"))]))
            await c.produce(wire.ProduceRequest("big", 0, [entry]))
            got = await c.get_message("big", 0, 1)
            assert got.messages[0].body == body
            seen: list[Message] = []
            async with AsyncConsumer(b.address, "g", "big", start_from="earliest", rebalance_interval=0.2) as con:

                async def handler(m: Message) -> None:
                    seen.append(m)
                    if len(seen) == 2:
                        con.stop()

                await con.run(handler)
            assert seen[1].body == body and seen[1].properties == {"a": "b"}


async def test_a_pull_answer_never_exceeds_the_frame_cap(tmp_path: Path) -> None:
    """Many records whose lengths fill the byte budget: their 12-byte items used to
    push the answer over max_frame."""
    max_frame = 1 << 20
    cfg = make_config(tmp_path / "d", max_frame=max_frame, max_message_bytes=4096)
    async with open_broker(cfg) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        entries = [wire.encode_entry(Message(b"b" * 60))] * 1000
        for _ in range(15):
            await c.produce(wire.ProduceRequest("t", 0, entries))
        payload = await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 0, 10_000, 1 << 30).encode())
        *_, msgs = wire.decode_pull_batches("t", payload)
        assert len(msgs) > 1000
        assert HEADER.size + len(payload) <= max_frame, f"answer frame {HEADER.size + len(payload)} > {max_frame}"


async def test_a_commit_past_the_end_is_refused(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        with pytest.raises(OffsetOutOfRange, match="past the end of t/0: its next offset is 0"):
            await c.commit_offset("g", "t", 0, 123456)
        assert await c.query_offset("g", "t", 0) == -1
        await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"x"))] * 3))
        await c.commit_offset("g", "t", 0, 3)  # the end itself is fine
        assert await c.query_offset("g", "t", 0) == 3


@attrs.define
class _FailsAfterWriting(WriteOp):
    """A test op that writes, then fails with a plain bug (no EQueueError): the shape
    of the COMMIT_OFFSET ≥ 2^64 probe (struct.error inside the writer thread)."""

    group: str

    def apply(self, w: WriteContext) -> None:
        CommitOffsetOp(self.group, "t", 0, 0).apply(w)
        raise RuntimeError("a bug in one op")


async def test_a_failing_op_fails_only_its_own_request(tmp_path: Path) -> None:
    """200 failing ops interleaved with produces: every produce commits; the failing
    ops' partial writes do not."""
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        info = await c.create_topic("t", 1)
        entry = wire.encode_entry(Message(b"x"))
        produced: list[object] = []
        failed: list[object] = []

        async def produce() -> None:
            try:
                produced.append(await c.produce(wire.ProduceRequest("t", 0, [entry])))
            except Exception as exc:
                failed.append(exc)

        async def bad(i: int) -> None:
            try:
                await b.appender.submit(_FailsAfterWriting(f"bad{i}"))
            except InternalBrokerError:
                failed.append(None)

        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(produce)
                    n.start_soon(bad, i)
                    n.start_soon(b.appender.submit, ProduceOp(info, 0, [entry]))
        assert [f for f in failed if f is not None] == []
        assert len(produced) == 200 and failed == [None] * 200
        assert (await c.queue_offsets("t", 0)).max_offset == 400
        for i in range(0, 200, 20):
            assert await c.query_offset(f"bad{i}", "t", 0) == -1


@attrs.define
class _RawAppend(WriteOp):
    """Append record batches to a queue as stored batches WITHOUT the produce checks:
    what an older broker stored, or what disk damage left behind (the store's write
    API, in the test; no broker code is patched). ``batches``: each a list of raw
    records (the record layout of equeue.wire.batches)."""

    info: control.TopicInfo
    queue_id: int
    batches: list[list[bytes]]

    def apply(self, w: WriteContext) -> None:
        w.wrote = True
        tid, qid = self.info.topic_id, self.queue_id
        st = w.queue(tid, qid)
        for recs in self.batches:
            records = b"".join(recs)
            batch = batches.BATCH_HEAD.pack(batches.BATCH_MAGIC, 0, len(recs), zlib.crc32(records), len(records))
            value = batches.encode_stored(tid, qid, st.next_offset, w.now, w.now, None, 0, batch + records)
            g = w.next_global
            w.txn.put(layout.global_key(g), value, db=w.db[b"messages"])
            w.txn.put(layout.qindex_key(tid, qid, st.next_offset), layout.pack_qindex_value(g, len(recs)),
                      db=w.db[b"qindex"])  # fmt: skip
            w.next_global += len(recs)
            st.next_offset += len(recs)
            st.bytes += len(value)
        w.touched.add((tid, qid))


def _bad_props_record() -> bytes:
    """A record whose property block says 9 bytes of value where there is 1."""
    block = b"\x02ab\x09x"
    rest = bytes((batches.A_PROPS, len(block))) + block + b"hi"
    return bytes((len(rest),)) + rest


async def _consume_past_a_poison_record(b: Broker, c: AsyncClient, batched: list[list[bytes]]) -> None:
    """Store ``batched`` (4 good records m0..m3 around one poison record at offset 2)
    and consume: the 4 are delivered, the poison one is quarantined, the offset is
    committed past it."""
    info = await c.create_topic("t", 1)
    await b.appender.submit(_RawAppend(info, 0, batched))
    seen: list[bytes] = []
    async with AsyncConsumer(
        b.address, "g", "t", start_from="earliest", heartbeat_interval=0.2, rebalance_interval=0.2,
        commit_interval=0.2,
    ) as con:  # fmt: skip

        async def handler(m: Message) -> None:
            seen.append(m.body)

        async def members_report() -> bool:
            d = await c.describe_group("g")
            return [m.quarantined for m in d.members] == [1]

        async with trio.open_nursery() as n:
            n.start_soon(con.run, handler)
            await wait_until(lambda: len(seen) == 4, timeout=30, what="the 4 good messages consumed")
            await wait_until(members_report, timeout=30, what="group describe shows the skipped record")
            con.stop()
        assert con.statistics().quarantined == 1
    assert seen == [b"m0", b"m1", b"m2", b"m3"]
    assert await c.query_offset("g", "t", 0) == 5  # committed past it


def _good_records() -> list[bytes]:
    return [batches.encode_record(Message(f"m{i}".encode(), properties={"i": str(i)})) for i in range(4)]


async def _the_poison_letter(c: AsyncClient) -> None:
    """The group's one dead letter is the salvaged poison record at t/0 offset 2: its
    stored bytes as the body, why it does not decode in ``%POISON``."""
    page = await c.dlq_list("g")
    (letter,) = page.letters
    assert (letter.origin_topic, letter.origin_queue, letter.origin_offset) == ("t", 0, 2)
    assert "property overruns its block" in letter.properties["%POISON"]
    assert base64.b64decode(letter.body) == _bad_props_record()


async def test_a_poison_record_goes_to_the_dlq_and_the_queue_moves_on(tmp_path: Path) -> None:
    """The probe: a stored record with a malformed property block stalled every consumer
    of its queue ("property overruns its block"), the messages before it included."""
    with trio.fail_after(60):
        async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
            good = _good_records()
            await _consume_past_a_poison_record(b, c, [[good[0]], [good[1]], [_bad_props_record()], [good[2]],
                                                       [good[3]]])  # fmt: skip
            await _the_poison_letter(c)


async def test_a_poison_record_inside_a_batch_costs_no_other_record_of_it(tmp_path: Path) -> None:
    """The whole batch comes back in every answer: the consumer decodes record by record
    to find the poison one, and skips only it; the broker salvages only that record
    into the letter, and still serves and sends back the others of its batch."""
    with trio.fail_after(60):
        async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
            good = _good_records()
            await _consume_past_a_poison_record(b, c, [[good[0], good[1], _bad_props_record(), good[2], good[3]]])
            await _the_poison_letter(c)
            assert [m.body for m in (await c.get_message("t", 0, 3)).messages] == [b"m2"]  # a neighbour reads intact
            await c.send_back("g", "t", 0, 1, 0, 0)  # a neighbour sent back is a copy, not a salvage
            (retried,) = [m for m in (await c.dlq_list("g")).letters if m.origin_offset == 1]
            assert base64.b64decode(retried.body) == b"m1" and "%POISON" not in retried.properties


async def test_a_tag_filtered_pull_answers_the_matches_before_a_poison_record(tmp_path: Path) -> None:
    """The filter's scan stops right before the record that does not decode: what
    matched before it is answered, and the pull from it names that exact offset."""
    with trio.fail_after(30):
        async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
            info = await c.create_topic("t", 1)
            recs = [batches.encode_record(Message(f"m{i}".encode(), tags="ab"[i % 2])) for i in range(4)]
            await b.appender.submit(_RawAppend(info, 0, [[recs[0], recs[1], _bad_props_record(), recs[3]]]))
            r = await c.pull(wire.PullRequest("t", 0, 0, 10, tags="b"))
            assert [m.body for m in r.messages] == [b"m1"] and r.next_offset == 2
            with pytest.raises(CorruptRecord, match=r"t/0 offset 2: a property overruns its block"):
                await c.pull(wire.PullRequest("t", 0, 2, 10, tags="b"))
            await c.skip_message("t", 0, 2)
            r = await c.pull(wire.PullRequest("t", 0, 2, 10, tags="b"))
            assert [m.body for m in r.messages] == [b"m3"] and r.next_offset == 4


async def test_a_record_too_big_for_any_answer_is_skipped_not_looped_on(tmp_path: Path) -> None:
    """A record stored under a larger limit (an older broker's): it used to make an
    answer over the clients' frame cap, and the consumer reconnected in a loop."""
    cfg = make_config(tmp_path / "d", max_frame=64 << 10, max_message_bytes=1024)
    with trio.fail_after(60):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            info = await c.create_topic("t", 1)
            small = [batches.encode_record(Message(f"m{i}".encode())) for i in range(2)]
            huge = batches.encode_record(Message(b"h" * (80 << 10)))
            await b.appender.submit(_RawAppend(info, 0, [[small[0]], [huge], [small[1]]]))
            payload = await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 0, 10).encode())
            assert len(wire.decode_pull_batches("t", payload)[4]) == 1  # the budget stops before it
            with pytest.raises(CorruptRecord, match=r"offset 1 \(global offset \d+\) is 8\d{4} bytes: too big for any answer"):
                await c.request(RequestCode.PULL, wire.PullRequest("t", 0, 1, 10).encode())
            seen: list[bytes] = []
            async with AsyncConsumer(b.address, "g", "t", start_from="earliest", rebalance_interval=0.2) as con:

                async def handler(m: Message) -> None:
                    seen.append(m.body)
                    if len(seen) == 2:
                        con.stop()

                await con.run(handler)
                assert con.statistics().quarantined == 1
            assert seen == [b"m0", b"m1"]


async def test_find_by_key_and_dlq_list_answers_fit_in_a_frame(tmp_path: Path) -> None:
    """Large messages under one key, and large dead letters: every FIND_BY_KEY and
    DLQ_LIST answer stays within max_frame (it used to gather up to 1,000 hits, or a
    page of base64 bodies, whatever their size); the rest is one resume away."""
    max_frame = 256 << 10
    cfg = make_config(tmp_path / "d", max_frame=max_frame, max_message_bytes=200 << 10)
    async with open_broker(cfg) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 2)
        for i in range(5):
            body = bytes([65 + i]) * (196 << 10)
            await c.produce(wire.ProduceRequest("t", i % 2, [wire.encode_entry(Message(body, key="k"))]))
        found: list[bytes] = []
        before = -1
        while True:
            req = control.FindByKey("t", "k", 32, before)
            payload = await c.request(RequestCode.FIND_BY_KEY, control.encode(req))
            assert HEADER.size + len(payload) <= max_frame, f"answer frame {HEADER.size + len(payload)} > {max_frame}"
            res = wire.decode_pull_response("t", payload, 0, -1)
            found += [m.body for m in res.messages]
            if not res.next_offset:
                break
            before = res.next_offset
        assert sorted(found) == sorted(bytes([65 + i]) * (196 << 10) for i in range(5))
        # dead letters: 196 KiB bodies (base64: 261 KiB, over the frame) are listed without them
        for i in range(5):
            await c.send_back("g", "t", i % 2, i // 2, 16, 16)
        letters: list[control.DeadLetter] = []
        q = off = 0
        while True:
            payload = await c.request(RequestCode.DLQ_LIST, control.encode(control.DlqList("g", q, off, 100)))
            assert HEADER.size + len(payload) <= max_frame, f"answer frame {HEADER.size + len(payload)} > {max_frame}"
            page = control.decode(payload, control.DlqPage)
            letters += page.letters
            if page.done:
                break
            q, off = page.next_queue_id, page.next_offset
        assert len(letters) == 5 and all(d.body_omitted and d.body == "" for d in letters)
        whole = await c.get_message(global_offset=letters[0].id)
        assert len(whole.messages[0].body) == 196 << 10
