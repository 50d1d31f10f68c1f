"""``equeue topic create|alter|list|describe|delete|pause|resume``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from equeue.cli._common import (
    BROKER_OPTION,
    JSON_OPTION,
    fail,
    json_option,
    print_json,
    routed,
    table,
)
from equeue.config import (
    format_retention_bytes,
    format_retention_ms,
    parse_retention_bytes,
    parse_retention_ms,
)
from equeue.errors import ConfigError
from equeue.retention import check_topic_settings

#: what ``topic alter --retention[-bytes]`` takes to put a setting back to the broker's default
DEFAULT_WORD = "default"
_FOREVER_HELP = "-1 or forever: keep messages forever, whatever the broker's default"


def _setting(text: str, flag: str, parse: Callable[[str, str], int]) -> int | None:
    """A ``--retention``/``--retention-bytes`` value → -1 (forever), a value > 0, or
    None (not given, or ``default``). Anything else is one error line, exit 1,
    before the broker is asked."""
    if not text or text.strip().lower() == DEFAULT_WORD:
        return None
    try:
        return parse(text, flag)
    except ConfigError as exc:
        fail(str(exc))


def _shown(value: int | None, fmt: Callable[[int], str]) -> str:
    """A topic's retention override as printed: default, forever or the value."""
    return DEFAULT_WORD if value is None else fmt(value)


_COMPRESSION_HELP = (
    "How the topic stores batches: producer (as sent), none, zstd or lz4 (recompressing others); "
    "not given: the broker's --compression."
)


def _summary(info: Any) -> str:
    """A TopicInfo's queue count and retention overrides, for one output line."""
    rms = _shown(info.retention_ms, format_retention_ms)
    rbytes = _shown(info.retention_bytes, format_retention_bytes)
    return f"{info.queues} queues, retention {rms} / {rbytes}, compression {info.compression or DEFAULT_WORD}"


def _compression(text: str, *, allow_default: bool) -> str | None:
    """``--compression``'s value: None when not given (or ``default``, with
    ``allow_default``: the caller resets it); fails on anything else unknown."""
    from equeue import control

    value = text.strip().lower()
    if not value or (allow_default and value == DEFAULT_WORD):
        return None
    if value not in control.COMPRESSION_SETTINGS:
        fail(f"--compression must be one of {', '.join(control.COMPRESSION_SETTINGS)}, got {text!r}")
    return value


def _print_topic(info: Any, as_json: bool) -> None:
    """A created or altered topic: its TopicInfo as JSON, or one summary line."""
    if as_json:
        print_json(info)
    else:
        typer.echo(f"topic {info.name}: {_summary(info)}")


