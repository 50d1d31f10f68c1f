"""Hostile producer batches: decompression bombs (zstd, lz4), batches whose crc32,
size or count lie, truncated batches. Each is refused with CORRUPT_RECORD before
anything is inflated or written, and the broker keeps serving its other clients."""

from __future__ import annotations

import zlib
from pathlib import Path

import lz4.frame
import pytest
import zstandard

from equeue import Message, wire
from equeue.broker import open_broker
from equeue.client import AsyncClient
from equeue.errors import CorruptRecord, InvalidMessage
from equeue.wire.batches import (
    BATCH_HEAD,
    BATCH_MAGIC,
    Codec,
    ProducedRecords,
    encode_batch,
    encode_record,
)
from tests.conftest import make_config, wait_until
from tests.hostile.conftest import LatencyProbe

#: what a bomb inflates to: far above the frame limit
_BOMB = 256 << 20


def _batch(
    codec: Codec, count: int, records_len: int, carried: bytes, crc: int | None = None
) -> bytes:
    """A batch written field by field, so any field can lie."""
    crc = zlib.crc32(carried) if crc is None else crc
    return BATCH_HEAD.pack(BATCH_MAGIC, codec, count, crc, records_len) + carried


def _zeros(codec: Codec, n: int) -> bytes:
    if codec is Codec.ZSTD:
        # streamed: the compressor never holds the inflated size
        cobj = zstandard.ZstdCompressor(level=1).compressobj()
        chunk = bytes(1 << 20)
        return b"".join(cobj.compress(chunk) for _ in range(n >> 20)) + cobj.flush()
    return bytes(lz4.frame.compress(bytes(n)))


def _attacks() -> list[tuple[str, bytes]]:
    rec = encode_record(Message(b"hello"))
    two = rec + rec
    good_z = zstandard.ZstdCompressor().compress(two)
    out: list[tuple[str, bytes]] = []
    for codec in (Codec.ZSTD, Codec.LZ4):
        name = codec.name.lower()
        bomb = _zeros(codec, _BOMB if codec is Codec.ZSTD else 64 << 20)
        # announced honestly: refused on the header, above the frame limit
        out.append((f"{name} bomb announced", _batch(codec, 1, _BOMB, bomb)))
        # announced small: decompression stops one byte past the announced size
        out.append((f"{name} bomb lying about its size", _batch(codec, 1, 100, bomb)))
    # honest, small on the wire, and 4M records of 2 bytes: refused on its count before
    # it is inflated (decoding it would cost seconds and gigabytes of Messages)
    tiny = b"\x01\x00" * (4 << 20)
    out.append(("zstd of 4M tiny records", _batch(Codec.ZSTD, 4 << 20, len(tiny), zstandard.ZstdCompressor().compress(tiny))))
    out += [
        ("crc lies", _batch(Codec.NONE, 2, len(two), two, crc=zlib.crc32(two) ^ 1)),
        ("crc lies (zstd)", _batch(Codec.ZSTD, 2, len(two), good_z, crc=zlib.crc32(good_z) ^ 1)),
        ("size lies (none)", _batch(Codec.NONE, 2, len(two) + 5, two)),
        ("size lies (zstd)", _batch(Codec.ZSTD, 2, len(two) - 1, good_z)),
        ("count lies", _batch(Codec.NONE, 3, len(two), two)),
        ("truncated (none)", encode_batch([Message(b"hello")] * 2)[:-3]),
        ("truncated (zstd, crc of what is left)", _batch(Codec.ZSTD, 2, len(two), good_z[:-4])),
        ("truncated header", encode_batch([Message(b"hello")])[:7]),
        (
            "unknown codec",
            _batch(Codec.NONE, 1, len(rec), rec)[:1]
            + b"\x07"
            + _batch(Codec.NONE, 1, len(rec), rec)[2:],
        ),
    ]
    return out


async def test_lying_batches_are_refused_nothing_stored_and_others_served(tmp_path: Path) -> None:
    async with (
        open_broker(make_config(tmp_path / "d")) as b,
        AsyncClient(b.address) as c,
        LatencyProbe(b.address) as probe,
    ):
        await c.create_topic("t", 1)
        for what, batch in _attacks():
            with pytest.raises(CorruptRecord) as info:
                await c.produce(wire.ProduceRequest("t", 0, (), batch=batch))
            assert info.value.code == CorruptRecord.code, what
            assert (await c.queue_offsets("t", 0)).max_offset == 0, what
        # the same connection still produces, and the probe (produce + pull round
        # trips on its own connection) was served throughout
        ok = await c.produce(wire.ProduceRequest("t", 0, (), batch=encode_batch([Message(b"ok")], Codec.LZ4)))
        assert ok.stored == 1
        rounds = probe.rounds
        await wait_until(lambda: probe.rounds > rounds + 2)
    assert not probe.errors, str(probe)


