"""A store written by format 2's code still reads, message for message.

``tests/fixtures/store_format2`` holds a real broker's ``data.mdb`` (gzipped) written
by the code of the commit named in its manifest, and the manifest of everything in
it: every message as pulled (positions, key, tags, properties, body, store time),
committed offsets, a skipped record, a paused topic, a pending delayed message and
an idempotent producer's state. A broker of this version opens a copy and must serve
all of it unchanged; a broker of a later store format must too (docs/storage.md)."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from equeue import Message, wire
from equeue.broker import EmbeddedBroker
from equeue.broker.storage import ProduceOp, Store, convert, layout
from equeue.client import Client
from equeue.config import BrokerConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store_format2"


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return json.loads((FIXTURE / "manifest.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def old_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    data = tmp_path_factory.mktemp("format2") / "data"
    data.mkdir()
    with gzip.open(FIXTURE / "data.mdb.gz", "rb") as src, open(data / "data.mdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    with EmbeddedBroker(BrokerConfig(data_dir=data, port=0, flush="sync")) as broker, Client(broker.address) as c:
        yield c


def _row(topic: str, m: Message) -> dict[str, Any]:
    """A message as the fixture's manifest lists it."""
    return {
        "topic": topic, "queue": m.queue_id, "queue_offset": m.queue_offset, "global_offset": m.global_offset,
        "key": m.key, "tags": m.tags, "properties": m.properties, "timestamp": m.timestamp,
        "reconsume_times": m.reconsume_times, "body": base64.b64encode(m.body).decode(),
    }  # fmt: skip


def _pulled(c: Client, topic: str) -> list[dict[str, Any]]:
    out = []
    for q in range(c.describe_topic(topic).info.queues):
        off = 0
        while (r := c.pull(wire.PullRequest(topic, q, off, max_messages=7))).messages:
            for m in r.messages:
                out.append(_row(topic, m))
            off = r.messages[-1].queue_offset + 1
    return out


def _fields(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "skipped"}


def test_every_message_reads_back_as_it_was_written(old_store: Client, manifest: dict[str, Any]) -> None:
    assert manifest["format"] == 2
    got = _pulled(old_store, "orders") + _pulled(old_store, "plain")
    assert got == [_fields(m) for m in manifest["messages"] if not m["skipped"]]


def test_single_lookups_find_every_message(old_store: Client, manifest: dict[str, Any]) -> None:
    by_key: dict[tuple[str, str], set[int]] = {}
    skipped = {m["global_offset"] for m in manifest["messages"] if m["skipped"]}
    for m in manifest["messages"]:
        if m["skipped"]:
            continue
        (found,) = old_store.get_message(m["topic"], global_offset=m["global_offset"]).messages
        assert found.queue_offset == m["queue_offset"] and base64.b64encode(found.body).decode() == m["body"]
        if m["key"] is not None:
            by_key.setdefault((m["topic"], m["key"]), set()).add(m["global_offset"])
    assert by_key
    for (topic, key), offsets in by_key.items():
        hits = old_store.find_by_key(topic, key, limit=100)
        # a skipped record may be listed too: the marker is on its queue position
        assert offsets <= {h.global_offset for h in hits.messages} <= offsets | skipped, key


def test_offsets_skips_pauses_and_the_schedule_survive(old_store: Client, manifest: dict[str, Any]) -> None:
    for name, offset in manifest["offsets"].items():
        group, topic, queue = name.split("/")
        assert old_store.query_offset(group, topic, int(queue)) == offset
    ((topic, queue, offset),) = [(m["topic"], m["queue"], m["queue_offset"]) for m in manifest["messages"] if m["skipped"]]
    served = old_store.pull(wire.PullRequest(topic, queue, offset, max_messages=1)).messages
    assert served and served[0].queue_offset == offset + 1  # the skipped record is never served
    assert old_store.describe_topic("plain").info.paused
    assert old_store.describe_topic("plain").pending_delayed == manifest["delayed"]["plain"]


# ---------------------------------------------------------------- the store itself
def _copy(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    with gzip.open(FIXTURE / "data.mdb.gz", "rb") as src, open(data / "data.mdb", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return data


def _read_all(s: Store, topic: str) -> list[dict[str, Any]]:
    info = s.topic(topic)
    out = []
    for q in range(info.queues):
        off = s.queue_state(info.topic_id, q).min_offset
        while True:
            msgs, r = s.read_messages(info, q, off, 7)
            if not r.batches:
                break
            for m in msgs:
                out.append(_row(topic, m))
            off = r.next_offset
    return out


def _check_store(s: Store, manifest: dict[str, Any]) -> None:
    got = _read_all(s, "orders") + _read_all(s, "plain")
    assert got == [_fields(m) for m in manifest["messages"] if not m["skipped"]]
    for m in manifest["messages"]:
        hit = s.get_global(m["global_offset"])
        assert hit is not None and hit.message(m["topic"]).body == base64.b64decode(m["body"])
        if m["key"] is not None:
            hits = s.find_by_key(s.topic(m["topic"]), m["key"], 1000).hits
            assert m["global_offset"] in {h.global_offset for h in hits}
    assert s.committed("billing", "orders", 0) == manifest["offsets"]["billing/orders/0"]
    assert s.pending_delayed(s.topic("plain").topic_id) == manifest["delayed"]["plain"]


def test_the_store_is_converted_to_batches_at_open(
    tmp_path: Path, manifest: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    data = _copy(tmp_path)
    with caplog.at_level(logging.WARNING, logger="equeue.store"):
        s = Store(data)
    try:
        lines = [r.getMessage() for r in caplog.records]
        assert any("has format 2: converting its records" in line for line in lines)
        assert any(f"its {len(manifest['messages'])} records were converted" in line for line in lines)
        with s.env.begin() as txn:
            assert layout.unpack_u32(txn.get(b"format", db=s.db[b"meta"])) == layout.FORMAT_VERSION
            assert txn.stat(s.db[b"messages"])["entries"] < len(manifest["messages"]) / 3  # batches now
        _check_store(s, manifest)
        info = s.topic("orders")
        (ans,) = s.write([ProduceOp(info, 0, [wire.encode_entry(Message(b"new", key="cust-003"))])]).settled()
        assert ans.first_global == max(m["global_offset"] for m in manifest["messages"]) + 1
        assert ans.first_global in {h.global_offset for h in s.find_by_key(info, "cust-003", 1000).hits}
    finally:
        s.close()


def test_a_conversion_cut_short_resumes_at_the_next_open(
    tmp_path: Path, manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = _copy(tmp_path)
    monkeypatch.setattr(convert, "CHUNK", 9)
    calls = []
    real = convert._convert_chunk

    def cut(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the broker stopped mid-way
        return real(*args)

    monkeypatch.setattr(convert, "_convert_chunk", cut)
    with pytest.raises(KeyboardInterrupt):
        Store(data)
    monkeypatch.setattr(convert, "_convert_chunk", real)
    monkeypatch.setattr(convert, "PROGRESS_EVERY", 0.0)  # a progress line after each transaction
    with caplog.at_level(logging.WARNING, logger="equeue.store"):
        s = Store(data)
    try:
        said = [r.getMessage() for r in caplog.records if r.name == "equeue.store"]
        assert "converting its records" in said[0] and "were converted" in said[-1]
        assert any("records converted to batches" in line for line in said[1:-1])
        _check_store(s, manifest)
    finally:
        s.close()
