"""Structured log lines (equeue/logs.py): logfmt by default, JSON with ``fmt="json"``;
``ts`` is RFC 3339 UTC with milliseconds, then ``level``, ``logger``, ``msg`` (a plain
string) and the record's fields. A logfmt line reads back through a simple logfmt
parser, a JSON line through ``json.loads``; quiet by default; rate limiting kept."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from equeue.logs import RateLimitedLog, setup_logging

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?:\s+|$)')
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def parse_logfmt(line: str) -> dict[str, str]:
    """A simple logfmt reader: ``key=bare`` or ``key="quoted"`` (with ``\\\\``, ``\\"``,
    ``\\n``, ``\\r``, ``\\t``) pairs separated by spaces; anything else fails."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(line):
        m = _PAIR.match(line, pos)
        assert m is not None, f"not logfmt at {pos}: {line[pos:]!r} in {line!r}"
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", lambda e: _UNESCAPE[e.group(1)], value[1:-1])
        assert key not in out, f"{key} twice in {line!r}"
        out[key] = value
        pos = m.end()
    return out


@pytest.fixture
def log(capsys: pytest.CaptureFixture[str]) -> Iterator[logging.Logger]:
    root = logging.getLogger()
    level = root.level
    yield logging.getLogger("equeue.test.logs")
    for handler in [h for h in root.handlers if getattr(h, "_equeue_structured", False)]:
        root.removeHandler(handler)
    root.setLevel(level)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


NASTY = 'a "quoted" word, key=value, back\\slash, tab\there,\nnew line and ünïcode'


def test_a_logfmt_line_reads_back(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info")
    before = datetime.now(UTC)
    log.info("broker listening on %s:%d (%s)", "127.0.0.1", 5800, NASTY, extra={"topic": "a b", "queue": 3, "empty": ""})
    after = datetime.now(UTC)
    [line] = lines(capsys)
    assert line.startswith("ts=") and "\n" not in line
    fields = parse_logfmt(line)
    assert list(fields)[:4] == ["ts", "level", "logger", "msg"]
    assert fields == {
        "ts": fields["ts"], "level": "info", "logger": "equeue.test.logs",
        "msg": f"broker listening on 127.0.0.1:5800 ({NASTY})", "topic": "a b", "queue": "3", "empty": "",
    }  # fmt: skip
    assert TS.fullmatch(fields["ts"]), fields["ts"]
    ts = datetime.strptime(fields["ts"], "%Y-%m-%dT%H:%M:%S.%f%z")
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= ts <= after


def test_a_json_line_reads_back(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    log.warning("refused %r", NASTY, extra={"user": "alice", "count": 2, "audit": {"op": "create"}})
    [line] = lines(capsys)
    obj = json.loads(line)
    assert list(obj) == ["ts", "level", "logger", "msg", "user", "count", "audit"]
    assert TS.fullmatch(obj["ts"]) and obj["level"] == "warning" and obj["logger"] == "equeue.test.logs"
    assert obj["msg"] == f"refused {NASTY!r}" and obj["user"] == "alice" and obj["count"] == 2
    assert obj["audit"] == {"op": "create"}


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_a_traceback_stays_in_its_line(log: logging.Logger, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    setup_logging("warning", fmt)
    try:
        raise ValueError("bad thing")
    except ValueError:
        log.exception("request failed")
    [line] = lines(capsys)
    fields = json.loads(line) if fmt == "json" else parse_logfmt(line)
    assert fields["level"] == "error" and fields["msg"] == "request failed"
    assert fields["exception"].startswith("Traceback") and "ValueError: bad thing" in fields["exception"]


def test_nested_fields_are_flattened_in_logfmt(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging()
    log.warning("audit", extra={"audit": {"user": "bob", "op": "delete topic"}})
    assert parse_logfmt(lines(capsys)[0])["audit.op"] == "delete topic"


def test_quiet_by_default_and_set_up_once(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging()
    log.info("not shown")
    log.debug("not shown either")
    setup_logging()  # again: one handler, one line per record
    log.warning("shown")
    assert [parse_logfmt(line)["msg"] for line in lines(capsys)] == ["shown"]


def test_rate_limiting_is_kept(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging()
    now = [0.0]
    limited = RateLimitedLog(log, 10.0, lambda: now[0])
    for t in (0.0, 1.0, 2.0, 11.0):
        now[0] = t
        limited.log(logging.ERROR, "k", "bad record %d", int(t))
    assert [parse_logfmt(line)["msg"] for line in lines(capsys)] == [
        "bad record 0",
        "bad record 11 (2 more like it in the last 10 s)",
    ]


def test_the_timestamp_is_the_records_time_in_utc(log: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info")
    record = log.makeRecord(log.name, logging.INFO, __file__, 1, "at %s", ("noon",), None)
    record.created, record.msecs = 1_795_788_185.123456, 123.456
    log.handle(record)
    assert parse_logfmt(lines(capsys)[0])["ts"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_795_788_185)) + ".123Z"
