"""``equeue message get|find|skip|skipped``: look up stored messages by offset or
by key; move consumers past a corrupt record.

``get`` reads one message by (queue, queue offset) or by global offset; ``find``
lists the messages of a topic with a key, newest first, through the broker's key
index (no log scan). ``skip`` (admin) makes the broker stop serving one record, so
consumers stuck on a corrupt record move past it; ``skipped`` lists those records.
``get`` and ``find`` print the headers, properties and body: the body as text when
it is valid UTF-8 without control characters, else as hex (``--hex`` forces hex).
``--json`` prints one JSON document: an object (``get``, ``skip``, ``skipped``) or a
list (``find``).
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Any

import typer

from equeue.cli._common import BROKER_OPTION, fail, json_option, print_json, routed, table

if TYPE_CHECKING:
    from equeue.models import Message

_PREVIEW = 48


def _is_text(body: bytes) -> bool:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in text)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _body(body: bytes, force_hex: bool) -> tuple[str, str]:
    """(encoding, rendered body): ``utf-8`` text or ``hex``."""
    if not force_hex and _is_text(body):
        return "utf-8", body.decode("utf-8")
    return "hex", body.hex()


def message_dict(m: Message, force_hex: bool = False) -> dict[str, Any]:
    """The JSON form of a looked-up message."""
    enc, text = _body(m.body, force_hex)
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "global_offset": m.global_offset,
        "timestamp": m.timestamp,
        "stored_at": _iso(m.timestamp),
        "key": m.key,
        "tags": m.tags,
        "reconsume_times": m.reconsume_times,
        "properties": dict(m.properties),
        "body_size": len(m.body),
        "body_encoding": enc,
        "body": text,
    }


def _print_message(m: Message, force_hex: bool) -> None:
    enc, text = _body(m.body, force_hex)
    rows = [
        ("topic", m.topic), ("queue", m.queue_id), ("queue offset", m.queue_offset),
        ("global offset", m.global_offset), ("stored at", f"{_iso(m.timestamp)} ({m.timestamp})"),
        ("key", "-" if m.key is None else m.key), ("tags", "-" if m.tags is None else m.tags),
        ("reconsume times", m.reconsume_times),
    ]  # fmt: skip
    out = [f"{name:<16}{value}" for name, value in rows]
    if m.properties:
        out.append("properties")
        out += [f"  {k} = {v}" for k, v in sorted(m.properties.items())]
    else:
        out.append("properties      -")
    out.append(f"body ({len(m.body)} bytes, {'text' if enc == 'utf-8' else 'hex'})")
    out.append(text)
    sys.stdout.write("\n".join(out) + "\n")


def _preview(body: bytes) -> str:
    if _is_text(body):
        text = body.decode("utf-8").replace("\n", " ")
        return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"
    h = body.hex()
    return "0x" + (h if len(h) <= _PREVIEW else h[: _PREVIEW - 1] + "…")


def register(app: typer.Typer) -> None:
    msg_app = typer.Typer(
        help="Look up stored messages by offset or by key; skip a corrupt record.", no_args_is_help=True
    )
    app.add_typer(msg_app, name="message")

    @msg_app.command("get")
    def get(
        topic: str,
        queue: int = typer.Option(-1, "--queue", "-q", help="Queue id (with --offset)."),
        offset: int = typer.Option(-1, "--offset", "-o", help="Queue offset (with --queue)."),
        global_offset: int = typer.Option(-1, "--global-offset", help="Global offset (instead of --queue/--offset)."),
        force_hex: bool = typer.Option(False, "--hex", help="Print the body as hex even if it is text."),
        as_json: bool = json_option("the message (an object)"),
        broker_group: str = typer.Option(
            None, "--broker-group", help="Cluster: the broker group whose store the global offset is in."
        ),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Print one message: headers, properties and body (asked of the queue's owner
        broker group; a global offset is in one group's store).

        Examples: ``equeue message get orders --queue 1 --offset 42``,
        ``equeue message get orders --global-offset 1234 --json``.
        """
        by_queue = queue >= 0 or offset >= 0
        if by_queue == (global_offset >= 0):
            fail("give either --queue Q --offset O, or --global-offset G")
        if by_queue and (queue < 0 or offset < 0):
            fail("--queue and --offset go together (both >= 0)")
        res = routed(broker, lambda admin: admin.get_message(topic, queue if by_queue else -1, offset,
                                                             global_offset, broker_group))  # fmt: skip
        if not res.messages:
            fail("message not found")
        m = res.messages[0]
        if as_json:
            print_json(message_dict(m, force_hex))
        else:
            _print_message(m, force_hex)

    @msg_app.command("find")
    def find(
        topic: str,
        key: str = typer.Option(..., "--key", "-k", help="The message key to look up."),
        limit: int = typer.Option(32, "--limit", "-n", min=1, max=1000, help="Most messages to list."),
        force_hex: bool = typer.Option(False, "--hex", help="Print bodies as hex even if they are text."),
        as_json: bool = json_option("the full messages (an array, newest first)"),
        before: int = typer.Option(-1, "--before", help="Only messages below this global offset (go on "
                                   "after a search the broker cut short)."),
        broker: str = BROKER_OPTION,
    ) -> None:
        """List the messages of TOPIC with KEY, newest first (key index, no log scan;
        every broker group owning queues of TOPIC is asked).

        Example: ``equeue message find orders --key user-42 --limit 10``.
        """
        res = routed(broker, lambda admin: admin.find_by_key(topic, key, limit, before))
        msgs = res.messages
        if res.next_offset:
            typer.echo(f"search cut short by the broker's scan budget (many keys share this key's hash); "
                       f"go on with --before {res.next_offset}", err=True)  # fmt: skip
        if as_json:
            print_json([message_dict(m, force_hex) for m in msgs])
            return
        if not msgs:
            typer.echo(f"no messages with key {key!r} in topic {topic}", err=True)
            return
        from rich.markup import escape

        rows = [
            (m.global_offset, m.queue_id, m.queue_offset, _iso(m.timestamp), escape(m.tags or ""),
             len(m.body), escape(m.body.hex() if force_hex else _preview(m.body)))
            for m in msgs
        ]  # fmt: skip
        table(
            f"{len(msgs)} message(s) with key {key!r} in {topic} (newest first)",
            ["global", "queue", "offset", "stored at", "tags", "bytes", "body"], rows,
            right=["global", "queue", "offset", "bytes"],
        )  # fmt: skip

    @msg_app.command("skip")
    def skip(
        topic: str = typer.Option(..., "--topic", "-t", help="Topic of the record."),
        queue: int = typer.Option(..., "--queue", "-q", min=0, help="Queue id."),
        offset: int = typer.Option(..., "--offset", "-o", min=0, help="Queue offset of the record."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
        broker: str = BROKER_OPTION,
        as_json: bool = json_option("the broker's answer (topic, queue_id, queue_offset, already_skipped, problem)"),
    ) -> None:
        """Admin: stop serving one record (a corrupt one consumers cannot get past).

        Pulls step over it from now on, so every group moves past it; the record stays
        on disk (for forensics) and ``message get`` answers "skipped". Not undoable.
        Example: ``equeue message skip --topic orders --queue 1 --offset 42 --yes``.
        """
        if not yes and not typer.confirm(
            f"Stop serving {topic}/{queue} offset {offset} to every consumer? (cannot be undone)", err=True
        ):
            fail("not skipped", code=1)
        ans = routed(broker, lambda admin: admin.skip_message(topic, queue, offset))
        if as_json:
            print_json(ans)
            return
        where = f"{topic}/{queue} offset {offset}"
        if ans.already_skipped:
            typer.echo(f"{where} was already skipped")
        elif ans.problem:
            typer.echo(f"skipped {where} ({ans.problem})")
        else:
            typer.echo(f"skipped {where} (it read intact: skipped all the same)")

    @msg_app.command("skipped")
    def skipped(
        topic: str,
        as_json: bool = json_option("the skipped offsets by queue (an object: queue id as a string → offsets)"),
        broker: str = BROKER_OPTION,
    ) -> None:
        """List the records of TOPIC an operator skipped (``message skip``), by queue."""
        by_queue = routed(broker, lambda admin: admin.list_skipped(topic))
        if as_json:
            print_json({str(q): offs for q, offs in by_queue.items()})
            return
        if not by_queue:
            typer.echo(f"no skipped records in topic {topic}", err=True)
            return
        table(
            f"skipped records of {topic}", ["queue", "offsets"],
            [(q, ", ".join(map(str, offs))) for q, offs in sorted(by_queue.items())], right=["queue"],
        )  # fmt: skip
