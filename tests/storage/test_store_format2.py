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
import shutil
from pathlib import Path
from typing import Any

import pytest

from equeue import wire
from equeue.broker import BrokerConfig, EmbeddedBroker
from equeue.producer import Client

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


def _pulled(c: Client, topic: str) -> list[dict[str, Any]]:
    out = []
    for q in range(c.describe_topic(topic).info.queues):
        off = 0
        while (r := c.pull(wire.PullRequest(topic, q, off, max_messages=7))).messages:
            for m in r.messages:
                out.append({
                    "topic": topic, "queue": m.queue_id, "queue_offset": m.queue_offset,
                    "global_offset": m.global_offset, "key": m.key, "tags": m.tags, "properties": m.properties,
                    "timestamp": m.timestamp, "reconsume_times": m.reconsume_times,
                    "body": base64.b64encode(m.body).decode(),
                })  # fmt: skip
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
