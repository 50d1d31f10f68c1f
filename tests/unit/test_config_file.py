"""``equeue broker start --config broker.toml``: a TOML file keyed by the long options'
names; the command line overrides it; an unknown key, a wrong type or a bad value is
one error line naming the file and the key (the broker is never started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from equeue.cli import app
from equeue.cli.broker_cmd import read_config_file
from equeue.config import FlushPolicy, TlsClientAuth
from equeue.errors import ConfigError

runner = CliRunner()


def start_params() -> list[object]:
    command = typer.main.get_command(app).commands["broker"].commands["start"]  # type: ignore[attr-defined]
    return list(command.params)


def test_keys_are_the_long_options_with_dashes_or_underscores(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text(
        'data-dir = "/var/lib/equeue"\nport = 5801\nhttp_port = 0\nmap-size = "64GiB"\nflush = "async"\n'
        'flush_interval = 0.25\nretention = -1\nretention-bytes = "10GB"\nauto-create = false\n'
        'cluster = ["http://e1:2379", "http://e2:2379"]\ntls-client-auth = "none"\nlog-level = "info"\n'
    )
    got = {name: value for name, (value, _key) in read_config_file(f, start_params()).items()}  # type: ignore[arg-type]
    assert got == {
        "data_dir": Path("/var/lib/equeue"), "port": 5801, "http_port": "0", "map_size": "64GiB",
        "flush": FlushPolicy.ASYNC, "flush_interval": "0.25", "retention": "-1", "retention_bytes": "10GB",
        "auto_create": False, "cluster": "http://e1:2379,http://e2:2379", "tls_client_auth": TlsClientAuth.NONE,
        "log_level": "info",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('mapsize = "1GB"', "broker.toml: unknown key 'mapsize' (did you mean 'map-size'?)"),
        ("retention_ms = 5", "broker.toml: unknown key 'retention_ms' (did you mean 'retention'?)"),
        ("config = 'other.toml'", "broker.toml: unknown key 'config'"),
        ('port = "5800"', "broker.toml: port: expected a whole number, got str '5800'"),
        ('auto-create = "yes"', "broker.toml: auto-create: expected true or false, got str 'yes'"),
        ("tls-cert = 5", "broker.toml: tls-cert: expected a path (a string), got int 5"),
        ("map-size = true", "broker.toml: map-size: expected a string or a number, got bool True"),
        ('flush = "fast"', "broker.toml: flush: value must be one of 'sync', 'async', got 'fast'"),
        ('map-size = "lots"', "broker.toml: map-size: invalid size 'lots'"),
        ('flush-interval = "-1s"', "broker.toml: flush-interval: invalid duration '-1s'"),
        ("retention = 0", "broker.toml: retention: invalid value '0'"),
        ("port = 70000", "broker.toml: port: port must be a port number 0..65535"),
        ('acks = "most"', "broker.toml: acks: acks must be one of 'all', 'leader'"),
        ('map_size = "1GB"\nmap-size = "2GB"', "broker.toml: 'map-size' is given twice (as 'map_size' too)"),
        ("port = ", "broker.toml: not a TOML file"),
    ],
)
def test_a_bad_file_is_one_error_line_naming_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, message: str
) -> None:
    (tmp_path / "broker.toml").write_text(toml + "\n")
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["broker", "start", "--config", "broker.toml", "--data-dir", "d"])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), r.output
    assert not (tmp_path / "d").exists()  # nothing was started


def test_a_missing_file_and_a_missing_data_dir(tmp_path: Path) -> None:
    r = runner.invoke(app, ["broker", "start", "--config", str(tmp_path / "none.toml")])
    assert r.exit_code == 1 and "cannot read the config file" in r.output and "none.toml" in r.output, r.output
    (tmp_path / "broker.toml").write_text("port = 0\n")
    r = runner.invoke(app, ["broker", "start", "--config", str(tmp_path / "broker.toml")])
    assert r.exit_code == 1 and "--data-dir DIR, or data-dir in the --config file" in r.output, r.output


def test_read_config_file_refuses_what_is_not_a_setting(tmp_path: Path) -> None:
    f = tmp_path / "b.toml"
    f.write_text("[broker]\nport = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'broker'"):
        read_config_file(f, start_params())  # type: ignore[arg-type]


def test_the_documented_example_is_a_full_and_valid_file(tmp_path: Path) -> None:
    """docs/operations.md's example names every option (the commented ones too) and
    builds a BrokerConfig."""
    from equeue.cli.broker_cmd import OPTION_FIELDS, build_config

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    example = doc.split("<!-- broker.toml example")[1].split("```toml\n")[1].split("```")[0]
    f = tmp_path / "broker.toml"
    f.write_text(example)
    params = start_params()
    settings = read_config_file(f, params)  # type: ignore[arg-type]
    commented = {line[2:].split(" = ")[0] for line in example.splitlines() if line.startswith("# ") and " = " in line}
    every = {p.opts[0].removeprefix("--") for p in params if p.name != "config"}  # type: ignore[attr-defined]
    assert {key for _, key in settings.values()} | commented == every
    values = {name: value for name, (value, _) in settings.items() if name in OPTION_FIELDS}
    cfg = build_config(settings["data_dir"][0], values, str)  # type: ignore[arg-type]
    assert cfg.map_size == 64 << 30 and cfg.http_port == 5890 and cfg.retention_bytes is None
