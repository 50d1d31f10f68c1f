"""``equeue topic create|alter|list|describe|delete``."""

from __future__ import annotations

from collections.abc import Callable

import typer

from equeue.cli._common import BROKER_OPTION, JSON_OPTION, leader, print_json, routed, table
from equeue.config import parse_duration_ms, parse_size


def register(app: typer.Typer) -> None:
    topic_app = typer.Typer(help="Create, inspect and delete topics.", no_args_is_help=True)
    app.add_typer(topic_app, name="topic")

    @topic_app.command("create")
    def create(
        name: str,
        queues: int = typer.Option(4, "--queues", "-q", help="Number of queues (partitions)."),
        retention: str = typer.Option("", help="Override the broker's time retention (e.g. 24h)."),
        retention_bytes: str = typer.Option("", help="Override the broker's size retention (e.g. 1GiB)."),
        exist_ok: bool = typer.Option(False, "--exist-ok", help="Succeed if the topic exists."),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Create a topic with N queues."""
        info = leader(broker, lambda c: c.create_topic(
            name, queues,
            retention_ms=parse_duration_ms(retention) if retention else None,
            retention_bytes=parse_size(retention_bytes) if retention_bytes else None,
            exist_ok=exist_ok,
        ))  # fmt: skip
        typer.echo(f"topic {info.name} ({info.queues} queues)")

    @topic_app.command("alter")
    def alter(
        name: str,
        queues: int = typer.Option(None, "--queues", "-q", help="New queue count (grow only)."),
        retention: str = typer.Option("", help="Time retention override (e.g. 24h; 'default' clears it)."),
        retention_bytes: str = typer.Option("", help="Size retention override (e.g. 1GiB; 'default' clears it)."),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Grow a topic's queue count or change its retention overrides."""

        def pick(v: str, parse: Callable[[str], int]) -> int | None:
            if not v:
                return None
            return -1 if v == "default" else parse(v)

        info = leader(broker, lambda c: c.alter_topic(
            name, queues=queues, retention_ms=pick(retention, parse_duration_ms),
            retention_bytes=pick(retention_bytes, parse_size),
        ))  # fmt: skip
        typer.echo(
            f"topic {info.name}: {info.queues} queues, retention "
            f"{info.retention_ms if info.retention_ms is not None else 'default'} ms / "
            f"{info.retention_bytes if info.retention_bytes is not None else 'default'} bytes"
        )

    @topic_app.command("list")
    def list_(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """List topics."""
        topics = leader(broker, lambda c: c.list_topics())
        if as_json:
            print_json(topics)
            return
        table(None, ["topic", "queues", "id"], [(t.name, t.queues, t.topic_id) for t in topics], right=["queues", "id"])

    @topic_app.command("describe")
    def describe(name: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Per queue: owner broker group, retained range, message count and bytes;
        pending delayed messages. Each queue's row comes from the group owning it."""
        from equeue.cli._routed import describe_topic

        d = routed(broker, lambda r: describe_topic(r, name))
        if as_json:
            print_json(d)
            return
        rows: list[tuple[object, ...]] = [
            (q, owner or "-", s.min_offset, s.max_offset, s.count, f"{s.bytes:,}") if s is not None
            else (q, owner or "-", "unavailable", "", "", "")
            for q, (s, owner) in enumerate(zip(d.queues, d.owners, strict=True))
        ]  # fmt: skip
        rows.append(("all", "", "", "", sum(s.count for s in d.queues if s is not None), f"{d.store_bytes:,}"))
        table(
            f"topic {d.info.name}: {d.info.queues} queues, {d.pending_delayed} delayed pending",
            ["queue", "broker group", "min offset", "max offset", "messages", "bytes"], rows,
            right=["queue", "min offset", "max offset", "messages", "bytes"],
        )  # fmt: skip

    @topic_app.command("delete")
    def delete(name: str, broker: str = BROKER_OPTION) -> None:
        """Delete a topic and (in the background) its messages."""
        leader(broker, lambda c: c.delete_topic(name))
        typer.echo(f"deleted topic {name}")
