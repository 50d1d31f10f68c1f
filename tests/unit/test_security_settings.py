"""equeue.security: the TLS settings and credentials every client takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from equeue.errors import ConfigError
from equeue.security import ClientSecurity, Credentials, TlsSettings, read_credentials_file


def test_nothing_set_is_plain_and_anonymous() -> None:
    assert ClientSecurity.from_env({}) == ClientSecurity(None, None)


def test_env_tls_and_user(tmp_path: Path) -> None:
    sec = ClientSecurity.from_env(
        {"EQUEUE_TLS_CA": str(tmp_path / "ca.pem"), "EQUEUE_USERNAME": "alice", "EQUEUE_PASSWORD": "s3cret:x"}
    )
    assert sec.tls == TlsSettings(ca_file=tmp_path / "ca.pem")
    assert sec.credentials == Credentials("alice", "s3cret:x")
    assert "s3cret" not in repr(sec)
    assert ClientSecurity.from_env({"EQUEUE_TLS": "1"}).tls == TlsSettings()


def test_credentials_file(tmp_path: Path) -> None:
    f = tmp_path / "creds"
    f.write_text("bob:pa:ss\nignored\n")
    assert read_credentials_file(f) == Credentials("bob", "pa:ss")
    assert ClientSecurity.from_env({"EQUEUE_CREDENTIALS_FILE": str(f)}).credentials == Credentials("bob", "pa:ss")
    f.write_text("no colon\n")
    with pytest.raises(ConfigError, match="username:password"):
        read_credentials_file(f)
    with pytest.raises(ConfigError, match="cannot read"):
        read_credentials_file(tmp_path / "missing")


@pytest.mark.parametrize(
    "values",
    [
        {"username": "alice"},
        {"password": "x"},
        {"username": "a", "password": "b", "credentials_file": "f"},
        {"key": "k.pem"},
    ],
)
def test_incomplete_settings_are_refused(values: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ClientSecurity.from_values(**values)  # type: ignore[arg-type]


def test_spark_options_override_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "creds"
    f.write_text("carol:pw\n")
    env = {"EQUEUE_USERNAME": "alice", "EQUEUE_PASSWORD": "x", "EQUEUE_TLS": "1"}
    sec = ClientSecurity.from_options({"tls.ca": "ca.pem", "tls.serverName": "b1", "credentials.file": str(f)}, env)
    assert sec.tls == TlsSettings(ca_file=Path("ca.pem"), server_hostname="b1")
    assert sec.credentials == Credentials("carol", "pw")
    assert ClientSecurity.from_options({"tls": "false"}, env).tls is None
    assert ClientSecurity.from_options({}, env) == ClientSecurity.from_env(env)
