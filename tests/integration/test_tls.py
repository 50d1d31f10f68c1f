"""TLS end to end: the broker port and the HTTP port with a test CA (trustme).

Real brokers on port 0, real handshakes: the SDK (produce, a long-polled pull
answered after a commit, a consumer group), mutual TLS, every certificate problem
(unknown CA, wrong host name, expired broker or client certificate, no client
certificate) as a clear, non-transient TlsError, a stalled or failed handshake
closed with one rate-limited log line, the CLI through the EQUEUE_TLS_* variables,
and HTTPS /metrics.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from typer.testing import CliRunner

from equeue import Message, wire
from equeue.broker import EmbeddedBroker, open_broker
from equeue.cli import app
from equeue.client import AsyncClient, Client
from equeue.client.retry import is_transient
from equeue.config import BrokerConfig
from equeue.consumer import AsyncConsumer
from equeue.errors import ConfigError, ConnectionBroken, TlsError
from equeue.producer import AsyncProducer
from equeue.security import ClientSecurity, TlsSettings
from tests.conftest import make_config, wait_until
from tests.integration.test_server import free_port

pytestmark = pytest.mark.timeout(60)

PAST = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)


class Pki:
    """A test CA, a broker certificate for 127.0.0.1/localhost and client
    certificates, as PEM files under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = trustme.CA()
        self.ca_file = self._write("ca.pem", self.ca.cert_pem)
        self.server = self.issue("server.pem", "127.0.0.1", "localhost")
        self.client = self.issue("client.pem", "client-1@example")

    def _write(self, name: str, blob: trustme.Blob) -> Path:
        path = self.root / name
        blob.write_to_path(str(path))
        return path

    def issue(self, name: str, *identities: str, ca: trustme.CA | None = None, **kw: Any) -> Path:
        """A PEM with the key and the chain of a new certificate for ``identities``."""
        cert = (ca or self.ca).issue_cert(*identities, **kw)
        return self._write(name, cert.private_key_and_cert_chain_pem)

    def tls(self, cert: Path | None = None, **kw: Any) -> ClientSecurity:
        return ClientSecurity(tls=TlsSettings(ca_file=kw.pop("ca_file", self.ca_file), cert_file=cert, **kw))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_config(data: Path, pki: Pki, **kw: Any) -> BrokerConfig:
    return make_config(data, tls_cert=kw.pop("tls_cert", pki.server), **kw)


def entries(prefix: str, n: int) -> list[bytes]:
    return [wire.encode_entry(Message(f"{prefix}-{i}".encode())) for i in range(n)]


async def refused(address: str, security: ClientSecurity) -> TlsError:
    """Connect with ``security``: the TlsError it must fail with (at once: no retry)."""
    with trio.fail_after(10):
        async with AsyncClient(address, security=security) as c:
            with pytest.raises(TlsError) as info:
                await c.stats()
    assert not is_transient(info.value), "a certificate problem must not be retried"
    return info.value


# --------------------------------------------------------------------------- the SDK
async def test_produce_pull_and_consume_over_tls(tmp_path: Path, pki: Pki) -> None:
    """Answers of every kind over TLS, the long-polled pull answered after a commit
    included: on a TLS connection the writer thread must not write (raw bytes on the
    socket would break the TLS session)."""
    sec = pki.tls()
    with trio.fail_after(30):
        async with open_broker(tls_config(tmp_path / "d", pki)) as b:
            async with AsyncClient(b.address, security=sec) as c, AsyncClient(b.address, security=sec) as waiter:
                await c.create_topic("secure", 2)
                got: list[Any] = []

                async def park() -> None:
                    got.append(await waiter.pull(wire.PullRequest("secure", 0, 0, 100, max_wait_ms=10_000)))

                async with trio.open_nursery() as n:
                    n.start_soon(park)
                    await wait_until(lambda: b.parked.parked > 0, what="the pull parked")
                    ack = await c.produce(wire.ProduceRequest("secure", 0, entries("a", 5)))
                    assert ack.stored == 5
                assert [m.body for m in got[0].messages] == [f"a-{i}".encode() for i in range(5)]
                # a large answer crosses many TLS records
                big = [wire.encode_entry(Message(bytes([i]) * 100_000)) for i in range(20)]
                await c.produce(wire.ProduceRequest("secure", 1, big))
                res = await c.pull(wire.PullRequest("secure", 1, 0, 100, max_bytes=8 << 20))
                assert [m.body for m in res.messages] == [bytes([i]) * 100_000 for i in range(20)]
            async with AsyncProducer(b.address, security=sec) as p:
                for i in range(2000):
                    await p.send_async("secure", f"m{i}".encode(), key=f"k{i}")
                await p.flush()
            seen: set[bytes] = set()
            async with AsyncConsumer(
                b.address, "g", "secure", start_from="earliest", security=sec,
                heartbeat_interval=0.2, rebalance_interval=0.2,
            ) as consumer:  # fmt: skip

                async def handler(m: Message) -> None:
                    seen.add(m.body)

                async with trio.open_nursery() as n:
                    n.start_soon(consumer.run, handler)
                    await wait_until(lambda: len(seen) >= 2025, timeout=20, what="every message consumed")
                    n.cancel_scope.cancel()
            assert {f"m{i}".encode() for i in range(2000)} <= seen


