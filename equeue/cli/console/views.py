"""How the console shows values: message bodies, sizes, times, durations, and the
parsing of form values (each bad value is a :class:`~equeue.cli.console.failures.BadInput`
that names the field)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import attrs
import humanfriendly

from equeue.cli.console.failures import BadInput
from equeue.config import format_retention_bytes, format_retention_ms
from equeue.errors import ConfigError
from equeue.times import parse_time_ms

__all__ = [
    "BODY_LIMIT",
    "Body",
    "duration",
    "form_int",
    "form_time_ms",
    "iso",
    "render_body",
    "retention",
    "size",
]

#: bytes of a body shown on a page (the rest is cut, and the page says so)
BODY_LIMIT = 64 * 1024


@attrs.frozen
class Body:
    """A body as a page shows it: ``kind`` "text", "json" (pretty-printed) or "hex",
    the shown ``text``, the body's ``size`` and how many bytes were ``cut``."""

    kind: str
    text: str
    size: int
    cut: int


def _is_text(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(c.isprintable() or c in "\n\r\t" for c in text) else None


def render_body(body: bytes, limit: int = BODY_LIMIT) -> Body:
    """JSON (pretty-printed) when the whole body is a JSON object or array within the
    limit, else UTF-8 text when printable, else hex; at most ``limit`` bytes shown."""
    shown = body[:limit]
    cut = len(body) - len(shown)
    text = None
    for trim in range(4 if cut else 1):  # a cut may split a character of up to 4 bytes
        text = _is_text(shown[: len(shown) - trim])
        if text is not None:
            break
    if text is not None and cut == 0 and text.lstrip()[:1] in ("{", "["):
        try:
            return Body("json", json.dumps(json.loads(text), indent=2, ensure_ascii=False), len(body), 0)
        except ValueError:
            pass
    if text is not None:
        return Body("text", text, len(body), len(body) - len(text.encode()))
    return Body("hex", " ".join(shown[i : i + 16].hex(" ") for i in range(0, len(shown), 16)), len(body), cut)


def iso(ms: int | None) -> str:
    """Epoch ms as ISO 8601 UTC to the second (empty for 0/None)."""
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def size(n: int | None) -> str:
    """Bytes for reading: ``512 bytes``, ``11.41 KiB``, ``8 GiB``."""
    return "" if n is None else humanfriendly.format_size(n, binary=True)


def retention(ms: int | None, nbytes: int | None) -> str:
    """A topic's retention overrides as one phrase."""
    t = "default" if ms is None else format_retention_ms(ms)
    b = "default" if nbytes is None else format_retention_bytes(nbytes)
    return f"{t} / {b}"


def duration(seconds: float) -> str:
    """``3d 4h``, ``5h 2m``, ``7m 3s``, ``12s``."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {s}s"
    return f"{s}s"


def form_int(form: Any, name: str, *, default: int | None = None, low: int | None = None, high: int | None = None) -> int:
    """The integer field ``name`` of a form or query (``default`` when empty). Raises
    BadInput naming the field for anything else, or outside [low, high]."""
    raw = str(form.get(name) or "").strip()
    if not raw:
        if default is None:
            raise BadInput(f"{name}: a number is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name}: {raw[:40]!r} is not a whole number") from None
    if low is not None and value < low:
        raise BadInput(f"{name}: must be at least {low}")
    if high is not None and value > high:
        raise BadInput(f"{name}: must be at most {high}")
    return value


def form_time_ms(form: Any, name: str) -> int:
    """The time field ``name``: epoch milliseconds, or ISO 8601 (a browser's
    ``datetime-local`` value too; no offset means UTC). Raises BadInput."""
    raw = str(form.get(name) or "").strip()
    if not raw:
        raise BadInput(f"{name}: a time is required")
    if raw.isdigit():
        return int(raw)
    try:
        return parse_time_ms(raw)
    except ConfigError as exc:
        raise BadInput(f"{name}: {exc}") from None
