"""Corruption. A truncated data.mdb, damaged headers and records,
an index pointer gone wrong -- each is a clear, coded answer, never a silent crash,
a traceback, or another message in place of the one asked for; and an operator can
move consumers past a corrupt record (``equeue message skip``)."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, control, wire
from equeue.broker import Broker
from equeue.broker.process import BrokerProcess
from equeue.broker.storage import CreateTopicOp, ProduceOp, RetentionOp, Store, layout
from equeue.broker.storage.filecheck import DATA_FILE, _free_pages
from equeue.broker.storage.skips import SkipRecordOp
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.errors import CorruptRecord, MessageNotFound, StoreDamaged, StoreError, StoreTruncated
from equeue.protocol import PullStatus
from equeue.wire import batches
from tests.conftest import wait_until_sync

MAP = 1 << 28


def _fill(path: Path, batches: int = 100) -> None:
    """A closed store with a topic ``t`` (2 queues) and ``batches`` x 20 1 KB messages."""
    s = Store(path, map_size=MAP)
    try:
        [info] = s.write([CreateTopicOp("t", 2)]).settled()
        for i in range(batches):
            s.write([ProduceOp(info, i % 2, [wire.encode_entry(Message(b"x" * 1000))] * 20)])
    finally:
        s.close()


def _start_cli(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "equeue", "broker", "start", "--data-dir", str(data_dir), "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


# ----------------------------------------------------------------------------- truncation
def test_a_truncated_data_file_is_refused_with_one_line(tmp_path: Path) -> None:
    """It used to kill the broker with SIGBUS (rc 135/-7) and print nothing."""
    _fill(tmp_path)
    data = tmp_path / DATA_FILE
    full = data.stat().st_size
    os.truncate(data, full // 2)
    done = _start_cli(tmp_path)  # first, in a child: before the fix it died of SIGBUS
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(data) in lines[0] and "truncated" in lines[0] and "mdb_copy" in lines[0]
    assert f"{full // 2} bytes" in lines[0] and str(full) in lines[0]
    with pytest.raises(StoreTruncated) as err:
        Store(tmp_path, map_size=MAP)
    assert f"{full // 2} bytes" in str(err.value) and f"need {full}" in str(err.value)


def test_a_data_file_without_its_meta_pages_is_refused(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    os.truncate(tmp_path / DATA_FILE, 100)
    with pytest.raises(StoreTruncated, match="too short"):
        Store(tmp_path, map_size=MAP)
    os.truncate(tmp_path / DATA_FILE, 5000)  # the first meta page only
    with pytest.raises(StoreTruncated, match="second meta page"):
        Store(tmp_path, map_size=MAP)


def test_free_pages_are_read_from_the_free_tree(tmp_path: Path) -> None:
    """The tail of the file may legitimately be missing when LMDB's free tree lists
    it: the check reads that tree. After overwrites it lists pages inside the file."""
    _fill(tmp_path, 100)
    s = Store(tmp_path, map_size=MAP)
    info = s.topic("t")
    s.write([ProduceOp(info, 0, [wire.encode_entry(Message(b"y" * 1000))] * 20)])
    last = s.env.info()["last_pgno"]
    s.close()
    fd = os.open(tmp_path / DATA_FILE, os.O_RDONLY)
    try:
        metas = [os.pread(fd, 160, off) for off in (0, 4096)]
        meta = max(metas, key=lambda m: int.from_bytes(m[144:152], sys.byteorder))
        free = _free_pages(fd, 4096, int.from_bytes(meta[80:88], sys.byteorder), last)
    finally:
        os.close(fd)
    assert free is not None and free, "the writes freed pages"
    assert all(2 <= p <= last for p in free)


def test_a_store_truncated_under_a_running_broker_reports_the_fatal_signal(
    real_broker: Callable[..., BrokerProcess],
) -> None:
    """A SIGBUS at run time (the file cut short under the broker) cannot be caught in
    Python; faulthandler prints a clear report with the store frame instead of nothing."""
    b = real_broker()

    async def produce_then_read() -> None:
        async with AsyncClient(b.address) as c:
            await c.create_topic("t", 1)
            for _ in range(50):
                await c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message(b"z" * 1000))] * 20))
            os.truncate(b.data_dir / DATA_FILE, 8192)
            with pytest.raises(Exception):  # noqa: B017 - the connection dies with the broker
                await c.pull(wire.PullRequest("t", 0, 0, 1000))

    trio.run(produce_then_read)
    assert b.proc is not None
    wait_until_sync(lambda: b.proc is not None and b.proc.poll() is not None, timeout=20, what="the broker died")
    assert b.proc.returncode == -signal.SIGBUS
    wait_until_sync(lambda: b.error_lines, timeout=10, what="the fatal-signal report was read")
    assert b.error_lines[0].startswith("Fatal Python error: Bus error"), b._tail()
    assert "broker/storage" in b._tail()


# ----------------------------------------------------------------------------- header damage
def _damage(kind: str, path: Path) -> None:
    if kind == "lmdb-magic":
        with open(path / DATA_FILE, "r+b") as f:
            for off in (16, 4096 + 16):
                f.seek(off)
                f.write(b"\0\0\0\0")
        return
    s = Store(path, map_size=MAP)
    try:
        with s.env.begin(write=True) as txn:
            meta = s.db[b"meta"]
            if kind == "format":
                txn.put(b"format", b"\x01\x00", db=meta)
            elif kind == "next_global":
                txn.put(b"next_global", b"\x01\x02\x03", db=meta)
            elif kind == "deleting":
                txn.put(b"deleting", b"[1, oops", db=meta)
            elif kind == "topic":
                txn.put(b"t", b'{"name": "t", "topic_id": "x"}', db=s.db[b"topics"])
            elif kind == "qstats":
                txn.put(layout.queue_key(1, 0), b"short", db=s.db[b"qstats"])
            elif kind == "offsets":
                txn.put(b"no-separators", layout.pack_u64(1), db=s.db[b"offsets"])
    finally:
        s.close()


DAMAGE = {
    "lmdb-magic": "header is damaged (bad magic)",
    "format": "format record",
    "next_global": "next_global",
    "deleting": "deleting",
    "topic": "topic metadata of b't'",
    "qstats": "qindex, qstats",
    "offsets": "consumer offsets",
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_header_damage_is_one_clear_line(kind: str, tmp_path: Path) -> None:
    """Each used to print a traceback (up to 80 lines) or an unclear line."""
    _fill(tmp_path, 2)
    _damage(kind, tmp_path)
    with pytest.raises(StoreDamaged) as err:
        Store(tmp_path, map_size=MAP)
    assert DAMAGE[kind] in str(err.value) and "restore" in str(err.value)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(StoreDamaged):  # the lock was released: the same refusal, not DataDirLocked
        Store(tmp_path, map_size=MAP)


def test_header_damage_through_the_cli_is_one_line(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    _damage("next_global", tmp_path)
    done = _start_cli(tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "damaged" in lines[0] and "next_global" in lines[0] and "mdb_copy" in lines[0]


def test_an_unknown_format_is_still_a_store_error(tmp_path: Path) -> None:
    _fill(tmp_path, 1)
    s = Store(tmp_path, map_size=MAP)
    with s.env.begin(write=True) as txn:
        txn.put(b"format", layout.pack_u32(7), db=s.db[b"meta"])
    s.close()
    with pytest.raises(StoreError, match=r"format 7.*run the broker version that wrote it"):
        Store(tmp_path, map_size=MAP)


# ----------------------------------------------------------------------------- records
def _point(broker: Broker, topic_id: int, queue: int, base: int, to_global: int, count: int) -> None:
    """Alter a queue-index entry (the batch at queue offset ``base``), as a damaged page would."""
    store = broker.store
    with store.env.begin(write=True) as txn:
        txn.put(layout.qindex_key(topic_id, queue, base), layout.pack_qindex_value(to_global, count),
                db=store.db[b"qindex"])  # fmt: skip


def _overwrite_batch(store: Store, global_base: int, value: bytes) -> None:
    with store.env.begin(write=True) as txn:
        txn.put(layout.global_key(global_base), value, db=store.db[b"messages"])


def _flip_last_byte(store: Store, global_base: int) -> None:
    """A flipped bit in a stored batch's last record: its checksum fails."""
    hit = store.get_global(global_base)
    assert hit is not None
    _overwrite_batch(store, global_base, hit.value[:-1] + bytes([hit.value[-1] ^ 0xFF]))


