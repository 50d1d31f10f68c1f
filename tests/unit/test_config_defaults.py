"""One configuration source: BrokerConfig validates every field, and the CLI's
defaults and docs/operations.md's table are those of the config classes."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs
import click
import pytest
import typer

from equeue.cli import app
from equeue.cli.broker_cmd import OPTION_FIELDS
from equeue.config import (
    DEFAULT_ADDRESS,
    DEFAULTS,
    BrokerConfig,
    FlushPolicy,
    format_duration_ms,
    format_size,
    parse_address,
    parse_duration_ms,
    parse_size,
)
from equeue.consumer.options import ConsumerOptions
from equeue.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name: f for f in attrs.fields(BrokerConfig)}

#: ``broker start`` option → (BrokerConfig field, the option's text → the field's value):
#: the CLI's own table, so that these tests check the options the CLI really reads
START_OPTIONS = OPTION_FIELDS
#: ``broker start`` options that are not BrokerConfig fields with a default
NOT_CONFIG = {"config", "data_dir", "log_level", "log_format", "audit_log"}


def command(*path: str) -> click.Command:
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd  # type: ignore[no-any-return]


def params(*path: str) -> dict[str, click.Parameter]:
    return {p.name: p for p in command(*path).params if p.name}


def test_broker_start_defaults_are_broker_config_defaults() -> None:
    opts = params("broker", "start")
    assert set(opts) == set(START_OPTIONS) | NOT_CONFIG, "a new option must take its default from BrokerConfig"
    for option, (field, parse) in START_OPTIONS.items():
        default = opts[option].default
        value = parse(default) if parse else default
        built = getattr(BrokerConfig(data_dir="d", **{field: value}), field)  # through the field's converter
        assert built == FIELDS[field].default, f"--{option} default {default!r} != BrokerConfig.{field}"
        assert type(built) is type(FIELDS[field].default), option


def test_client_side_defaults_are_the_sdk_defaults() -> None:
    start_from = params("consume")["start"].default
    assert start_from == DEFAULTS.start_from == attrs.fields(ConsumerOptions).start_from.default
    for path in (("topic", "list"), ("broker", "stats"), ("consume",), ("produce",)):
        assert params(*path)["broker"].default == DEFAULT_ADDRESS
    assert parse_address(DEFAULT_ADDRESS) == (FIELDS["host"].default, FIELDS["port"].default)


def test_the_cli_builds_the_default_config() -> None:
    """Every option at its default gives exactly ``BrokerConfig(data_dir)``."""
    opts = params("broker", "start")
    kw: dict[str, Any] = {}
    for option, (field, parse) in START_OPTIONS.items():
        default = opts[option].default
        kw[field] = parse(default) if parse else default
    assert BrokerConfig(data_dir="d", **kw) == BrokerConfig(data_dir="d")


def _render(field: str, value: object) -> str:
    """A default as docs/operations.md writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, StrEnum):
        return value.value
    if field in (
        "map_size", "max_frame", "max_message_bytes", "retention_bytes",
        "output_buffer_soft", "output_buffer_hard", "max_partial_frame_bytes", "inline_commit_bytes",
    ):  # fmt: skip
        return format_size(value)  # type: ignore[arg-type]
    if field == "retention_ms":
        return format_duration_ms(value)  # type: ignore[arg-type]
    if isinstance(value, float):  # seconds
        for unit, n in (("d", 86400), ("h", 3600)):
            if value >= n and value % n == 0:
                return f"{value / n:g} {unit}"
        return f"{value:g} s"
    return str(value)


