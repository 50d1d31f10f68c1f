"""One lane per (topic, queue): the ordered, pipelined, idempotent send path.

A lane owns the batches of one queue in order: the ``open`` batch still filling
(sealed when ``linger`` passed, when full, or when a ``send``/``flush`` asks),
``sendq`` (sealed, waiting for a free slot of the in-flight window) and
``window`` (requests written, answers awaited, in sequence order). One task per
lane reads the answers in order, recovers failures and waits out ``linger``; the
lane's one write path (:meth:`_Lane._write_ready`) moves sealed batches into the
window, and its one wake verb (:meth:`_Lane.wake`) decides whether that happens at
once (the task parked idle, the connection free: no task switch) or in the task.

Idempotence: every batch gets the lane's producer id and a base sequence when it
is first written, and keeps both across retries, so the broker answers a resent
batch it already stored with the original offsets instead of storing it twice.

Retries: when the head answer is a failure the lane stops writing, lets the
window drain, then decides per batch in order:

- ``OutOfOrderSequence`` behind a failed batch of the same producer id: the batch
  was never stored (the broker refuses a gap), so it is numbered again under the
  lane's fresh producer id, at its next write, and resent at no cost;
- other transient errors (connection lost, broker busy or restarting, an
  out-of-order answer that its position does not explain): resent with the same
  id and sequence after the pause of the producer's retry policy
  (:meth:`equeue.client.retry.RetryPolicy.delay`), up to ``retries`` times within
  ``send_timeout``;
- NOT_OWNER, NOT_LEADER, QUEUE_UNAVAILABLE (the queue's broker group moved, is
  failing over to another replica, or is down) and a lost connection: the routes are
  refreshed and the batch is resent, keeping its id and sequence, to the queue's owner
  (its group's leader) as the new table says, the moment the table names one
  (:meth:`equeue.client.routing.Router.settle`: the routes are polled meanwhile, at most one
  refresh per :data:`equeue.client.routing.MIN_REFRESH_INTERVAL`; the policy's backoff when
  they do not change). Idempotence holds: a queue is owned by one group, whose
  replicas share its producer state, and a refused batch was stored nowhere.
  NOT_OWNER, NOT_LEADER and QUEUE_UNAVAILABLE do not count against ``retries``: they
  are retried until ``send_timeout``, then QUEUE_UNAVAILABLE is raised as is;
- a lost connection to a group of a cluster counts like NOT_LEADER (its leader died:
  the group fails over), retried until ``send_timeout``; standalone it counts against
  ``retries`` as below;
- NOT_ENOUGH_REPLICAS (the group's in-sync set is below ``--min-insync``) and
  TOPIC_PAUSED (an operator paused the topic): resent with the same id and sequence
  after the policy's backoff, until ``send_timeout`` (not counted against
  ``retries``), then raised as is. A pause logs a ``retry scheduled`` line naming the
  topic (:meth:`equeue.client.retry.RetryLog.note`, rate-limited); the batches behind
  the refused one were refused too (or, resumed meanwhile, as a gap), so the order holds;
- anything else, or retries/time exhausted: the batch fails with that error.
  When a written batch fails, the lane switches to a fresh producer id (its fate
  may be unknown, and the broker would refuse what follows it as a gap). With
  ``stable_id`` it keeps its id instead and every later batch fails with the same
  error (a replay under the same id then resends them all in order).

Order across a retired id: while a batch of a retired id is in flight the lane
writes nothing new (checked before every batch it writes, so a batch resent under a
retired id is never followed in the same breath by batches numbered under the new one,
which the broker would take first), and a batch of that id that was refused with nothing written
(NOT_OWNER, NOT_LEADER, QUEUE_UNAVAILABLE, or out of sequence) is numbered under the
new id only at its next write, in its turn. So the batches behind a lost one keep
their order (per-key order within the queue); a batch whose fate is unknown keeps
its old id and sequence (the broker answers it as a duplicate if it was stored).

The lane takes only what it uses: the router (the owner's client is resolved per
lane, not per message: kept until a routing error or an owner change), the options,
its producer id, the
:class:`~equeue.producer.buffer.Buffer` (whose lock guards ``open``/``sendq``/``pending``),
the :class:`~equeue.producer.stats.SendStats` it counts outcomes in, and a callback for a
queue the broker does not know.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

import trio

from equeue import wire
from equeue.client.async_client import AsyncClient, PendingReply
from equeue.client.retry import log_retry
from equeue.client.routing import ROUTING_ERRORS, Router
from equeue.codec import Response
from equeue.errors import (
    ClientClosed,
    ConnectionBroken,
    EQueueError,
    ErrorCode,
    NotEnoughReplicas,
    NotLeader,
    NotOwner,
    OperationTimeout,
    OutOfOrderSequence,
    QueueNotFound,
    QueueUnavailable,
    TopicPaused,
)
from equeue.producer._batch import _Batch
from equeue.producer.buffer import Buffer
from equeue.producer.options import ProducerOptions, new_producer_id
from equeue.producer.stats import SendStats
from equeue.protocol import RequestCode
from equeue.wire.batches import seal_records

log = logging.getLogger("equeue.producer")

__all__ = ["LaneLoop", "_Lane", "cork"]


def _answered(entry: tuple[_Batch, PendingReply | None, BaseException | None]) -> bool:
    reply = entry[1]
    return reply is None or reply.done.is_set()


class LaneLoop:
    """The loop thread the lanes of one producer run on: the nursery their tasks live
    in, and the hop to that thread.

    A lane woken from another thread is woken again on the loop thread
    (:meth:`defer`): the lanes woken meanwhile are collected and woken by one
    ``run_sync_soon`` callback, their connections corked around it (:func:`cork`) so
    the requests they write leave together.
    """

    def __init__(self, lock: threading.Lock) -> None:
        #: the producer's buffer lock (guards the deferred lanes too)
        self.lock = lock
        self.nursery: trio.Nursery | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        #: the loop thread's ident (0 until :meth:`attach`)
        self.ident = 0
        #: set by the producer's close: no lane task starts after it
        self.closed = False
        self._deferred: set[_Lane] = set()
        self._scheduled = False

    def attach(self, nursery: trio.Nursery) -> None:
        """Run the lanes' tasks in ``nursery``; the calling thread is the loop thread."""
        self.nursery = nursery
        self.token = trio.lowlevel.current_trio_token()
        self.ident = threading.get_ident()

    def defer(self, lane: _Lane) -> None:
        """Wake ``lane`` on the loop thread soon (from any other thread). Raises
        ClientClosed when the loop no longer runs."""
        with self.lock:
            self._deferred.add(lane)
            if self._scheduled:
                return
            self._scheduled = True
        assert self.token is not None
        try:
            self.token.run_sync_soon(self._run_deferred)
        except trio.RunFinishedError:
            raise ClientClosed("the producer's event loop is not running") from None

    def _run_deferred(self) -> None:
        with self.lock:
            lanes, self._deferred = self._deferred, set()
            self._scheduled = False
        corked = cork(lanes)
        try:
            for lane in lanes:
                lane.wake()
        finally:
            for client in corked:
                client.uncork()