def register(app: typer.Typer) -> None:
    topic_app = typer.Typer(help="Create, inspect and delete topics.", no_args_is_help=True)
    app.add_typer(topic_app, name="topic")

    @topic_app.command("create")
    def create(
        name: str,
        queues: int = typer.Option(4, "--queues", help="Number of queues (partitions)."),
        retention: str = typer.Option("", help=f"Override the broker's time retention (e.g. 24h; {_FOREVER_HELP})."),
        retention_bytes: str = typer.Option("", help=f"Override the broker's size retention (e.g. 1GiB; {_FOREVER_HELP})."),
        exist_ok: bool = typer.Option(False, "--exist-ok", help="Succeed if the topic exists."),
        compression: str = typer.Option("", help=_COMPRESSION_HELP),
        broker: str = BROKER_OPTION,
        as_json: bool = json_option("the topic (as topic list shows it)"),
    ) -> None:
        """Create a topic with N queues."""
        rms = _setting(retention, "--retention", parse_retention_ms)
        rbytes = _setting(retention_bytes, "--retention-bytes", parse_retention_bytes)
        codec = _compression(compression, allow_default=False)
        info = routed(broker, lambda admin: admin.create_topic(
            name, queues, retention_ms=rms, retention_bytes=rbytes, exist_ok=exist_ok, compression=codec
        ))  # fmt: skip
        _print_topic(info, as_json)

    @topic_app.command("alter")
    def alter(
        name: str,
        queues: int = typer.Option(None, "--queues", help="New queue count (grow only)."),
        retention: str = typer.Option("", help=f"Time retention override (e.g. 24h; {_FOREVER_HELP}; 'default': back to the broker's)."),
        retention_bytes: str = typer.Option("", help=f"Size retention override (e.g. 1GiB; {_FOREVER_HELP}; 'default': back to the broker's)."),
        compression: str = typer.Option("", help=_COMPRESSION_HELP + " 'default': back to the broker's --compression."),
        broker: str = BROKER_OPTION,
        as_json: bool = json_option("the topic after the change (as topic list shows it)"),
    ) -> None:
        """Grow a topic's queue count or change its retention overrides or compression."""
        rms = _setting(retention, "--retention", parse_retention_ms)
        rbytes = _setting(retention_bytes, "--retention-bytes", parse_retention_bytes)
        codec = _compression(compression, allow_default=True)
        reset = [
            setting
            for setting, text in (
                ("retention_ms", retention), ("retention_bytes", retention_bytes), ("compression", compression)
            )
            if text.strip().lower() == DEFAULT_WORD
        ]  # fmt: skip
        try:  # the client's retention checks, before anything is sent
            check_topic_settings(rms, rbytes, [r for r in reset if r != "compression"])
        except ConfigError as exc:
            fail(str(exc))
        info = routed(broker, lambda admin: admin.alter_topic(
            name, queues=queues, retention_ms=rms, retention_bytes=rbytes, reset=reset, compression=codec
        ))  # fmt: skip
        _print_topic(info, as_json)

    @topic_app.command("list")
    def list_(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """List topics."""
        topics = routed(broker, lambda admin: admin.list_topics())
        if as_json:
            print_json(topics)
            return
        table(None, ["topic", "queues", "id", "paused"],
              [(t.name, t.queues, t.topic_id, "paused" if t.paused else "") for t in topics],
              right=["queues", "id"])  # fmt: skip

    @topic_app.command("describe")
    def describe(name: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Per queue: owner broker group, retained range, message count and bytes;
        pending delayed messages. Each queue's row comes from the group owning it."""
        d = routed(broker, lambda admin: admin.describe_topic(name))
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
            f"topic {d.info.name}: {_summary(d.info)}, {d.pending_delayed} delayed pending"
            + (", PAUSED (produce refused)" if d.info.paused else ""),
            ["queue", "broker group", "min offset", "max offset", "messages", "bytes"], rows,
            right=["queue", "min offset", "max offset", "messages", "bytes"],
        )  # fmt: skip

    def _pause(name: str, paused: bool, broker: str, as_json: bool) -> None:
        answer = routed(broker, lambda admin: admin.pause_topic(name) if paused else admin.resume_topic(name))
        if as_json:
            print_json(answer)
            return
        state = "paused" if paused else "resumed"
        typer.echo(f"topic {name} {state}" if answer.changed else f"topic {name} was already {state}")

    @topic_app.command("pause")
    def pause(name: str, broker: str = BROKER_OPTION, as_json: bool = json_option('{"kind", "name", "paused", "changed"}')) -> None:
        """Refuse the topic's produce (TOPIC_PAUSED; producers wait and retry within
        their send timeout) until it is resumed. Consumers still read what it holds."""
        _pause(name, True, broker, as_json)

    @topic_app.command("resume")
    def resume(name: str, broker: str = BROKER_OPTION, as_json: bool = json_option('{"kind", "name", "paused", "changed"}')) -> None:
        """Accept the topic's produce again."""
        _pause(name, False, broker, as_json)

    @topic_app.command("delete")
    def delete(
        name: str, broker: str = BROKER_OPTION, as_json: bool = json_option('{"topic": NAME, "deleted": true}')
    ) -> None:
        """Delete a topic and (in the background) its messages."""
        routed(broker, lambda admin: admin.delete_topic(name))
        if as_json:
            print_json({"topic": name, "deleted": True})
        else:
            typer.echo(f"deleted topic {name}")
