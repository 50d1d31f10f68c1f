"""The history: one JSON object per line, in the order things happened in the
harness's single trio thread, each stamped with monotonic seconds since the run began.

An operation is two lines sharing ``id``: its invocation (``type`` "invoke") and its
outcome (``type`` "ok", "fail" (did not happen) or "unknown" (may have happened: a
timeout, a connection broken after the request went out)). Observations without an
invocation (a consumer's delivery, a status sample) are single "ok" lines; the
nemesis writes "nemesis" lines; the run's own steps write "info" lines.

    {"i": 17, "t": 3.201544, "type": "invoke", "id": 9, "process": "p0", "f": "send",
     "value": {"mid": "p0-12", "topic": "chaos", "key": "p0k3", "crc": 123, "len": 88}}
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["History", "Op", "read_history"]

Op = dict[str, Any]


class History:
    """Append-only writer of ``path`` (line-buffered: a crash keeps what was written).

    Not thread-safe by design: every writer is a task of the one trio loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self._f: IO[str] | None = path.open("w", buffering=1 << 16)
        self._lines = itertools.count()
        self._ids = itertools.count(1)
        self.write("info", "run", "start", wall=time.time(), monotonic=self.t0)

    def now(self) -> float:
        """Seconds since the run began (the history's clock)."""
        return time.monotonic() - self.t0

    def write(self, type_: str, process: str, f: str, op_id: int | None = None, **value: Any) -> int:
        i = next(self._lines)
        line: Op = {"i": i, "t": round(self.now(), 6), "type": type_, "process": process, "f": f}
        if op_id is not None:
            line["id"] = op_id
        if value:
            line["value"] = value
        if self._f is not None:
            self._f.write(json.dumps(line, separators=(",", ":")) + "\n")
        return i

    def invoke(self, process: str, f: str, **value: Any) -> int:
        """Record an invocation; returns the operation id for :meth:`complete`."""
        op_id = next(self._ids)
        self.write("invoke", process, f, op_id, **value)
        return op_id

    def complete(self, op_id: int, outcome: str, process: str, f: str, **value: Any) -> None:
        """Record the outcome of ``op_id``: "ok", "fail" or "unknown"."""
        assert outcome in ("ok", "fail", "unknown"), outcome
        self.write(outcome, process, f, op_id, **value)

    def observe(self, process: str, f: str, **value: Any) -> None:
        """A single-line observation (a delivery, a sample)."""
        self.write("ok", process, f, **value)

    def nemesis(self, f: str, **value: Any) -> None:
        self.write("nemesis", "nemesis", f, **value)

    def info(self, f: str, **value: Any) -> None:
        self.write("info", "run", f, **value)

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_history(path: Path) -> Iterator[Op]:
    """The lines of a history file (a torn last line, from a killed run, is skipped)."""
    with path.open() as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
