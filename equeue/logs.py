"""Logging: structured lines for the stdlib loggers, and rate-limited logging.

:func:`setup_logging` sends every ``logging`` record (the code logs with the stdlib's
``log.info("... %s", x)``; no call site changes) to stderr as one structured line,
rendered by structlog's ``ProcessorFormatter``: logfmt by default, JSON with
``fmt="json"``. Each line holds ``ts`` (RFC 3339, UTC, milliseconds:
``2026-11-27T14:03:05.123Z``), ``level`` (``debug`` ... ``critical``), ``logger``,
``msg`` (the formatted message, a plain string), then the record's fields (``extra=``)
and, for a record with an exception, ``exception`` (the traceback, in the one line).
Quiet by default: ``warning``.

:class:`RateLimitedLog` is for what a peer can trigger again and again: a record that
keeps failing or a message the broker keeps refusing (the consumer), a client whose
requests keep failing inside the broker (the broker's internal-error tracebacks)."""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from enum import StrEnum
from typing import Any, TextIO

__all__ = ["LogFormat", "RateLimitedLog", "setup_logging"]

#: the keys every line starts with, in this order
FIRST_KEYS = ("ts", "level", "logger", "msg")


class LogFormat(StrEnum):
    """``--log-format``: how each log line is written."""

    LOGFMT = "logfmt"
    JSON = "json"


def _timestamp(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``ts``: the record's creation time, RFC 3339 in UTC with milliseconds."""
    record = event.get("_record")
    created = record.created if record is not None else time.time()
    millis = int(record.msecs) if record is not None else int(created * 1000) % 1000
    event["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"
    return event


@functools.cache
def _extra_adder() -> Any:
    """structlog's ``ExtraAdder``, made on first use (structlog loads with the formatter)."""
    from structlog.stdlib import ExtraAdder

    return ExtraAdder()


def _extras(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The record's fields (``extra=``): structlog's ``ExtraAdder``, less ``message``
    and ``asctime``, which another handler's formatter may have set on the record
    (``logging`` refuses them as ``extra`` keys)."""
    event = _extra_adder()(_logger, _name, event)  # type: ignore[arg-type]
    event.pop("message", None)
    event.pop("asctime", None)
    return event



def _first_keys(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``ts``, ``level``, ``logger``, ``msg`` first, then the event's fields."""
    ordered = {k: event.pop(k) for k in FIRST_KEYS if k in event}
    ordered.update(event)
    return ordered


def _flatten(_logger: object, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """logfmt has no nesting: a dict field ``audit={"user": "u"}`` becomes ``audit.user=u``."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _plain(text: str) -> bool:
    """A token logfmt writes bare: printable, no space, ``=``, quote or backslash."""
    return bool(text) and all(c.isprintable() and c not in ' ="\\' for c in text)


def _logfmt_value(value: object) -> str:
    r"""A logfmt value: bare when :func:`_plain`, else quoted with ``\\``, ``\"``,
    ``\n``, ``\r``, ``\t`` escaped (so every record is one line, and reads back)."""
    if value is None:
        return ""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return text if _plain(text) else '"' + text.translate(_ESCAPES) + '"'


def _logfmt_key(key: object) -> str:
    """A logfmt key: what :func:`_plain` refuses becomes ``_``."""
    return "".join(c if _plain(c) else "_" for c in str(key)) or "_"


def _logfmt(_logger: object, _name: str, event: MutableMapping[str, Any]) -> str:
    """The logfmt line of ``event``: ``key=value`` pairs separated by spaces. (structlog's
    ``LogfmtRenderer`` quotes only values with a space, ``=`` or ``"``: a value with a
    tab or a newline and no space came out unquoted and did not read back.)"""
    return " ".join(f"{_logfmt_key(key)}={_logfmt_value(value)}" for key, value in event.items())


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a test
    runner may replace it), as ``logging.lastResort`` does."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def formatter(fmt: LogFormat | str = LogFormat.LOGFMT) -> logging.Formatter:
    """The formatter of :func:`setup_logging`: one logfmt or JSON line per record.
    (structlog is imported here, not with the module: the SDK uses :class:`RateLimitedLog`
    and must not pay for it.)"""
    import structlog

    last: list[Any]
    if LogFormat(fmt) is LogFormat.JSON:
        last = [_first_keys, structlog.processors.JSONRenderer()]
    else:
        last = [_flatten, _first_keys, _logfmt]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            _timestamp,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            _extras,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.EventRenamer("msg"),
            *last,
        ],
    )


def setup_logging(level: str = "warning", fmt: LogFormat | str = LogFormat.LOGFMT) -> logging.Handler:
    """Send every log record at ``level`` (``debug``, ``info``, ``warning``, ``error``)
    or above to stderr, one structured line each (:func:`formatter`). Calling it again
    replaces the handler it installed. Raises ValueError for an unknown level or format."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_equeue_structured", False)]:
        root.removeHandler(old)
    handler = _Stderr()
    handler.setFormatter(formatter(fmt))
    handler._equeue_structured = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper()))
    return handler


class RateLimitedLog:
    """Logs a message at most once per ``interval`` seconds per ``key``; the next one
    logged says how many were suppressed in between. ``clock`` is the caller's clock
    (the consumer passes trio's)."""

    def __init__(self, logger: logging.Logger, interval: float, clock: Callable[[], float]) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(
        self,
        level: int,
        key: str,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
        fields: Mapping[str, object] | None = None,
    ) -> None:
        """Log ``msg % args`` (with ``exc_info``'s traceback, and ``fields`` as the line's
        structured fields) unless ``key`` was logged less than ``interval`` seconds ago;
        then only count it. With ``fields``, the count of suppressed lines is a field
        (``suppressed``, over ``suppressed_in``); without, a phrase appended to ``msg``."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 1024:  # keys are queues and topics: bounded, but be safe
            self._last.clear()
        self._last[key] = now
        n = self._suppressed.pop(key, 0)
        extra = dict(fields) if fields is not None else None
        if n and extra is not None:
            extra.update(suppressed=n, suppressed_in=f"{self.interval:g}s")
        elif n:
            msg += " (%d more like it in the last %.0f s)"
            args = (*args, n, self.interval)
        self.logger.log(level, msg, *args, exc_info=exc_info, extra=extra)
