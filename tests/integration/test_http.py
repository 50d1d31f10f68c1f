"""The broker's HTTP port (Starlette on Hypercorn): /metrics through prometheus-client
(parsed by its own parser), /stats, /healthz, /readyz, and the limits (request head
size, a client that never reads) against a real broker; the slowloris, idle-connection
and oversized-head attacks are in tests/hostile/test_http_hostile.py."""

from __future__ import annotations

import fcntl
import struct
import termios
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from equeue import control, wire
from equeue.broker import open_broker
from equeue.broker.http import MAX_REQUEST_HEAD, REQUEST_TIMEOUT, Readiness, replica_readiness
from equeue.broker.storage import CreateTopicOp, Store
from equeue.client import AsyncClient
from tests.conftest import make_config, wait_until
from tests.integration.test_server import batch

#: every metric docs/operations.md documents, as exposed (sample names)
DOCUMENTED = {
    "equeue_messages_in_total", "equeue_messages_out_total", "equeue_bytes_in_total", "equeue_bytes_out_total",
    "equeue_write_transactions_total", "equeue_write_transactions_inline_total", "equeue_write_inline_max_seconds",
    "equeue_produce_rate", "equeue_pull_rate", "equeue_connections", "equeue_topics", "equeue_parked_pulls",
    "equeue_store_bytes", "equeue_map_size_bytes", "equeue_next_global_offset", "equeue_pending_delayed",
    "equeue_uptime_seconds", "equeue_connections_refused_total", "equeue_connections_dropped_total", "equeue_info",
    "equeue_topic_queues", "equeue_topic_messages", "equeue_topic_bytes", "equeue_topic_appended_total",
    "equeue_metrics_queues_omitted", "equeue_ready", "equeue_group_lag",
    "equeue_produce_latency_seconds_bucket", "equeue_produce_latency_seconds_count", "equeue_produce_latency_seconds_sum",
    "equeue_pull_wait_seconds_bucket", "equeue_pull_wait_seconds_count", "equeue_pull_wait_seconds_sum",
    "equeue_http_connections", "equeue_http_connections_refused_total",
}  # fmt: skip
PER_QUEUE = {
    "equeue_queue_min_offset",
    "equeue_queue_max_offset",
    "equeue_queue_messages",
    "equeue_queue_bytes",
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> tuple[Samples, dict[str, str]]:
    """(name, sorted labels) -> value, and each family's type, by prometheus-client's parser."""
    values: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values, types


async def raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection and read until the broker closes it."""
    s = await trio.open_tcp_stream("127.0.0.1", port)
    await s.send_all(request)
    data = b""
    while chunk := await s.receive_some(65536):
        data += chunk
    await s.aclose()
    return data


async def test_metrics_parse_with_prometheus_client_and_keep_the_documented_names(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        async with open_broker(
            make_config(tmp_path / "d", http_port=0, metrics_queue_limit=3)
        ) as b:
            async with AsyncClient(b.address) as c:
                await c.create_topic("web", 2)
                await c.create_topic("other", 4)
                await c.produce(wire.ProduceRequest("web", 1, batch("m", 3)))
                await c.pull(wire.PullRequest("web", 1, 0, 10))
                await c.commit_offset("readers", "web", 1, 1)  # 2 of 3 left
                await c.commit_offset("readers", "web", 0, 0)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
                r = await http.get("/metrics")
                assert r.status_code == 200
                assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
                values, types = samples(r.text)
                names = {name for name, _ in values}
                assert DOCUMENTED <= names and not names & PER_QUEUE
                assert values[("equeue_ready", ())] == 1  # standalone: ready, no replication series
                assert not any(n.startswith("equeue_replication_") for n in names)
                assert (
                    "# TYPE equeue_messages_in_total counter" in r.text
                )  # the documented name, _total included
                assert (
                    types["equeue_messages_in"] == "counter"
                    and types["equeue_topic_queues"] == "gauge"
                )
                assert values[("equeue_messages_in_total", ())] == 3
                assert values[("equeue_messages_out_total", ())] == 3
                assert values[("equeue_topic_messages", (("topic", "web"),))] == 3
                assert values[("equeue_topic_queues", (("topic", "other"),))] == 4
                assert values[("equeue_topic_appended_total", (("topic", "web"),))] == 3
                assert values[("equeue_metrics_queues_omitted", ())] == 0
                assert values[("equeue_group_lag", (("group", "readers"), ("topic", "web")))] == 2
                assert not any(
                    n == "equeue_group_queue_lag" for n, _ in values
                )  # per queue: on request
                info = [labels for name, labels in values if name == "equeue_info"]
                version = (await http.get("/stats")).json()["version"]
                assert info == [(("flush", "sync"), ("version", version))]
                # per-queue series on request, capped by metrics_queue_limit (3 here)
                for query, want, omitted in (
                    ({"topic": "web"}, {("web", "0"), ("web", "1")}, 0),
                    ({"queues": "1"}, {("other", "0"), ("other", "1"), ("other", "2")}, 3),
                ):
                    values, _ = samples((await http.get("/metrics", params=query)).text)
                    got = {
                        (dict(lb)["topic"], dict(lb)["queue"])
                        for n, lb in values
                        if n == "equeue_queue_max_offset"
                    }
                    assert got == want, query
                    assert values[("equeue_metrics_queues_omitted", ())] == omitted
                    if ("web", "1") in want:
                        lag = values[
                            (
                                "equeue_group_queue_lag",
                                (("group", "readers"), ("queue", "1"), ("topic", "web")),
                            )
                        ]
                        assert lag == 2
                        assert (
                            values[
                                (
                                    "equeue_group_queue_lag",
                                    (("group", "readers"), ("queue", "0"), ("topic", "web")),
                                )
                            ]
                            == 0
                        )
                        assert (
                            values[("equeue_queue_max_offset", (("queue", "1"), ("topic", "web")))]
                            == 3
                        )
                        assert (
                            values[("equeue_queue_messages", (("queue", "0"), ("topic", "web")))]
                            == 0
                        )


def histogram(values: Samples, name: str, **labels: str) -> tuple[list[tuple[float, float]], float, float]:
    """A histogram's (le, cumulative count) buckets in order, its count and its sum."""
    key = tuple(sorted(labels.items()))
    buckets = sorted(
        (float(dict(lb)["le"]), v)
        for (n, lb), v in values.items()
        if n == f"{name}_bucket" and tuple(kv for kv in lb if kv[0] != "le") == key
    )
    return buckets, values[(f"{name}_count", key)], values[(f"{name}_sum", key)]


async def test_latency_histograms_and_http_connections_after_real_traffic(tmp_path: Path) -> None:
    """Produce latency counts every produce request answered; a parked pull's wait is
    counted by outcome: woken by a produce (answered with messages), and run out
    (empty); the HTTP port counts its own connections."""
    with trio.fail_after(30):
        async with open_broker(make_config(tmp_path / "d", http_port=0)) as b:
            async with AsyncClient(b.address) as c, AsyncClient(b.address) as waiter:
                await c.create_topic("lat", 1)
                for i in range(5):
                    await c.produce(wire.ProduceRequest("lat", 0, batch(f"m{i}-", 3)))
                woken: list[int] = []

                async def parked_pull() -> None:
                    r = await waiter.pull(wire.PullRequest("lat", 0, 15, 10, max_wait_ms=20_000))
                    woken.append(len(r.messages))

                async with trio.open_nursery() as n:
                    n.start_soon(parked_pull)
                    await wait_until(lambda: b.parked.parked == 1, what="the pull parked")
                    await c.produce(wire.ProduceRequest("lat", 0, batch("late", 1)))
                assert woken == [1]
                # nothing at the end: the pull waits its 50 ms out and is answered empty
                r = await c.pull(wire.PullRequest("lat", 0, 16, 10, max_wait_ms=50))
                assert not r.messages
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
                values, types = samples((await http.get("/metrics")).text)
        assert types["equeue_produce_latency_seconds"] == "histogram"
        assert types["equeue_pull_wait_seconds"] == "histogram"
        buckets, count, total = histogram(values, "equeue_produce_latency_seconds")
        assert count == 6 and 0 < total < 30
        assert buckets[-1] == (float("inf"), 6)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
        buckets, count, total = histogram(values, "equeue_pull_wait_seconds", outcome="messages")
        assert count == 1 and 0 < total < 20 and buckets[-1][1] == 1
        buckets, count, total = histogram(values, "equeue_pull_wait_seconds", outcome="empty")
        # it waited its 50 ms: counted in no bucket below 0.05 s (le 0.01 holds nothing)
        assert count == 1 and 0.045 < total < 20
        assert dict(buckets)[0.01] == 0 and buckets[-1][1] == 1
        assert values[("equeue_http_connections", ())] == 1  # this scrape's
        assert values[("equeue_http_connections_refused_total", ())] == 0


async def test_stats_methods_and_errors(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "d", http_port=0)) as b:
            async with AsyncClient(b.address) as c:
                await c.create_topic("web", 1)
                await c.produce(wire.ProduceRequest("web", 0, batch("m", 2)))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
                r = await http.get("/stats")
                assert r.status_code == 200 and r.headers["content-type"] == "application/json"
                stats = r.json()
                assert (
                    stats["messages_in"] == 2 and stats["flush"] == "sync" and stats["topics"] == 1
                )
                assert (await http.get("/nope")).status_code == 404
                assert (await http.post("/metrics")).status_code == 405
                r = await http.head("/stats")
                assert (
                    r.status_code == 200
                    and r.content == b""
                    and int(r.headers["content-length"]) > 0
                )
            # garbage is answered 400 and the port keeps serving
            assert (await raw_exchange(b.http_port, b"\x00\x01garbage\r\n\r\n")).startswith(
                b"HTTP/1.1 400"
            )
            async with httpx.AsyncClient() as http:
                assert (
                    await http.get(f"http://127.0.0.1:{b.http_port}/metrics")
                ).status_code == 200


