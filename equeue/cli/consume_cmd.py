"""``equeue consume TOPIC --group G``: print messages as a member of a group."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

import typer

from equeue.cli._common import BROKER_OPTION, fail
from equeue.config import DEFAULTS, StartFrom


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


def register(app: typer.Typer) -> None:
    @app.command("consume")
    def consume(
        topic: str,
        group: str = typer.Option(..., "--group", "-g", help="Consumer group."),
        start: StartFrom = typer.Option(DEFAULTS.start_from, "--from", help="Where a group with no offset starts."),
        max_messages: int = typer.Option(0, "--max", "-n", min=0, help="Exit after N messages (0: run until Ctrl-C)."),
        fmt: OutputFormat = typer.Option(OutputFormat.TEXT, "--format", "-f", help="One line per message."),
        tags: str = typer.Option("", "--tags", help='Tag filter, e.g. "paid || refunded".'),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Print messages of TOPIC as a member of group G; Ctrl-C commits and leaves."""
        from equeue.consumer import Consumer
        from equeue.errors import EQueueError

        count = 0
        c: Consumer | None = None
        try:
            # handler_threads="always": writing to a pipe may block (a slow reader); in a
            # worker thread that never holds up heartbeats
            c = Consumer(
                broker, group, [topic], start_from=start, tags=tags or None, concurrency=1, handler_threads="always"
            )
            consumer = c

            def handler(msg: Any) -> None:
                nonlocal count
                sys.stdout.write(_format(msg, fmt) + "\n")
                sys.stdout.flush()
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
                c.close()
        typer.echo(f"consumed {count} message(s)", err=True)
