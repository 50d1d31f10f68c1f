"""Values that would silently destroy data or disable a limit: every number of
BrokerConfig, ProducerOptions and ConsumerOptions, the size and duration texts of the
CLI and the CLI's own numeric flags. Each value has a documented meaning
(docs/operations.md, "Special values") or is refused with a ConfigError (the CLI: one
error line, or click's usage error) naming the option."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from typer.testing import CliRunner

from equeue.cli import app
from equeue.config import (
    BrokerConfig,
    parse_duration_ms,
    parse_retention_bytes,
    parse_retention_ms,
    parse_size,
)
from equeue.consumer.options import ConsumerOptions
from equeue.errors import ConfigError
from equeue.producer.options import ProducerOptions
from equeue.retention import FOREVER, check_topic_settings, retention_limit

NUMBERS = ("int", "float", "int | None", "float | None")


def numeric_fields(cls: type) -> list[str]:
    return [f.name for f in attrs.fields(cls) if f.type in NUMBERS]


#: options whose 0 has a documented meaning (docs/operations.md, "Special values")
ZERO_MEANS = {
    BrokerConfig: {"port", "http_port", "inline_commit_bytes", "shutdown_grace"},
    ProducerOptions: {"retries", "retry_backoff", "linger"},
    ConsumerOptions: {"max_reconsume_times"},
}
#: options whose -1 has a documented meaning (keep forever, no HTTP port), and what it becomes
MINUS_ONE_MEANS = {BrokerConfig: {"retention_ms": None, "retention_bytes": None, "http_port": None}}
#: options where infinity is documented (a producer's linger: until full or asked)
INFINITY_MEANS = {ProducerOptions: {"linger"}}

CLASSES = [BrokerConfig, ProducerOptions, ConsumerOptions]


def build(cls: type, **kw: Any) -> Any:
    return cls(data_dir="d", **kw) if cls is BrokerConfig else cls(**kw)


CASES = [(cls, name) for cls in CLASSES for name in numeric_fields(cls)]


def case_id(value: object) -> str:
    return getattr(value, "__name__", str(value))


def test_the_sweep_sees_the_fields() -> None:
    assert {"retention_ms", "retention_bytes", "flush_interval", "min_insync", "map_size"} <= set(numeric_fields(BrokerConfig))
    assert {"send_timeout", "linger", "max_batch_bytes"} <= set(numeric_fields(ProducerOptions))
    assert {"pull_hold", "max_reconsume_times", "close_timeout"} <= set(numeric_fields(ConsumerOptions))


@pytest.mark.parametrize(("cls", "name"), CASES, ids=case_id)
def test_negative_values_are_refused_or_documented(cls: type, name: str) -> None:
    for value in (-5, -1000, -0.5):
        with pytest.raises(ConfigError, match=name):
            build(cls, **{name: value})
    if name in MINUS_ONE_MEANS.get(cls, {}):
        assert getattr(build(cls, **{name: -1}), name) == MINUS_ONE_MEANS[cls][name]
    else:
        with pytest.raises(ConfigError, match=name):
            build(cls, **{name: -1})


@pytest.mark.parametrize(("cls", "name"), CASES, ids=case_id)
def test_zero_is_refused_or_documented(cls: type, name: str) -> None:
    if name in ZERO_MEANS[cls]:
        assert getattr(build(cls, **{name: 0}), name) == 0
    else:
        with pytest.raises(ConfigError, match=name):
            build(cls, **{name: 0})


@pytest.mark.parametrize(("cls", "name"), CASES, ids=case_id)
def test_nan_and_infinity_are_refused_or_documented(cls: type, name: str) -> None:
    """NaN passes every ``<=`` check (``nan <= 0`` is false); infinity turns a limit
    off (``flush_interval=inf``: acknowledged writes are never fsynced)."""
    with pytest.raises(ConfigError, match=name):
        build(cls, **{name: math.nan})
    if name in INFINITY_MEANS.get(cls, set()):
        assert getattr(build(cls, **{name: math.inf}), name) == math.inf
    else:
        with pytest.raises(ConfigError, match=name):
            build(cls, **{name: math.inf})


def test_retention_messages_name_the_forever_value() -> None:
    for name in ("retention_ms", "retention_bytes"):
        with pytest.raises(ConfigError, match=re.escape(f"{name} must be > 0, or -1 to keep messages forever, got 0")):
            BrokerConfig(data_dir="d", **{name: 0})
    cfg = BrokerConfig(data_dir="d", retention_ms=-1, retention_bytes=-1)
    assert (cfg.retention_ms, cfg.retention_bytes) == (None, None)  # None: no limit of that kind
    assert BrokerConfig(data_dir="d", retention_ms=None) == cfg


@pytest.mark.parametrize(
    ("text", "ms"),
    [("-1", FOREVER), ("forever", FOREVER), ("Infinite", FOREVER), ("unlimited", FOREVER), ("24h", 86_400_000), ("1", 1000)],
)
def test_parse_retention_ms(text: str, ms: int) -> None:
    assert parse_retention_ms(text) == ms


@pytest.mark.parametrize(
    ("text", "n"), [("-1", FOREVER), (" FOREVER ", FOREVER), ("infinite", FOREVER), ("1GiB", 1 << 30), ("1", 1)]
)
def test_parse_retention_bytes(text: str, n: int) -> None:
    assert parse_retention_bytes(text) == n


@pytest.mark.parametrize("text", ["0", "-5", "-1000", "-1s", "-1h", "0.1ms", "0s", "soon", "-inf", "nan", "inf"])
def test_parse_retention_ms_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match=r"-1|invalid duration"):
        parse_retention_ms(text)


@pytest.mark.parametrize("text", ["0", "-5", "-1KiB", "0KiB", "lots", "nan"])
def test_parse_retention_bytes_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match=r"-1|invalid size"):
        parse_retention_bytes(text)


@pytest.mark.parametrize("text", ["-1", "-5", "-1s", "-0.5", "inf", "1e999", "nan", "-inf"])
def test_durations_are_finite_and_not_negative(text: str) -> None:
    """``parse_duration_ms('-1')`` was -1000: a negative duration with no unit slipped
    through; ``'inf'`` raised OverflowError (a traceback in the CLI)."""
    with pytest.raises(ConfigError, match="duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize("text", ["-1", "-5", "-1KiB", "-0.5MiB", "inf", "nan", "1e999K"])
def test_sizes_are_finite_and_not_negative(text: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_topic_settings_rule() -> None:
    check_topic_settings(None, None)
    check_topic_settings(FOREVER, 1, reset=())
    check_topic_settings(None, None, reset=("retention_ms", "retention_bytes"))
    for kw in (
        {"retention_ms": 0}, {"retention_ms": -2}, {"retention_bytes": -1000}, {"retention_ms": True},
        {"retention_ms": 1.5}, {"reset": ("queues",)}, {"retention_ms": 5, "reset": ("retention_ms",)},
    ):  # fmt: skip
        args = {"retention_ms": None, "retention_bytes": None, **kw}
        with pytest.raises(ConfigError):
            check_topic_settings(args["retention_ms"], args["retention_bytes"], reset=args.get("reset", ()))


@pytest.mark.parametrize(
    ("override", "default", "limit"),
    [
        (None, None, None), (None, 5, 5), (7, 5, 7), (7, None, 7), (FOREVER, 5, None), (FOREVER, None, None),
        # never delete on a value that is not a limit, wherever it came from
        (0, 5, None), (-1000, 5, None), (None, 0, None), (None, -1, None),
    ],
)  # fmt: skip
def test_retention_limit_never_deletes_on_a_non_positive_value(override: int | None, default: int | None, limit: int | None) -> None:
    assert retention_limit(override, default) == limit


# ----------------------------------------------------------------------------- the CLI's own flags
runner = CliRunner()
NOWHERE = ["-b", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("args", "code", "what"),
    [
        (["consume", "t", "-g", "g", "--max", "-1"], 2, "--max"),
        (["dlq", "list", "g", "--limit", "0"], 2, "--limit"),
        (["dlq", "list", "g", "--limit", "-3"], 2, "--limit"),
        (["dlq", "list", "g", "--queue", "-1"], 2, "--queue"),
        (["dlq", "list", "g", "--offset", "-1"], 2, "--offset"),
        (["produce", "t", "--delay", "-5"], 1, "--delay"),
        (["topic", "create", "t", "--retention", "0"], 1, "retention"),
        (["topic", "alter", "t", "--retention-bytes", "-5"], 1, "retention"),
    ],
)
def test_cli_flags_refuse_values_that_make_no_sense_before_connecting(args: list[str], code: int, what: str) -> None:
    """Refused while parsing (a broker that cannot be reached is never asked)."""
    r = runner.invoke(app, [*args, *NOWHERE], input="")
    assert r.exit_code == code, r.output
    assert what in r.output and "Traceback" not in r.output, r.output


def test_broker_start_flags_refuse_nan_and_infinity(tmp_path: Path) -> None:
    start = ["broker", "start", "--data-dir", str(tmp_path / "d"), "--host", "192.0.2.1", "--port", "0"]
    for flag in ("--flush-interval", "--idle-timeout", "--frame-timeout", "--output-buffer-grace", "--replica-lag-max", "--member-expiry"):
        for value in ("nan", "inf"):
            r = runner.invoke(app, [*start, flag, value])
            assert r.exit_code == 1 and "finite" in r.output, (flag, value, r.output)
    assert not (tmp_path / "d").exists()