def _entries(*texts: str) -> list[bytes]:
    return [wire.encode_entry(Message(t)) for t in texts]


async def test_get_message_checks_the_record_against_the_position(broker: Broker) -> None:
    """An altered index pointer used to return another message silently."""
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 2)
            a = await c.produce(wire.ProduceRequest("t", 0, _entries("m0", "m1", "m2")))
            b = await c.produce(wire.ProduceRequest("t", 1, _entries("o0", "o1", "o2")))
            tid = broker.store.topic("t").topic_id
            _point(broker, tid, 0, 0, b.first_global, 3)  # queue 0's batch -> queue 1's
            with pytest.raises(CorruptRecord, match=r"t/0 offset 0: the index points to global offset"):
                await c.get_message("t", queue_id=0, queue_offset=0)
            with pytest.raises(CorruptRecord, match="equeue message skip --topic t --queue 0 --offset 2"):
                await c.get_message("t", queue_id=0, queue_offset=2)
            _point(broker, tid, 0, 0, a.first_global, 3)
            [m] = (await c.get_message("t", queue_id=0, queue_offset=2)).messages
            assert m.text == "m2"
            # by global offset: the batch's header must map back to it through the index
            other = broker.store.get_global(b.first_global)
            assert other is not None
            _overwrite_batch(broker.store, a.first_global, other.value)
            with pytest.raises(CorruptRecord, match=f"global offset {a.first_global + 1}"):
                await c.get_message("t", global_offset=a.first_global + 1)
            [m] = (await c.get_message("t", global_offset=b.first_global + 1)).messages
            assert m.text == "o1"  # the batch that really is there still reads


