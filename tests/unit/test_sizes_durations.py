"""Sizes and durations, as every CLI option and config key reads them: ``8GB`` is
8·10^9 bytes and ``8GiB`` 8·2^30; durations take ``500ms``, ``30s``, ``1h30m``,
``2d``; negative values and nonsense are refused with a ConfigError, except the
documented special values (``-1`` / ``forever`` for retention)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from equeue.cli import app
from equeue.cli.broker_cmd import build_config
from equeue.config import (
    BrokerConfig,
    format_duration_ms,
    format_size,
    parse_duration_ms,
    parse_retention_bytes,
    parse_retention_ms,
    parse_size,
)
from equeue.errors import ConfigError
from equeue.retention import FOREVER


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("8GB", 8 * 10**9), ("8G", 8 * 10**9), ("8 gb", 8 * 10**9), ("8GiB", 8 << 30), ("8Gi", 8 << 30),
        ("8 GiB", 8 << 30), ("512MiB", 512 << 20), ("512MB", 512 * 10**6), ("1.5KiB", 1536), ("1.5KB", 1500),
        ("4KiB", 4096), ("1TB", 10**12), ("1TiB", 1 << 40), ("100000", 100_000), ("0", 0), ("7 bytes", 7),
    ],
)  # fmt: skip
def test_sizes_decimal_and_binary(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize(
    "text", ["-1", "-8GB", "8Gorilla", "lots", "", "GiB", "1.5", "0.5B", "1e3", "nan", "inf", "8 GiB extra", "1,000"]
)
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500), ("30s", 30_000), ("1h30m", 5_400_000), ("1h 30m", 5_400_000), ("2d", 172_800_000),
        ("1h30m500ms", 5_400_500), ("1.5h", 5_400_000), ("72h", 259_200_000), ("1w", 604_800_000),
        ("5 min", 300_000), ("2 hours 3 minutes", 7_380_000), ("90", 90_000), ("1.5", 1500), ("0", 0),
    ],
)  # fmt: skip
def test_durations_compound_and_single(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["-1", "-5s", "-1h30m", "1h30", "1h-30m", "soon", "", "1x", "nan", "inf", "1e3", "30s later", "h"]
)
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid duration"):
        parse_duration_ms(text)


def test_the_special_retention_values_keep_working() -> None:
    for text in ("-1", "forever", "unlimited"):
        assert parse_retention_ms(text) == FOREVER
        assert parse_retention_bytes(text) == FOREVER
    assert parse_retention_ms("1h30m") == 5_400_000
    assert parse_retention_bytes("10GB") == 10 * 10**9
    for text in ("0", "-5", "-1s", "-1h30m"):
        with pytest.raises(ConfigError, match="-1"):
            parse_retention_ms(text)


@pytest.mark.parametrize("n", [0, 1, 1000, 4 << 20, 8 << 30, 10**9, (1 << 20) + 1])
def test_formatted_sizes_read_back(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("ms", [0, 1, 500, 1500, 60_000, 5_400_000, 72 * 3_600_000])
def test_formatted_durations_read_back(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


# ------------------------------------------------------------- every broker start option

def _build(**values: Any) -> BrokerConfig:
    return build_config(Path("d"), values, lambda option: f"--{option}")


def test_every_size_option_reads_decimal_and_binary_units() -> None:
    cfg = _build(map_size="8GB", max_message="1MB", inline_commit="64KiB", replica_log_bytes="2GiB",
                 replica_fetch_bytes="4MB", output_buffer_soft="100MB", output_buffer_hard="1GB",
                 max_partial_frame_bytes="200MB", retention_bytes="10GB")  # fmt: skip
    assert cfg.map_size == 8 * 10**9 and cfg.max_message_bytes == 10**6 and cfg.inline_commit_bytes == 64 << 10
    assert cfg.replica_log_bytes == 2 << 30 and cfg.replica_fetch_bytes == 4 * 10**6
    assert (cfg.output_buffer_soft, cfg.output_buffer_hard) == (10**8, 10**9)
    assert cfg.max_partial_frame_bytes == 2 * 10**8 and cfg.retention_bytes == 10 * 10**9


def test_every_duration_option_reads_durations() -> None:
    cfg = _build(flush_interval="500ms", idle_timeout="1h30m", frame_timeout="2m", output_buffer_grace="90",
                 member_expiry="15s", replica_lag_max="1.5s", scan_time="5ms", retention="2d",
                 cluster_lease_ttl="1m")  # fmt: skip
    assert (cfg.flush_interval, cfg.idle_timeout, cfg.frame_timeout) == (0.5, 5400.0, 120.0)
    assert (cfg.output_buffer_grace, cfg.member_expiry, cfg.replica_lag_max) == (90.0, 15.0, 1.5)
    assert cfg.scan_time == 0.005 and cfg.retention_ms == 2 * 86_400_000 and cfg.cluster_lease_ttl == 60
    assert _build(retention="-1", retention_bytes="forever").retention_ms is None


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("flush_interval", "-1s", "--flush_interval: invalid duration '-1s'"),
        ("idle_timeout", "1h30", "--idle_timeout: invalid duration '1h30'"),
        ("map_size", "-8GB", "--map_size: invalid size '-8GB'"),
        ("map_size", "8Gorilla", "--map_size: invalid size '8Gorilla'"),
        ("cluster_lease_ttl", "1500ms", "give whole seconds"),
        ("retention", "0", "--retention: invalid value '0'"),
        ("flush_interval", "0", "--flush_interval: flush_interval must be > 0"),
    ],
)
def test_a_bad_option_is_refused_naming_it(option: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _build(**{option: value})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--flush-interval", "-1s"], "--flush-interval: invalid duration '-1s'"),
        (["--idle-timeout", "nonsense"], "--idle-timeout: invalid duration 'nonsense'"),
        (["--map-size", "-1"], "--map-size: invalid size '-1'"),
        (["--acks", "most"], "--acks: acks must be one of 'all', 'leader'"),
    ],
)
def test_broker_start_refuses_a_bad_size_or_duration_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["broker", "start", "--data-dir", str(tmp_path / "d"), *args])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output
    assert not (tmp_path / "d").exists()
