"""Retry and dead letters: SEND_BACK, DLQ_LIST, DLQ_RESEND.

SEND_BACK moves a failed message's copy to the group's retry topic (delayed, the
delay ladder of docs/consumer.md, "Retry and dead letters") or, past the consumer's maximum, to its
dead-letter topic: the broker reads the message itself, so the consumer sends only
where it read it. DLQ_LIST answers one page of dead letters; DLQ_RESEND resends
letters at most once each (:mod:`equeue.broker.storage.deadletters`).

An ephemeral group (``<name>#ephemeral``) has no retry or dead-letter topic (a
persistent topic would outlive it): its SEND_BACK is refused with EPHEMERAL_GROUP,
and it has no dead letters to list.
"""

from __future__ import annotations

import base64
import time

import attrs

from equeue import control, wire
from equeue.broker.handlers.context import RequestContext
from equeue.broker.handlers.directory import TopicDirectory
from equeue.broker.handlers.limits import Limits, check_offset
from equeue.broker.handlers.writes import Submit
from equeue.broker.storage import BatchHit, ProduceOp, StoreReader
from equeue.broker.storage.deadletters import Letter, ResendOp, ResentMarksOp
from equeue.config import DEFAULTS, SYSTEM_PROPERTY_ROOM, retry_delay
from equeue.errors import (
    BadRequest,
    CorruptRecord,
    DelayTooLong,
    EphemeralGroup,
    MessageNotFound,
    TopicNotFound,
)
from equeue.models import (
    PROP_ORIGIN_GLOBAL,
    PROP_ORIGIN_OFFSET,
    PROP_ORIGIN_QUEUE,
    PROP_ORIGIN_TOPIC,
    PROP_RETRY_GROUP,
    SYSTEM_PROPERTY_PREFIX,
    Message,
)
from equeue.names import dlq_topic, is_ephemeral, retry_topic, validate_group
from equeue.protocol import PullStatus
from equeue.wire import batches

__all__ = ["DeadLetterHandlers"]

#: property of a dead letter salvaged from a poison record (one that does not decode):
#: why it did not; its body is the stored record's bytes as they were
PROP_POISON = "%POISON"
#: the stored record's size, when the salvaged body had to be cut to the message limit
PROP_POISON_BYTES = "%POISON_BYTES"

#: the default delay ladder (ms), when a SEND_BACK names none
DEFAULT_DELAYS_MS = tuple(int(d * 1000) for d in DEFAULTS.retry_delays)
#: most letters per DLQ_LIST page, and per DLQ_RESEND transaction
MAX_PAGE = 1000


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _letter(m: Message, resent: bool, max_bytes: int) -> control.DeadLetter:
    """One letter of a DLQ_LIST page. A letter whose body (base64) and properties would
    take over ``max_bytes`` of the page's JSON is listed without them, flagged
    ``body_omitted`` (it would not fit in a frame): GET_MESSAGE returns it whole."""
    props = m.properties
    omit = len(m.body) * 4 // 3 + sum(len(k) + len(v) for k, v in props.items()) > max_bytes
    body = "" if omit else base64.b64encode(m.body).decode("ascii")
    if omit:
        props = {}
    return control.DeadLetter(
        m.global_offset, m.queue_id, m.queue_offset, m.origin_topic,
        _int(props.get(PROP_ORIGIN_QUEUE), -1), _int(props.get(PROP_ORIGIN_OFFSET), -1),
        m.key, m.tags, m.reconsume_times, m.timestamp, props, body, resent, omit,
    )  # fmt: skip


