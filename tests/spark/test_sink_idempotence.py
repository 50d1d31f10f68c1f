"""The sink's publishing protocol without Spark: a task that died half-way and is run
again with the same producer id stores every row exactly once (real broker)."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from equeue import wire
from equeue.broker import EmbeddedBroker
from equeue.client import Client
from equeue.codec import HEADER
from equeue.config import BrokerConfig
from equeue.errors import ConnectionBroken
from equeue.protocol import RequestCode
from equeue.routing import queue_for_key
from equeue.spark import sink
from equeue.spark.source import allocate, split_ranges

pytestmark = [pytest.mark.spark, pytest.mark.timeout(60)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data", port=0, map_size=1 << 28)) as b:
        yield b


def _rows(n: int) -> list[tuple[str | None, bytes]]:
    return [(f"user-{i % 7}" if i % 3 else None, f"row-{i}".encode()) for i in range(n)]


def _publish(addr: str, pid: bytes, rows: list[tuple[str | None, bytes]], stop_after: int | None = None) -> sink.SinkCommit:
    pub = sink._Publisher(addr, "out", pid, 0)
    for key, body in rows:
        if stop_after is not None and pub.commit.chunks >= stop_after:
            pub.abort()  # the task fails: the rows of its current chunk are never sent
            return pub.commit
        pub.add("out", body, key)
    return pub.close()


def _stored(c: Client) -> list[tuple[int, bytes, str | None]]:
    out = []
    for qs in c.describe_topic("out").queues:
        r = c.pull(wire.PullRequest("out", qs.queue_id, 0, 10_000))
        out += [(m.queue_id, m.body, m.key) for m in r.messages]
    return out


def test_half_done_task_replayed_stores_each_row_once(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink, "CHUNK_ROWS", 10)  # many chunks, several requests per queue
    rows = _rows(200)
    pid = sink.producer_id_for("spark-stream", "query-1", 7, 0)
    with Client(broker.address) as c:
        c.create_topic("out", 3)
        first = _publish(broker.address, pid, rows, stop_after=5)
        assert 0 < first.stored < 200
        again = _publish(broker.address, pid, rows)  # Spark replays the task
        assert again.rows == 200 and again.duplicates == first.stored
        assert again.stored == 200 - first.stored
        third = _publish(broker.address, pid, rows)  # and once more: nothing new
        assert third.stored == 0 and third.duplicates == 200
        stored = _stored(c)
        assert sorted(b for _, b, _ in stored) == sorted(b for _, b in rows)
        assert all(q == queue_for_key(k, 3) for q, _, k in stored if k is not None)
        # another batch id is another producer: its rows are new messages
        other = _publish(broker.address, sink.producer_id_for("spark-stream", "query-1", 8, 0), rows[:10])
        assert other.stored == 10


def test_replay_with_big_rows_splits_requests_the_same_way(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests end at MAX_REQUEST_BYTES inside a chunk: a replay still sends the same ones."""
    monkeypatch.setattr(sink, "MAX_REQUEST_BYTES", 4096)
    rows = [(None, bytes([65 + i % 26]) * 1500) for i in range(120)]
    pid = sink.producer_id_for("spark-write", "w-1", 0)
    with Client(broker.address) as c:
        c.create_topic("out", 2)
        first = _publish(broker.address, pid, rows[:60])  # a run that got half-way
        assert first.stored == 60
        again = _publish(broker.address, pid, rows)
        assert (again.duplicates, again.stored) == (60, 60)
        assert sorted(b for _, b, _ in _stored(c)) == sorted(b for _, b in rows)


