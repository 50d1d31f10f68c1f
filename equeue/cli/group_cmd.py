"""``equeue group list|describe|reset-offsets|delete|pause|resume`` and ``equeue dlq list|resend``."""

from __future__ import annotations

import datetime as dt

import typer

from equeue.cli._common import BROKER_OPTION, JSON_OPTION, fail, print_json, routed, table


def _group_name(group: str) -> str:
    """``group`` if a group can have that name; else one ``error:`` line (InvalidName)."""
    from equeue.errors import InvalidName
    from equeue.names import validate_group

    try:
        return validate_group(group)
    except InvalidName as exc:
        fail(str(exc))


def _ms(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def register(app: typer.Typer) -> None:
    group_app = typer.Typer(help="Consumer groups: members, assignment, lag, offsets.", no_args_is_help=True)
    app.add_typer(group_app, name="group")
    dlq_app = typer.Typer(help="Dead letters of a consumer group: list and resend.", no_args_is_help=True)
    app.add_typer(dlq_app, name="dlq")

    @group_app.command("list")
    def list_(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Groups known to any broker group (live members or committed offsets); an
        ephemeral group (NAME#ephemeral) is listed while it has a live member."""
        groups = routed(broker, lambda admin: admin.list_groups())
        if as_json:
            print_json(groups)
            return
        table(None, ["group", "members", "topics", "ephemeral", "paused"],
              [(g.group, g.members, ", ".join(g.topics), "yes" if g.ephemeral else "-", "paused" if g.paused else "")
               for g in groups],
              right=["members"])  # fmt: skip

    @group_app.command("describe")
    def describe(group: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Members, and per queue: the broker group owning it, the member holding it,
        committed offset, max offset and lag (each row from the queue's owner). An
        unknown group is an error (no such group)."""
        _group_name(group)
        d = routed(broker, lambda admin: admin.describe_group(group))
        if as_json:
            print_json(d)
            return
        kind = " (ephemeral: offsets in memory, gone with its last member)" if d.ephemeral else ""
        table(
            f"group {d.group}{kind}: {len(d.members)} live member(s), generation {d.generation}"
            + (", PAUSED (pulls held)" if d.paused else ""),
            ["member", "host", "mode", "since", "poison skipped"],
            [(m.consumer_id, m.host, m.mode, _ms(m.since_ms), m.quarantined) for m in d.members],
            right=["poison skipped"],
        )
        rows: list[tuple[object, ...]] = [
            (q.topic, q.queue_id, q.broker_group or "-", q.owner or "-", q.committed if q.committed >= 0 else "-",
             q.max_offset, q.lag)
            for q in d.queues
        ]  # fmt: skip
        rows.append(("total", "", "", "", "", "", sum(q.lag for q in d.queues)))
        table(None, ["topic", "queue", "broker group", "member", "committed", "max offset", "lag"], rows,
              right=["queue", "committed", "max offset", "lag"])  # fmt: skip

    @group_app.command("reset-offsets")
    def reset_offsets(
        group: str,
        topic: str = typer.Option(..., "--topic", "-t", help="The topic whose offsets are reset."),
        to: str = typer.Option(
            ..., "--to", help="earliest | latest | an ISO time (2024-05-01T12:00:00Z; no offset means UTC)."
        ),
        force: bool = typer.Option(False, "--force", help="Reset even while the group has live members."),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Set the group's committed offsets of TOPIC (refused while members are live)."""
        from equeue.control import ResetTarget
        from equeue.errors import ConfigError
        from equeue.times import parse_time_ms

        _group_name(group)
        ts = 0
        target = ResetTarget.EARLIEST if to == "earliest" else ResetTarget.LATEST
        if to not in ("earliest", "latest"):
            try:  # a time without an offset is UTC (equeue.times: the one rule)
                ts, target = max(0, parse_time_ms(to)), ResetTarget.TIME
            except ConfigError as exc:
                fail(f"--to must be earliest, latest or an ISO time: {exc}")
        offsets = routed(broker, lambda admin: admin.reset_offsets(group, topic, target, ts, force))
        if as_json:
            print_json({"group": group, "topic": topic, "offsets": {str(q): o for q, o in sorted(offsets.items())}})
            return
        table(f"group {group}: offsets of {topic} reset to {to}", ["queue", "offset"],
              sorted(offsets.items()), right=["queue", "offset"])  # fmt: skip

    def _pause(group: str, paused: bool, broker: str, as_json: bool) -> None:
        _group_name(group)
        answer = routed(broker, lambda admin: admin.pause_group(group) if paused else admin.resume_group(group))
        if as_json:
            print_json(answer)
            return
        state = "paused" if paused else "resumed"
        typer.echo(f"group {group} {state}" if answer.changed else f"group {group} was already {state}")

    @group_app.command("pause")
    def pause(group: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Hold the group's pulls: nothing is delivered, its offsets stay, its members
        stay members, until it is resumed."""
        _pause(group, True, broker, as_json)

    @group_app.command("resume")
    def resume(group: str, broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Deliver to the group again (held pulls read at once)."""
        _pause(group, False, broker, as_json)

    @group_app.command("delete")
    def delete(
        group: str,
        force: bool = typer.Option(
            False, "--force", help="Delete the committed offsets even while the group has live members (they stay)."
        ),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Delete GROUP: its committed offsets and its state, at every broker group
        (refused while it has live members, unless --force). Its retry and dead-letter
        topics stay. An ephemeral group (NAME#ephemeral) exists only while it has live
        members: --force drops its in-memory offsets (it goes by itself with its last member)."""
        _group_name(group)
        answers = routed(broker, lambda admin: admin.delete_group(group, force))
        offsets = sum(a.offsets for a in answers.values())
        members = max((a.members for a in answers.values()), default=0)
        where = f" at {len(answers)} broker groups" if len(answers) > 1 else ""
        if as_json:
            print_json({"group": group, "offsets": offsets, "members": members, "broker_groups": len(answers)})
            return
        typer.echo(f"deleted group {group}: {offsets} committed offset(s){where}")
        if members:
            typer.echo(f"{members} live member(s) stay in the group: a queue's offset comes back when one of them commits a new position on it", err=True)

    @dlq_app.command("list")
    def dlq_list(
        group: str,
        limit: int = typer.Option(100, "--limit", "-n", min=1, max=1000, help="At most this many letters (one page, up to 1000)."),
        queue: int = typer.Option(0, "--queue", "-q", min=0, help="Start at this queue of %DLQ%GROUP (from a previous page)."),
        offset: int = typer.Option(0, "--offset", "-o", min=0, help="Start at this offset of that queue (from a previous page)."),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """One page of %DLQ%GROUP from every broker group: id (global offset in the
        broker group shown), origin, attempts, time, body, resent."""
        import base64

        from equeue.names import validate_group

        validate_group(group)
        page = routed(broker, lambda admin: admin.dlq_list(group, queue, offset, limit))
        texts = [
            f"(too big for a page: equeue message get %DLQ%{group} --global-offset {d.id}"
            f"{f' --broker-group {g}' if g else ''})"
            if d.body_omitted
            else base64.b64decode(d.body).decode("utf-8", "replace")
            for g, d in page.letters
        ]
        if as_json:
            print_json([
                {"id": d.id, "broker_group": g, "origin_topic": d.origin_topic, "key": d.key, "tags": d.tags,
                 "reconsume_times": d.reconsume_times, "timestamp": d.timestamp, "properties": d.properties,
                 "body": text, "resent": d.resent}
                for (g, d), text in zip(page.letters, texts, strict=True)
            ])  # fmt: skip
        else:
            rows = [
                (d.id, g or "-", d.origin_topic, d.key or "", d.reconsume_times, _ms(d.timestamp),
                 "yes" if d.resent else "", text[:60])
                for (g, d), text in zip(page.letters, texts, strict=True)
            ]  # fmt: skip
            table(f"dead letters of {group}: {len(page.letters)}",
                  ["id", "broker group", "origin", "key", "attempts", "time", "resent", "body"], rows,
                  right=["id", "attempts"])  # fmt: skip
        if not page.done:
            typer.echo(f"more: equeue dlq list {group} --queue {page.next_queue_id} --offset {page.next_offset}",
                       err=True)  # fmt: skip

    @dlq_app.command("resend")
    def dlq_resend(
        group: str,
        ids: list[int] = typer.Option([], "--id", help="Global offset (id) of a dead letter; repeatable."),
        all_: bool = typer.Option(False, "--all", help="Resend every dead letter of the group."),
        broker_group: str = typer.Option(
            None, "--broker-group", help="The broker group holding the ids (cluster: as dlq list shows)."
        ),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Send dead letters back to their origin topic (fresh: 0 attempts), each at most
        once. ``--all`` resends at every broker group."""
        from equeue.names import validate_group

        validate_group(group)
        if not ids and not all_:
            fail("pass --id ID (repeatable) or --all")
        ans = routed(broker, lambda admin: admin.dlq_resend(group, ids, all_, broker_group))
        if as_json:
            print_json(ans)
            raise typer.Exit(1 if ans.failed else 0)
        typer.echo(f"resent {len(ans.resent)} message(s) from %DLQ%{group}; {len(ans.already_resent)} resent before")
        for i, reason in sorted(ans.failed.items()):
            typer.echo(f"not resent: {i}: {reason}", err=True)
        if ans.failed:
            raise typer.Exit(1)
