"""The etcd proxy of the fault campaign (:mod:`tests.chaos.etcdproxy`), as a child
process in front of a REAL etcd (one member on free loopback ports), driven through
etcd's v3 JSON gateway with httpx and raw TCP. Only the pipeline property of ``delay``
is checked in-process, on trio's MockClock (exact times, no wall-clock bound)."""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from equeue.broker.cluster.etcdproc import ETCD_BINARY, EtcdProcess
from tests.chaos.etcdproxy import EtcdProxyError, EtcdProxyProcess, Proxy, set_mode
from tests.conftest import wait_until


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdProcess]:
    if not os.access(ETCD_BINARY, os.X_OK):
        pytest.skip(f"{ETCD_BINARY} missing (make etcd-install installs etcd-server)")
    with EtcdProcess() as e:
        yield e


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def proxy(etcd: EtcdProcess, tmp_path: Path) -> Iterator[EtcdProxyProcess]:
    """Ports 0 and 1 forward to etcd, port 2 to a port nothing listens on."""
    member = f"127.0.0.1:{etcd.client_port}"
    p = EtcdProxyProcess(
        tmp_path / "ctl.sock",
        "127.0.0.1",
        [0, 0, 0],
        [member, member, f"127.0.0.1:{_dead_port()}"],
        log_path=tmp_path / "proxy.log",
    )
    p.start()
    yield p
    p.stop()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def new_key() -> str:
    return f"/etcdproxy-test/{uuid.uuid4().hex}"


async def put(http: httpx.AsyncClient, base: str, key: str, value: str) -> None:
    r = await http.post(f"{base}/v3/kv/put", json={"key": b64(key), "value": b64(value)})
    r.raise_for_status()


async def get(http: httpx.AsyncClient, base: str, key: str) -> str | None:
    r = await http.post(f"{base}/v3/kv/range", json={"key": b64(key)})
    r.raise_for_status()
    kvs = r.json().get("kvs", [])
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


async def get_direct(etcd: EtcdProcess, key: str) -> str | None:
    """Read ``key`` from etcd itself, bypassing the proxy."""
    async with httpx.AsyncClient(timeout=None) as http:
        with trio.fail_after(10):
            return await get(http, etcd.endpoint, key)


def raw_put(key: str, value: str) -> bytes:
    """A complete HTTP/1.1 put request, for a raw TCP connection."""
    body = json.dumps({"key": b64(key), "value": b64(value)}).encode()
    head = f"POST /v3/kv/put HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the peer sends until it closes (FIN) or resets the connection."""
    got = b""
    try:
        while data := await stream.receive_some(65536):
            got += data
    except trio.BrokenResourceError:  # a reset
        pass
    return got


async def conns(proxy: EtcdProxyProcess) -> int:
    """The proxy's live client connections, from its status answer."""
    answer = await set_mode(proxy.control_path, "status")
    return int(answer.rsplit("conns=", 1)[1])


def conns_are(proxy: EtcdProxyProcess, n: int) -> Callable[[], Awaitable[bool]]:
    """A condition for ``wait_until``: the proxy has ``n`` live client connections."""

    async def check() -> bool:
        return await conns(proxy) == n

    return check


def urls(proxy: EtcdProxyProcess) -> list[str]:
    return proxy.urls.split(",")


async def test_pass_forwards_each_port_to_its_upstream_and_status_counts_connections(
    proxy: EtcdProxyProcess, etcd: EtcdProcess
) -> None:
    key = new_key()
    a, b, _ = urls(proxy)
    assert len(set(proxy.ports)) == 3 and 0 not in proxy.ports
    with trio.fail_after(20):
        assert await set_mode(proxy.control_path, "status") == "ok pass conns=0"
        assert await set_mode(proxy.control_path, "pass") == "ok pass"
        async with httpx.AsyncClient(timeout=None) as http:
            await put(http, a, key, "v1")
            assert await get(http, b, key) == "v1"
            # one keep-alive connection per port, both still open
            assert await set_mode(proxy.control_path, "status") == "ok pass conns=2"
        await wait_until(conns_are(proxy, 0), what="both connections end")
        assert await get_direct(etcd, key) == "v1"


async def test_blackhole_is_silent_both_ways_and_leaving_it_closes_its_connections(
    proxy: EtcdProxyProcess, etcd: EtcdProcess
) -> None:
    before, on_old, on_new, after = new_key(), new_key(), new_key(), new_key()
    url = urls(proxy)[0]
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=None) as http:
            await put(http, url, before, "x")  # a working keep-alive connection ...
            assert await set_mode(proxy.control_path, "blackhole") == "ok blackhole"
            with trio.move_on_after(1) as silent:
                await put(http, url, on_old, "lost")  # ... goes silent
            assert silent.cancelled_caught
        raw = await trio.open_tcp_stream("127.0.0.1", proxy.ports[0])  # a new connection too
        async with raw:
            await raw.send_all(raw_put(on_new, "lost"))
            with trio.move_on_after(1) as silent:
                await raw.receive_some(65536)
            assert silent.cancelled_caught
            assert await set_mode(proxy.control_path, "pass") == "ok pass"
            assert await read_until_closed(raw) == b""  # closed, never answered
        await wait_until(conns_are(proxy, 0), what="the black-holed connections end")
        assert await get_direct(etcd, on_old) is None  # nothing went through
        assert await get_direct(etcd, on_new) is None
        async with httpx.AsyncClient(timeout=None) as http:  # new connections work again
            await put(http, url, after, "y")
            assert await get(http, url, after) == "y"


