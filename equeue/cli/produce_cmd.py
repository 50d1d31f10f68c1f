"""``equeue produce TOPIC``: one message per line of ``--file`` or stdin."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import typer

from equeue.cli._common import (
    BROKER_OPTION,
    LOG_LEVEL_OPTION,
    LogLevel,
    console,
    err_console,
    fail,
    print_json,
    setup_logging,
)
from equeue.config import parse_duration_ms
from equeue.errors import ConfigError


def _properties(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            fail(f"--property expects k=v, got {item!r}")
        out[k] = v
    return out


def _lines(stream: IO[str]) -> Iterator[str]:
    for line in stream:
        line = line.rstrip("\r\n")
        if line.strip():
            yield line


def _key_of(line: str, field: str, lineno: int) -> str | None:
    try:
        doc = json.loads(line)
    except ValueError:
        fail(f"line {lineno} is not JSON (needed for --key-field {field})")
    if not isinstance(doc, dict):
        fail(f"line {lineno} is not a JSON object (needed for --key-field {field})")
    value: Any = doc.get(field)
    return None if value is None else str(value)


def register(app: typer.Typer) -> None:
    @app.command("produce")
    def produce(
        topic: str = typer.Argument(..., help="Topic to send to."),
        file: Path | None = typer.Option(None, "--file", "-f", help="Read messages from this file (default: stdin)."),
        key: str | None = typer.Option(None, "--key", "-k", help="Key for every message (routes to one queue)."),
        key_field: str | None = typer.Option(
            None, "--key-field", help="Take each message's key from this field of the JSON line."
        ),
        tags: str | None = typer.Option(None, "--tags", help="Tag for every message."),
        prop: list[str] = typer.Option([], "--property", "-p", help="k=v property (repeatable)."),
        delay: str | None = typer.Option(None, "--delay", help="Deliver later, e.g. 30s, 5m, 1h."),
        compression: str = typer.Option(
            "none", "--compression", help="Compress each request's batch: none, zstd (smallest) or lz4 (fastest)."
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print each message's send result as one JSON object per line (JSON Lines); "
            "the summary goes to stderr."
        ),
        broker: str = BROKER_OPTION,
        log_level: LogLevel = LOG_LEVEL_OPTION,
    ) -> None:
        """Send one message per line (empty lines are skipped); print a summary."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from equeue.errors import EQueueError
        from equeue.producer import Producer, SendHandle
        from equeue.wire.batches import Codec

        setup_logging(log_level)
        if key and key_field:
            fail("give --key or --key-field, not both")
        props = _properties(prop)
        try:
            codec = Codec.parse(compression)
        except ValueError as exc:
            fail(f"--compression: {exc}")
        delay_s = None
        if delay:
            try:
                delay_s = parse_duration_ms(delay) / 1000
            except ConfigError:
                fail(f"invalid --delay {delay!r} (a duration >= 0, e.g. 30s, 5m, 1h)")
        if file is not None and not file.is_file():
            fail(f"no such file: {file}")
        stream: IO[str] = file.open(encoding="utf-8") if file is not None else sys.stdin
        total_lines = None
        if file is not None:
            with file.open("rb") as fh:
                total_lines = sum(1 for raw in fh if raw.strip())
        queues: set[int] = set()
        count = 0
        start = time.perf_counter()
        handles: list[SendHandle] = []

        def drain(block: bool) -> None:
            keep = []
            for h in handles:
                if block or h.done():
                    r = h.result()
                    queues.add(r.queue_id)
                    if as_json:
                        print_json(r)
                else:
                    keep.append(h)
            handles[:] = keep

        show = file is not None and not as_json and err_console.is_terminal
        progress = Progress(
            TextColumn("sending"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:,.0f} msg/s"), TimeElapsedColumn(),
            console=err_console, disable=not show, transient=True,
        )  # fmt: skip
        try:
            with Producer(broker, connect_timeout=5.0, compression=codec) as p, progress:
                task = progress.add_task("send", total=total_lines, rate=0.0)
                for lineno, line in enumerate(_lines(stream), 1):
                    k = _key_of(line, key_field, lineno) if key_field else key
                    handles.append(
                        p.send_async(topic, line, key=k, tags=tags, properties=props or None, delay=delay_s)
                    )
                    count += 1
                    if len(handles) >= 10_000:
                        drain(False)
                    if count % 1000 == 0:
                        progress.update(task, completed=count, rate=count / (time.perf_counter() - start))
                p.flush()
                drain(True)
                progress.update(task, completed=count)
        except EQueueError as exc:
            fail(f"{type(exc).__name__}: {exc} (after {count} messages read)")
        finally:
            if file is not None:
                stream.close()
        elapsed = time.perf_counter() - start
        rate = count / elapsed if elapsed > 0 else 0.0
        summary = (
            f"sent {count} messages to {topic} ({len(queues)} queues hit: "
            f"{', '.join(map(str, sorted(queues))) or '-'}) in {elapsed:.2f} s ({rate:,.0f} msg/s)"
        )
        (err_console if as_json else console).print(summary, highlight=False)