async def test_mutual_tls_required(tmp_path: Path, pki: Pki) -> None:
    cfg = tls_config(tmp_path / "d", pki, tls_ca=pki.ca_file, tls_client_auth="required")
    async with open_broker(cfg) as b:
        err = await refused(b.address, pki.tls())  # no client certificate
        assert "refused the client certificate" in str(err), err
        async with AsyncClient(b.address, security=pki.tls(pki.client)) as c:
            await c.create_topic("m", 1)
            assert (await c.produce(wire.ProduceRequest("m", 0, entries("x", 2)))).stored == 2
        # a certificate from another CA is refused too
        other = pki.issue("other-client.pem", "mallory@example", ca=trustme.CA())
        err = await refused(b.address, pki.tls(other))
        assert "refused the client certificate" in str(err), err


async def test_optional_client_auth_takes_both(tmp_path: Path, pki: Pki) -> None:
    cfg = tls_config(tmp_path / "d", pki, tls_ca=pki.ca_file, tls_client_auth="optional")
    async with open_broker(cfg) as b:
        for sec in (pki.tls(), pki.tls(pki.client)):
            async with AsyncClient(b.address, security=sec) as c:
                assert (await c.stats()).connections == 1


async def test_wrong_ca_and_hostname_mismatch_are_clear_errors(tmp_path: Path, pki: Pki) -> None:
    other_ca = pki._write("other-ca.pem", trustme.CA().cert_pem)
    named = pki.issue("named.pem", "broker.example")
    async with open_broker(tls_config(tmp_path / "d", pki)) as b:
        err = await refused(b.address, pki.tls(ca_file=other_ca))
        assert "broker's certificate is refused" in str(err) and "issuer" in str(err), err
    async with open_broker(tls_config(tmp_path / "d2", pki, tls_cert=named)) as b:
        err = await refused(b.address, pki.tls())
        assert "mismatch" in str(err).lower() and "127.0.0.1" in str(err), err
        # the name to check can be set apart from the address
        async with AsyncClient(b.address, security=pki.tls(server_hostname="broker.example")) as c:
            await c.stats()


async def test_expired_broker_certificate(tmp_path: Path, pki: Pki) -> None:
    expired = pki.issue("expired-server.pem", "127.0.0.1", not_before=PAST, not_after=PAST + dt.timedelta(days=1))
    async with open_broker(tls_config(tmp_path / "d", pki, tls_cert=expired)) as b:
        err = await refused(b.address, pki.tls())
        assert "expired" in str(err), err


