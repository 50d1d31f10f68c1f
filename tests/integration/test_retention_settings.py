"""Retention's special values against a real broker: ``-1`` keeps a topic's messages
forever whatever the broker's defaults; any other value <= 0 is refused by the CLI,
the SDK and the broker itself (a client that skips the SDK), and nothing is stored;
ALTER_TOPIC's ``reset`` puts a setting back to the broker's default; a topic record
an earlier version wrote with a negative value reads as keep forever."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import Broker, open_broker
from equeue.broker.storage import Store
from equeue.cli import app
from equeue.client import AsyncClient
from equeue.errors import BadRequest, ConfigError, ErrorCode
from equeue.protocol import RequestCode
from tests.conftest import make_config


def step_clock(b: Broker) -> list[int]:
    """Give ``b``'s store a wall clock the test steps: ``wall[0] += ms``."""
    wall = [time.time_ns() // 1_000_000]
    b.store.clock = lambda: wall[0]
    return wall


async def produce(c: AsyncClient, topic: str, n: int, size: int = 100) -> None:
    entries = [wire.encode_entry(Message(b"m%d" % i + b"." * size)) for i in range(n)]
    await c.produce(wire.ProduceRequest(topic, 0, entries))


async def count(c: AsyncClient, topic: str) -> int:
    return sum(q.count for q in (await c.describe_topic(topic)).queues)


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


async def test_minus_one_keeps_a_topic_forever_whatever_the_broker_defaults(tmp_path: Path) -> None:
    """Broker defaults that would delete everything (1 s, 1 byte); a topic created with
    -1 for both keeps all of it, a topic on the defaults loses all of it."""
    cfg = make_config(tmp_path / "data", retention_ms=1000, retention_bytes=1)
    with trio.fail_after(20):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            info = await c.create_topic("keep", 1, retention_ms=-1, retention_bytes=-1)
            assert (info.retention_ms, info.retention_bytes) == (-1, -1)
            await c.create_topic("std", 1)
            await produce(c, "keep", 5)
            await produce(c, "std", 5)
            wall[0] += 60_000
            assert await b.lifecycle.enforce_retention() == 5
            assert await count(c, "keep") == 5 and await count(c, "std") == 0
            d = await c.describe_topic("keep")
            assert (d.info.retention_ms, d.info.retention_bytes) == (-1, -1)


async def test_cli_retention_minus_one_is_forever_not_minus_one_second(tmp_path: Path) -> None:
    """The reported misuse: ``topic create t --retention -1`` (Kafka's "keep forever")
    was stored as -1000 ms and both messages were gone at the next retention pass."""
    with trio.fail_after(30):
        async with open_broker(make_config(tmp_path / "data")) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            for topic, args in (
                ("t", ["--retention", "-1"]),
                ("w", ["--retention", "forever", "--retention-bytes", "-1"]),
                ("x", ["--retention-bytes=infinite"]),
            ):
                code, out = await trio.to_thread.run_sync(cli, "topic", "create", topic, "--queues", "1", *args, "-b", b.address)
                assert code == 0, out
                assert "forever" in out, out
                await produce(c, topic, 2)
            info = {t.name: t for t in await c.list_topics()}
            assert (info["t"].retention_ms, info["t"].retention_bytes) == (-1, None)
            assert (info["w"].retention_ms, info["w"].retention_bytes) == (-1, -1)
            assert (info["x"].retention_ms, info["x"].retention_bytes) == (None, -1)
            wall[0] += 35_000
            assert await b.lifecycle.enforce_retention() == 0
            assert [await count(c, t) for t in ("t", "w", "x")] == [2, 2, 2]


@pytest.mark.parametrize(
    "args",
    [
        ["--retention", "0"],
        ["--retention", "-5"],
        ["--retention", "-1000"],
        ["--retention", "-1s"],
        ["--retention-bytes", "-5"],
        ["--retention-bytes", "0"],
        ["--retention-bytes", "-1KiB"],
    ],
)
async def test_cli_refuses_other_non_positive_retention_in_one_line(broker: Broker, args: list[str]) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("old", 1)
            for cmd in (["topic", "create", "t"], ["topic", "alter", "old"]):
                code, out = await trio.to_thread.run_sync(cli, *cmd, *args, "-b", broker.address)
                assert code == 1, out
                assert out.startswith("error: ") and "-1" in out and "forever" in out, out
                assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
            assert [t.name for t in await c.list_topics()] == ["old"]
            info = (await c.describe_topic("old")).info
            assert (info.retention_ms, info.retention_bytes) == (None, None)


async def test_cli_alter_default_resets_and_minus_one_is_forever(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "data", retention_bytes=1)
    with trio.fail_after(30):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            await c.create_topic("t", 1, retention_bytes=1 << 30)
            await produce(c, "t", 3)
            code, out = await trio.to_thread.run_sync(cli, "topic", "alter", "t", "--retention-bytes", "-1", "-b", b.address)
            assert code == 0 and "forever" in out, out
            assert await b.lifecycle.enforce_retention() == 0
            code, out = await trio.to_thread.run_sync(cli, "topic", "alter", "t", "--retention-bytes", "default", "-b", b.address)
            assert code == 0 and "default" in out, out
            assert (await c.describe_topic("t")).info.retention_bytes is None
            assert await b.lifecycle.enforce_retention() == 3  # the broker's 1-byte default


async def _raw(c: AsyncClient, code: RequestCode, body: dict[str, Any]) -> bytes:
    """A control request as any client could send it (no SDK-side checks)."""
    return await c.request(code, json.dumps(body).encode())


@pytest.mark.parametrize(
    "bad",
    [
        {"retention_ms": 0},
        {"retention_ms": -5},
        {"retention_ms": -1000},
        {"retention_bytes": 0},
        {"retention_bytes": -2},
    ],
)
async def test_broker_refuses_non_positive_retention_from_any_client(broker: Broker, bad: dict[str, int]) -> None:
    ((field, _),) = bad.items()
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("old", 1, retention_ms=60_000)
            with pytest.raises(BadRequest, match=f"{field}.*-1") as exc:
                await _raw(c, RequestCode.CREATE_TOPIC, {"name": "t", "queues": 1, **bad})
            assert exc.value.code is ErrorCode.BAD_REQUEST
            with pytest.raises(BadRequest, match=field):
                await _raw(c, RequestCode.ALTER_TOPIC, {"name": "old", **bad})
            assert [t.name for t in await c.list_topics()] == ["old"]
            assert (await c.describe_topic("old")).info.retention_ms == 60_000


async def test_broker_refuses_a_bad_reset(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("t", 1, retention_ms=60_000)
            for body, why in (
                ({"reset": ["queues"]}, "reset"),
                ({"reset": ["retention_ms"], "retention_ms": 5000}, "retention_ms"),
            ):
                with pytest.raises(BadRequest, match=why):
                    await _raw(c, RequestCode.ALTER_TOPIC, {"name": "t", **body})
            assert (await c.describe_topic("t")).info.retention_ms == 60_000


async def test_alter_minus_one_is_forever_and_reset_is_the_broker_default(tmp_path: Path) -> None:
    """-1 on ALTER_TOPIC used to clear the override; it now means keep forever, and
    going back to the broker's default is the explicit ``reset``."""
    cfg = make_config(tmp_path / "data", retention_ms=1000)
    with trio.fail_after(20):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            await c.create_topic("t", 1, retention_ms=3_600_000)
            await produce(c, "t", 4)
            wall[0] += 60_000
            info = await c.alter_topic("t", retention_ms=-1)
            assert info.retention_ms == -1
            assert await b.lifecycle.enforce_retention() == 0
            raw = await _raw(c, RequestCode.ALTER_TOPIC, {"name": "t", "reset": ["retention_ms"]})
            assert json.loads(raw)["retention_ms"] is None
            assert await b.lifecycle.enforce_retention() == 4
            await c.alter_topic("t", retention_ms=-1)
            info = await c.alter_topic("t", reset=["retention_ms"])  # the SDK's spelling
            assert info.retention_ms is None


async def test_sdk_refuses_before_sending(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("old", 1)
            for call in (
                lambda: c.create_topic("t", 1, retention_ms=0),
                lambda: c.create_topic("t", 1, retention_bytes=-5),
                lambda: c.alter_topic("old", retention_ms=-1000),
                lambda: c.alter_topic("old", retention_bytes=0),
                lambda: c.alter_topic("old", reset=["queues"]),
                lambda: c.alter_topic("old", retention_ms=5, reset=["retention_ms"]),
            ):
                with pytest.raises(ConfigError):
                    await call()
            assert [t.name for t in await c.list_topics()] == ["old"]


async def test_records_written_by_earlier_versions_read_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No override stays no override; 0 (an earlier "no limit") and a negative value
    (an earlier version stored ``--retention -1`` as -1000 and deleted everything)
    read as keep forever, the negative one with a warning naming the topic."""
    cfg = make_config(tmp_path / "data", retention_ms=1000, retention_bytes=1)
    async with open_broker(cfg) as b, AsyncClient(b.address) as c:
        for t in ("plain", "zero", "bug"):
            await c.create_topic(t, 1)
    store = Store(cfg.data_dir, map_size=cfg.map_size)
    try:
        with store.env.begin(write=True) as txn:
            db = store.db[b"topics"]
            for name, values in (("zero", (0, 0)), ("bug", (-1000, -5))):
                obj = json.loads(txn.get(name.encode(), db=db))
                obj["retention_ms"], obj["retention_bytes"] = values
                txn.put(name.encode(), json.dumps(obj).encode(), db=db)
    finally:
        store.close()
    with trio.fail_after(20), caplog.at_level(logging.WARNING):
        async with open_broker(cfg) as b, AsyncClient(b.address) as c:
            wall = step_clock(b)
            info = {t.name: t for t in await c.list_topics()}
            assert (info["plain"].retention_ms, info["plain"].retention_bytes) == (None, None)
            assert (info["zero"].retention_ms, info["zero"].retention_bytes) == (-1, -1)
            assert (info["bug"].retention_ms, info["bug"].retention_bytes) == (-1, -1)
            for t in ("plain", "zero", "bug"):
                await produce(c, t, 3)
            wall[0] += 60_000
            assert await b.lifecycle.enforce_retention() == 3  # "plain" only (the defaults)
            assert [await count(c, t) for t in ("zero", "bug")] == [3, 3]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "bug" in r.getMessage()]
    assert warned and "-1000" in warned[0], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if "'zero'" in r.getMessage() or " zero " in r.getMessage()]


def test_broker_start_refuses_non_positive_retention_in_one_line(tmp_path: Path) -> None:
    """``--retention 0`` (once "forever" for the broker flag only) and every other
    value <= 0 but -1 are refused before anything starts. (192.0.2.1, a documentation
    address, makes a broker that wrongly starts fail at once instead of serving.)"""
    runner = CliRunner()
    start = ["broker", "start", "--data-dir", str(tmp_path / "d"), "--host", "192.0.2.1", "--port", "0"]
    for args in (["--retention", "0"], ["--retention", "-5"], ["--retention-bytes", "-5"], ["--retention-bytes", "0"]):
        r = runner.invoke(app, [*start, *args])
        assert r.exit_code == 1, r.output
        assert "retention" in r.output and "-1" in r.output and "forever" in r.output, r.output
        assert not (tmp_path / "d").exists()