async def test_healthz_and_readyz_of_a_standalone_broker(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "d", http_port=0)) as b:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}") as http:
                r = await http.get("/healthz")
                assert r.status_code == 200 and r.json() == {"alive": True}
                r = await http.get("/readyz")
                assert r.status_code == 200 and r.json() == {
                    "ready": True,
                    "role": "standalone",
                    "reason": "",
                }
            b.stop()  # stopping: no longer ready (and the port closes with the broker at once)
            assert b.readiness() == Readiness(False, "stopping", "the broker is stopping")


def status(role: str, *, leader: str = "b1", isr: tuple[str, ...] = ("b1", "b2"), position: int = 10,
           high_watermark: int = 10) -> control.ReplicationStatus:  # fmt: skip
    return control.ReplicationStatus(
        role, "g1", "b2" if role == "follower" else "b1", 3, leader, position, high_watermark, 100, list(isr),
        "all", 1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("st", "serving", "reads_held", "cut_off", "ready", "why"),
    [
        (status("leader"), True, False, False, True, ""),
        (status("leader"), False, False, False, False, "fenced"),
        (status("leader"), True, True, False, False, "just promoted"),
        (status("leader"), True, False, True, False, "etcd unreachable"),
        (status("follower"), False, False, False, True, ""),
        (status("follower", isr=("b1",)), False, False, False, False, "in-sync"),
        (status("follower", position=4), False, False, False, False, "behind the high watermark"),
        (status("follower", leader=""), False, False, False, False, "no leader"),
        (status("follower"), False, False, True, False, "etcd unreachable"),
    ],
)
def test_replica_readiness(
    st: control.ReplicationStatus,
    serving: bool,
    reads_held: bool,
    cut_off: bool,
    ready: bool,
    why: str,
) -> None:
    r = replica_readiness(st, serving=serving, reads_held=reads_held, cut_off=cut_off)
    assert r.ready is ready and r.role == st.role and why in r.reason
    assert (r.reason == "") is ready


