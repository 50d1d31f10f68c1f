"""``equeue group list|describe|reset-offsets`` and ``equeue dlq list|resend``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer

from equeue.cli._common import BROKER_OPTION, JSON_OPTION, client, fail, print_json, query, table


def _ms(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _read_all(c: Any, topic: str, limit: int) -> list[Any]:
    """Every retained message of a topic (oldest first per queue), up to ``limit``."""
    from equeue import wire
    from equeue.errors import TopicNotFound
    from equeue.protocol import PullStatus

    try:
        desc = c.describe_topic(topic)
    except TopicNotFound:
        return []
    out: list[Any] = []
    for qs in desc.queues:
        off = qs.min_offset
        while off < qs.max_offset and len(out) < limit:
            r = c.pull(wire.PullRequest(topic, qs.queue_id, off, min(256, limit - len(out))))
            if r.status is not PullStatus.FOUND:
                if r.status is PullStatus.OFFSET_TOO_SMALL:
                    off = r.min_offset
                    continue
                break
            out.extend(r.messages)
            off = r.next_offset
    return out


def register(app: typer.Typer) -> None:
    group_app = typer.Typer(help="Consumer groups: members, assignment, lag, offsets.", no_args_is_help=True)
    app.add_typer(group_app, name="group")
    dlq_app = typer.Typer(help="Dead letters of a consumer group: list and resend.", no_args_is_help=True)
    app.add_typer(dlq_app, name="dlq")

    @group_app.command("list")
    def list_(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Groups known to the broker (live members or committed offsets)."""
        groups = query(broker, lambda c: c.list_groups(), as_json)
        if groups is None:
            return
        table(None, ["group", "members", "topics"], [(g.group, g.members, ", ".join(g.topics)) for g in groups], right=["members"])

    @group_app.command("describe")
    def describe(group: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Members, queue → owner, committed offset, max offset and lag per queue."""
        d = query(broker, lambda c: c.describe_group(group), as_json)
        if d is None:
            return
        table(
            f"group {d.group}: {len(d.members)} live member(s), generation {d.generation}",
            ["member", "host", "mode", "since"],
            [(m.consumer_id, m.host, m.mode, _ms(m.since_ms)) for m in d.members],
        )
        rows = [
            (q.topic, q.queue_id, q.owner or "-", q.committed if q.committed >= 0 else "-", q.max_offset, q.lag)
            for q in d.queues
        ]
        rows.append(("total", "", "", "", "", sum(q.lag for q in d.queues)))
        table(None, ["topic", "queue", "owner", "committed", "max offset", "lag"], rows,
              right=["queue", "committed", "max offset", "lag"])  # fmt: skip

    @group_app.command("reset-offsets")
    def reset_offsets(
        group: str,
        topic: str = typer.Option(..., "--topic", "-t"),
        to: str = typer.Option(..., "--to", help="earliest | latest | an ISO time (2024-05-01T12:00:00Z)."),
        force: bool = typer.Option(False, "--force", help="Reset even while the group has live members."),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Set the group's committed offsets of TOPIC (refused while members are live)."""
        ts = 0
        target = to
        if to not in ("earliest", "latest"):
            try:
                when = dt.datetime.fromisoformat(to.replace("Z", "+00:00"))
            except ValueError:
                fail(f"--to must be earliest, latest or an ISO time, not {to!r}")
            if when.tzinfo is None:
                when = when.astimezone()
            ts, target = int(when.timestamp() * 1000), "time"
        with client(broker) as c:
            offsets = c.reset_offsets(group, topic, target, ts, force)
        table(f"group {group}: offsets of {topic} reset to {to}", ["queue", "offset"],
              sorted(offsets.items()), right=["queue", "offset"])  # fmt: skip

    @dlq_app.command("list")
    def dlq_list(
        group: str,
        limit: int = typer.Option(1000, "--limit", help="At most this many messages."),
        broker: str = BROKER_OPTION,
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Messages in %DLQ%GROUP: id (global offset), origin, attempts, time, body."""
        from equeue.names import dlq_topic, validate_group

        validate_group(group)
        with client(broker) as c:
            msgs = _read_all(c, dlq_topic(group), limit)
        if as_json:
            print_json([
                {"id": m.global_offset, "origin_topic": m.origin_topic, "key": m.key, "tags": m.tags,
                 "reconsume_times": m.reconsume_times, "timestamp": m.timestamp,
                 "properties": m.properties, "body": m.text}
                for m in msgs
            ])  # fmt: skip
            return
        rows = [
            (m.global_offset, m.origin_topic, m.key or "", m.reconsume_times, _ms(m.timestamp),
             m.text[:60])
            for m in msgs
        ]  # fmt: skip
        table(f"dead letters of {group}: {len(msgs)}", ["id", "origin", "key", "attempts", "time", "body"],
              rows, right=["id", "attempts"])  # fmt: skip

    @dlq_app.command("resend")
    def dlq_resend(
        group: str,
        ids: list[int] = typer.Option([], "--id", help="Global offset (id) of a dead letter; repeatable."),
        all_: bool = typer.Option(False, "--all", help="Resend every dead letter of the group."),
        broker: str = BROKER_OPTION,
    ) -> None:
        """Send dead letters back to their origin topic (fresh: 0 attempts)."""
        from equeue import Message, wire
        from equeue.models import SYSTEM_PROPERTY_PREFIX
        from equeue.names import dlq_topic, validate_group

        validate_group(group)
        if not ids and not all_:
            fail("pass --id ID (repeatable) or --all")
        topic = dlq_topic(group)
        with client(broker) as c:
            if all_:
                msgs = _read_all(c, topic, 1 << 30)
            else:
                msgs = []
                for i in ids:
                    r = c.get_message(topic, global_offset=i)
                    msgs.extend(r.messages)
            routes: dict[str, int] = {}
            for m in msgs:
                origin = m.origin_topic
                if origin not in routes:
                    routes[origin] = c.get_route(origin, False).queues
                props = {k: v for k, v in m.properties.items() if not k.startswith(SYSTEM_PROPERTY_PREFIX)}
                qid = int(m.properties.get("%ORIGIN_QUEUE", "0")) % routes[origin]
                entry = wire.encode_entry(Message(m.body, m.key, m.tags, props))
                c.produce(wire.ProduceRequest(origin, qid, [entry]))
        typer.echo(f"resent {len(msgs)} message(s) from {topic}")
