"""The console's pages and actions: each reads or changes the cluster through
:class:`~equeue.client.async_admin.AsyncAdminClient` of the asking user (:class:`Viewer`).

Pages: overview (``/``), cluster, topics and a topic, consumer groups and a group,
messages (lookups), dead letters of a group. Actions (POST, CSRF-checked): create,
alter, pause, resume and delete a topic; pause, resume and reset the offsets of a
group; resend dead letters. Every list
is bounded (:data:`PAGE_SIZE` rows a page, at most
:data:`MAX_LISTED_TOPICS` topics described for a sort).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import attrs
import trio
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from equeue import control
from equeue.cli.console.failures import BadInput
from equeue.cli.console.views import form_int, form_time_ms, render_body
from equeue.client.async_admin import AsyncAdminClient
from equeue.errors import EQueueError, TopicNotFound
from equeue.models import Message
from equeue.names import validate_group

if TYPE_CHECKING:
    from equeue.cli.console.app import Console, Viewer

__all__ = ["routes"]

#: rows of a paged list
PAGE_SIZE = 50
#: most topics described for the topic list (its sort covers these)
MAX_LISTED_TOPICS = 200
#: most messages a lookup by key shows
MAX_FOUND = 50
#: columns the topic list sorts by
TOPIC_SORTS = ("name", "queues", "messages", "bytes", "rate", "retention", "paused")
#: most concurrent requests of one page
_FAN_OUT = 8
#: most queues a topic may be given from the console
MAX_QUEUES = 1024


@attrs.frozen
class TopicRow:
    name: str
    queues: int
    messages: int | None
    bytes: int | None
    rate: float | None
    retention_ms: int | None
    retention_bytes: int | None
    paused: bool = False
    error: str = ""


@attrs.frozen
class GroupRow:
    group: str
    members: int
    topics: list[str]
    lag: int | None
    state: str
    paused: bool = False
    ephemeral: bool = False
    error: str = ""


async def _bounded(items: list[Any], fn: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    """``fn(item)`` for each item, at most :data:`_FAN_OUT` at once, in order."""
    out: list[Any] = [None] * len(items)
    limiter = trio.CapacityLimiter(_FAN_OUT)

    async def one(i: int, item: Any) -> None:
        async with limiter:
            out[i] = await fn(item)

    async with trio.open_nursery() as nursery:
        for i, item in enumerate(items):
            nursery.start_soon(one, i, item)
    return out


def _page_of(request: Request, total: int, size: int) -> tuple[int, int]:
    """(page number from 1, number of pages) of the ``page`` query value."""
    pages = max(1, (total + size - 1) // size)
    page = form_int(request.query_params, "page", default=1, low=1)
    return min(page, pages), pages


def _message_view(m: Message) -> dict[str, Any]:
    return {"m": m, "body": render_body(m.body)}


def routes(console: Console) -> list[Route]:
    """The routes of every page and action of ``console``."""
    sampler = console.sampler
    render = console.render
    page = console.page

    # ------------------------------------------------------------------ overview
    async def overview(request: Request, v: Viewer) -> Response:
        rows = await v.admin.broker_stats()
        rates = {
            r.address: (
                sampler.broker_in[r.address][-1] if sampler.broker_in.get(r.address) else None,
                sampler.broker_out[r.address][-1] if sampler.broker_out.get(r.address) else None,
            )
            for r in rows
        }
        chart = sampler.broker_chart([r.address for r in rows if r.stats is not None])
        return render(request, "overview.html", user=v.user, rows=rows, rates=rates, chart=chart,
                      sampler_error=sampler.last_error)  # fmt: skip

    # ------------------------------------------------------------------ cluster
    async def cluster(request: Request, v: Viewer) -> Response:
        report = await v.admin.cluster_report()
        replication = {r.group: r for r in report.replication}
        followers = {(r.group, f.broker_id): f for r in report.replication if r.status for f in r.status.replicas}
        health = {(h.group, h.broker_id): h for h in report.health}
        return render(request, "cluster.html", user=v.user, report=report, replication=replication,
                      followers=followers, health=health, elections=list(sampler.elections))  # fmt: skip

    # ------------------------------------------------------------------ topics
    async def topics(request: Request, v: Viewer) -> Response:
        infos = await v.admin.list_topics(include_internal=False)
        infos = sorted(infos, key=lambda t: t.name)
        truncated = len(infos) > MAX_LISTED_TOPICS
        infos = infos[:MAX_LISTED_TOPICS]
        sort = request.query_params.get("sort", "name")
        if sort not in TOPIC_SORTS:
            raise BadInput(f"sort: one of {', '.join(TOPIC_SORTS)}")
        desc = request.query_params.get("desc") == "1"

        async def row(info: control.TopicInfo) -> TopicRow:
            try:
                merged = await v.admin.describe_topic(info.name)
            except EQueueError as exc:
                return TopicRow(info.name, info.queues, None, None, None, info.retention_ms, info.retention_bytes,
                                info.paused, str(exc))  # fmt: skip
            known = [q for q in merged.queues if q is not None]
            return TopicRow(info.name, len(merged.queues), sum(q.count for q in known), sum(q.bytes for q in known),
                            sampler.topic_rate(info.name), info.retention_ms, info.retention_bytes,
                            info.paused or merged.info.paused,
                            "" if len(known) == len(merged.queues) else "some queues' owners are down")  # fmt: skip

        rows: list[TopicRow] = await _bounded(infos, row)
        keys: dict[str, Callable[[TopicRow], Any]] = {
            "name": lambda r: r.name,
            "queues": lambda r: r.queues,
            "messages": lambda r: r.messages or 0,
            "bytes": lambda r: r.bytes or 0,
            "rate": lambda r: r.rate or 0.0,
            "retention": lambda r: (r.retention_ms is None, r.retention_ms or 0),
            "paused": lambda r: r.paused,
        }
        rows.sort(key=keys[sort], reverse=desc)
        n, pages = _page_of(request, len(rows), PAGE_SIZE)
        shown = rows[(n - 1) * PAGE_SIZE : n * PAGE_SIZE]
        return render(request, "topics.html", user=v.user, rows=shown, sort=sort, desc=desc, page=n, pages=pages,
                      total=len(rows), truncated=truncated, sorts=TOPIC_SORTS)  # fmt: skip

    async def topic(request: Request, v: Viewer) -> Response:
        name = request.path_params["name"]
        merged = await v.admin.describe_topic(name)
        rates = sampler.topic_rates(name)
        summaries = [g for g in await v.admin.list_groups() if name in g.topics][:PAGE_SIZE]

        async def lags(g: control.GroupSummary) -> tuple[str, dict[int, control.GroupQueue] | str]:
            try:
                d = await v.admin.describe_group(g.group)
            except EQueueError as exc:
                return g.group, str(exc)
            return g.group, {q.queue_id: q for q in d.queues if q.topic == name}

        consumers = await _bounded(summaries, lags)
        return render(request, "topic.html", user=v.user, name=name, t=merged, rates=rates, consumers=consumers,
                      max_queues=MAX_QUEUES)  # fmt: skip

    async def create_topic(request: Request, v: Viewer) -> Response:
        form = await console.check_csrf(request)
        name = str(form.get("name") or "").strip()
        if not name:
            raise BadInput("name: a topic name is required")
        queues = form_int(form, "queues", default=4, low=1, high=MAX_QUEUES)
        info = await v.admin.create_topic(name, queues)
        console.flash(request, f"topic {info.name} created with {info.queues} queues")
        return RedirectResponse(f"/topics/{quote(info.name, safe='')}", 303)

    async def alter_topic(request: Request, v: Viewer) -> Response:
        form = await console.check_csrf(request)
        name = request.path_params["name"]
        queues = form_int(form, "queues", low=1, high=MAX_QUEUES)
        info = await v.admin.alter_topic(name, queues=queues)
        console.flash(request, f"topic {info.name} now has {info.queues} queues")
        return RedirectResponse(f"/topics/{quote(name, safe='')}", 303)

    def pause_action(kind: str, pause: bool) -> Callable[[Request, Viewer], Awaitable[Response]]:
        """The POST that pauses or resumes a topic or a group (``kind``), answered by
        the page of it with the broker's answer, or its refusal, as the one-line result."""
        calls: dict[tuple[str, bool], Callable[[AsyncAdminClient, str], Awaitable[control.PauseAnswer]]] = {
            ("topic", True): AsyncAdminClient.pause_topic,
            ("topic", False): AsyncAdminClient.resume_topic,
            ("group", True): AsyncAdminClient.pause_group,
            ("group", False): AsyncAdminClient.resume_group,
        }
        call = calls[(kind, pause)]

        async def action(request: Request, v: Viewer) -> Response:
            await console.check_csrf(request)
            name = request.path_params["name"]
            answer = await call(v.admin, name)
            if answer.changed:
                text = f"{kind} {name} {'paused' if answer.paused else 'resumed'}"
            elif answer.paused:  # it was so already: the broker changed nothing
                text = f"{kind} {name} was paused already"
            else:
                text = f"{kind} {name} was not paused: nothing to resume"
            console.flash(request, text)
            return RedirectResponse(f"/{kind}s/{quote(name, safe='')}", 303)

        return action

    async def confirm_delete(request: Request, v: Viewer) -> Response:
        name = request.path_params["name"]
        infos = await v.admin.list_topics(include_internal=False)
        if name not in {t.name for t in infos}:
            raise TopicNotFound(f"no such topic {name!r}")
        return render(request, "topic_delete.html", user=v.user, name=name)

    async def delete_topic(request: Request, v: Viewer) -> Response:
        form = await console.check_csrf(request)
        name = request.path_params["name"]
        if str(form.get("confirm") or "") != name:
            console.flash(request, f"not deleted: type the topic's name ({name}) to confirm", ok=False)
            return RedirectResponse(f"/topics/{quote(name, safe='')}/delete", 303)
        await v.admin.delete_topic(name)
        console.flash(request, f"topic {name} deleted")
        return RedirectResponse("/topics", 303)

    # ------------------------------------------------------------------ consumer groups
    async def groups(request: Request, v: Viewer) -> Response:
        summaries = await v.admin.list_groups()
        n, pages = _page_of(request, len(summaries), PAGE_SIZE)
        shown = summaries[(n - 1) * PAGE_SIZE : n * PAGE_SIZE]

        async def row(g: control.GroupSummary) -> GroupRow:
            try:
                d = await v.admin.describe_group(g.group)
            except EQueueError as exc:
                return GroupRow(g.group, g.members, g.topics, None, "unknown", g.paused, g.ephemeral, str(exc))
            lag = sum(max(0, q.lag) for q in d.queues)
            return GroupRow(g.group, len(d.members), g.topics, lag, "active" if d.members else "empty",
                            g.paused or d.paused, g.ephemeral or d.ephemeral)  # fmt: skip

        rows = await _bounded(shown, row)
        return render(request, "groups.html", user=v.user, rows=rows, page=n, pages=pages, total=len(summaries))

    async def group(request: Request, v: Viewer) -> Response:
        name = request.path_params["name"]
        d = await v.admin.describe_group(name)
        topics = sorted({q.topic for q in d.queues} | {t for m in d.members for t in m.topics})
        return render(request, "group.html", user=v.user, name=name, d=d, topics=topics,
                      chart=sampler.lag_chart(name))  # fmt: skip

    async def reset_group(request: Request, v: Viewer) -> Response:
        form = await console.check_csrf(request)
        name = request.path_params["name"]
        validate_group(name)
        topic_name = str(form.get("topic") or "").strip()
        if not topic_name:
            raise BadInput("topic: choose the topic whose offsets to reset")
        to = str(form.get("to") or "")
        if to not in {t.value for t in control.ResetTarget}:
            raise BadInput("to: earliest, latest or time")
        ts = form_time_ms(form, "time") if to == control.ResetTarget.TIME else 0
        force = form.get("force") in ("1", "on", "true")
        offsets = await v.admin.reset_offsets(name, topic_name, control.ResetTarget(to), ts, force)
        shown = ", ".join(f"{q}→{o}" for q, o in offsets.items())
        console.flash(request, f"group {name}: offsets of {topic_name} reset to {to} ({shown or 'no queue'})")
        return RedirectResponse(f"/groups/{quote(name, safe='')}", 303)

    # ------------------------------------------------------------------ messages
    async def messages(request: Request, v: Viewer) -> Response:
        q = request.query_params
        by = q.get("by", "")
        found: list[dict[str, Any]] = []
        note = ""
        if by:
            topic_name = (q.get("topic") or "").strip()
            broker_group = (q.get("broker_group") or "").strip() or None
            if by == "global":
                offset = form_int(q, "global_offset", low=0)
                m = await v.admin.get_message(topic_name, -1, -1, offset, broker_group)
                found = [_message_view(x) for x in m.messages]
            elif by in ("queue", "time"):
                if not topic_name:
                    raise BadInput("topic: a topic name is required")
                queue = form_int(q, "queue", low=0)
                if by == "queue":
                    offset = form_int(q, "offset", low=0)
                else:
                    ts = form_time_ms(q, "time")
                    offset = await v.admin.offset_for_time(topic_name, queue, ts)
                    note = f"the first message stored at or after {q.get('time')} is at queue offset {offset}"
                r = await v.admin.get_message(topic_name, queue, offset, -1, None)
                found = [_message_view(x) for x in r.messages]
                if not found and by == "time":
                    note = f"no message of queue {queue} was stored at or after {q.get('time')}"
            elif by == "key":
                if not topic_name:
                    raise BadInput("topic: a topic name is required")
                key = q.get("key") or ""
                if not key:
                    raise BadInput("key: a key is required")
                r = await v.admin.find_by_key(topic_name, key, MAX_FOUND, -1)
                found = [_message_view(x) for x in r.messages]
                if r.next_offset:
                    note = f"the broker stopped its walk early: older messages with this key may exist (before {r.next_offset})"
                elif not found:
                    note = f"no message of {topic_name} has the key {key!r}"
            else:
                raise BadInput("by: global, queue, key or time")
        return render(request, "messages.html", user=v.user, q=q, by=by, found=found, note=note)

    # ------------------------------------------------------------------ dead letters
    async def dlq(request: Request, v: Viewer) -> Response:
        chosen = (request.query_params.get("group") or "").strip()
        if chosen:
            return RedirectResponse(f"/dlq/{quote(chosen, safe='')}", 303)
        summaries = await v.admin.list_groups()
        n, pages = _page_of(request, len(summaries), PAGE_SIZE)
        shown = summaries[(n - 1) * PAGE_SIZE : n * PAGE_SIZE]
        return render(request, "dlq.html", user=v.user, groups=shown, page=n, pages=pages)

    async def dlq_group(request: Request, v: Viewer) -> Response:
        name = request.path_params["group"]
        validate_group(name)
        q = request.query_params
        queue = form_int(q, "queue", default=0, low=0)
        offset = form_int(q, "offset", default=0, low=0)
        page_ = await v.admin.dlq_list(name, queue, offset, PAGE_SIZE)
        letters = []
        for broker_group, d in page_.letters:
            try:
                body = render_body(base64.b64decode(d.body), 512) if d.body else None
            except (binascii.Error, ValueError):
                body = None
            letters.append({"bg": broker_group, "d": d, "body": body})
        return render(request, "dlq_group.html", user=v.user, name=name, page=page_, letters=letters,
                      cluster=v.admin.router.cluster)  # fmt: skip

    async def dlq_resend(request: Request, v: Viewer) -> Response:
        form = await console.check_csrf(request)
        name = request.path_params["group"]
        validate_group(name)
        what = str(form.get("what") or "")
        answers: list[control.DlqResendAnswer] = []
        if what == "all":
            answers.append(await v.admin.dlq_resend(name, [], True, None))
        elif what == "selected":
            chosen = [form["one"]] if form.get("one") else form.getlist("letter")
            if not chosen:
                raise BadInput("choose at least one dead letter")
            by_group: dict[str, list[int]] = {}
            for item in chosen:
                bg, _, raw = str(item).rpartition(":")
                if not raw.isdigit():
                    raise BadInput(f"letter: {str(item)[:40]!r} is not a dead letter id")
                by_group.setdefault(bg, []).append(int(raw))
            for bg, ids in by_group.items():
                answers.append(await v.admin.dlq_resend(name, ids, False, bg or None))
        else:
            raise BadInput("what: selected or all")
        resent = sum(len(a.resent) for a in answers)
        already = sum(len(a.already_resent) for a in answers)
        failed = {k: r for a in answers for k, r in a.failed.items()}
        text = f"resent {resent} dead letter(s)"
        if already:
            text += f", {already} resent before"
        if failed:
            text += "; failed: " + "; ".join(f"{k}: {r}" for k, r in list(failed.items())[:10])
        console.flash(request, text, ok=not failed)
        return RedirectResponse(f"/dlq/{quote(name, safe='')}", 303)

    return [
        Route("/", page(overview), methods=["GET"]),
        Route("/cluster", page(cluster), methods=["GET"]),
        Route("/topics", page(topics), methods=["GET"]),
        Route("/topics/create", page(create_topic), methods=["POST"]),
        Route("/topics/{name}", page(topic), methods=["GET"]),
        Route("/topics/{name}/alter", page(alter_topic), methods=["POST"]),
        Route("/topics/{name}/pause", page(pause_action("topic", True)), methods=["POST"]),
        Route("/topics/{name}/resume", page(pause_action("topic", False)), methods=["POST"]),
        Route("/topics/{name}/delete", page(confirm_delete), methods=["GET"]),
        Route("/topics/{name}/delete", page(delete_topic), methods=["POST"]),
        Route("/groups", page(groups), methods=["GET"]),
        Route("/groups/{name}", page(group), methods=["GET"]),
        Route("/groups/{name}/reset", page(reset_group), methods=["POST"]),
        Route("/groups/{name}/pause", page(pause_action("group", True)), methods=["POST"]),
        Route("/groups/{name}/resume", page(pause_action("group", False)), methods=["POST"]),
        Route("/messages", page(messages), methods=["GET"]),
        Route("/dlq", page(dlq), methods=["GET"]),
        Route("/dlq/{group}", page(dlq_group), methods=["GET"]),
        Route("/dlq/{group}/resend", page(dlq_resend), methods=["POST"]),
    ]