async def test_an_oversized_request_head_is_refused_and_scrapes_go_on(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "d", http_port=0)) as b:
            big = (
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: "
                + b"a" * (2 * MAX_REQUEST_HEAD)
                + b"\r\n\r\n"
            )
            assert (await raw_exchange(b.http_port, big)).startswith(b"HTTP/1.1 431")
            # a head that does not even end within the cap: 431 from Hypercorn, closed
            endless = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_REQUEST_HEAD)
            assert (await raw_exchange(b.http_port, endless)).startswith(b"HTTP/1.1 431")
            async with httpx.AsyncClient() as http:
                assert (
                    await http.get(f"http://127.0.0.1:{b.http_port}/metrics")
                ).status_code == 200


async def test_connections_past_the_cap_are_refused_503_at_once(tmp_path: Path) -> None:
    """``http_max_connections`` connections held open (sending nothing): one more is
    answered 503 and closed without being read; once one goes, the port serves again."""
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "d", http_port=0, http_max_connections=2)) as b:
            held = [await trio.open_tcp_stream("127.0.0.1", b.http_port) for _ in range(2)]
            answer = await raw_exchange(b.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = answer.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 503") and body == b"too many connections to the HTTP port\n"
            assert f"content-length: {len(body)}".encode() in head
            await held.pop().aclose()

            async def served() -> bool:
                answer = await raw_exchange(b.http_port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\nHost: x\r\n\r\n")
                return answer.startswith(b"HTTP/1.1 200")

            await wait_until(served, what="a connection served again")
            values, _ = samples((await raw_exchange(
                b.http_port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\nHost: x\r\n\r\n"
            )).split(b"\r\n\r\n", 1)[1].decode())  # fmt: skip
            assert values[("equeue_http_connections_refused_total", ())] >= 1
            assert values[("equeue_http_connections", ())] == 2  # the one held, this scrape
            await held.pop().aclose()


async def test_an_open_keep_alive_connection_does_not_hold_the_stop(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(make_config(tmp_path / "d", http_port=0)) as b:
            http = httpx.AsyncClient()
            assert (await http.get(f"http://127.0.0.1:{b.http_port}/healthz")).status_code == 200
            stopping = trio.current_time()
        assert trio.current_time() - stopping < 3
        await http.aclose()


async def test_a_client_that_never_reads_its_answer_holds_neither_scrapes_nor_the_stop(
    tmp_path: Path,
) -> None:
    """An answer far larger than the socket buffers (the kernel holds at most ~4 MiB
    sent plus 128 KiB received for a reader that never reads), never read: the
    kernel drops that connection once data stayed unread for the cap (Hypercorn's
    writes ignore cancellation: without it the broker's stop waited for ever).
    Other scrapes are served meanwhile."""
    data = tmp_path / "d"
    store = Store(data, map_size=1 << 30, sync=False)
    try:
        store.write([CreateTopicOp(f"t{i:02}", 1024) for i in range(40)])
    finally:
        store.close()
    with trio.fail_after(60):
        async with open_broker(make_config(data, http_port=0, metrics_queue_limit=50_000)) as b:
            s = await trio.open_tcp_stream("127.0.0.1", b.http_port)
            await s.send_all(
                b"GET /metrics?queues=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            )  # ~9 MB of series

            def unread() -> int:
                return int(
                    struct.unpack("i", fcntl.ioctl(s.socket.fileno(), termios.FIONREAD, b"\0" * 4))[
                        0
                    ]
                )

            # past the head: the broker is inside the body's write, which cannot finish
            await wait_until(lambda: unread() > 4096, timeout=30, what="the body's write began")
            async with httpx.AsyncClient() as http:
                for _ in range(3):
                    assert (
                        await http.get(f"http://127.0.0.1:{b.http_port}/healthz")
                    ).status_code == 200
            stopping = trio.current_time()
        assert trio.current_time() - stopping < REQUEST_TIMEOUT + 3
        await trio.aclose_forcefully(s)