async def test_a_record_the_broker_would_not_store_is_refused(tmp_path: Path) -> None:
    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        batch = encode_batch([Message(b"x", key="k" * 70_000)], Codec.ZSTD)
        with pytest.raises(InvalidMessage, match="65535"):
            await c.produce(wire.ProduceRequest("t", 0, (), batch=batch))
        huge_due = b"\x05\x04" + b"\xff" * 9 + b"\x7f" + b"x"  # attrs deliver_at, a 70-bit varint
        rec = bytes((len(huge_due) - 1,)) + huge_due[1:]
        with pytest.raises(CorruptRecord):
            await c.produce(
                wire.ProduceRequest("t", 0, (), batch=_batch(Codec.NONE, 1, len(rec), rec))
            )
        # a record claiming its own store time (ts delta, attrs 32): stored as sent, it
        # would move its message back or forth in time (retention, time lookups)
        timed = b"\x20\x7f" + b"x"
        rec = bytes((len(timed),)) + timed
        with pytest.raises(InvalidMessage, match="store-time delta"):
            await c.produce(wire.ProduceRequest("t", 0, (), batch=_batch(Codec.NONE, 1, len(rec), rec)))
        # a reconsume count above what an entry holds (u16): refused, not silently cut
        with pytest.raises(InvalidMessage, match="reconsume count"):
            await c.produce(wire.ProduceRequest("t", 0, (), batch=encode_batch([Message(b"x", reconsume_times=70_000)])))
        assert (await c.queue_offsets("t", 0)).max_offset == 0


async def test_other_clients_are_answered_while_a_large_batch_is_checked(tmp_path: Path) -> None:
    """A 10,000-record batch (~1 MiB) is decompressed, decoded and checked off the loop:
    while its check runs, another client's produce + pull round trip is answered. The
    check is held (a threading.Event) until that round trip is over, or 10 s: on the
    loop it would hold every client, and the round trip could not happen meanwhile."""
    import threading

    import trio

    async with (
        open_broker(make_config(tmp_path / "d")) as b,
        AsyncClient(b.address) as big,
        LatencyProbe(b.address) as probe,
    ):
        await big.create_topic("t", 1)
        handler = b.handlers.produce
        check = handler.check_batch
        checking, probed = threading.Event(), threading.Event()
        answered_meanwhile: list[bool] = []

        def held_check(batch: bytes) -> ProducedRecords | list[bytes]:
            if bytes(batch) == big_batch:
                checking.set()
                answered_meanwhile.append(probed.wait(10))
            return check(batch)

        handler.check_batch = held_check  # type: ignore[method-assign]
        big_batch = encode_batch([Message(b"%05d" % i + b"-" * 90, key=f"k{i}") for i in range(10_000)], Codec.ZSTD)
        assert len(big_batch) < 64 * 1024  # compressed: its size as carried does not make it large
        stored: list[int] = []

        async def produce_big() -> None:
            stored.append((await big.produce(wire.ProduceRequest("t", 0, (), batch=big_batch))).stored)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce_big)
            await wait_until(checking.is_set, what="the large batch being checked")
            rounds = probe.rounds
            await wait_until(lambda: probe.rounds > rounds, what="a probe round trip")
            probed.set()
        assert answered_meanwhile == [True]
        assert stored == [10_000]
        assert (await big.queue_offsets("t", 0)).max_offset == 10_000
    assert not probe.errors, str(probe)


async def test_a_batch_no_pull_answer_could_carry_is_refused(tmp_path: Path) -> None:
    """A producer batch that fits a request but, with the broker's header, not a pull
    answer (the same frame cap): storing it would acknowledge messages no consumer
    could ever read. Refused (MESSAGE_TOO_LARGE), nothing stored; a smaller one goes."""
    from equeue.errors import MessageTooLarge

    frame = 64 << 10
    async with open_broker(make_config(tmp_path / "d", max_frame=frame, max_message_bytes=frame - 2048)) as b:
        async with AsyncClient(b.address, max_frame=frame) as c:
            await c.create_topic("t", 1)
            # many messages, each within --max-message; the request (frame header, topic,
            # flags, lengths) just fits the frame
            n = 1
            while len(encode_batch([Message(bytes(600))] * (n + 1))) + 200 <= frame:
                n += 1
            last = 0  # the last message's size: the batch is exactly frame - 80 bytes
            while len(batch := encode_batch([Message(bytes(600))] * n + [Message(bytes(last))])) < frame - 80:
                last += 1
            assert len(wire.ProduceRequest("t", 0, (), batch=batch).encode()) + 16 <= frame
            with pytest.raises(MessageTooLarge, match="a pull answer can carry"):
                await c.produce(wire.ProduceRequest("t", 0, (), batch=batch))
            assert (await c.queue_offsets("t", 0)).max_offset == 0
            ok = encode_batch([Message(bytes(600))] * (n - 2))
            await c.produce(wire.ProduceRequest("t", 0, (), batch=ok))
            got = await c.pull(wire.PullRequest("t", 0, 0, max_messages=n + 1))
            assert len(got.messages) == n - 2


async def test_a_delayed_message_whose_key_is_not_utf8_is_refused_at_produce(tmp_path: Path) -> None:
    """The key and tags of a delayed entry are checked when it is produced, as a live
    entry's are: scheduled unchecked, it would fail when it comes due."""
    import time

    async with open_broker(make_config(tmp_path / "d")) as b, AsyncClient(b.address) as c:
        await c.create_topic("t", 1)
        due = int(time.time() * 1000) + 60_000
        bad = wire.pack_entry(b"x", key=b"\xff\xfe", deliver_at=due)
        with pytest.raises(InvalidMessage, match="UTF-8"):
            await c.produce(wire.ProduceRequest("t", 0, [wire.pack_entry(b"ok"), bad]))
        assert (await c.describe_topic("t")).pending_delayed == 0
        assert (await c.queue_offsets("t", 0)).max_offset == 0
