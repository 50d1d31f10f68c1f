"""Serving the web console for real: Hypercorn's trio worker on a port bound here,
in-process (:func:`equeue.cli.console.open_console`) and as ``equeue console`` in a child
process, over plain HTTP and HTTPS, against a real broker."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import trio
import trustme

from equeue.broker import Broker, EmbeddedBroker
from equeue.cli.console import ConsoleConfig, open_console, server_context
from equeue.security import ClientSecurity
from tests.conftest import ROOT


async def test_in_process_console_serves_pages_and_caps_the_request_head(broker: Broker) -> None:
    with trio.fail_after(30):
        async with open_console(ConsoleConfig(broker.address, security=ClientSecurity())) as url:
            assert url.startswith("http://127.0.0.1:")
            async with httpx.AsyncClient(base_url=url) as http:
                assert (await http.get("/healthz")).text == "ok\n"
                home = await http.get("/")
                assert home.status_code == 200 and 'data-testid="open-mode-banner"' in home.text
                assert "script-src 'self'" in home.headers["content-security-policy"]
                assert home.headers["x-frame-options"] == "DENY"
                vendor = await http.get("/static/vendor/htmx-2.0.11.min.js")
                assert vendor.status_code == 200 and vendor.text.startswith("var htmx=")
                big = await http.get("/", headers={"x-filler": "a" * 9000})
                assert big.status_code == 431


async def test_https_console_sets_a_secure_cookie(broker: Broker, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    pem = tmp_path / "console.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    with trio.fail_after(30):
        config = ConsoleConfig(broker.address, security=ClientSecurity())
        async with open_console(config, ssl_context=server_context(pem)) as url:
            assert url.startswith("https://")
            async with httpx.AsyncClient(base_url=url, verify=client_ctx) as http:
                home = await http.get("/")
                assert home.status_code == 200
                cookie = home.headers["set-cookie"].lower()
                assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie


def test_equeue_console_runs_as_a_child_process(embedded_broker: EmbeddedBroker) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "equeue", "console", "--brokers", embedded_broker.address, "--port", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the port is bound
        url = json.loads(line)["url"]
        r = httpx.get(url + "/topics", timeout=10)
        assert r.status_code == 200 and 'data-testid="topics-table"' in r.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_taken_port_is_one_error_line(embedded_broker: EmbeddedBroker) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "equeue", "console", "--brokers", embedded_broker.address, "--port", str(port)],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("error: cannot listen on") and "Traceback" not in r.stderr


def test_sign_in_to_brokers_over_tls(tmp_path: Path) -> None:
    """The console's TLS settings to the brokers (as the CLI's) carry every user's
    connection: sign-in runs SCRAM inside TLS."""
    from starlette.testclient import TestClient

    from equeue.acl import UsersFile
    from equeue.cli.console import Console
    from equeue.security import TlsSettings
    from equeue.users import make_user
    from equeue.users import update_users_file as update
    from tests.conftest import make_config
    from tests.integration.test_console import sign_in, texts

    ca = trustme.CA()
    ca_file, server = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(server))
    users = tmp_path / "users.json"
    update(users, lambda _: UsersFile().with_user(make_user("root", "root-pw", admin=True)))
    with EmbeddedBroker(make_config(tmp_path / "data", tls_cert=server, users_file=users)) as b:
        plain = Console(ConsoleConfig(b.address, security=ClientSecurity()))
        with TestClient(plain.app(), backend="trio", follow_redirects=False) as client:
            r = sign_in(client, "root", "root-pw")  # without TLS the broker cannot be reached
            assert r.status_code == 400 and "closed during the handshake" in texts(r.text, "login-error")[0]
        tls = Console(ConsoleConfig(b.address, security=ClientSecurity(tls=TlsSettings(ca_file=ca_file))))
        with TestClient(tls.app(), backend="trio", follow_redirects=False) as client:
            assert sign_in(client, "root", "root-pw").status_code == 303
            assert texts(client.get("/topics").text, "signed-in-user") == ["root"]


def test_bad_console_flags_are_one_error_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from equeue.cli import app

    for args, message in (
        (["--tls-key", "k.pem"], "--tls-key needs --tls-cert"),
        (["--tls-cert", str(tmp_path / "missing.pem")], "cannot load the console's certificate"),
        # the old names still work, hidden from --help
        (["--keyfile", "k.pem"], "--tls-key needs --tls-cert"),
        (["--certfile", str(tmp_path / "missing.pem")], "cannot load the console's certificate"),
        (["--tls-cert", "c.pem", "--certfile", "c.pem"], "the old names of --tls-cert and --tls-key"),
        (["--session-idle", "0"], "must be above 0"),
    ):
        res = CliRunner().invoke(app, ["console", "--port", "0", *args])
        assert res.exit_code == 1 and message in res.stderr, (args, res.stderr)
    shown = CliRunner().invoke(app, ["console", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--tls-cert" in shown and "--tls-key" in shown
    assert "--certfile" not in shown and "--keyfile" not in shown


def test_max_connections_caps_the_console(embedded_broker: EmbeddedBroker) -> None:
    """``--max-connections 1``: with one connection open, the next is answered 503 and
    closed at once; 0 is one error line."""
    args = [sys.executable, "-m", "equeue", "console", "--brokers", embedded_broker.address, "--port", "0"]
    r = subprocess.run([*args, "--max-connections", "0"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1 and r.stderr == "error: --max-connections must be at least 1\n"
    proc = subprocess.Popen([*args, "--json", "--max-connections", "1"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["url"]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as held:
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the first; kept alive after its answer
            assert held.recv(4096).startswith(b"HTTP/1.1 200")
            refused = httpx.get(url + "/healthz", timeout=10)
            assert refused.status_code == 503 and refused.text == "too many connections to the HTTP port\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
