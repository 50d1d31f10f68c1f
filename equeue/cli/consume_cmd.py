"""``equeue consume TOPIC [--group G]``: print messages as a member of a group.

It runs until Ctrl-C, or until an end condition: ``--max N`` messages, ``--exit-at-end``
(every queue assigned to it read to its end, kcat's ``-e``), ``--idle-timeout`` (no
message for that long), whichever comes first. It then commits and leaves.

Without ``--group`` it reads as the only member of a temporary group
(``equeue-console-<random>``) that commits nothing, so it leaves nothing behind (as
Kafka's console consumer without a group): every run starts at ``--from``.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from enum import StrEnum
from typing import Any

import typer

from equeue.cli._common import BROKER_OPTION, fail
from equeue.config import DEFAULTS

#: the name of ``equeue consume``'s temporary group (no ``--group``) begins so
TEMP_GROUP_PREFIX = "equeue-console-"


class OutputFormat(StrEnum):
    """``--format``: one line per message, as text or as a JSON object."""

    TEXT = "text"
    JSON = "json"


def _format(msg: Any, fmt: OutputFormat) -> str:
    if fmt is OutputFormat.JSON:
        return json.dumps(
            {
                "topic": msg.topic, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
                "global_offset": msg.global_offset, "key": msg.key, "tags": msg.tags,
                "properties": msg.properties, "timestamp": msg.timestamp,
                "reconsume_times": msg.reconsume_times, "body": msg.text,
            }
        )
    return f"{msg.topic}/{msg.queue_id}@{msg.queue_offset} key={msg.key or ''} {msg.text}"


def _idle_seconds(text: str | None) -> float | None:
    """``--idle-timeout`` (``30s``, ``5m``, ``1500ms``; a bare number: seconds) in
    seconds; fails (exit 1) for anything else, or 0."""
    if text is None:
        return None
    from equeue.config import parse_duration_ms
    from equeue.errors import ConfigError

    try:
        ms = parse_duration_ms(text)
    except ConfigError as exc:
        fail(f"--idle-timeout: {exc}")
    if ms <= 0:
        fail(f"--idle-timeout must be above 0, not {text!r}")
    return ms / 1000


def _topic_exists(broker: str, topic: str) -> bool:
    """Whether the cluster (or broker) has ``topic`` (GET_ROUTES, never creating it)."""
    from equeue.client import Client

    with Client(broker) as c:
        return topic not in c.get_routes([topic]).missing


def register(app: typer.Typer) -> None:
    @app.command("consume")
    def consume(
        topic: str,
        group: str = typer.Option(
            None, "--group", "-g",
            help=f"Consumer group (none: a temporary group, {TEMP_GROUP_PREFIX}<random>, that commits nothing).",
        ),
        start: str = typer.Option(
            DEFAULTS.start_from.value, "--from",
            help="Where a group with no offset starts: earliest | latest | an ISO time "
            "(2024-05-01T12:00:00Z; no offset means UTC).",
        ),
        max_messages: int = typer.Option(
            0, "--limit", "--max", "-n", min=0, help="Exit after N messages (0: no limit)."
        ),
        exit_at_end: bool = typer.Option(
            False, "--exit-at-end", "-e",
            help="Exit once every queue assigned to this consumer is read to its end (as the pulls report it).",
        ),
        idle_timeout: str = typer.Option(
            None, "--idle-timeout", metavar="DURATION", help="Exit after no message for this long (30s, 5m)."
        ),
        fmt: OutputFormat = typer.Option(OutputFormat.TEXT, "--format", help="One line per message."),
        as_json: bool = typer.Option(
            False, "--json", help="Each message as one JSON object per line (JSON Lines): --format json."
        ),
        tags: str = typer.Option("", "--tags", help='Tag filter, e.g. "paid || refunded".'),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Print messages of TOPIC as a member of group G until Ctrl-C or an end condition
        (--limit, --exit-at-end, --idle-timeout: the first one met); then commit and leave.
        Without --group: a temporary group that commits nothing and leaves nothing behind."""
        from equeue.consumer import Consumer
        from equeue.errors import EQueueError, TopicNotFound

        idle = _idle_seconds(idle_timeout)
        if as_json:
            fmt = OutputFormat.JSON
        temporary = group is None
        if group is None:
            group = TEMP_GROUP_PREFIX + secrets.token_hex(4)
        count = 0
        reader_gone = False
        c: Consumer | None = None
        try:
            # handler_threads="always": writing to a pipe may block (a slow reader); in a
            # worker thread that never holds up heartbeats
            c = Consumer(
                broker, group, [topic], start_from=start, tags=tags or None, concurrency=1, handler_threads="always",
                stop_at_end=exit_at_end, idle_timeout=idle, commit_offsets=not temporary,
            )  # fmt: skip
            if not _topic_exists(broker, topic):
                if exit_at_end:
                    raise TopicNotFound(f"no topic {topic!r}: nothing to read (--exit-at-end)")
                typer.echo(
                    f"topic {topic!r} does not exist (yet): waiting until it is created (equeue topic create, "
                    "or a first produce when the broker auto-creates topics); Ctrl-C to stop",
                    err=True,
                )
            consumer = c

            def handler(msg: Any) -> None:
                nonlocal count, reader_gone
                try:
                    sys.stdout.write(_format(msg, fmt) + "\n")
                    sys.stdout.flush()
                except BrokenPipeError:
                    # the reader is gone (| head): stop. This message counts as handled
                    # (as those still in the pipe's buffer); the rest of the chunk stays
                    # undone. Raising would send it, and every later one, to the retry topic.
                    reader_gone = True
                    consumer.stop()
                    return
                count += 1
                if max_messages and count >= max_messages:
                    consumer.stop()

            c.run(handler)
        except KeyboardInterrupt:
            pass  # Consumer.run already committed and left
        except EQueueError as exc:
            fail(str(exc))
        finally:
            if c is not None:
                try:
                    c.close()
                except KeyboardInterrupt:
                    pass  # Ctrl-C during the close: it ran to its end all the same
        if reader_gone:  # no second BrokenPipeError when the interpreter flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        typer.echo(f"consumed {count} message(s)", err=True)
