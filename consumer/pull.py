"""The pull loop of one queue: long-poll the broker, hand batches to the dispatcher,
pause while too much is outstanding (flow control) or while the application holds the
queue (:meth:`equeue.consumer.AsyncConsumer.pause`), quarantine corrupt records.

One :class:`PullLoop` serves every queue of a member; :meth:`PullLoop.run` runs for
one :class:`~equeue.consumer.process_queue.ProcessQueue` until the queue is stopped or its lease
is lost (the returned :class:`PullEnd` says which).

Each queue is pulled from the broker group that owns it (its leader): the loop
resolves the owner's connection once (:meth:`equeue.client.routing.Router.client_for`) and
keeps it until NOT_OWNER, NOT_LEADER, QUEUE_UNAVAILABLE or a broken connection, after
which it waits for the routes to name another endpoint (a new owner or leader:
:meth:`equeue.client.routing.Router.settle`, backoff at most) and resolves again. A queue
whose group is down or failing over thus waits alone; the other queues' loops go on.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from equeue import wire
from equeue.client.retry import DEFAULT_POLICY
from equeue.client.routing import ROUTING_ERRORS, Endpoint
from equeue.consumer.options import ConsumerOptions
from equeue.consumer.process_queue import ProcessQueue
from equeue.consumer.sendback import SendBackResult
from equeue.consumer.stats import Counters
from equeue.errors import (
    BadRequest,
    ConnectionBroken,
    CorruptRecord,
    EQueueError,
    NotQueueOwner,
    QueueNotFound,
    TopicNotFound,
)
from equeue.logs import RateLimitedLog
from equeue.models import Message
from equeue.protocol import PullStatus, RequestCode

log = logging.getLogger("equeue.consumer")

__all__ = ["MAX_PULL_BYTES", "PullEnd", "PullLoop"]

MAX_PULL_BYTES = 4 << 20
#: the most a queue keeps of a pull answer past what it delivered (the decompressed
#: records of the batch the answer stopped inside, and the later batches as sent): a
#: larger rest (a big compressed batch) is dropped, and the next pull fetches it again
MAX_KEPT_BYTES = 1 << 20
#: seconds between two logs of the same kind for one queue (corrupt records, failing pulls)
LOG_INTERVAL = 10.0


class Requester(Protocol):
    """The client call a pull makes (:meth:`equeue.client.async_client.AsyncClient.request`)."""

    def request(self, code: int, payload: bytes) -> Awaitable[bytes]: ...


class PullEnd(enum.Enum):
    """Why a pull loop ended."""

    STOPPED = "stopped"
    #: the broker says this member no longer holds the queue (commit nothing)
    LEASE_LOST = "lease lost"


@attrs.frozen
class PullLoop:
    """What the pull loops need: the owner's connection of a queue and the route
    refresh, the options, the member's identity (empty in broadcast mode: no lease),
    the counters, where a queue starts and where pulled messages go."""

    client_for: Callable[[str, int], Awaitable[Requester]]
    #: the queue's current endpoint, and the wait after a routing error
    #: (:meth:`equeue.client.routing.Router.endpoint`, :meth:`~equeue.client.routing.Router.settle`)
    endpoint: Callable[[str, int], Endpoint]
    settle: Callable[[str, int, Endpoint, float], Awaitable[None]]
    options: ConsumerOptions
    #: the group named in pulls (an operator's pause of it holds them); "" for none
    group: str
    #: the member named in pulls (the broker checks it holds the queue's lease); "" for none
    consumer_id: str
    counters: Counters
    start_offset: Callable[[ProcessQueue], Awaitable[int]]
    deliver: Callable[[ProcessQueue, list[Message], int], None]
    logs: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log, LOG_INTERVAL, trio.current_time))
    #: sends a poison record (topic, queue, queue offset) to the group's dead-letter
    #: topic (:meth:`equeue.consumer.sendback.SendBack.dead_letter`); None (broadcast mode):
    #: a poison record is only skipped
    dead_letter: Callable[[tuple[str, int, int]], Awaitable[SendBackResult]] | None = None
    #: a heartbeat round now, waited for (:meth:`equeue.consumer.rebalance.Coordinator.heartbeat_now`):
    #: after NOT_QUEUE_OWNER the broker may be a group's new leader that has not seen
    #: this member yet; the pull is made once more before the queue counts as lost
    regain: Callable[[], Awaitable[None]] | None = None
    #: a pull answered after a routing error: the lease is confirmed at the queue's
    #: (new) leader, its buffered messages may be handed out again
    #: (:meth:`equeue.consumer.dispatch.Dispatcher.resume`)
    resume: Callable[[ProcessQueue], None] | None = None
    #: a queue was read to its end (``q.at_end`` became true): ``stop_at_end``'s check
    on_end: Callable[[], None] | None = None

    async def run(self, q: ProcessQueue) -> PullEnd:
        """Long-poll ``q`` until it is stopped: resolve the start offset, then pull,
        deliver, pause while the queue holds too much (flow control) or is held by the
        application (an answer that comes back while held is dropped, not delivered:
        the window stays, and the same messages are pulled again once released).

        Transient errors are retried with backoff; a corrupt record is quarantined
        (:meth:`_quarantine`)."""
        with q.scope:
            await self._start(q)
            return await self._pull(q)
        return PullEnd.STOPPED

    async def _start(self, q: ProcessQueue) -> None:
        attempt = 0
        while not q.started:
            try:
                start = await self.start_offset(q)
            except EQueueError as exc:
                attempt += 1
                log.warning("queue %s: cannot resolve start offset (%s); retrying", q.key, exc)
                await trio.sleep(DEFAULT_POLICY.delay(attempt))
                continue
            if q.started:  # the application's seek placed it meanwhile
                break
            q.window.jump(start)
            q.started = True

    async def _pull(self, q: ProcessQueue) -> PullEnd:
        o = self.options
        hold_ms = int(o.pull_hold * 1000)
        tags = "" if q.retry else (o.tags or "")
        deliver, counters = self.deliver, self.counters
        client: Requester | None = None
        endpoint: Endpoint = None
        verify = o.verify_checksums
        # a consumer that checks every record itself spares the broker its recheck
        # whole batches: the records of the last batch past the n asked for come back
        # too (they cost nothing more to send) and are kept for the next pull
        flags = wire.PULL_BATCHES | wire.PULL_WHOLE_BATCHES | (wire.PULL_CLIENT_VERIFIES if verify else 0)
        max_messages, max_bytes = o.max_buffered_messages, o.max_buffered_bytes
        decode, decode_rest = wire.decode_pull_answer, wire.decode_pull_rest
        failures = overflows = 0
        regained = False  # NOT_QUEUE_OWNER once: a heartbeat round, then one more pull
        #: after this consumer's decoder found a corrupt record in a batch: pull that
        #: many records one at a time, to find which one (and skip only it)
        single = 0
        while not q.stopped:
            if q.held:  # the application paused this queue (AsyncConsumer.pause)
                await q.pause()
                continue
            if q.full(max_messages, max_bytes):
                counters.paused += 1
                await q.pause()
                continue
            offset = q.window.end
            n = 1 if single else min(q.batch, max_messages - len(q.window))
            # stop_at_end: no long-poll hold until the queue first reached its end (an
            # empty queue answers at once)
            hold = 0 if o.stop_at_end and not q.at_end else hold_ms
            rest, q.kept = q.kept, None
            if rest is not None and rest.start == offset and not single and not q.suspended:
                # the last answer's undelivered records: no round trip (a record that
                # does not decode sends the queue to the broker, one record at a time)
                try:
                    status, lo, hi, nxt, msgs, kept = decode_rest(rest, n, verify)
                except CorruptRecord:
                    single = n
                    continue
                except EQueueError as exc:
                    self.logs.log(logging.ERROR, f"pull {q.key}", "queue %s: bad pull answer: %s", q.key, exc)
                    continue
                counters.kept_pulls += 1
            else:
                rest = None
                req = wire.PullRequest(q.topic, q.queue_id, offset, n, MAX_PULL_BYTES, hold, self.group,
                                       self.consumer_id, tags, flags)  # fmt: skip
                epoch = q.epoch
                counters.pulls += 1
                try:
                    with trio.CancelScope() as pulling:
                        q.pull_scope = pulling
                        if client is None:
                            endpoint = self.endpoint(q.topic, q.queue_id)
                            client = await self.client_for(q.topic, q.queue_id)
                        payload = await client.request(RequestCode.PULL, req.encode())
                    q.pull_scope = None
                    if pulling.cancelled_caught or q.epoch != epoch:  # a seek: pull from its offset
                        continue
                except NotQueueOwner:
                    if regained or self.regain is None:
                        return PullEnd.LEASE_LOST
                    regained = True
                    await self.regain()
                    continue
                except ROUTING_ERRORS as exc:  # the owner moved or is down: refresh, pause this queue
                    client = None
                    if self.consumer_id:  # the lease is unconfirmed until a pull is answered again
                        q.suspended = True
                    failures += 1
                    level = logging.DEBUG if isinstance(exc, ConnectionBroken) else logging.WARNING
                    self.logs.log(level, f"route {q.key}", "queue %s: %s; refreshing routes", q.key, exc)
                    await self.settle(q.topic, q.queue_id, endpoint, DEFAULT_POLICY.delay(failures))
                    continue
                except CorruptRecord as exc:  # the broker's: the first record it would return
                    if not await self._quarantine(q, offset, exc):
                        failures += 1
                        await trio.sleep(DEFAULT_POLICY.delay(failures))
                    continue
                except (TopicNotFound, QueueNotFound) as exc:
                    log.warning("queue %s: %s", q.key, exc)
                    await trio.sleep(o.rebalance_interval)
                    continue
                except EQueueError as exc:
                    if isinstance(exc, BadRequest) and flags & wire.PULL_WHOLE_BATCHES:
                        # a broker from before whole batches refuses the flag: pull as before
                        flags &= ~wire.PULL_WHOLE_BATCHES
                        log.info("queue %s: the broker refused whole batches (%s); pulling without", q.key, exc)
                        continue
                    failures += 1
                    if not exc.transient:
                        self.logs.log(logging.ERROR, f"pull {q.key}", "queue %s: pull failed: %s", q.key, exc)
                    await trio.sleep(DEFAULT_POLICY.delay(failures))
                    continue
                try:
                    # at most the n messages asked for, though whole batches come back: flow
                    # control holds, and one record at a time (after a batch did not decode)
                    # decodes only that record, so a poison record costs no other of its batch
                    status, lo, hi, nxt, msgs, kept = decode(q.topic, payload, offset, verify, None, n)
                except CorruptRecord as exc:  # this consumer's check: some record of the batch
                    if n == 1:
                        if await self._quarantine(q, offset, exc):
                            single = 0
                        else:
                            failures += 1
                            await trio.sleep(DEFAULT_POLICY.delay(failures))
                    else:
                        single = n
                    continue
                except EQueueError as exc:  # a malformed answer: pull it again
                    failures += 1
                    self.logs.log(logging.ERROR, f"pull {q.key}", "queue %s: bad pull answer: %s", q.key, exc)
                    await trio.sleep(DEFAULT_POLICY.delay(failures))
                    continue
            failures = 0
            regained = False
            if q.suspended and self.resume is not None:
                self.resume(q)
            if q.stopped:
                break
            if q.held:  # paused while the pull was out: drop the answer, pull it again on resume
                continue
            if single:
                single -= 1
            if kept is not None and kept_size(kept) <= MAX_KEPT_BYTES:
                q.kept = kept
            if msgs:
                deliver(q, msgs, nxt)
                if len(msgs) >= n:
                    q.batch = min(q.batch * 2, o.max_pull_batch)
                elif rest is None:  # (a kept rest that ran out is not the queue's end)
                    q.batch = o.pull_batch
                    # Caught up (a short answer): let the worker woken by deliver run
                    # the handler first -- it runs in the next scheduling batch; two
                    # checkpoints put the next pull behind it whatever order trio
                    # picks in that batch. The pull would park at the broker anyway.
                    await trio.lowlevel.checkpoint()
                    await trio.lowlevel.checkpoint()
                if rest is not None:
                    # served without a round trip: let the workers woken by deliver
                    # take these before the next rest is decoded
                    await trio.lowlevel.checkpoint()
            elif status is PullStatus.NO_NEW_MESSAGE or status is PullStatus.NO_MATCHED_MSG or (
                status is PullStatus.FOUND and nxt > offset
            ):
                # past what a tag filter or a skip left out (FOUND: a batch whose every
                # record from the offset is masked out); NO_MATCHED_MSG: scan on
                q.window.advance(nxt)
            elif status is PullStatus.OFFSET_TOO_SMALL:
                log.warning(
                    "queue %s: offset %d is below the lowest retained offset %d (messages lost "
                    "to retention); moving to %d", q.key, offset, lo, lo,
                )  # fmt: skip
                q.window.jump(lo)
            elif status is PullStatus.OFFSET_OVERFLOW:
                # past the end: usually a topic recreated or data lost; retry a few times
                # first, so a momentarily stale answer never rewinds (and duplicates)
                overflows += 1
                if overflows < 3:
                    await trio.sleep(0.05 * overflows)
                    continue
                log.warning("queue %s: offset %d is past the end %d; moving to %d", q.key, offset, hi, hi)
                q.window.jump(hi)
            if status is not PullStatus.OFFSET_OVERFLOW:
                overflows = 0
            at_end = status is PullStatus.NO_NEW_MESSAGE or (
                (status is PullStatus.FOUND or status is PullStatus.NO_MATCHED_MSG) and nxt >= hi
            )
            if at_end is not q.at_end:
                q.at_end = at_end
                if at_end and self.on_end is not None:
                    self.on_end()
        return PullEnd.STOPPED

    async def _quarantine(self, q: ProcessQueue, offset: int, exc: CorruptRecord) -> bool:
        """Skip the poison record at ``offset`` (one that fails its checksum or does not
        decode), so the queue never stalls on it: hand it to the group's dead-letter
        topic (clustering mode), log it (rate-limited), count it, and move past it
        like past a message a tag filter skipped (docs/consumer.md).

        Returns False (nothing skipped) when the broker could not take it for a reason
        of its own: the caller pulls it again after a pause and retries."""
        where = (q.topic, q.queue_id, offset)
        fate = "skipped"
        if self.dead_letter is not None:
            result = await self.dead_letter(where)
            if result is SendBackResult.UNSENT:
                self.logs.log(
                    logging.WARNING, f"poison {q.key}",
                    "queue %s: could not dead-letter the poison record at offset %d; trying again", q.key, offset,
                )  # fmt: skip
                return False
            fate = "moved to the dead-letter topic" if result is SendBackResult.SENT else "dropped"
        if q.stopped or q.window.end != offset:  # revoked (or moved) meanwhile: not ours to skip
            return True
        self.counters.quarantined += 1
        self.logs.log(
            logging.ERROR, f"corrupt {q.key}",
            "queue %s: record at offset %d cannot be served (%s); skipping it (%s)", q.key, offset, exc, fate,
        )  # fmt: skip
        q.window.advance(offset + 1)
        return True


def kept_size(rest: wire.PullRest) -> int:
    """The bytes ``rest`` holds: its partly delivered batch's records (decompressed)
    and its later batches as sent."""
    return (len(rest.batch.records) if rest.batch is not None else 0) + sum(len(v) for _g, _m, v in rest.items)
