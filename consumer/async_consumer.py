"""``AsyncConsumer``: the consumer core (trio). :class:`equeue.consumer.Consumer` forwards to it.

This module is the member's lifetime (``async with``) and its public calls; the parts
live in one module each and get only the collaborators they use::

    rebalance.Coordinator ──start/revoke──▶ assignments.Assignments ──▶ commit.Committer
                                                 │ one task per queue
                                                 ▼
    pull.PullLoop ──deliver──▶ dispatch.Dispatcher ──take (chunks)──▶ workers.Workers ──▶ invoke (handler)
        ▲                                                              │
        └── flow control (process.ProcessQueue) ◀──── finish ──────────┘──▶ sendback.SendBack

Membership and rebalance (:mod:`equeue.consumer.rebalance`), who holds which queue
(:mod:`equeue.consumer.assignments`), one pull loop per owned queue (:mod:`equeue.consumer.pull`),
the ready line (:mod:`equeue.consumer.dispatch`), the workers of :meth:`AsyncConsumer.run`
(:mod:`equeue.consumer.workers`) running the handler inline or in threads
(:mod:`equeue.consumer.invoke`), failed messages sent back (:mod:`equeue.consumer.sendback`),
offsets (:mod:`equeue.consumer.commit`), counters (:mod:`equeue.consumer.stats`).

Routing (docs/cluster.md): the member's :class:`equeue.client.routing.Router` knows which
broker group owns each queue. Heartbeats fan out to every group of the subscribed
topics (:mod:`equeue.consumer.rebalance`); pulls, commits, offset queries, releases and
send-backs go to the queue's owner (:mod:`equeue.consumer.routed`); leaving is announced to
every group. ``brokers`` may list any brokers of a cluster.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from equeue.client.async_client import AsyncClient
from equeue.client.lifetime import StackOwner
from equeue.client.retry import RetryPolicy
from equeue.client.routing import Router
from equeue.consumer.assignments import Assignments
from equeue.consumer.broadcast_store import BroadcastOffsetStore, default_state_dir
from equeue.consumer.commit import Committer
from equeue.consumer.dispatch import Dispatcher, Item
from equeue.consumer.ending import EndWatch, watch_idle
from equeue.consumer.invoke import ChunkHandler, Handler, make_invoker
from equeue.consumer.options import ConsumeMode, ConsumerOptions, StartFrom
from equeue.consumer.process_queue import Lease
from equeue.consumer.pull import LOG_INTERVAL, PullLoop
from equeue.consumer.rebalance import Coordinator
from equeue.consumer.routed import RoutedCalls
from equeue.consumer.sendback import SendBack
from equeue.consumer.stats import ConsumerStatistics, Counters
from equeue.consumer.workers import Workers
from equeue.errors import ClientClosed, ConfigError, EQueueError, SerializationError
from equeue.logs import RateLimitedLog
from equeue.models import Message
from equeue.names import is_ephemeral, validate_group, validate_topic
from equeue.protocol import PushCode
from equeue.serde import deserialize_into

log = logging.getLogger("equeue.consumer")

__all__ = ["AsyncConsumer", "ConsumerStatistics", "Iteration", "queue_list"]

#: seconds between the router's own route refreshes (each rebalance refreshes too)
ROUTE_REFRESH = 30.0

T = TypeVar("T")


def queue_list(queues: Iterable[tuple[str, int]]) -> list[Lease]:
    """``queues`` as a list of ``(topic, queue_id)`` tuples; TypeError for anything else
    (a lone tuple too: it is one queue, not a collection of them)."""
    if isinstance(queues, (str, bytes)) or not isinstance(queues, Iterable):
        raise TypeError(f"queues must be a collection of (topic, queue_id) tuples, got {queues!r}")
    if isinstance(queues, tuple) and len(queues) == 2 and isinstance(queues[0], str):
        raise TypeError(f"queues must be a collection of (topic, queue_id) tuples: pass [{queues!r}]")
    out: list[Lease] = []
    for item in queues:
        if not (
            isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], int) and not isinstance(item[1], bool)
        ):  # fmt: skip
            raise TypeError(f"a queue is a (topic, queue_id) tuple, got {item!r}")
        out.append((item[0], item[1]))
    return out


@asynccontextmanager
async def _task_nursery() -> AsyncGenerator[trio.Nursery, None]:
    """A nursery for an object's tasks, entered in the task that enters the object:
    the body of its ``async with`` runs inside the nursery's cancel scope, so the
    nursery absorbs a Cancelled of its own scope (the object cancelling itself), while
    any other exception of the body is not handed to it (a trio nursery would wrap it
    in an ExceptionGroup) but raised unchanged once the nursery closed."""
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except trio.Cancelled:
            raise
        except BaseException as exc:  # re-raised below, after the nursery
            body_error = exc
    if body_error is not None:
        raise body_error


#: default of :meth:`AsyncConsumer.poll`'s ``max_messages`` (Kafka's ``max.poll.records``)
MAX_POLL = 500

#: :attr:`AsyncConsumer._consuming`'s values: how the application takes messages
RUN, ITERATION, POLL = "run", "iteration", "poll"


def _busy(how: str, wanted: str) -> RuntimeError:
    if how == POLL or wanted == POLL:
        return RuntimeError(
            f"this consumer is consumed with {how}{'()' if how != ITERATION else ''}: poll() cannot be mixed with "
            "run() or iteration on one consumer (polled messages are done only at the next poll, "
            "commit or close); use one consumer per way of consuming"
        )
    return RuntimeError(f"this consumer is already consuming ({how})")


def _on_loop(token: trio.lowlevel.TrioToken) -> bool:
    """True when called from the trio run that ``token`` belongs to."""
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:  # not in any trio run: another thread
        return False


class Iteration:
    """One iteration over a consumer's messages, in batches: what ``async for`` on
    :class:`AsyncConsumer` uses, and what a front driving the core from another thread
    (the blocking ``Consumer``, the asyncio front) uses through its loop.

    Made by :meth:`AsyncConsumer.iteration`, which marks the consumer as consumed by
    iteration until :meth:`end`. Each :meth:`next_batch` says how many messages of the
    batch handed out before were done (the rest go back first in line) and waits for
    the next batch. :meth:`next_batch` and :meth:`end` run on the consumer's loop;
    :attr:`live` may be read from any thread."""

    __slots__ = ("_consumer", "_current", "_ended")

    def __init__(self, consumer: AsyncConsumer) -> None:
        self._consumer = consumer
        #: the batch handed out last (its queue, its chunk), not settled yet
        self._current: Item | None = None
        self._ended = False

    @property
    def live(self) -> bool:
        """Whether the rest of the batch handed out last may still be handed on: False
        once the consumer stops, or once that batch's queue was stopped (revoked, lost,
        no longer assigned, sought). A front stops yielding from the batch then; what it
        did not yield is not done and goes back at the next :meth:`next_batch` or
        :meth:`end`. A plain read of two flags: callable from any thread."""
        if self._consumer.dispatcher.stopping:
            return False
        cur = self._current
        return cur is None or not cur[0].stopped

    async def next_batch(self, done: int, limit: int) -> list[Message] | None:
        """The first ``done`` messages of the batch handed out last are done (the rest
        go back first in line); wait for the next batch of up to ``limit`` messages of
        one queue, or None once the consumer stopped. One loop hand-off per batch for a
        front on another thread.

        With deserializers, each message is deserialized here; a message one fails on
        is handed out all the same, its ``value``/``key_value`` raising the
        SerializationError (iteration has no retry path: the loop body decides).
        Raises RuntimeError once :meth:`end` was called."""
        if self._ended:
            raise RuntimeError("this iteration has ended: start another with iteration()")
        self._settle(done)
        item = await self._consumer.dispatcher.next_batch(limit)
        if item is None:
            return None
        self._current = item
        self._consumer._deserialize(item[1])
        return item[1]

    def end(self, done: int = 0) -> None:
        """End the iteration without asking for another batch: the first ``done``
        messages of the batch handed out last are done, the rest (the message the loop
        ended on among them) go back first in line (a later iteration, or a restart,
        redelivers them). The consumer may then be consumed again. Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._settle(done)
        self._consumer._consuming = None

    def _settle(self, done: int) -> None:
        cur, self._current = self._current, None
        if cur is not None:
            self._consumer.dispatcher.settle(cur, done)