def test_operations_doc_lists_every_field_with_its_default_and_flag() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("<!-- BrokerConfig: one row per field")[1].split("\n\n")[0]
    rows = [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in table.splitlines()
        if line.startswith("| `")
    ]
    documented = {r[0].strip("`"): (r[1], r[2]) for r in rows}
    assert list(documented) == list(FIELDS), "one row per BrokerConfig field, in order"
    opts = params("broker", "start")
    flags = {field: opts[option].opts[0] for option, (field, _) in START_OPTIONS.items()}
    flags["data_dir"] = "--data-dir"
    for name, (flag, default) in documented.items():
        f = FIELDS[name]
        expected = "required" if f.default is attrs.NOTHING else f"`{_render(name, f.default)}`"
        assert default == expected, f"{name}: documented {default}, BrokerConfig has {expected}"
        if name in flags:
            assert flag.startswith(f"`{flags[name]}"), f"{name}: the doc says {flag}, the CLI {flags[name]}"
        else:
            assert flag == "", f"{name} has no CLI flag, the doc says {flag}"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"flush": "fast"}, "flush must be one of 'sync', 'async'"),
        ({"port": 70000}, "port must be a port number"),
        ({"http_port": -2}, "http_port must be a port number 0..65535 (0: a free one), or -1 / off for none"),
        ({"flush_interval": 0}, "flush_interval must be > 0"),
        ({"map_size": "8GiB"}, "map_size must be a number"),
        ({"retention_ms": 0}, "retention_ms must be > 0, or -1 to keep messages forever"),
        ({"retention_bytes": -5}, "retention_bytes must be > 0, or -1 to keep messages forever"),
        ({"flush_interval": float("inf")}, "flush_interval must be a finite number"),
        ({"shutdown_grace": -1.0}, "shutdown_grace must be >= 0"),
        ({"host": ""}, "host must be a host name or address"),
        ({"delete_consumed": "yes"}, "delete_consumed must be true or false"),
        ({"default_queues": 2048}, "default_queues (2048) must be <= max_queues (1024)"),
        ({"compression": "gzip"}, "compression must be one of 'producer', 'none', 'zstd', 'lz4', got 'gzip'"),
        ({"tls_key": "k.pem"}, "tls_key, tls_ca and tls_client_auth need tls_cert"),
        ({"tls_cert": "c.pem", "tls_client_auth": "required"}, "tls_client_auth required needs tls_ca"),
        ({"tls_cert": "c.pem", "tls_client_auth": "always"}, "tls_client_auth must be one of 'none', 'optional', 'required'"),
        ({"output_buffer_soft": 2 << 30}, "output_buffer_soft (2147483648) must be <= output_buffer_hard"),
        ({"max_partial_frame_bytes": 1 << 20}, "max_partial_frame_bytes (1048576) must be >= max_frame"),
        ({"idle_timeout": 0.0}, "idle_timeout must be > 0"),
        ({"cluster": "127.0.0.1:2379"}, "cluster: '127.0.0.1:2379' is not an etcd client URL"),
        ({"cluster": "http://127.0.0.1:2379"}, "cluster needs broker_group"),
        ({"broker_group": "g1"}, "broker_group needs cluster"),
        ({"cluster": "http://e:1", "broker_group": "g 1"}, "broker_group 'g 1' is not a valid name"),
        ({"advertise": "0.0.0.0:5800"}, "advertise must be HOST:PORT that clients can reach"),
        ({"advertise": "h:0"}, "advertise must be HOST:PORT"),
        ({"cluster_lease_ttl": 1}, "cluster_lease_ttl must be a whole number of seconds, 2..600"),
    ],
)
def test_broker_config_rejects_bad_values_with_config_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        BrokerConfig(data_dir="d", **kw)


def test_flush_policy_takes_the_strings() -> None:
    cfg = BrokerConfig(data_dir="d", flush="async")
    assert cfg.flush is FlushPolicy.ASYNC and cfg.flush == "async" and f"{cfg.flush}" == "async"
    assert BrokerConfig(data_dir="d", retention_ms=None, shutdown_grace=0.0).retention_ms is None


@pytest.mark.parametrize("n", [0, 1, 1000, 4 << 20, 8 << 30, 3 << 40, (1 << 20) + 1])
def test_sizes_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("ms", [0, 1, 1500, 45_000, 30 * 60_000, 72 * 3_600_000, 7 * 86_400_000])
def test_durations_round_trip(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


def test_bad_size_and_duration_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        parse_size("lots")
    with pytest.raises(ConfigError, match="invalid duration"):
        parse_duration_ms("soon")


def test_broker_start_reports_a_bad_value_in_one_line(tmp_path: Path) -> None:
    """BrokerConfig's ConfigError (or a bad size) is one error line, exit status 1;
    an unknown flush policy is refused by the option's choices (usage error, 2)."""
    from typer.testing import CliRunner

    runner = CliRunner()
    start = ["broker", "start", "--data-dir", str(tmp_path / "d")]
    r = runner.invoke(app, [*start, "--map-size", "lots"])
    assert r.exit_code == 1 and "invalid size 'lots'" in r.output, r.output
    r = runner.invoke(app, [*start, "--default-queues", "0"])
    assert r.exit_code == 1 and "default_queues must be > 0" in r.output, r.output
    r = runner.invoke(app, [*start, "--flush", "fast"])
    assert r.exit_code == 2 and "sync" in r.output and "async" in r.output, r.output
    assert not (tmp_path / "d").exists()  # nothing was started