async def test_expired_client_certificate(tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    expired = pki.issue("expired-client.pem", "old@example", not_before=PAST, not_after=PAST + dt.timedelta(days=1))
    cfg = tls_config(tmp_path / "d", pki, tls_ca=pki.ca_file, tls_client_auth="required")
    with caplog.at_level(logging.INFO, logger="equeue.broker"):
        async with open_broker(cfg) as b:
            err = await refused(b.address, pki.tls(expired))
            assert "refused the client certificate" in str(err) and "EXPIRED" in str(err).upper(), err
            await wait_until(lambda: "TLS handshake failed" in caplog.text, what="the broker logs the refusal")
    line = next(r for r in caplog.records if "TLS handshake failed" in r.getMessage())
    assert "expired" in line.getMessage().lower() and line.exc_info is None


# --------------------------------------------------------------------------- broker side
async def test_failed_handshakes_are_one_rate_limited_line(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain-TCP client or a scanner on a TLS port: closed, one INFO line per
    reason per 10 s, no traceback; the broker keeps serving."""
    with caplog.at_level(logging.INFO, logger="equeue.broker"):
        async with open_broker(tls_config(tmp_path / "d", pki)) as b:
            for _ in range(20):
                s = await trio.open_tcp_stream("127.0.0.1", b.port)
                await s.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                with trio.fail_after(5):
                    while await s.receive_some(1024):
                        pass  # the broker closes
                await s.aclose()
            async with AsyncClient(b.address, security=pki.tls()) as c:
                await c.stats()
    lines = [r for r in caplog.records if "TLS handshake failed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.INFO and lines[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a failed handshake"


async def test_tls_handshake_is_bounded_by_the_handshake_timeout(tmp_path: Path, pki: Pki) -> None:
    async with open_broker(tls_config(tmp_path / "d", pki, handshake_timeout=0.5)) as b:
        s = await trio.open_tcp_stream("127.0.0.1", b.port)
        t0 = trio.current_time()
        with trio.fail_after(10):
            assert await s.receive_some(1024) == b""  # closed without a word
        waited = trio.current_time() - t0
        assert waited >= 0.4, f"closed after {waited:.2f} s, before the handshake timeout"
        await s.aclose()


async def test_plain_client_on_a_tls_port_and_tls_client_on_a_plain_port(tmp_path: Path, pki: Pki) -> None:
    async with open_broker(tls_config(tmp_path / "d", pki)) as b:
        with trio.fail_after(10):
            async with AsyncClient(b.address, security=ClientSecurity(), connect_timeout=2) as c:
                with pytest.raises(ConnectionBroken, match="does it speak TLS"):
                    await c.stats()
    async with open_broker(make_config(tmp_path / "plain")) as b:
        err = await refused(b.address, pki.tls())
        assert "plain TCP" in str(err), err


def test_unreadable_files_are_config_errors(tmp_path: Path, pki: Pki) -> None:
    from equeue.broker.tls import server_context

    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        server_context(BrokerConfig(data_dir=tmp_path, tls_cert=tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="cannot load the TLS CA file"):
        server_context(BrokerConfig(data_dir=tmp_path, tls_cert=pki.server, tls_ca=tmp_path / "none.pem",
                                    tls_client_auth="required"))  # fmt: skip
    with pytest.raises(ConfigError, match="cannot load the TLS client certificate"):
        AsyncClient("127.0.0.1:1", security=pki.tls(tmp_path / "missing.pem"))


# --------------------------------------------------------------------------- CLI and HTTPS
@pytest.fixture
def tls_broker(tmp_path: Path, pki: Pki) -> Iterator[EmbeddedBroker]:
    cfg = tls_config(tmp_path / "d", pki, http_port=free_port(), tls_ca=pki.ca_file, tls_client_auth="optional")
    with EmbeddedBroker(cfg) as b:
        yield b


def test_cli_over_tls_from_the_environment(tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path) -> None:
    runner = CliRunner()
    addr = tls_broker.address
    env = {"EQUEUE_TLS_CA": str(pki.ca_file), "EQUEUE_TLS_CERT": str(pki.client)}
    res = runner.invoke(app, ["topic", "create", "cli-tls", "--queues", "2", "-b", addr], env=env)
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["topic", "list", "-b", addr], env=env)
    assert res.exit_code == 0 and "cli-tls" in res.output, res.output
    wrong = trustme.CA().cert_pem
    wrong.write_to_path(str(tmp_path / "wrong-ca.pem"))
    res = runner.invoke(app, ["topic", "list", "-b", addr], env={"EQUEUE_TLS_CA": str(tmp_path / "wrong-ca.pem")})
    assert res.exit_code == 1 and "certificate is refused" in res.output, res.output


def test_https_metrics(tls_broker: EmbeddedBroker, pki: Pki) -> None:
    url = f"https://127.0.0.1:{tls_broker._broker.http_port}/metrics"
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        assert r.status == 200 and "equeue_connections" in r.read().decode()
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP on the HTTPS port: closed
        urllib.request.urlopen(url.replace("https", "http"), timeout=10)


# --------------------------------------------------------------------------- Spark's puller
def test_spark_puller_over_tls(tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path) -> None:
    """The Spark reader's blocking puller speaks TLS (client certificate included);
    a certificate problem fails at once instead of being retried."""
    from equeue.spark.puller import Puller

    with Client(tls_broker.address, security=pki.tls(pki.client)) as c:
        c.create_topic("pull-tls", 1)
        c.produce(wire.ProduceRequest("pull-tls", 0, entries("p", 10)))
    p = Puller(tls_broker.address, security=pki.tls(pki.client))
    try:
        p.submit(wire.PullRequest("pull-tls", 0, 0, 100))
        res = wire.decode_pull_response("pull-tls", p.next())
        assert [m.body for m in res.messages] == [f"p-{i}".encode() for i in range(10)]
    finally:
        p.close()
    wrong = tmp_path / "wrong-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(wrong))
    bad = Puller(tls_broker.address, security=pki.tls(ca_file=wrong))
    t0 = time.monotonic()
    with pytest.raises(TlsError, match="certificate is refused"):
        bad.submit(wire.PullRequest("pull-tls", 0, 0, 100))
    assert time.monotonic() - t0 < 5, "a certificate problem must not be retried"


# --------------------------------------------------------------------------- rotation
async def test_certificate_rotation_without_a_restart(tmp_path: Path, pki: Pki) -> None:
    """``reload_tls`` (SIGHUP in ``broker start``) serves the replaced certificate to
    new connections, on both ports; open connections keep working; a bad file
    changes nothing."""
    live = tmp_path / "live.pem"
    live.write_bytes(pki.server.read_bytes())
    new_ca = trustme.CA()
    new_ca_file = pki._write("new-ca.pem", new_ca.cert_pem)
    rotated = pki.issue("rotated.pem", "127.0.0.1", ca=new_ca)
    port = free_port()
    async with open_broker(tls_config(tmp_path / "d", pki, tls_cert=live, http_port=port)) as b:
        async with AsyncClient(b.address, security=pki.tls()) as old:
            await old.create_topic("rot", 1)
            await refused(b.address, pki.tls(ca_file=new_ca_file))  # not yet
            live.write_bytes(rotated.read_bytes())
            b.reload_tls()
            async with AsyncClient(b.address, security=pki.tls(ca_file=new_ca_file)) as new:
                assert [t.name for t in await new.list_topics()] == ["rot"]
            await refused(b.address, pki.tls())  # the old CA no longer fits
            assert [t.name for t in await old.list_topics()] == ["rot"]  # the open connection lives on
            ctx = ssl.create_default_context(cafile=str(new_ca_file))

            def scrape() -> int:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10) as r:
                    return int(r.status)

            assert await trio.to_thread.run_sync(scrape) == 200
            live.write_text("not a certificate")
            with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
                b.reload_tls()
            async with AsyncClient(b.address, security=pki.tls(ca_file=new_ca_file)) as new:
                await new.stats()  # still the rotated certificate


def test_sighup_reloads_the_certificate(tmp_path: Path, pki: Pki) -> None:
    from equeue.broker.process import BrokerProcess
    from tests.conftest import wait_until_sync

    live = tmp_path / "live.pem"
    live.write_bytes(pki.server.read_bytes())
    new_ca = trustme.CA()
    new_ca_file = pki._write("sighup-ca.pem", new_ca.cert_pem)
    with BrokerProcess(tmp_path / "d", "--tls-cert", str(live)) as b:
        live.write_bytes(pki.issue("sighup.pem", "127.0.0.1", ca=new_ca).read_bytes())
        b.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_until_sync(lambda: "TLS certificate reloaded" in "".join(b.stderr_tail), what="the reload")
        with Client(b.address, security=pki.tls(ca_file=new_ca_file)) as c:
            c.stats()