def cork(lanes: Iterable[_Lane]) -> list[AsyncClient]:
    """Cork the connections of ``lanes`` (loop thread; see ``AsyncClient.cork``): the
    requests their wakes write leave together. The caller uncorks each one."""
    clients: list[AsyncClient] = []
    for lane in lanes:
        c = lane.client
        if c is not None and c not in clients:
            c.cork()
            clients.append(c)
    return clients


class _Lane:
    """The send path of one queue of one topic (see the module docstring).

    States (of the lane task; the batches' places are ``open``, ``sendq``, ``window``,
    ``retry``):

    - *not started*: no task yet; the first :meth:`wake` starts it in the producer's
      nursery (none after the producer's close);
    - *running*: the task reads the answers at the window's head, seals an ``open``
      batch whose ``linger`` passed, and writes through :meth:`_write_ready`; a wake
      meanwhile sets its event, so it goes round again before parking;
    - *parked*: the task waits for its event, until the open batch's linger or the
      window head's ``send_timeout`` at the latest. A wake while it is parked idle (no
      open batch, nothing to recover, the window's head not answered
      with a failure, the owner's client known, the lane not dead) writes the sealed
      batches at once, through the same :meth:`_write_ready`, when the connection takes
      a write without waiting: a single ``send`` then costs no task switch (its answer
      is taken by :meth:`on_reply`). Anything else sets the event;
    - *recovering*: the window's head failed: nothing is written until the window is
      drained and every failed batch decided (:meth:`_recover`, which may sleep for the
      retry policy's backoff or wait for the routes);
    - *closed*: :meth:`fail_all` failed every unfinished batch and the producer's nursery
      cancels the task.

    :meth:`wake` is the one way to wake a lane (any thread: from another thread it is
    woken again on the loop thread by :class:`LaneLoop`), and :meth:`_write_ready` the one
    path that writes its requests.
    """

    def __init__(
        self,
        topic: str,
        queue_id: int,
        *,
        router: Router,
        options: ProducerOptions,
        producer_id: bytes,
        buffer: Buffer,
        stats: SendStats,
        on_queue_missing: Callable[[str], None],
        loop: LaneLoop,
    ) -> None:
        self.topic = topic
        self.loop = loop
        self.queue_id = queue_id
        self.router = router
        #: the owner group's client (None: resolve it before the next write)
        self.client: AsyncClient | None = router.client_now(topic, queue_id)
        self.owner = router.owner(topic, queue_id)
        #: the queue's endpoint (owner group, its leader) when the client was resolved:
        #: after a routing error the lane waits for the routes to name another one
        self.endpoint = router.endpoint(topic, queue_id)
        #: consecutive NOT_ENOUGH_REPLICAS or TOPIC_PAUSED rounds (their backoff)
        self.replica_waits = 0
        #: consecutive routing failures (the backoff of NOT_OWNER/QUEUE_UNAVAILABLE)
        self.route_failures = 0
        #: routing failures over the lane's life (reroutes after a refresh)
        self.reroutes = 0
        self.options = options
        self.policy = options.retry_policy
        self.buffer = buffer
        self.lock = buffer.lock
        self.stats = stats
        self.on_queue_missing = on_queue_missing
        self.pid: bytes = producer_id
        self.next_seq = 0
        self.failed_pids: set[bytes] = set()
        #: with ``stable_id``: the failure that ended this lane's sequence
        self.dead: BaseException | None = None
        # guarded by self.lock (touched by submitting threads)
        self.open: _Batch | None = None
        self.sendq: collections.deque[_Batch] = collections.deque()
        self.pending: set[_Batch] = set()
        # loop thread only
        self.window: collections.deque[tuple[_Batch, PendingReply | None, BaseException | None]] = (
            collections.deque()
        )
        self.retry: list[_Batch] = []
        self.started = False
        #: the task's wake-up: replaced at the start of each of its rounds
        self._event = trio.Event()
        #: the cancel scope of the task's idle wait, while it is parked there
        self._parked: trio.CancelScope | None = None
        #: :meth:`_write_ready` runs (a wake from inside it only sets the event)
        self._writing = False

    def owner_changed(self, owner: str | None) -> None:
        """The route table names ``owner`` for this queue: resolve the client again
        before the next write if it changed (loop thread)."""
        if owner != self.owner:
            self.owner = owner
            self.client = None

    async def _resolve(self) -> AsyncClient | None:
        """The owner's client; on failure (group down, topic gone) the queued batches
        go to the retry path with that error, and None is returned."""
        self.endpoint = self.router.endpoint(self.topic, self.queue_id)
        try:
            client = self.client = await self.router.client_for(self.topic, self.queue_id)
        except EQueueError as exc:
            self.endpoint = self.router.endpoint(self.topic, self.queue_id)
            with self.lock:
                batches = list(self.sendq)
                self.sendq.clear()
            for b in batches:
                if not b.finished:
                    b.error = exc
                    self.retry.append(b)
            self.wake()
            return None
        self.owner = self.router.owner(self.topic, self.queue_id)
        self.endpoint = self.router.endpoint(self.topic, self.queue_id)
        return client

    def wake(self) -> None:
        """Wake the lane: new sealed batches, an answer, a failure to handle (any
        thread). The one way to wake a lane, and the one place that decides when its
        sealed batches are written (the class docstring's states):

        - from a thread other than the loop's, the lane is woken again on the loop
          thread (:meth:`LaneLoop.defer`; raises ClientClosed when the loop is gone);
        - not started: its task is started (it then writes what is sealed);
        - parked idle: the sealed batches are written here and now
          (:meth:`_write_ready`), and the parked wait's deadline is moved to the
          window head's ``send_timeout``;
        - otherwise, or when that write needs the task (connection busy, connecting or
          TLS, a batch to fail), the task's event is set.
        """
        loop = self.loop
        if threading.get_ident() != loop.ident:
            loop.defer(self)
            return
        if not self.started:
            if loop.nursery is not None and not loop.closed:
                self.started = True
                loop.nursery.start_soon(self.run, name=f"equeue-lane-{self.topic}-{self.queue_id}")
            return
        parked = self._parked
        window = self.window
        client = self.client
        if (
            parked is None
            or self._writing
            or self.retry
            or self.open is not None
            or client is None
            or self.dead is not None
            or (window and _answered(window[0]))
            or self._write_ready(client, inline=True) is not True
        ):
            self._event.set()
            return
        if window:  # the parked task must still enforce the head's send_timeout
            at = trio.current_time() + max(0.0, window[0][0].deadline - time.monotonic())
            if at < parked.deadline:
                parked.deadline = at

    def _write_ready(self, client: AsyncClient, *, inline: bool) -> bool | tuple[_Batch, bytes]:
        """The lane's one write path: move the sealed batches of ``sendq`` into the
        window, in order, while it has room and no batch of a retired producer id is
        in flight (checked per batch: one just written may be of a retired id). Each
        is numbered on its first write (:meth:`_payload`) and written with
        ``send_request_nowait`` while the connection takes a write at once.

        Returns True when it wrote all it may write now (a failed write has woken the
        lane). ``inline`` (called by :meth:`wake`, the task parked): nothing is failed
        or awaited here; False when the task must take over (connection busy, a batch
        to fail). From the task (``inline`` False): batches of a dead lane or unsent
        past their ``send_timeout`` fail here, and when the connection cannot take a
        write at once (connecting, busy, TLS) the head batch is taken off ``sendq``,
        numbered, and returned with its payload: the task awaits its write and enters
        it with :meth:`_written`.
        """
        window = self.window
        sendq = self.sendq
        max_in_flight = self.options.max_in_flight
        now = time.monotonic()
        self._writing = True
        try:
            while sendq and len(window) < max_in_flight:
                if self._stale_in_flight():
                    return True  # its answer wakes the lane
                b = sendq[0]
                if b.finished:
                    sendq.popleft()
                    continue
                if self.dead is not None or (b.pid is None and now >= b.deadline):
                    if inline:
                        return False  # failing runs callbacks: the task's work
                    sendq.popleft()
                    self.fail(b, self.dead or OperationTimeout(
                        f"not sent within send_timeout ({self.options.send_timeout:g} s)"))  # fmt: skip
                    continue
                if not client.can_send_now():
                    if inline:
                        return False
                    sendq.popleft()  # deque: atomic; appends happen under the lock
                    return b, self._payload(b)
                sendq.popleft()
                payload = self._payload(b)
                try:
                    reply = client.send_request_nowait(RequestCode.PRODUCE, payload, self.on_reply)
                except trio.WouldBlock:  # the socket went away meanwhile: b keeps its id and sequence
                    if inline:
                        with self.lock:
                            sendq.appendleft(b)
                        return False
                    return b, payload
                except EQueueError as exc:
                    self._written(b, None, exc)
                    return True
                if not self._written(b, reply, None):
                    return True
            return True
        finally:
            self._writing = False

    def _written(self, b: _Batch, reply: PendingReply | None, error: BaseException | None) -> bool:
        """Enter a written batch in the window (its answer ``reply``, or the ``error``
        its write raised). False, with the lane woken, when the task must look at once:
        the write failed (nothing more is written behind it), or the answer arrived
        before the batch joined the window (:meth:`on_reply` could not see it)."""
        self.window.append((b, reply, error))
        if error is not None or (reply is not None and reply.done.is_set()):
            self.wake()
            return False
        return True

    def _stale_in_flight(self) -> bool:
        """A batch under a retired producer id is still in flight: write nothing new
        until it is answered (it may have to be numbered again under the new id, and
        it must keep its place before the batches behind it)."""
        failed = self.failed_pids
        return bool(failed) and any(e[0].pid in failed for e in self.window)

    def _payload(self, b: _Batch) -> bytes:
        """Number ``b`` on its first send (kept across retries); its request payload:
        one batch of its records (:func:`~equeue.wire.batches.produced_record`),
        compressed with the ``compression`` option, sealed once."""
        if b.pid is None:
            b.pid = self.pid
            b.seq = self.next_seq
            self.next_seq += len(b.records)
        b.sent_behind = bool(self.window)
        if b.batch is None:
            b.batch = seal_records(b"".join(b.records), len(b.records), self.options.compression)
        return wire.ProduceRequest(
            self.topic, self.queue_id, (), b.pid, b.seq, self.options.auto_create, b.batch
        ).encode()

    def on_reply(self) -> None:
        """An answer or a failure arrived (loop thread, called by the client's reader).

        Successful answers at the head of the window are resolved right here, so a
        waiting ``send`` wakes without a round through the lane task; the lane is
        woken (:meth:`wake`) only when there is work: a failure to handle, a batch to
        write into the freed window slot.
        """
        window = self.window
        while window and not self.retry:
            b, reply, _ = window[0]
            if reply is None or not reply.done.is_set():
                break
            res = reply.result
            if not isinstance(res, Response) or res.code != ErrorCode.OK:
                break  # the lane task decides (retry, fail)
            try:
                answer = wire.ProduceResponse.decode(res.payload)
            except EQueueError:
                break
            window.popleft()
            self.resolve(b, answer)
        if self.sendq or self.retry or (window and _answered(window[0])):
            self.wake()

    # ------------------------------------------------------------------ task
    async def run(self) -> None:
        """The lane task: lives in the producer's nursery until it closes."""
        options = self.options
        linger = options.linger
        max_in_flight = options.max_in_flight
        lock = self.lock
        while True:
            event = self._event = trio.Event()
            now = time.monotonic()
            o = self.open
            if o is not None and now - o.first_at >= linger:
                with lock:
                    if self.open is o:
                        self.sendq.append(o)
                        self.open = None
            # read the answers, in order
            window = self.window
            while window:
                b, reply, error = window[0]
                if reply is not None and not reply.done.is_set():
                    if time.monotonic() >= b.deadline:
                        window.popleft()
                        self.fail(b, OperationTimeout(
                            f"no answer within send_timeout ({options.send_timeout:g} s); "
                            "the message may or may not have been stored"
                        ))  # fmt: skip
                        continue
                    break
                window.popleft()
                if reply is not None:
                    try:
                        answer = wire.ProduceResponse.decode(AsyncClient.answer(reply))
                    except EQueueError as exc:
                        error = exc
                    else:
                        self.resolve(b, answer)
                        continue
                b.error = error
                self.retry.append(b)
            if self.retry and not window:
                await self._recover()
                continue
            # write, in order, while the window has room (not while recovering)
            if not self.retry and self.sendq and len(self.window) < max_in_flight and not self._stale_in_flight():
                client = self.client or await self._resolve()
                while client is not None:
                    step = self._write_ready(client, inline=False)
                    if step is True:
                        break
                    assert not isinstance(step, bool)
                    b, payload = step  # the connection takes no write at once: await this one
                    try:
                        reply = await client.send_request(RequestCode.PRODUCE, payload, self.on_reply)
                    except EQueueError as exc:
                        self._written(b, None, exc)
                        break
                    if not self._written(b, reply, None):
                        break
            # wait for a wake (new batch, answer), the linger of the open batch, a deadline
            at = float("inf")
            o = self.open
            if o is not None:
                at = o.first_at + linger
            if window:
                at = min(at, window[0][0].deadline)
            deadline = math.inf if at == math.inf else trio.current_time() + max(0.0, at - time.monotonic())
            with trio.CancelScope(deadline=deadline) as parked:
                self._parked = parked
                try:
                    await event.wait()
                finally:
                    self._parked = None

    async def _recover(self) -> None:
        """Decide on every failed batch of the drained window (module docstring)."""
        options = self.options
        resend: list[_Batch] = []
        backoff_attempts = 0
        paused: TopicPaused | None = None
        reroute = False
        explained = False  # an earlier batch of this round failed: an out-of-order answer is expected
        for b in self.retry:
            e = b.error
            b.error = None
            assert e is not None
            if self.dead is not None:
                self.fail(b, self.dead)
                continue
            if isinstance(e, OutOfOrderSequence) and b.pid in self.failed_pids:
                b.pid = None  # numbered again at its next write, in its turn (its id is retired)
                resend.append(b)
                continue
            if isinstance(e, QueueNotFound):
                self.on_queue_missing(self.topic)
            if isinstance(e, ROUTING_ERRORS):
                reroute = True
            # until send_timeout; in a cluster also a broken connection (the group's
            # leader died: a failover, not a broker to give up on after `retries`)
            if isinstance(e, NotOwner | NotLeader | QueueUnavailable | NotEnoughReplicas | TopicPaused) or (
                isinstance(e, ConnectionBroken) and self.router.cluster
            ):
                if time.monotonic() >= b.deadline:
                    kept = isinstance(e, QueueUnavailable | NotEnoughReplicas | TopicPaused)
                    self.fail(b, e if kept else OperationTimeout(
                        f"send_timeout ({options.send_timeout:g} s) passed; last error: {e}"))  # fmt: skip
                    continue
                if b.pid in self.failed_pids and isinstance(e, NotOwner | NotLeader | QueueUnavailable):
                    # nothing was written, and its id is retired (a batch before it failed
                    # for good): numbered again at its next write, in its turn, so it keeps
                    # its place before the batches behind it
                    b.pid = None
                if isinstance(e, NotEnoughReplicas | TopicPaused):
                    self.replica_waits += 1
                    backoff_attempts = max(backoff_attempts, self.replica_waits)
                    if isinstance(e, TopicPaused):
                        paused = e
                resend.append(b)
                explained = True
                continue
            if isinstance(e, ClientClosed) or not (isinstance(e, EQueueError) and e.transient):
                self.fail(b, e)
                explained = True
                continue
            if not (isinstance(e, OutOfOrderSequence) and (b.sent_behind or explained)):
                b.attempts += 1
                if not isinstance(e, OutOfOrderSequence):
                    backoff_attempts = max(backoff_attempts, b.attempts)
            explained = True
            if b.attempts > options.retries:
                self.fail(b, e)
                continue
            if time.monotonic() >= b.deadline:
                self.fail(b, OperationTimeout(f"send_timeout ({options.send_timeout:g} s) passed; last error: {e}"))
                continue
            log.debug("retrying %s/%d seq %d (attempt %d): %s", self.topic, self.queue_id, b.seq, b.attempts, e)
            resend.append(b)
        self.retry = []
        left = max(0.0, min(b.deadline for b in resend) - time.monotonic()) if resend else 0.0
        if reroute:
            self.client = None  # resolved again, from the refreshed table, before the next write
            self.route_failures += 1
            self.reroutes += 1
            # resend at once when the refreshed table names another owner or leader
            # that is up; else after the backoff (the table is polled meanwhile)
            attempts = max(backoff_attempts, self.route_failures)
            await self.router.settle(self.topic, self.queue_id, self.endpoint, min(self.policy.delay(attempts), left))
        else:
            self.route_failures = 0
            if backoff_attempts and resend:
                wait = min(self.policy.delay(backoff_attempts), left)
                if paused is not None:  # say why the sends wait (an operator's pause)
                    where = ",".join(f"{h}:{p}" for h, p in self.client.brokers) if self.client is not None else None
                    log_retry.note(f"producer.send:{self.topic}", where, str(self.replica_waits), wait, paused)
                await trio.sleep(wait)
                if paused is not None:  # still paused at the deadline: fail as such, not as a timeout
                    now = time.monotonic()
                    for b in [b for b in resend if now >= b.deadline]:
                        resend.remove(b)
                        self.fail(b, paused)
        with self.lock:
            self.sendq.extendleft(reversed(resend))

    # ------------------------------------------------------------------ outcomes
    def resolve(self, b: _Batch, answer: wire.ProduceResponse) -> None:
        b.finish(answer, None)
        self.route_failures = 0  # the owner answered: a later NOT_OWNER backs off from the start
        self.replica_waits = 0
        self._release(b)

    def fail(self, b: _Batch, error: BaseException) -> None:
        """Fail a batch for good; a written batch retires the lane's producer id
        (or, with ``stable_id``, ends the lane's sequence: see the module docstring)."""
        if b.pid is not None and b.pid == self.pid:
            if self.options.stable_id:
                if self.dead is None:
                    self.dead = error
            else:
                self.failed_pids.add(self.pid)
                self.pid = new_producer_id()
                self.next_seq = 0
        b.finish(None, error)
        self._release(b)

    def fail_all(self, error: BaseException) -> None:
        """Fail every unfinished batch (the producer is closing)."""
        with self.lock:
            batches = list(self.pending)
            self.open = None
            self.sendq.clear()
        self.window.clear()
        self.retry = []
        for b in batches:
            b.finish(None, error)
            self._release(b)

    def _release(self, b: _Batch) -> None:
        """A batch finished: count its outcome, free its buffer bytes, then run its
        callbacks, once (loop thread; the callbacks outside the lock, so they may send)."""
        with self.lock:
            if b not in self.pending:
                return
            self.pending.discard(b)
            callbacks, b.callbacks, b.called = b.callbacks, None, True
        if b.error is not None:
            self.stats.failed_batch(len(b.records), b.error)
        elif b.answer is not None:
            self.stats.answered(len(b.records), b.answer)
        self.buffer.release(b.nbytes)
        if callbacks is not None:
            b.run_callbacks(callbacks)
