"""The Spark reader's transport and range reads against a real broker (no Spark
session needed): pipelined pulls, short answers, reconnects, error answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from equeue import Message, wire  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.client.retry import RetryPolicy  # noqa: E402
from equeue.errors import ConfigError, ConnectionBroken, TopicNotFound  # noqa: E402
from equeue.spark import source  # noqa: E402
from equeue.spark.puller import RETRIES, Puller  # noqa: E402
from equeue.spark.source import RangePartition, read_range  # noqa: E402
from tests.unit.test_columns import SCHEMA  # noqa: E402


def fill(address: str, topic: str, queues: int, per_queue: int, batch: int = 700) -> None:
    with Client(address) as c:
        c.create_topic(topic, queues)
        for q in range(queues):
            for start in range(0, per_queue, batch):
                n = min(batch, per_queue - start)
                c.produce(
                    wire.ProduceRequest(
                        topic, q, [wire.encode_entry(Message(f"{q}:{start + i}".encode(), key=f"k{i}")) for i in range(n)]
                    )
                )


def rows(address: str, part: RangePartition, **kw: Any) -> list[tuple[int, bytes]]:
    out = []
    for b in read_range(address, part, SCHEMA, **kw):
        assert b.num_rows <= source.PULL_MAX_MESSAGES
        out += zip(b.column("queue_offset").to_pylist(), b.column("body").to_pylist(), strict=True)
    return out


def test_range_read_is_exact_with_pipelined_and_short_answers(
    broker_process: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = broker_process("--flush", "async")
    fill(b.address, "t", 2, 30_000)
    want = [(o, f"1:{o}".encode()) for o in range(1234, 27_001)]
    assert rows(b.address, RangePartition("t", 1, 1234, 27_001)) == want
    # a byte cap far below 10,000 records: every answer is short, the pulls sent
    # after it are discarded and reading goes on from the right offset
    monkeypatch.setattr(source, "PULL_MAX_BYTES", 50_000)
    assert rows(b.address, RangePartition("t", 1, 1234, 27_001)) == want
    # abandoning a read half-way leaves a clean connection for the next one
    it = read_range(b.address, RangePartition("t", 0, 0, 30_000), SCHEMA)
    next(it)
    it.close()
    assert rows(b.address, RangePartition("t", 0, 5, 9)) == [(o, f"0:{o}".encode()) for o in range(5, 9)]


def test_reader_survives_a_broker_restart(
    broker_process: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    connects = []
    real = Puller._connect
    monkeypatch.setattr(Puller, "_connect", lambda self: (connects.append(1), real(self))[1])
    b = broker_process("--flush", "sync")
    fill(b.address, "t", 1, 40_000, batch=5_000)
    got: list[int] = []
    it = read_range(b.address, RangePartition("t", 0, 0, 40_000), SCHEMA)
    got += next(it).column("queue_offset").to_pylist()
    b.stop()  # pulls in flight die with the connection
    b2 = broker_process("--flush", "sync", data_dir=b.data_dir, port=b.port)
    assert b2.address == b.address
    for batch in it:
        got += batch.column("queue_offset").to_pylist()
    assert got == list(range(40_000))
    assert len(connects) >= 2


def test_puller_errors(broker_process: Callable[..., Any]) -> None:
    b = broker_process()
    p = Puller(b.address)
    p.submit(wire.PullRequest("nope", 0, 0))
    with pytest.raises(TopicNotFound):
        p.next()
    p.close()
    b.kill()
    dead = Puller(b.address)
    with pytest.raises(ConnectionBroken):
        dead.submit(wire.PullRequest("t", 0, 0))


def test_puller_pauses_between_reconnects() -> None:
    """The puller pauses between reconnects (the backoff of client/retry.py), never retrying at once."""
    import socket

    import stamina.instrumentation as si

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    waits: list[float] = []
    before = si.get_on_retry_hooks()
    si.set_on_retry_hooks([lambda details: waits.append(details.wait_for)])
    try:
        with pytest.raises(ConnectionBroken):
            Puller(f"127.0.0.1:{port}").submit(wire.PullRequest("t", 0, 0))
    finally:
        si.set_on_retry_hooks(before)
    assert len(waits) == RETRIES - 1 and all(w > 0 for w in waits), waits


@pytest.mark.timeout(30)
def test_a_broker_that_never_answers_the_hello_fails_at_the_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that takes the connection and never answers (or drips bytes) fails
    the puller's connect once the connect timeout is spent, for the whole handshake
    (not after the 60 s an answer may take once connected)."""
    import socket

    from equeue.spark import puller as puller_module

    monkeypatch.setattr(puller_module, "CONNECT_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody answers
        p = Puller(f"127.0.0.1:{silent.getsockname()[1]}", policy=RetryPolicy(attempts=1, timeout=5.0))
        with pytest.raises(ConnectionBroken, match="cannot connect"):
            p.submit(wire.PullRequest("t", 0, 0))


def test_a_read_and_a_write_freeze_the_workers_heap_unless_gc_freeze_is_off(
    broker_process: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's read and the sink's write each call freeze_worker_heap (by default
    and with gcFreeze true), neither does with gcFreeze false, and a value that is not a
    boolean is a ConfigError naming the option."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from equeue.spark import sink

    b = broker_process("--flush", "async")
    fill(b.address, "t", 1, 5)
    calls: list[str] = []
    monkeypatch.setattr(source, "freeze_worker_heap", lambda: calls.append("read"))
    monkeypatch.setattr(sink, "freeze_worker_heap", lambda: calls.append("write"))
    body = StructType([StructField("body", BinaryType())])
    for given, want in ((None, ["read", "write"]), ("true", ["read", "write"]), ("false", [])):
        opts = {"brokers": b.address, "topic": "t"} | ({} if given is None else {"gcFreeze": given})
        calls.clear()
        read = list(source.EQueueDataSource(opts).reader(source.SCHEMA).read(RangePartition("t", 0, 0, 5)))
        assert sum(x.num_rows for x in read) == 5
        done = sink.EQueueBatchWriter(opts, body, False).write(iter([pa.record_batch({"body": pa.array([b"x"])})]))
        assert isinstance(done, sink.SinkCommit) and done.rows == 1
        assert calls == want, given
    with pytest.raises(ConfigError, match="gcFreeze"):
        source.EQueueDataSource({"topic": "t", "gcFreeze": "maybe"}).reader(source.SCHEMA)
    with pytest.raises(ConfigError, match="gcFreeze"):
        sink.EQueueBatchWriter({"topic": "t", "gcFreeze": "maybe"}, body, False)