async def test_delay_holds_each_direction_also_on_an_existing_connection(
    proxy: EtcdProxyProcess,
) -> None:
    key = new_key()
    url = urls(proxy)[1]
    delay = 0.3
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=None) as http:
            await put(http, url, key, "slow")  # opens the keep-alive connection in pass
            assert await set_mode(proxy.control_path, "delay 300") == "ok delay 300"
            start = trio.current_time()
            assert await get(http, url, key) == "slow"
            # the request waits `delay` on its way in, the answer on its way out
            assert trio.current_time() - start >= 2 * delay
            assert await set_mode(proxy.control_path, "status") == "ok delay 300 conns=1"


async def test_delay_is_a_pipeline_per_direction(autojump_clock: trio.testing.MockClock) -> None:
    """Chunks read 0.1 s apart arrive 0.1 s apart, each exactly the delay after it was
    read, both ways at once (a proxy sleeping per chunk would deliver them 1 s apart)."""
    proxy = Proxy()
    proxy.set_mode("delay", 1000)
    client, client_end = trio.testing.memory_stream_pair()
    upstream_end, upstream = trio.testing.memory_stream_pair()

    async def connect() -> trio.abc.Stream:
        return upstream_end

    sent: dict[bytes, float] = {}
    arrived: dict[bytes, float] = {}

    async def collect(stream: trio.abc.ReceiveStream) -> None:
        while True:
            data = await stream.receive_some(65536)
            arrived[bytes(data)] = trio.current_time()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(proxy.handle, client_end, connect)
            nursery.start_soon(collect, upstream)  # requests, at etcd's end
            nursery.start_soon(collect, client)  # answers, at the client's end
            for i in range(10):
                for stream, tag in ((client, b"q"), (upstream, b"a")):
                    chunk = tag + str(i).encode()
                    sent[chunk] = trio.current_time()
                    await stream.send_all(chunk)
                await trio.sleep(0.1)  # paces the load (virtual time)
            await wait_until(
                lambda: len(arrived) >= len(sent), timeout=10, what="every chunk arrives"
            )
            assert arrived.keys() == sent.keys()  # one chunk each, none merged
            for chunk, at in sent.items():
                assert arrived[chunk] == pytest.approx(at + 1.0), chunk
            assert len(proxy.conns) == 1
            nursery.cancel_scope.cancel()


async def test_drop_answers_applies_the_request_and_loses_its_answer(
    proxy: EtcdProxyProcess, etcd: EtcdProcess
) -> None:
    key = new_key()
    url = urls(proxy)[0]
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=None) as http:
            await put(http, url, new_key(), "x")  # an existing keep-alive connection
            assert await set_mode(proxy.control_path, "drop-answers") == "ok drop-answers"
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await put(http, url, key, "applied")
        assert await get_direct(etcd, key) == "applied"


async def test_a_connection_opened_in_drop_answers_keeps_it(
    proxy: EtcdProxyProcess, etcd: EtcdProcess
) -> None:
    key, later = new_key(), new_key()
    with trio.fail_after(20):
        assert await set_mode(proxy.control_path, "drop-answers") == "ok drop-answers"
        raw = await trio.open_tcp_stream("127.0.0.1", proxy.ports[1])
        async with raw:
            await wait_until(conns_are(proxy, 1), what="the proxy accepted the connection")
            assert await set_mode(proxy.control_path, "pass") == "ok pass"
            await raw.send_all(raw_put(key, "applied"))
            assert await read_until_closed(raw) == b""  # not one byte of the answer
        assert await get_direct(etcd, key) == "applied"
        async with httpx.AsyncClient(timeout=None) as http:  # a new connection is in pass
            await put(http, urls(proxy)[1], later, "answered")
            assert await get(http, urls(proxy)[1], later) == "answered"


async def test_an_unreachable_upstream_closes_the_client_only(proxy: EtcdProxyProcess) -> None:
    key = new_key()
    first, _, dead = urls(proxy)
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=None) as http:
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await get(http, dead, key)
            await put(http, first, key, "still serving")
            assert await get(http, first, key) == "still serving"
    assert proxy.running


async def test_control_errors_and_several_lines_on_one_connection(proxy: EtcdProxyProcess) -> None:
    ctl = proxy.control_path
    with trio.fail_after(20):
        for bad in ("bogus", "delay", "delay -5", "delay 1.5", "pass now", "", "x" * 5000):
            with pytest.raises(EtcdProxyError, match=r"^error "):
                await set_mode(ctl, bad)
        assert await set_mode(ctl, "status") == "ok pass conns=0"  # unchanged
        stream = await trio.open_unix_socket(str(ctl))
        async with stream:
            await stream.send_all(b"delay 50\nstatus\nnope\ndrop-answers\n")
            got = b""
            while got.count(b"\n") < 4:
                data = await stream.receive_some(4096)
                assert data, f"the proxy closed the control connection after {got!r}"
                got += data
        lines = got.decode().splitlines()
        assert lines[:2] == ["ok delay 50", "ok delay 50 conns=0"]
        assert lines[2].startswith("error ") and lines[3] == "ok drop-answers"


def test_sigterm_exits_cleanly_and_a_restart_keeps_the_ports(proxy: EtcdProxyProcess) -> None:
    ports = list(proxy.ports)
    assert proxy.control_path.exists() and proxy.running
    proxy.stop()
    assert proxy.proc is not None and proxy.proc.returncode == 0
    assert not proxy.running and not proxy.control_path.exists()
    proxy.start()
    assert proxy.ports == ports and proxy.control_path.exists()
    assert proxy.urls == ",".join(f"http://127.0.0.1:{p}" for p in ports)
