"""EtcdClient against a real etcd: leases, transactions, prefixes, watches, failover,
timeouts and malformed answers."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from equeue.broker.cluster.etcd import (
    EtcdClient,
    EtcdUnavailable,
    KeyValue,
    WatchCompacted,
    WatchEvent,
)
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.errors import ClusterUnavailable, ConfigError, EQueueError, ErrorCode
from tests.conftest import wait_until


def dead_endpoint() -> str:
    """A loopback URL where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_lease_keepalive_and_expiry(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        lease = await c.grant(1)  # etcd raises a TTL this short to its minimum (~2 s)
        assert await c.keepalive(lease) >= 1
        await c.put("/t/leased", b"v", lease=lease)
        kv = await c.get("/t/leased")
        assert kv is not None and kv.lease == lease
        ttl, keys = await c.time_to_live(lease)
        assert ttl >= 1 and keys == ["/t/leased"]

        async def gone() -> bool:
            return await c.get("/t/leased") is None

        await wait_until(gone, timeout=15, interval=0.1, what="the leased key to expire")
        assert await c.keepalive(lease) == 0
        assert await c.revoke(lease) is False  # already gone: not an error


async def test_revoke_deletes_the_keys_at_once(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        lease = await c.grant(30)
        await c.put("/t/a", b"1", lease=lease)
        assert await c.revoke(lease) is True
        assert await c.get("/t/a") is None


async def test_create_if_absent_twice(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        assert await c.create("/t/k", b"first") is True
        assert await c.create("/t/k", b"second") is False
        kv = await c.get("/t/k")
        assert kv is not None and kv.value == b"first" and kv.create_revision == kv.mod_revision


async def test_replace_is_a_compare_and_swap(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        rev = await c.put("/t/k", b"v1")
        kv = await c.get("/t/k")
        assert kv is not None and kv.mod_revision == rev
        assert await c.replace("/t/k", b"v2", rev) is True
        assert await c.replace("/t/k", b"v3", rev) is False  # stale: someone changed it
        kv = await c.get("/t/k")
        assert kv is not None and kv.value == b"v2" and kv.mod_revision > rev
        assert await c.replace("/t/missing", b"x", 1) is False


async def test_delete_and_delete_if(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        rev = await c.put("/t/k", b"v1")
        await c.put("/t/k", b"v2")
        assert await c.delete_if("/t/k", rev) is False
        kv = await c.get("/t/k")
        assert kv is not None
        assert await c.delete_if("/t/k", kv.mod_revision) is True
        assert await c.get("/t/k") is None
        await c.put("/t/j", b"x")
        assert await c.delete("/t/j") is True
        assert await c.delete("/t/j") is False


async def test_get_prefix_selects_exactly_the_prefix(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        for key in ("/p/", "/p/a", "/p/b/c", "/p0", "/o/a", "/q"):
            last = await c.put(key, key.encode())
        kvs, revision = await c.get_prefix("/p/")
        assert [kv.key for kv in kvs] == ["/p/", "/p/a", "/p/b/c"]
        assert [kv.value for kv in kvs] == [b"/p/", b"/p/a", b"/p/b/c"]
        assert revision == last
        assert await c.get_prefix("/none/") == ([], revision)


async def test_watch_sees_puts_and_deletes_in_order(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        _, rev = await c.get_prefix("/w/")
        seen: list[WatchEvent] = []
        async with c.watch_prefix("/w/", rev + 1) as stream:
            await c.put("/w/a", b"1")
            await c.put("/outside", b"x")
            await c.put("/w/b", b"2")
            await c.delete("/w/a")
            with trio.fail_after(10):
                async for batch in stream:
                    seen += batch
                    if len(seen) >= 3:
                        break
        assert [(e.kind, e.kv.key, e.kv.value) for e in seen] == [
            ("put", "/w/a", b"1"),
            ("put", "/w/b", b"2"),
            ("delete", "/w/a", b""),
        ]
        revisions = [e.revision for e in seen]
        assert revisions == sorted(revisions) and revisions[0] == rev + 1


async def test_watch_from_a_compacted_revision_raises(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint]) as c:
        first = await c.put("/w/a", b"1")
        last = await c.put("/w/a", b"2")
        await c.compact(last)
        with trio.fail_after(10), pytest.raises(WatchCompacted) as info:
            async with c.watch_prefix("/w/", first) as stream:
                await stream.__anext__()  # etcd acks the watch, then cancels it
        assert info.value.revision == last
        assert isinstance(info.value, ClusterUnavailable)


async def test_watch_breaks_on_restart_and_rewatch_misses_nothing(own_etcd: EtcdProcess) -> None:
    async with EtcdClient([own_etcd.endpoint], request_timeout=1.0) as c:
        rev = await c.put("/w/a", b"before")
        with trio.fail_after(20):
            async with c.watch_prefix("/w/", rev + 1) as stream:
                own_etcd.kill()
                with pytest.raises(EtcdUnavailable):
                    async for _ in stream:
                        pass
            await trio.to_thread.run_sync(own_etcd.start)  # same ports, same data
            await c.put("/w/b", b"after")
            async with c.watch_prefix("/w/", rev + 1) as stream:
                batch = await stream.__anext__()
        assert [(e.kv.key, e.kv.value) for e in batch] == [("/w/b", b"after")]


async def test_failover_to_the_next_endpoint(etcd: EtcdProcess) -> None:
    async with EtcdClient([dead_endpoint(), etcd.endpoint], request_timeout=1.0) as c:
        _, rev = await c.get_prefix("/t/")
        assert await c.create("/t/k", b"v") is True  # not idempotent: failover still safe
        assert (await c.status())["endpoint"] == etcd.endpoint
        async with c.watch_prefix("/t/", rev + 1) as stream:
            batch = await stream.__anext__()
        assert batch[0].kv == KeyValue("/t/k", b"v", batch[0].revision, batch[0].revision, 0)
        status = await c.status()
        assert (
            status["version"].startswith("3.") and status["leader"] != 0 and status["revision"] >= 2
        )


async def test_no_endpoint_answers() -> None:
    async with EtcdClient([dead_endpoint(), dead_endpoint()], request_timeout=1.0) as c:
        with trio.fail_after(10):
            with pytest.raises(EtcdUnavailable) as info:
                await c.get("/k")
            with pytest.raises(EtcdUnavailable):
                await c.create("/k", b"v")
            with pytest.raises(EtcdUnavailable):
                async with c.watch_prefix("/", 1):
                    pass
    assert info.value.code == ErrorCode.CLUSTER_UNAVAILABLE and info.value.transient
    assert "no etcd endpoint answered" in str(info.value)


async def test_a_frozen_etcd_times_out(etcd: EtcdProcess) -> None:
    async with EtcdClient([etcd.endpoint], request_timeout=0.3) as c:
        await c.put("/t/k", b"v")
        etcd.freeze()
        try:
            with trio.fail_after(10):
                with pytest.raises(EtcdUnavailable, match="no answer"):
                    await c.get("/t/k")
                # a write that may have been applied is not retried into a wrong answer
                with pytest.raises(EtcdUnavailable, match="outcome unknown"):
                    await c.create("/t/new", b"v")
        finally:
            etcd.thaw()
        # a thawed etcd may take longer than the 0.3 s request timeout for its first
        # answers on a loaded machine: it answers again within the deadline
        with trio.fail_after(10):
            while True:
                try:
                    kv = await c.get("/t/k")
                    break
                except EtcdUnavailable:
                    await trio.sleep(0.05)
        assert kv is not None and kv.value == b"v"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"kvs": 5}',
        b'{"kvs": [5]}',
        b'{"kvs": [{"key": 5}]}',
        b'{"kvs": [{"key": "!!notbase64"}]}',
        b'{"kvs": [{"key": "/w==", "value": "eA=="}]}',
        b'{"kvs": [{"key": "YQ==", "mod_revision": "x1"}]}',
        b'{"kvs": [{"key": "YQ==", "mod_revision": true}]}',
        b'{"header": []}',
        b'{"header": {"revision": {}}}',
        b'{"result": "x", "succeeded": "yes", "ID": "z", "deleted": []}',
    ],
)
async def test_malformed_answers_are_cluster_unavailable(body: bytes) -> None:
    """A broken gateway (or a proxy in the way) never crashes the caller with a
    KeyError or TypeError: every method raises ClusterUnavailable."""

    async def answer(stream: trio.SocketStream) -> None:
        try:
            while b"\r\n\r\n" not in await stream.receive_some(65536):
                pass
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            await stream.send_all(head.encode() + body)
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, answer, 0)
        port = listeners[0].socket.getsockname()[1]
        async with EtcdClient([f"http://127.0.0.1:{port}"], request_timeout=2.0) as c:
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: c.get("/k"), lambda: c.get_prefix("/"), lambda: c.put("/k", b"v"),
                lambda: c.create("/k", b"v"), lambda: c.replace("/k", b"v", 1),
                lambda: c.delete("/k"), lambda: c.delete_if("/k", 1), lambda: c.grant(5),
                lambda: c.keepalive(1), lambda: c.time_to_live(1), c.status,
            ]  # fmt: skip
            for call in calls:
                try:
                    with trio.fail_after(10):
                        await call()
                except ClusterUnavailable:
                    pass
                except EQueueError as exc:  # pragma: no cover - the test's failure message
                    raise AssertionError(f"{call}: {exc!r}") from exc
            # some bodies are valid for some calls (e.g. put ignores a missing header);
            # what matters is that nothing else than ClusterUnavailable escapes
        nursery.cancel_scope.cancel()


def test_etcd_process_without_the_binary(tmp_path: Path) -> None:
    with pytest.raises(EQueueError, match="install etcd-server"):
        EtcdProcess(tmp_path, binary=str(tmp_path / "no-etcd")).start()


def test_etcd_process_restarts_on_the_same_ports(own_etcd: EtcdProcess) -> None:
    endpoint, pid = own_etcd.endpoint, own_etcd.pid
    own_etcd.stop()
    assert not own_etcd.running
    own_etcd.start()
    assert own_etcd.endpoint == endpoint and own_etcd.pid != pid


@pytest.mark.parametrize("endpoints", [[], ["127.0.0.1:2379"], ["http://"]])
def test_bad_endpoints_are_config_errors(endpoints: list[str]) -> None:
    with pytest.raises(ConfigError):
        EtcdClient(endpoints)


def test_an_etcd_whose_port_another_etcd_serves_does_not_count_as_started(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A bind race (the port picked was taken before etcd bound it): the ``/health``
    that answers is the other etcd's, so start() must not report this one serving."""
    other = EtcdProcess(tmp_path / "other")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other.peer_port = s.getsockname()[1]
    other.client_port = etcd.client_port  # fixed: started as-is, no new ports
    try:
        with pytest.raises(EQueueError, match="address already in use"):
            other.start(timeout=10)
        assert not other.running
    finally:
        other.close()


async def test_a_call_after_the_block_ended_is_cluster_unavailable(etcd: EtcdProcess) -> None:
    """A request still answered while the broker stops (its etcd client closed, a
    GET_ROUTES looking a topic up, say) gets the transient, coded CLUSTER_UNAVAILABLE,
    not an internal error; a client used before its block is a programming error."""
    c = EtcdClient([etcd.endpoint])
    with pytest.raises(RuntimeError):
        await c.get("/t/x")
    async with c:
        assert await c.get("/t/x") is None
    with pytest.raises(ClusterUnavailable) as info:
        await c.get("/t/x")
    assert info.value.code == ErrorCode.CLUSTER_UNAVAILABLE
