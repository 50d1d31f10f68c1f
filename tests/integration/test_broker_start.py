"""Starting a broker: every start-up failure of ``python -m equeue broker start`` is
one ``error:`` line on stderr and exit status 1 (a port in use, the HTTP port in use,
TLS files that cannot be read, a data directory that cannot be used or is in use, a
map too small, a bad setting), never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from equeue.broker import EmbeddedBroker
from equeue.broker.process import BrokerProcess
from equeue.config import BrokerConfig
from equeue.errors import ConfigError, StartupError
from tests.conftest import wait_until_sync


def start(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m equeue broker start ARGS`` to its end (each case here fails at
    start; the timeout only bounds a broker that would wrongly start)."""
    return subprocess.run(
        [sys.executable, "-m", "equeue", "broker", "start", *map(str, args)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def assert_one_error_line(r: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for word in words:
        assert word in lines[0], r.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_broker_port_in_use(tmp_path: Path, taken_port: int) -> None:
    r = start("--data-dir", tmp_path / "d", "--port", str(taken_port))
    assert_one_error_line(r, f"127.0.0.1:{taken_port}", "broker port", "Address already in use")


def test_the_http_port_in_use(tmp_path: Path, taken_port: int) -> None:
    r = start("--data-dir", tmp_path / "d", "--port", "0", "--http-port", str(taken_port))
    assert_one_error_line(r, f"127.0.0.1:{taken_port}", "HTTP port", "Address already in use")


def test_tls_files_that_cannot_be_read(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = tmp_path / "broker.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    d = tmp_path / "d"
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--tls-cert", tmp_path / "missing.pem"),
                          "missing.pem", "No such file")  # fmt: skip
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--tls-cert", junk), "junk.pem")
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--tls-cert", cert, "--tls-key", junk), "junk.pem")
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--tls-cert", cert, "--tls-ca", junk,
                                "--tls-client-auth", "required"), "TLS CA file", "junk.pem")  # fmt: skip


def test_a_data_dir_that_cannot_be_used(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert_one_error_line(start("--data-dir", a_file, "--port", "0"), "data directory", str(a_file))
    (tmp_path / "d" / "data.mdb").mkdir(parents=True)  # LMDB's data file is a directory
    assert_one_error_line(start("--data-dir", tmp_path / "d", "--port", "0"), "data directory", str(tmp_path / "d"))


def test_a_data_dir_in_use(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "d"):
        assert_one_error_line(start("--data-dir", tmp_path / "d", "--port", "0"), "data directory")


def test_a_map_too_small_and_bad_settings(tmp_path: Path) -> None:
    d = tmp_path / "d"
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--map-size", "4KiB"), "--map-size", "at least 1MiB")
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--acks", "some"), "--acks")
    assert_one_error_line(start("--data-dir", d, "--port", "0", "--output-buffer-soft", "1GiB",
                                "--output-buffer-hard", "1MiB"), "output_buffer_soft")  # fmt: skip
    assert not d.exists()  # nothing was started


def test_the_audit_log_cannot_be_opened(tmp_path: Path) -> None:
    r = start("--data-dir", tmp_path / "d", "--port", "0", "--audit-log", tmp_path / "no" / "such" / "audit.log")
    assert_one_error_line(r, "audit log")


def test_embedded_broker_raises_the_start_up_refusal_itself(tmp_path: Path, taken_port: int) -> None:
    with pytest.raises(StartupError, match="Address already in use"):
        EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "d", port=taken_port)).start()
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "d", port=0, tls_cert=tmp_path / "missing.pem")).start()


# ------------------------------------------------------------------------ --http-port 0

def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return answer.status, answer.read().decode()


def test_http_port_0_picks_a_free_port_and_prints_it() -> None:
    with BrokerProcess(None, "--http-port", "0") as b:
        assert b.http_port > 0 and b.http_port != b.port
        assert any(f"listening on {b.address}, HTTP on 127.0.0.1:{b.http_port}" in line for line in b.stderr_tail)
        status, text = get(b.http_port, "/metrics")
        assert status == 200 and "equeue_messages_in_total" in text


@pytest.mark.parametrize("off", ["off", "-1"])
def test_http_port_off_serves_no_http(off: str) -> None:
    with BrokerProcess(None, "--http-port", off) as b:
        assert b.http_port == 0
        assert not any("HTTP on" in line for line in b.stderr_tail)
    with BrokerProcess(None) as b:  # the default
        assert b.http_port == 0


def test_http_port_0_in_embedded_use(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "e", port=0, http_port=0)) as b:
        assert b.http_port > 0 and b._broker is not None and b._broker.http_port == b.http_port
        assert get(b.http_port, "/stats")[0] == 200
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "f", port=0)) as b:
        assert b.http_port == 0
    assert BrokerConfig(data_dir="d", http_port=-1).http_port is None


# ------------------------------------------------------------------------ --config FILE

def test_a_config_file_sets_the_broker_and_the_command_line_overrides_it(tmp_path: Path) -> None:
    from equeue.client import Client

    f = tmp_path / "broker.toml"
    f.write_text(
        f'data-dir = "{tmp_path / "from-file"}"\n'
        'http-port = 0\nmap-size = "1GB"\nflush = "async"\nflush-interval = "250ms"\nretention = "1h30m"\n'
    )
    with BrokerProcess(tmp_path / "from-flag", "--config", str(f), "--flush", "sync") as b:
        assert b.http_port > 0  # from the file
        c = Client(b.address)
        try:
            stats = c.stats()
        finally:
            c.close()
        assert stats.map_size == 10**9  # from the file, 1GB: decimal
        assert stats.flush == "sync"  # the command line wins
    assert (tmp_path / "from-flag" / "data.mdb").exists() and not (tmp_path / "from-file").exists()


def test_the_data_dir_from_a_config_file(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text(f'data-dir = "{tmp_path / "d"}"\nport = 0\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "equeue", "broker", "start", "--config", str(f)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the ready line (or the refusal, then EOF)
        assert "listening on 127.0.0.1:" in first and f"data {tmp_path / 'd'}" in first, first
        assert (tmp_path / "d" / "data.mdb").exists()
    finally:
        proc.terminate()
        proc.wait(30)
    f.write_text(f'data-dir = "{tmp_path / "d"}"\nport = 0\nmap-size = "4KiB"\n')
    r = subprocess.run(
        [sys.executable, "-m", "equeue", "broker", "start", "--config", str(f)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert_one_error_line(r, f"{f}: map-size: map_size must be at least 1MiB")


# ------------------------------------------------------------------------ structured logs

@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_the_broker_logs_structured_lines(fmt: str) -> None:
    from tests.unit.test_logs import TS, parse_logfmt

    with BrokerProcess(None, "--log-format", fmt, log_level="info") as b:
        pass  # started and stopped: its start and stop lines are logged
    wait_until_sync(lambda: any("broker stopped" in line for line in b.stderr_tail), what="the last line read")
    logged = [line for line in b.stderr_tail if line.startswith(("ts=", "{"))]
    records = [json.loads(line) if fmt == "json" else parse_logfmt(line.rstrip("\n")) for line in logged]
    assert records and all(list(r)[:4] == ["ts", "level", "logger", "msg"] and TS.fullmatch(r["ts"]) for r in records)
    messages = [(r["level"], r["logger"], r["msg"]) for r in records]
    assert ("info", "equeue.broker", f"broker listening on {b.address} (data {b.data_dir}, flush sync)") in messages
    assert ("info", "equeue.broker", "broker stopped") in messages
