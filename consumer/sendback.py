"""Sending a failed message back: to the group's retry topic, or its dead-letter topic.

What the copy looks like is decided by :mod:`consumer.retry`; here it is produced,
under the clients' one retry policy (:mod:`client.retry`: transient errors only,
backoff with jitter, bounded). A failing message must never block its queue, so
every outcome is a :class:`SendBackResult` the caller acts on:

- ``SENT``: the copy is in the retry (or dead-letter) topic; the message is done.
- ``DROPPED``: the broker refused the copy for good (``MESSAGE_TOO_LARGE``, say: its
  limit was lowered after the message was stored), in the retry topic and then in the
  dead-letter topic. Logged (rate-limited) and counted in
  ``statistics().dropped``; the message is done and the queue moves on.
- ``UNSENT``: transient trouble outlasted the retry policy, or the client closed. The
  message is not done; the caller retries it locally (the handler runs again later).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from client.retry import RetryPolicy, is_transient, retry_async
from consumer.logs import RateLimitedLog
from consumer.options import ConsumerOptions
from consumer.retry import send_back_message
from consumer.stats import Counters
from equeue import control, wire
from equeue.errors import ClientClosed, EQueueError
from equeue.models import Message
from equeue.names import dlq_topic

log = logging.getLogger("equeue.consumer")

__all__ = ["SEND_BACK_POLICY", "SendBack", "SendBackResult"]

#: how long a send-back keeps trying through transient trouble before the message is
#: retried locally instead (a worker is held meanwhile, so this stays short)
SEND_BACK_POLICY = RetryPolicy(attempts=6, timeout=10.0)


def _permanent(err: EQueueError | None) -> bool:
    """A refusal that trying again will not change (not transient, not a closed client)."""
    return err is not None and not is_transient(err) and not isinstance(err, ClientClosed)


class SendBackResult(enum.Enum):
    SENT = "sent"
    DROPPED = "dropped"
    UNSENT = "unsent"


class Producing(Protocol):
    """The client calls a send-back makes."""

    def get_route(self, topic: str, auto_create: bool = True) -> Awaitable[control.TopicInfo]: ...

    def produce(self, req: wire.ProduceRequest) -> Awaitable[wire.ProduceResponse]: ...


class SendBack:
    """Produces failed messages of one group to its retry or dead-letter topic."""

    def __init__(
        self, client: Producing, group: str, options: ConsumerOptions, counters: Counters, retry_topic: str,
        on_retry_sent: Callable[[], None], logs: RateLimitedLog, policy: RetryPolicy = SEND_BACK_POLICY,
    ) -> None:  # fmt: skip
        self.client = client
        self.group = group
        self.options = options
        self.counters = counters
        self.retry_topic = retry_topic
        self.dlq_topic = dlq_topic(group)
        #: called after a copy reached the retry topic (it may have just been created)
        self.on_retry_sent = on_retry_sent
        self.logs = logs
        self.policy = policy
        self._routes: dict[str, int] = {}

    async def send(self, m: Message) -> SendBackResult:
        """Send ``m`` (as its handler saw it) back; see the module docs for the results."""
        o = self.options
        topic, out = send_back_message(m, self.group, o.retry_delays, o.max_reconsume_times)
        err = await self._produce(topic, m.queue_id, out)
        if _permanent(err) and topic == self.retry_topic:
            # refused for good by the retry topic (a delay past the broker's limit, say):
            # the dead-letter topic takes it without a delay, or refuses it too
            first = err
            topic, out = send_back_message(m, self.group, o.retry_delays, 0)
            err = await self._produce(topic, m.queue_id, out)
            if _permanent(err):
                err = first
        if err is None:
            if topic == self.retry_topic:
                self.counters.retried += 1
                self.on_retry_sent()
            else:
                self.counters.dead_lettered += 1
                log.warning("message %s/%d@%d moved to %s after %d attempts",
                            m.topic, m.queue_id, m.queue_offset, topic, m.reconsume_times + 1)  # fmt: skip
            return SendBackResult.SENT
        if not _permanent(err):
            log.warning("could not send %s/%d@%d back to %s: %s (it is retried here later)",
                        m.topic, m.queue_id, m.queue_offset, topic, err)  # fmt: skip
            return SendBackResult.UNSENT
        self.counters.dropped += 1
        self.logs.log(
            logging.ERROR, f"dropped {m.topic}",
            "message %s/%d@%d failed and the broker refuses to take it back (%s); dropping it",
            m.topic, m.queue_id, m.queue_offset, err,
        )  # fmt: skip
        return SendBackResult.DROPPED

    async def _produce(self, topic: str, queue_id: int, out: Message) -> EQueueError | None:
        """Produce ``out`` to ``topic`` (retrying transient errors); the error, if any."""
        entry = wire.encode_entry(out)

        async def once() -> None:
            n = self._routes.get(topic)
            if n is None:
                n = self._routes[topic] = (await self.client.get_route(topic)).queues
            qid = queue_id % n if queue_id >= 0 else 0
            await self.client.produce(wire.ProduceRequest(topic, qid, [entry]))

        try:
            await retry_async(once, self.policy)
        except EQueueError as exc:
            return exc
        return None