async def test_a_corrupt_record_is_logged_once_a_minute(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(10), caplog.at_level(logging.ERROR, logger="equeue.store"):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("logged", 1)
            a = await c.produce(wire.ProduceRequest("logged", 0, _entries("m0", "m1")))
            _flip_last_byte(broker.store, a.first_global)
            for _ in range(5):
                with pytest.raises(CorruptRecord):
                    await c.get_message("logged", queue_id=0, queue_offset=0)
                with pytest.raises(CorruptRecord):
                    await c.pull(wire.PullRequest("logged", 0, 0, 10))
    lines = [r.getMessage() for r in caplog.records if r.name == "equeue.store"]
    assert len(lines) == 1 and "corrupt record at logged/0 offset 0" in lines[0], lines


async def test_a_pull_never_returns_a_misplaced_record(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            a = await c.produce(wire.ProduceRequest("t", 0, _entries("m0", "m1")))
            await c.produce(wire.ProduceRequest("t", 0, _entries("m2", "m3")))
            _point(broker, broker.store.topic("t").topic_id, 0, 2, a.first_global, 2)  # offsets 2.. -> 0's batch
            r = await c.pull(wire.PullRequest("t", 0, 0, 10))  # stops before the bad batch
            assert [m.text for m in r.messages] == ["m0", "m1"] and r.next_offset == 2
            with pytest.raises(CorruptRecord, match="t/0 offset 2"):
                await c.pull(wire.PullRequest("t", 0, 2, 10))


async def test_skip_moves_consumers_past_a_corrupt_record(broker: Broker) -> None:
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            await c.produce(wire.ProduceRequest("t", 0, _entries("m0")))
            bad = await c.produce(wire.ProduceRequest("t", 0, _entries("m1")))
            await c.produce(wire.ProduceRequest("t", 0, _entries("m2", "m3")))
            _flip_last_byte(broker.store, bad.first_global)
            with pytest.raises(CorruptRecord, match="checksum mismatch"):
                await c.pull(wire.PullRequest("t", 0, 1, 10))
            ans = await c.skip_message("t", 0, 1)
            assert not ans.already_skipped and "checksum mismatch" in ans.problem
            r = await c.pull(wire.PullRequest("t", 0, 1, 10))
            assert [m.text for m in r.messages] == ["m2", "m3"] and r.next_offset == 4
            r = await c.pull(wire.PullRequest("t", 0, 0, 10))
            assert [m.queue_offset for m in r.messages] == [0, 2, 3]
            only = await c.pull(wire.PullRequest("t", 0, 1, 1))  # the skipped one alone: moves on
            # (at most the one message asked for: the skipped record does not count)
            assert ([m.queue_offset for m in only.messages], only.next_offset) == ([2], 3)
            with pytest.raises(MessageNotFound, match="skipped by an operator"):
                await c.get_message("t", queue_id=0, queue_offset=1)
            assert (await c.skip_message("t", 0, 1)).already_skipped
            assert await c.list_skipped("t") == {0: [1]}
            with pytest.raises(MessageNotFound, match=r"retained range \[0, 4\)"):
                await c.skip_message("t", 0, 4)


def test_a_corrupt_batch_is_corrupt_for_its_records_and_stalls_nothing_else(tmp_path: Path) -> None:
    """Store level: every record of a damaged batch is CORRUPT_RECORD (the error names
    the batch's offsets to skip); the other queues, lookups by key and retention go on;
    once its records are skipped, its queue reads past it."""
    s = Store(tmp_path, map_size=MAP)
    try:
        [info] = s.write([CreateTopicOp("t", 2)]).settled()
        keyed = [wire.encode_entry(Message(f"m{i}", key=f"k{i}")) for i in range(5)]
        [a, b, c] = s.write([ProduceOp(info, 0, keyed), ProduceOp(info, 1, keyed), ProduceOp(info, 0, keyed)]).settled()
        _flip_last_byte(s, a.first_global)
        for o in range(5):
            with pytest.raises(CorruptRecord, match=rf"offset {o}: batch checksum mismatch.*offsets 0\.\.4"):
                s.get_queue_offset(info, 0, o)
        with pytest.raises(CorruptRecord):
            s.read_queue(info, 0, 2, 10, 1 << 20)
        msgs, _r = s.read_messages(info, 1, 0, 10)
        assert [m.text for m in msgs] == [f"m{i}" for i in range(5)]  # the other queue reads
        assert [h.global_offset for h in s.find_by_key(info, "k3", 10).hits] == [c.first_global + 3, b.first_global + 3]
        for o in range(5):
            [ans] = s.write([SkipRecordOp("t", 0, o)]).settled()
            assert "checksum mismatch" in ans.problem
        msgs, r = s.read_messages(info, 0, 0, 10)
        assert [m.queue_offset for m in msgs] == list(range(5, 10)) and r.next_offset == 10
        s.clock = lambda: 1 << 62  # far future: everything is past a time limit
        s.write([RetentionOp(1, None)]).settled()
        assert s.queue_state(info.topic_id, 0).min_offset == 10  # the damaged batch went with its queue
    finally:
        s.close()


def test_a_skip_marker_survives_a_restart(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    s = Store(tmp_path, map_size=MAP)
    try:
        [ans] = s.write([SkipRecordOp("t", 0, 5)]).settled()
        assert ans == control.SkipAnswer("t", 0, 5, False, "")
    finally:
        s.close()
    s = Store(tmp_path, map_size=MAP)
    try:
        info = s.topic("t")
        assert s.view.skips(info.topic_id, 0) == {5}
        msgs, r = s.read_messages(info, 0, 4, 3)
        # max_messages is exact: the answer ends inside the batch, one past the third
        # record delivered; the skipped record is masked out, never served
        assert [m.queue_offset for m in msgs] == [4, 6, 7] and r.next_offset == 8
        msgs, r = s.read_messages(info, 0, 5, 100)
        assert [m.queue_offset for m in msgs] == list(range(6, 20)) and r.next_offset == 20
        assert s.get_queue_offset(info, 0, 5) is None
    finally:
        s.close()


async def test_a_pull_moves_past_a_skipped_last_record(broker: Broker) -> None:
    """A corrupt last record is answered CORRUPT_RECORD (never parked); once skipped,
    a pull from it moves on to the end of the queue (and answers NO_NEW_MESSAGE)."""
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            a = await c.produce(wire.ProduceRequest("t", 0, _entries("only")))
            _flip_last_byte(broker.store, a.first_global)
            with pytest.raises(CorruptRecord):
                await c.pull(wire.PullRequest("t", 0, 0, 10, max_wait_ms=100))
            await c.skip_message("t", 0, 0)
            r = await c.pull(wire.PullRequest("t", 0, 0, 10, max_wait_ms=100))
            assert r.status is PullStatus.NO_NEW_MESSAGE and r.next_offset == 1 and not r.messages


def test_message_skip_cli(embedded_broker: object) -> None:
    from equeue.client import Client

    address = embedded_broker.address  # type: ignore[attr-defined]
    with Client(address) as c:
        c.create_topic("t", 1)
        c.produce(wire.ProduceRequest("t", 0, [wire.encode_entry(Message("a")), wire.encode_entry(Message("b"))]))
    runner = CliRunner()
    args = ["message", "skip", "--topic", "t", "--queue", "0", "--offset", "0", "-b", address]
    refused = runner.invoke(app, args, input="n\n")
    assert refused.exit_code == 1 and "not skipped" in refused.output
    done = runner.invoke(app, [*args, "--yes"])
    assert done.exit_code == 0, done.output
    assert "skipped t/0 offset 0 (it read intact" in done.output
    again = runner.invoke(app, [*args, "--yes"])
    assert "already skipped" in again.output
    listed = runner.invoke(app, ["message", "skipped", "t", "--json", "-b", address])
    assert json.loads(listed.output) == {"0": [0]}
    got = runner.invoke(app, ["message", "get", "t", "--queue", "0", "--offset", "0", "-b", address])
    assert got.exit_code == 1 and "skipped by an operator" in got.output
    assert control.SkipMessage("t", 0, 0).CODE == 72 and control.ListSkipped("t").CODE == 73


async def test_a_record_of_a_batch_failing_its_checksum_is_salvaged_into_a_letter(broker: Broker) -> None:
    """SEND_BACK of a record whose batch fails its checksum writes a salvaged dead letter
    (its stored bytes, why in ``%POISON``); a damaged pointer is still refused."""
    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1)
            a = await c.produce(wire.ProduceRequest("t", 0, _entries("m0", "m1", "m2")))
            _flip_last_byte(broker.store, a.first_global)
            answer = await c.send_back("g", "t", 0, 1, 0, 16)  # a poison record: no retries
            assert answer.dead_lettered
            (letter,) = (await c.dlq_list("g")).letters
            assert (letter.origin_topic, letter.origin_offset) == ("t", 1)
            assert "batch checksum mismatch" in letter.properties["%POISON"]
            assert base64.b64decode(letter.body) == batches.encode_record(Message("m1"))
            await c.produce(wire.ProduceRequest("t", 0, _entries("m3")))
            _point(broker, broker.store.topic("t").topic_id, 0, 3, a.first_global, 1)  # offset 3 -> 0's batch
            with pytest.raises(CorruptRecord, match="t/0 offset 3: the index points to global offset"):
                await c.send_back("g", "t", 0, 3, 0, 16)