class ProduceBreaker:
    """A TCP proxy to the broker that forwards the handshake and every request but
    a produce: on a produce it closes both sides (the request never arrives), and
    notes when."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.produce_times: list[float] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_broker: bool) -> None:
        buf = b""
        handshake = 8 if to_broker else 0
        try:
            while data := src.recv(65536):
                if not to_broker:
                    dst.sendall(data)
                    continue
                buf += data
                if handshake:
                    take = min(handshake, len(buf))
                    dst.sendall(buf[:take])
                    buf, handshake = buf[take:], handshake - take
                while not handshake and len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                    n = 4 + struct.unpack_from(">I", buf)[0]
                    frame, buf = buf[:n], buf[n:]
                    if HEADER.unpack_from(frame)[2] == RequestCode.PRODUCE:
                        self.produce_times.append(time.monotonic())
                        raise ConnectionResetError("produce refused")
                    dst.sendall(frame)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_sink_pauses_between_resends(broker: EmbeddedBroker) -> None:
    """The sink used to resend a failed request at once, 5 times in a row. It now
    resends through the producer's retry policy: a growing pause between attempts."""
    with Client(broker.address) as c:
        c.create_topic("out", 1)
    proxy = ProduceBreaker(broker.address)
    try:
        pub = sink._Publisher(proxy.address, "out", sink.producer_id_for("spark-write", "w-2", 0), 0)
        pub.add("out", b"x")
        with pytest.raises(ConnectionBroken):
            pub.close()
    finally:
        proxy.close()
    times = proxy.produce_times
    assert len(times) == sink.SEND_RETRIES + 1
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.15, gaps  # the first pause is retry_backoff (0.2 s)
    assert gaps[-1] > gaps[0]


def test_allocate_splits_budget_by_lag() -> None:
    lags = {("t", "0"): 300, ("t", "1"): 100, ("t", "2"): 0}
    assert allocate(lags, 1000) == lags
    got = allocate(lags, 100)
    assert got == {("t", "0"): 75, ("t", "1"): 25, ("t", "2"): 0}
    got = allocate({("t", "0"): 5, ("t", "1"): 5, ("t", "2"): 5}, 2)
    assert sum(got.values()) == 2 and max(got.values()) == 1


def test_split_ranges_min_partitions_and_cap() -> None:
    parts = split_ranges([("t", 0, 0, 100), ("t", 1, 50, 50), ("t", 2, 0, 10)], 1, 40)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 0, 33), (0, 33, 66), (0, 66, 100), (2, 0, 10)]
    parts = split_ranges([("t", 0, 0, 90), ("t", 1, 0, 10)], 10, 1_000_000)
    assert len(parts) == 10 and sum(p.end - p.start for p in parts) == 100


def test_the_compression_option_compresses_each_request(broker: EmbeddedBroker) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from equeue.errors import ConfigError
    from equeue.wire.batches import Codec, batch_head, stored_batch

    schema = StructType([StructField("body", BinaryType())])
    assert sink.EQueueBatchWriter({"topic": "out", "compression": "zstd"}, schema, False).compression is Codec.ZSTD
    with pytest.raises(ConfigError, match="option compression: unknown compression 'gzip'"):
        sink.EQueueBatchWriter({"topic": "out", "compression": "gzip"}, schema, False)
    rows = _rows(50)
    with Client(broker.address) as c:
        c.create_topic("out", 3)
        pub = sink._Publisher(broker.address, "out", sink.producer_id_for("w", "1", 0), 0, compression=Codec.ZSTD)
        for key, body in rows:
            pub.add("out", body, key)
        assert pub.close().stored == 50
        assert sorted(b for _, b, _ in _stored(c)) == sorted(b for _, b in rows)
    store = broker._broker.store  # type: ignore[union-attr]
    codecs = {
        batch_head(stored_batch(v), 1 << 20).codec
        for q in range(3)
        for _, v, _ in store.read_queue(store.topic("out"), q, 0, 1000, 1 << 30).batches
    }
    assert codecs == {Codec.ZSTD}


def test_property_maps_null_values_are_left_out_and_others_must_be_text(broker: EmbeddedBroker) -> None:
    import pyarrow as pa

    with Client(broker.address) as c:
        c.create_topic("out", 1)
    pub = sink._Publisher(broker.address, "out", b"\x02" * 16, 0)
    props = pa.array([[("a", "1"), ("gone", None)], None], type=pa.map_(pa.string(), pa.string()))
    pub.add_batch(pa.RecordBatch.from_arrays([pa.array([b"x", b"y"]), props], names=["body", "properties"]))
    with pytest.raises(TypeError, match="property 'n' must be a str, not int"):
        pub.add_batch(
            pa.RecordBatch.from_arrays(
                [pa.array([b"z"]), pa.array([[("n", 1)]], type=pa.map_(pa.string(), pa.int64()))],
                names=["body", "properties"],
            )
        )
    assert pub.close().rows == 2
    with Client(broker.address) as c:
        r = c.pull(wire.PullRequest("out", 0, 0, 10))
        assert [(m.body, m.properties) for m in r.messages] == [(b"x", {"a": "1"}), (b"y", {})]