class AsyncConsumer(StackOwner):
    """A member of a consumer group (trio). See docs/consumer.md.

    Rebalance listeners are options: ``on_assigned``, ``on_revoked``, ``on_lost``, each
    called with a set of ``(topic, queue_id)`` tuples, sync (on the loop) or async
    (awaited in a task of the consumer); see docs/consumer.md, "Rebalance listeners".

    ``async with AsyncConsumer(brokers, group, topics, ...) as c: await c.run(handler)``
    or ``async for msg in c: ...`` or ``await c.poll()``. No topics makes a consumer
    for manual assignment (:meth:`assign`): no membership, no rebalance, no lease; with
    ``group=None`` no commit either, with a group its queues start at the group's
    committed offsets and commit to it. Raises ConfigError for invalid arguments;
    entering raises ConnectionBroken when no broker is reachable.
    """

    def __init__(
        self,
        brokers: str | Sequence[str],
        group: str | None,
        topics: str | Sequence[str] = (),
        *,
        mode: ConsumeMode | str = ConsumeMode.CLUSTERING,
        start_from: StartFrom | str | dt.datetime = StartFrom.LATEST,
        tags: str | None = None,
        orderly: bool = False,
        concurrency: int = 16,
        allocation: Any = "average",
        **options: Any,
    ) -> None:
        names = [topics] if isinstance(topics, str) else list(topics)
        #: no topics: manual assignment (:meth:`assign`), with or without a group
        self.manual = not names
        self.group = None if group is None else validate_group(group)
        if group is None and names:
            raise ConfigError("a consumer without a group subscribes to no topic: give it its queues with assign()")
        self.topics = [validate_topic(t, allow_internal=True) for t in dict.fromkeys(names)]
        self.options = o = ConsumerOptions.build(
            mode=mode, start_from=start_from, tags=tags, orderly=orderly,
            concurrency=concurrency, allocation=allocation, **options,
        )  # fmt: skip
        self.consumer_id = o.consumer_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.client = AsyncClient(
            brokers, connect_timeout=o.connect_timeout, on_push=self._on_push, security=o.security
        )
        #: the route table and a connection per owner broker group (standalone: the client)
        self.router = Router(self.client, refresh_interval=ROUTE_REFRESH, on_push=self._on_push)
        #: queue-level calls, each at the queue's owner
        self.calls = RoutedCalls(self.router, RetryPolicy(attempts=3, timeout=o.connect_timeout + 5))
        self.closing = False
        self._closed = trio.Event()
        #: how messages are taken now (RUN, ITERATION), or POLL once polled (for good)
        self._consuming: str | None = None
        #: what the last poll() returned: done at the next poll, commit or close
        self._polled: list[Item] = []
        #: manual assignment: assign() was called (stop_at_end watches from then on)
        self._assigned_once = False
        self._run_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        #: the loop this consumer runs on (set on entry): stop() from another thread goes through it
        self._token: trio.lowlevel.TrioToken | None = None
        if self.manual:
            if o.mode != ConsumeMode.CLUSTERING:
                raise ConfigError("a consumer with manual assignment has no mode: it reads the queues assign() gives it")
            if any(fn is not None for fn in (o.on_assigned, o.on_revoked, o.on_lost)):
                raise ConfigError("a consumer with manual assignment has no rebalance: on_assigned/on_revoked/on_lost "
                                  "are for members subscribed to topics")  # fmt: skip
            if self.group is None:
                # nothing to commit to: each queue starts at start_from, or where seek() puts it
                o = self.options = attrs.evolve(o, commit_offsets=False)
            elif is_ephemeral(self.group):
                raise ConfigError(
                    f"group {self.group!r} is ephemeral (its offsets live only while it has members): a consumer "
                    "with manual assignment is no member; use a durable group, or group=None"
                )
        group_name = self.group or ""
        clustering = o.mode == ConsumeMode.CLUSTERING and not self.manual
        ephemeral = is_ephemeral(group_name)
        if ephemeral and not clustering:
            raise ConfigError(
                f"group {self.group!r} is ephemeral (its offsets live in the brokers' memory): broadcast mode "
                "keeps a member's offsets on its own disk; use clustering mode or a group without '#ephemeral'"
            )
        store = None if clustering or self.manual else BroadcastOffsetStore(o.state_dir or default_state_dir(), group_name)
        self._store = store
        self.counters = Counters()
        logs = RateLimitedLog(log, LOG_INTERVAL, trio.current_time)
        self.dispatcher = Dispatcher(o, self.counters)
        # manual assignment commits as no member (no consumer id): the broker takes such a
        # commit for any queue, fencing none (docs/consumer.md, "Manual assignment")
        committer = Committer(self.calls, group_name, "" if self.manual else self.consumer_id, o, store,
                              regain=None if self.manual else lambda: self.coordinator.heartbeat_now())  # fmt: skip
        self._send_back = SendBack(
            self.calls, group_name, o, self.counters, self._retry_sent, logs
        )
        #: stop_at_end: stops the member once its queues are read to the end
        self._end_watch = EndWatch(
            lambda: self.coordinator.desired if clustering else set(self.assignments.queues),
            lambda: self.assignments.queues, self.stop,
        ) if o.stop_at_end else None  # fmt: skip
        poke = self._end_watch.poke if self._end_watch is not None else None
        self.dispatcher.on_progress = poke
        pull = PullLoop(
            # manual assignment with a group names it (an operator's group pause holds its
            # pulls) but no member: there is no lease to check
            self.router.client_for, self.router.endpoint, self.router.settle, o,
            group_name if clustering or self.manual else "", self.consumer_id if clustering else "",
            self.counters, committer.start_offset, self.dispatcher.deliver, logs,
            dead_letter=self._send_back.dead_letter if clustering else None,
            regain=(lambda: self.coordinator.heartbeat_now()) if clustering else None,
            resume=self.dispatcher.resume, on_end=poke,
        )  # fmt: skip
        self.assignments = Assignments(
            self.calls, group_name, self.consumer_id, o, committer, self.dispatcher, pull,
            on_lost=lambda: self.coordinator.trigger(),
        )  # fmt: skip
        self.coordinator = Coordinator(
            self.router, group_name, self.consumer_id, self.topics, o, self.assignments,
            counters=self.counters, on_round=poke,
        )
        self._workers = Workers(self.dispatcher, o, self.counters, self._send_back,
                                local_retry=not clustering or ephemeral)  # fmt: skip

    # ------------------------------------------------------------------ lifetime
    async def _enter(self, stack: AsyncExitStack) -> None:
        """Open the connections and the consumer's nursery on ``stack``, join (unless
        assigned by hand) and start the background tasks. Exit (the stack unwinding, in
        reverse) closes (:meth:`aclose`), cancels the tasks, closes the nursery, then the
        route table and the connection; those two never see the body's exception.

        The consumer's nursery is entered in the caller's task, so cancelling it (as
        :meth:`aclose` does) cancels the rest of the ``async with`` body too, as for a
        nursery's body: that Cancelled is absorbed by the nursery (the ``async with``
        ends quietly). Other exceptions of the body pass through unchanged
        (:func:`_task_nursery`)."""
        self._token = trio.lowlevel.current_trio_token()
        await self.client.__aenter__()
        stack.push_async_callback(self.client.__aexit__, None, None, None)
        await self.router.__aenter__()
        stack.push_async_callback(self.router.__aexit__, None, None, None)
        stack.push_async_callback(self.router.aclose)
        nursery = self._nursery = await stack.enter_async_context(_task_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        stack.push_async_callback(self.aclose)
        self.assignments.open(nursery)
        if self._store is not None:
            await trio.to_thread.run_sync(self._store.load)
        if not self.manual:
            await self.coordinator.rebalance()
        if not self.manual:  # manual assignment: no membership, no lease
            nursery.start_soon(self.coordinator.run)
            nursery.start_soon(self.coordinator.expire_loop)
        nursery.start_soon(self.assignments.commit_loop)
        if self._end_watch is not None and not self.manual:  # manual: from the first assign()
            nursery.start_soon(self._end_watch.run)
        if self.options.idle_timeout is not None:
            self.dispatcher.activity = trio.current_time()
            nursery.start_soon(
                watch_idle, self.dispatcher, self.assignments.queues, self.options.idle_timeout, self.stop
            )

    @property
    def _stopping(self) -> bool:
        return self.dispatcher.stopping

    def stop(self) -> None:
        """Stop handing out messages (final). Running handlers finish; :meth:`run`
        returns and iteration ends. Safe to call from a handler, including a sync
        handler running in a worker thread (the loop's part is then scheduled on the
        loop: trio objects are touched from the loop thread only); :meth:`aclose`
        then commits and leaves."""
        self.dispatcher.stopping = True  # a plain flag: handlers see it at once, from any thread
        token = self._token
        if token is not None and not _on_loop(token):
            try:
                token.run_sync_soon(self.dispatcher.stop)
            except trio.RunFinishedError:
                pass
            return
        self.dispatcher.stop()

    async def aclose(self) -> None:
        """Stop pulling, wait for running handlers (up to ``close_timeout``), call
        ``on_revoked`` for every queue still consumed (heartbeats go on meanwhile),
        commit, leave the group. Idempotent; never raises for broker trouble (it logs).

        Chunks already handed to handlers run to their end (but the one holding a
        queue's highest handed-out offset), so what is committed covers everything
        handled: the next owner handles nothing twice (docs/consumer.md)."""
        if self.closing:
            if not self._closed.is_set():  # closed already: no checkpoint (a cancelled caller returns too)
                await self._closed.wait()
            return
        self.closing = True
        # a task cancelled from outside (a deadline, a Ctrl-C under trio.run) closes without
        # the shield below: the connection's reader lives in the caller's cancelled scope,
        # so a shielded commit would only wait for answers that cannot come
        cancelled = trio.current_effective_deadline() == -math.inf
        self.assignments.closing = True
        self._poll_settle()  # what poll() returned counts as processed (Kafka's close)
        self.stop()
        a = self.assignments
        try:
            for q in list(a.queues.values()):
                q.stop()
            if not await a.wait_handlers(list(a.queues.values()), self.options.close_timeout):
                log.warning("close: handlers still running after %.1f s; abandoning them "
                            "(their messages will be redelivered)", self.options.close_timeout)  # fmt: skip
            if self._run_scope is not None:
                self._run_scope.cancel()
            # shielded: a close made by a handler (inside the run scope cancelled just
            # above) still commits and leaves; each step is bounded
            with trio.CancelScope(shield=not cancelled):
                # on_revoked for every queue before the commit and the leave (heartbeats go
                # on meanwhile: the leases stay held while it runs)
                await a.revoke_all()
                a.leaving = True
                if self.manual and self.group is not None and a.queues:
                    with trio.move_on_after(self.options.connect_timeout + 5):
                        await self.commit()  # to the group; no member to leave
                elif not self.manual and (self.client.connected or a.queues):
                    with trio.move_on_after(self.options.connect_timeout + 5):
                        # a round still heartbeating (with this member's leases) would register
                        # the member again after its leave: a ghost holding its queues until the
                        # broker's member_expiry; it ends within this bound (its heartbeat's)
                        await self.coordinator.wait_idle()
                    with trio.move_on_after(self.options.connect_timeout + 5):
                        await self.commit()
                        await self.calls.leave_group(self.group or "", self.consumer_id)
        except EQueueError as exc:
            log.warning("close: could not commit/leave cleanly: %s", exc)
        finally:
            a.leaving = True
            self._closed.set()
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ consuming
    async def run(self, handler: Handler | ChunkHandler) -> None:
        """Hand every message to ``handler`` until :meth:`stop` or :meth:`aclose`.

        ``handler(msg)`` returning means done; raising means retry (see docs). Async
        handlers run as tasks, sync ones in worker threads, up to ``concurrency`` at
        once (orderly: one per queue) — or, with ``handler_threads="auto"``, inline on
        this loop, one at a time, once they prove fast (docs/consumer.md, "Where
        handlers run"). A front running handlers on another loop passes a
        :class:`equeue.consumer.invoke.ChunkHandler` (whole chunks per call). Raises
        RuntimeError if already consuming.
        """
        if self._consuming:
            raise _busy(self._consuming, RUN)
        if self._stopping:
            return
        self._consuming = RUN
        invoke, placement = make_invoker(handler, self.options, self.dispatcher)
        try:
            with trio.CancelScope() as scope:
                self._run_scope = scope
                await self._workers.run(invoke, placement)
        finally:
            self._run_scope = None
            self._consuming = None

    def _retry_sent(self) -> None:
        if not self.assignments.retry_held():
            self.coordinator.trigger()  # the retry topic may have just been created

    # ------------------------------------------------------------------ iterator
    def __aiter__(self) -> AsyncIterator[Message]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Message]:
        it = self.iteration()
        try:
            while True:  # the message yielded before is done once the next is asked for
                msgs = await it.next_batch(1, 1)
                if msgs is None:
                    return
                yield msgs[0]
        finally:
            it.end()  # the message the loop ended on is not done

    def iteration(self) -> Iteration:
        """Start an iteration in batches (:class:`Iteration`): the interface of
        ``async for`` for a front that drives this consumer from another thread. Call on
        the consumer's loop; end it with :meth:`Iteration.end`. Raises RuntimeError when
        the consumer is already consumed (by :meth:`run`, another iteration, or poll)."""
        if self._consuming:
            raise _busy(self._consuming, ITERATION)
        self._consuming = ITERATION
        return Iteration(self)

    def _deserialize(self, msgs: list[Message]) -> None:
        """Iteration and poll: deserialize each message as it is handed out; one a
        deserializer fails on keeps the error (its ``value`` raises it)."""
        o = self.options
        if o.value_deserializer is not None or o.key_deserializer is not None:
            for m in msgs:
                try:
                    deserialize_into(m, o.key_deserializer, o.value_deserializer)
                except SerializationError as exc:
                    m._set_failed(exc)

    # ------------------------------------------------------------------ poll
    async def poll(self, max_messages: int = MAX_POLL) -> list[Message]:
        """The next batch of up to ``max_messages`` messages (Kafka's ``poll``), waiting
        for at least one; ``[]`` once the consumer is stopped. What the previous poll
        returned is done now (commit-on-poll: it is committed with the next commit,
        periodic, :meth:`commit`, :meth:`commit_async` or the close).

        No timeout parameter: the caller bounds the wait with a trio cancel scope
        (``with trio.move_on_after(1): msgs = await c.poll()``); a wait cancelled so took
        nothing (what the previous poll returned is done all the same). The blocking
        :meth:`Consumer.poll` has the timeout.

        A batch is made of the chunks ready in the consumer's buffer, first from the
        queue first in line; with deserializers each message is deserialized here, and
        one a deserializer fails on is returned all the same (its ``value`` raises).

        Raises TypeError/ConfigError for a bad ``max_messages``, RuntimeError when the
        consumer is consumed with :meth:`run` or iteration (poll cannot be mixed with
        them: once polled, a consumer is consumed by poll only)."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise TypeError(f"max_messages must be an int, got {max_messages!r}")
        if max_messages < 1:
            raise ConfigError(f"max_messages must be >= 1, got {max_messages}")
        if self._consuming not in (None, POLL):
            raise _busy(self._consuming, POLL)
        self._consuming = POLL
        self._poll_settle()
        first = await self.dispatcher.next_batch(max_messages)
        if first is None:
            return []
        items = [first]
        n = len(first[1])
        while n < max_messages:  # more that is ready now, without waiting
            item = self.dispatcher.take(max_messages - n)
            if item is None:
                break
            items.append(item)
            n += len(item[1])
        self._polled = items
        msgs = first[1] if len(items) == 1 else [m for item in items for m in item[1]]
        self._deserialize(msgs)
        return msgs

    def _poll_settle(self) -> None:
        """What the last poll returned is done (its queue's window moves on)."""
        items, self._polled = self._polled, []
        for item in items:
            self.dispatcher.settle(item, len(item[1]))

    def undo_poll(self) -> None:
        """What the last :meth:`poll` returned never reached the application (a front's
        wait for it was interrupted: Ctrl-C in the blocking front, a cancelled ``await``
        in the asyncio one): none of it is done; it goes back first in line, in order,
        and the next poll returns it. Call on the consumer's loop, before the next poll."""
        items, self._polled = self._polled, []
        for item in reversed(items):
            self.dispatcher.settle(item, 0)

    # ------------------------------------------------------------------ pausing fetching
    def _on_own_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this consumer's loop: directly when called there (or before
        entry), else from this thread through the loop (a sync handler's worker thread,
        the blocking front's thread). ClientClosed once the loop has ended."""
        token = self._token
        if token is None or _on_loop(token):
            return fn(*args)
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=token)
        except trio.RunFinishedError:
            raise ClientClosed("the consumer's event loop is not running") from None

    def assignment(self) -> set[tuple[str, int]]:
        """The queues this member consumes now, as ``(topic, queue_id)`` tuples (in
        clustering mode, those whose lease it holds; the queues of the group's retry
        topic among them; without a group, those :meth:`assign` gave). Callable from
        any thread."""
        return self._on_own_loop(self.assignments.assigned)

    def pause(self, queues: Iterable[tuple[str, int]]) -> None:
        """Stop fetching from ``queues`` (``(topic, queue_id)`` tuples) until :meth:`resume`,
        e.g. for back-pressure on what a queue's messages feed (docs/consumer.md,
        "Pausing and resuming fetching"). Idempotent; callable from a handler or any thread.

        Only fetching stops: messages already buffered from those queues are still handed
        to the handler, and their offsets committed; the answer of a pull in flight is
        dropped (its messages are pulled again on resume); heartbeats go on, so the queues'
        leases are kept. A pause lasts while the queue stays assigned: it is gone once the
        queue is revoked or lost (a queue assigned again starts unpaused).

        Raises TypeError when ``queues`` is not a collection of ``(topic, queue_id)``
        tuples, ConfigError (nothing paused) when one is not assigned to this member
        (:meth:`assignment`)."""
        leases = queue_list(queues)
        self._on_own_loop(self.assignments.pause, leases)

    def resume(self, queues: Iterable[tuple[str, int]]) -> None:
        """Fetch from ``queues`` again, from where each stood (the messages after the
        last one delivered). Resuming a queue not paused does nothing. Raises as
        :meth:`pause` (ConfigError for a queue not assigned: a pause revoked with its
        queue is already gone)."""
        leases = queue_list(queues)
        self._on_own_loop(self.assignments.resume, leases)

    def paused(self) -> set[tuple[str, int]]:
        """The assigned queues whose fetching is paused (:meth:`pause`)."""
        return self._on_own_loop(self.assignments.paused)

    # ------------------------------------------------------------------ offsets
    async def commit(self) -> None:
        """Commit every queue whose committable offset moved (also done periodically,
        on revoke and on close). What the last :meth:`poll` returned counts as done
        first, so it is committed too. Raises the first commit error (EQueueError)."""
        self._poll_settle()
        await self.assignments.commit_all()

    def commit_async(self, callback: Callable[[EQueueError | None], Any] | None = None) -> None:
        """Start a commit, as :meth:`commit` does, without waiting for it: it runs in a
        task of the consumer (what the last :meth:`poll` returned is marked done at once,
        so the commit covers it). Callable from a handler or any thread.

        Its outcome: ``callback(None)`` once done, ``callback(error)`` when it failed
        (an EQueueError; ClientClosed when the consumer closed before the commit
        ended); without a callback a failure is logged (WARNING), as a
        periodic commit's is. The callback runs on the consumer's loop: keep it quick;
        what it raises is logged. Commits of one queue never overlap, so a later commit
        never lands before an earlier one. Raises ClientClosed when the consumer is
        closed or not entered."""
        self._on_own_loop(self._start_commit, callback)

    def _start_commit(self, callback: Callable[[EQueueError | None], Any] | None) -> None:
        if self._nursery is None or self._closed.is_set():
            raise ClientClosed("the consumer is not open: commit_async needs its running loop")
        self._poll_settle()

        async def commit() -> None:
            error: EQueueError | None = None
            try:
                await self.assignments.commit_all()
            except EQueueError as exc:
                error = exc
            except trio.Cancelled:  # the consumer closed first: the callback still hears of it
                if callback is not None:
                    try:
                        callback(ClientClosed("the consumer closed before the commit ended"))
                    except Exception:
                        log.exception("commit_async callback raised (ignored)")
                raise
            if callback is None:
                if error is not None:
                    log.warning("offset commit failed: %s", error)
                return
            try:
                callback(error)
            except Exception:
                log.exception("commit_async callback raised (ignored)")

        self._nursery.start_soon(commit)

    # ------------------------------------------------------------------ positions
    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Fetch ``topic``/``queue_id`` from ``offset`` next (Kafka's ``seek``): the
        messages of that queue still buffered (pulled, not handed out) are dropped, a
        pull in flight is discarded, and the next message of that queue handed out is the
        one at ``offset`` (or the first retained after it; past the end: the end).
        Messages already handed out (a running handler's, what the last poll returned)
        are not affected.

        Commits are not made by a seek: the committed offset moves only as messages are
        processed (or counted done by the next poll) and committed; once what was handed
        out before is done, the next commit commits the new position. A group member's
        commit never moves its group's offset back at the broker, so after seeking back
        the committed offset stays where it was until processing passes it.

        Callable from a handler or any thread. Raises TypeError for a bad argument,
        ConfigError when the queue is not assigned to this consumer (:meth:`assignment`)
        or ``offset`` is negative."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {topic!r}")
        for name, value in (("queue_id", queue_id), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if offset < 0:
            raise ConfigError(f"offset must be >= 0, got {offset}")
        self._on_own_loop(self.assignments.seek, (topic, queue_id), offset)

    def assign(self, queues: Iterable[tuple[str, int]]) -> None:
        """Consume exactly ``queues`` (``(topic, queue_id)`` tuples; Kafka's ``assign``):
        a consumer made without topics only. Queues newly given start at the group's
        committed offset when there is one (``group=None``: never), else at
        ``start_from`` (then :meth:`seek` them); queues no longer given are stopped (what
        was buffered from them is dropped; with a group, what was done of them is
        committed once their running handlers finished); queues given again go on where
        they stood. No rebalance, no lease, no heartbeat. Callable from any thread once
        entered.

        Raises TypeError for a bad ``queues``, ConfigError for a consumer subscribed to
        topics (its queues come from its group's rebalance: subscription and manual
        assignment do not mix) or an invalid topic name, ClientClosed before entry or
        once closed."""
        leases = queue_list(queues)
        if not self.manual:
            raise ConfigError(f"assign() is for a consumer made without topics (manual assignment); this member of "
                              f"group {self.group!r} subscribes to {self.topics} and gets its queues from the "
                              "group's rebalance: subscription and manual assignment do not mix")  # fmt: skip
        for topic, _ in leases:
            validate_topic(topic)
        self._on_own_loop(self._assign, leases)

    def _assign(self, leases: list[Lease]) -> None:
        if self._nursery is None or self.closing:
            raise ClientClosed("the consumer is not open: enter it (async with) before assign()")
        first = not self._assigned_once
        self._assigned_once = True
        self.assignments.assign_manually(leases)
        if self._end_watch is not None:
            if first:
                self._nursery.start_soon(self._end_watch.run)
            self._end_watch.poke()

    # ------------------------------------------------------------------ pausing fetching
    # ------------------------------------------------------------------ misc
    def _on_push(self, code: int, payload: bytes) -> None:
        if code == PushCode.GROUP_CHANGED:
            self.coordinator.trigger()

    def statistics(self) -> ConsumerStatistics:
        qs = list(self.assignments.queues.values())
        c = self.counters
        return ConsumerStatistics(
            self.consumer_id, sorted(q.key for q in qs), c.consumed, c.failed, c.retried,
            c.dead_lettered, sum(len(q.window) for q in qs),
            max((q.peak_buffered for q in qs), default=0), c.paused,
            self.coordinator.rebalances, c.dropped, c.quarantined, c.pulls, c.kept_pulls,
        )  # fmt: skip