class DeadLetterHandlers:
    def __init__(self, topics: TopicDirectory, store: StoreReader, submit: Submit, limits: Limits) -> None:
        self._topics = topics
        self._store = store
        self._submit = submit
        self._max_body = limits.max_message_bytes
        self._max_delay_ms = limits.max_delay_ms
        #: record bytes per DLQ_LIST page (base64 and JSON add about half again)
        self._page_bytes = max(1, (limits.max_frame - 4096) // 2)

    # ------------------------------------------------------------------ SEND_BACK
    async def send_back(self, req: control.SendBack, ctx: RequestContext) -> control.SendBackAnswer:
        validate_group(req.group)
        if is_ephemeral(req.group):
            raise EphemeralGroup(
                f"group {req.group!r} is ephemeral: it has no retry or dead-letter topic "
                "(its consumers retry a failed message in place, then drop it)"
            )
        if req.reconsume_times < 0 or req.max_reconsume_times < 0 or any(d < 0 for d in req.retry_delays_ms):
            raise BadRequest("reconsume_times, max_reconsume_times and retry delays must be >= 0")
        if any(d > self._max_delay_ms for d in req.retry_delays_ms):  # (a u64 due time overflowed)
            raise DelayTooLong(f"retry delays must be at most the broker's maximum delay, {self._max_delay_ms} ms")
        info = await self._topics.require_queue(req.topic, req.queue_id)  # NotOwner elsewhere
        check_offset("queue_offset", req.queue_offset)
        # a record that does not decode comes back too (its position checked): salvaged below
        found = self._store.get_queue_offset(info, req.queue_id, req.queue_offset, salvage=True)
        if found is None:
            raise MessageNotFound(f"no message at {req.topic}/{req.queue_id} offset {req.queue_offset}")
        try:
            msg = found.message(info.name)
        except CorruptRecord as exc:  # a poison record: salvage it, straight to the DLQ
            msg = self._salvage(info.name, req.queue_id, req.queue_offset, found, exc)
            req = attrs.evolve(req, max_reconsume_times=0)
        props = dict(msg.properties)
        props.setdefault(PROP_ORIGIN_TOPIC, msg.topic)
        props.setdefault(PROP_ORIGIN_QUEUE, str(msg.queue_id))
        props.setdefault(PROP_ORIGIN_OFFSET, str(msg.queue_offset))
        props.setdefault(PROP_ORIGIN_GLOBAL, str(msg.global_offset))
        props[PROP_RETRY_GROUP] = req.group
        rc = req.reconsume_times
        dead = rc >= req.max_reconsume_times
        if dead:
            target, deliver_at = dlq_topic(req.group), 0
            copy = Message(msg.body, msg.key, msg.tags, props, reconsume_times=rc)
        else:
            delays = req.retry_delays_ms or DEFAULT_DELAYS_MS
            target = retry_topic(req.group)
            deliver_at = time.time_ns() // 1_000_000 + int(retry_delay(delays, rc))
            copy = Message(msg.body, msg.key, msg.tags, props, deliver_at=deliver_at, reconsume_times=rc + 1)
        origin_queue = _int(props.get(PROP_ORIGIN_QUEUE), 0)
        cluster = self._topics.cluster
        if cluster is not None:  # a queue of the retry/DLQ topic this group owns (docs/cluster.md)
            dest, qid = await cluster.own_queue(target, origin_queue)
        else:
            dest = await self._topics.require(target, auto_create=True)
            qid = origin_queue % dest.queues
        await self._submit(
            # the copy may exceed the limit by the properties added here (BrokerConfig
            # keeps that room in every answer, so it is still served)
            ProduceOp(
                dest,
                qid,
                [wire.encode_entry(copy)],
                max_body=self._max_body + SYSTEM_PROPERTY_ROOM,
                max_delay_ms=self._max_delay_ms,
            )
        )
        return control.SendBackAnswer(target, qid, dead, deliver_at)

    def _salvage(
        self, topic: str, queue_id: int, queue_offset: int, found: BatchHit, exc: CorruptRecord
    ) -> Message:
        """A dead letter for a stored record that does not decode: its body is the
        record's stored bytes (:meth:`BatchHit.raw_record`: the record, or the stored
        batch holding it when its records cannot be told apart), cut to the message
        limit; ``%POISON`` says why."""
        raw = found.raw_record()
        room = self._max_body  # the properties below take the system properties' room
        props = {PROP_POISON: str(exc)[:300]}
        if len(raw) > room:
            props[PROP_POISON_BYTES] = str(len(raw))
        return Message(raw[:room], None, None, props, 0, topic, queue_id, queue_offset, found.global_offset)

    # ------------------------------------------------------------------ DLQ_LIST
    def _letters(self, group: str) -> control.TopicInfo | None:
        validate_group(group)
        return self._store.topics.get(dlq_topic(group))

    def _page(
        self, info: control.TopicInfo, queue_id: int, offset: int, limit: int
    ) -> tuple[list[Message], int, int, bool]:
        """Up to ``limit`` letters from the cursor on; (letters, next queue, next offset, done)."""
        out: list[Message] = []
        budget = self._page_bytes
        q, off = max(0, queue_id), max(0, offset)
        while q < info.queues:
            qs = self._store.queue_state(info.topic_id, q)
            off = max(off, qs.min_offset)
            if off < qs.next_offset:
                msgs, r = self._store.read_messages(info, q, off, limit - len(out), budget)
                if r.status is PullStatus.FOUND:
                    for m in msgs:
                        size = _letter_size(m)
                        if out and (size > budget or len(out) >= limit):  # the rest: next page
                            return out, q, m.queue_offset, False
                        out.append(m)
                        budget -= size
                    off = r.next_offset
                    if len(out) >= limit or budget <= 0:
                        return out, q, off, q == info.queues - 1 and off >= qs.next_offset
                    continue
                if r.status is PullStatus.OFFSET_TOO_SMALL:
                    off = r.min_offset
                    continue
            q, off = q + 1, 0
        return out, q, 0, True

    async def list_letters(self, req: control.DlqList, ctx: RequestContext) -> control.DlqPage:
        info = self._letters(req.group)
        if info is None:
            return control.DlqPage([], 0, 0, True)  # no dead letters yet
        limit = max(1, min(req.limit, MAX_PAGE))
        check_offset("offset", max(0, req.offset))
        msgs, nq, noff, done = self._page(info, req.queue_id, req.offset, limit)
        resent: set[int] = await self._submit(ResentMarksOp(req.group, [m.global_offset for m in msgs]))
        return control.DlqPage([_letter(m, m.global_offset in resent, self._page_bytes) for m in msgs], nq, noff, done)

    # ------------------------------------------------------------------ DLQ_RESEND
    async def resend(self, req: control.DlqResend, ctx: RequestContext) -> control.DlqResendAnswer:
        info = self._letters(req.group)
        if info is None:
            raise TopicNotFound(f"group {req.group!r} has no dead letters ({dlq_topic(req.group)} does not exist)")
        if not req.ids and not req.all_letters:
            raise BadRequest("name the letters to resend (ids) or ask for all of them")
        answer = control.DlqResendAnswer([], [], {})
        if req.ids:
            msgs = []
            for i in dict.fromkeys(req.ids):
                check_offset("letter id", i)
                hit = self._store.get_global(i)
                if hit is None or _topic_id_of(hit) != info.topic_id:
                    raise MessageNotFound(f"no dead letter {i} in {info.name} (see: equeue dlq list {req.group})")
                msgs.append(hit.message(info.name))
            for start in range(0, len(msgs), MAX_PAGE):
                await self._resend(req.group, msgs[start : start + MAX_PAGE], answer)
        if req.all_letters:
            q, off, done = 0, 0, False
            while not done:
                msgs, q, off, done = self._page(info, q, off, MAX_PAGE)
                await self._resend(req.group, msgs, answer)
        return answer

    def _first_retained(self, group: str) -> int:
        """A global offset below every retained letter of the group (its queues'
        first records; the store's next offset when none is retained)."""
        store = self._store
        info = store.topics.get(dlq_topic(group))
        first = store.next_global
        if info is None:
            return first
        for q in range(info.queues):
            qs = store.queue_state(info.topic_id, q)
            if qs.min_offset < qs.next_offset:
                hit = store.get_queue_offset(info, q, qs.min_offset)
                if hit is None:  # its first record is being removed right now: keep every record
                    return 0
                first = min(first, hit.global_offset)
        return first

    def _foreign_owner(self, origin: str, m: Message) -> str | None:
        """Cluster mode: the group owning the letter's origin queue when it is not
        this broker's (None: this group owns it, or the topic is gone here, which
        ResendOp reports)."""
        cluster = self._topics.cluster
        info = self._store.topics.get(origin)
        if cluster is None or info is None or info.queues <= 0:
            return None
        q = _int(m.properties.get(PROP_ORIGIN_QUEUE), 0) % info.queues
        if q in cluster.owned.get(origin, frozenset()):
            return None
        return cluster.owner_of(origin, q) or "?"

    async def _resend(self, group: str, msgs: list[Message], answer: control.DlqResendAnswer) -> None:
        letters = []
        cluster = self._topics.cluster
        for m in msgs:
            origin = m.properties.get(PROP_ORIGIN_TOPIC)
            if origin is None:
                answer.failed[m.global_offset] = "no origin topic recorded"
                continue
            if cluster is not None and (owner := self._foreign_owner(origin, m)) is not None:
                answer.failed[m.global_offset] = (
                    f"its origin queue is owned by broker group {owner!r}: resend it there (NOT_OWNER)"
                )
                continue
            props = {k: v for k, v in m.properties.items() if not k.startswith(SYSTEM_PROPERTY_PREFIX)}
            entry = wire.encode_entry(Message(m.body, m.key, m.tags, props))
            letters.append(Letter(m.global_offset, origin, _int(m.properties.get(PROP_ORIGIN_QUEUE), 0), entry))
        if letters:
            resent, already, failed = await self._submit(ResendOp(group, letters, self._first_retained(group)))
            answer.resent.extend(resent)
            answer.already_resent.extend(already)
            answer.failed.update(failed)


def _letter_size(m: Message) -> int:
    """About the bytes a letter takes in a page (its body, key, tags and properties)."""
    return len(m.body) + len(m.key or "") + len(m.tags or "") + sum(len(k) + len(v) for k, v in m.properties.items()) + 32


def _topic_id_of(hit: BatchHit) -> int:
    """The topic id in a hit's batch header (-1: a damaged header)."""
    try:
        return batches.stored_head(hit.value).topic_id
    except CorruptRecord:
        return -1
