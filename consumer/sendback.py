"""Sending a failed message back: the broker copies it to the group's retry topic, or
its dead-letter topic (SEND_BACK).

The consumer names where it read the message (topic, queue, queue offset); the
broker reads it there and writes the copy itself (:mod:`equeue.consumer.retry` describes
the copy). The request goes under the clients' one retry policy
(:mod:`equeue.client.retry`: transient errors only, backoff with jitter, bounded). A failing
message must never block its queue, so every outcome is a :class:`SendBackResult`
the caller acts on:

- ``SENT``: the copy is in the retry (or dead-letter) topic; the message is done.
- ``DROPPED``: the broker refused for good, for the retry topic and then for the
  dead-letter topic (``MESSAGE_TOO_LARGE``, say: its limit was lowered after the
  message was stored; or ``MESSAGE_NOT_FOUND``: retention removed it meanwhile).
  Logged (rate-limited) and counted in ``statistics().dropped``; the message is done
  and the queue moves on.
- ``UNSENT``: transient trouble outlasted the retry policy, the client closed, or the
  broker failed for a reason of its own (a full store, an internal error, a broker
  without SEND_BACK). The message is not done; the caller retries it locally (the
  handler runs again later), so nothing is lost to the broker's trouble.

An ephemeral group (``<name>#ephemeral``) has no retry or dead-letter topic: its
members retry a failed message in place (:class:`~equeue.consumer.workers.Workers`,
``local_retry``), and past ``max_reconsume_times`` :meth:`SendBack.send` drops it
(``DROPPED``, logged and counted) without asking the broker, which would refuse
(EPHEMERAL_GROUP); a poison record is dropped the same way.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from equeue import control
from equeue.client.retry import RetryPolicy, retry_async
from equeue.consumer.options import ConsumerOptions
from equeue.consumer.stats import Counters
from equeue.errors import (
    BadRequest,
    CorruptRecord,
    DelayTooLong,
    EphemeralGroup,
    EQueueError,
    MessageNotFound,
    MessageTooLarge,
    QueueNotFound,
    TopicNotFound,
)
from equeue.logs import RateLimitedLog
from equeue.models import Message
from equeue.names import is_ephemeral

log = logging.getLogger("equeue.consumer")

__all__ = ["SEND_BACK_POLICY", "SendBack", "SendBackResult"]

#: how long a send-back keeps trying through transient trouble before the message is
#: retried locally instead (a worker is held meanwhile, so this stays short)
SEND_BACK_POLICY = RetryPolicy(attempts=6, timeout=10.0)


#: refusals about the message itself, which trying again will not change; any other
#: error (a full store, an internal error, a broker without SEND_BACK) is trouble of
#: the broker's, and the message is kept (UNSENT) rather than dropped
_MESSAGE_REFUSALS = (
    MessageTooLarge, DelayTooLong, MessageNotFound, CorruptRecord, BadRequest, TopicNotFound, QueueNotFound,
    EphemeralGroup,
)  # fmt: skip


def _permanent(err: EQueueError | None) -> bool:
    """A refusal of this message that trying again will not change."""
    return isinstance(err, _MESSAGE_REFUSALS)


class SendBackResult(enum.Enum):
    SENT = "sent"
    DROPPED = "dropped"
    UNSENT = "unsent"


class SendingBack(Protocol):
    """The client call a send-back makes."""

    def send_back(
        self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int,
        max_reconsume_times: int = 16, retry_delays_ms: Sequence[int] = (),
    ) -> Awaitable[control.SendBackAnswer]: ...  # fmt: skip


class SendBack:
    """Hands failed messages of one group back to the broker."""

    def __init__(
        self, client: SendingBack, group: str, options: ConsumerOptions, counters: Counters,
        on_retry_sent: Callable[[], None], logs: RateLimitedLog, policy: RetryPolicy = SEND_BACK_POLICY,
    ) -> None:  # fmt: skip
        self.client = client
        self.group = group
        self.options = options
        self.counters = counters
        #: called after a copy reached the retry topic (it may have just been created)
        self.on_retry_sent = on_retry_sent
        self.logs = logs
        self.policy = policy
        self._delays_ms = [int(d * 1000) for d in options.retry_delays]
        #: an ephemeral group, or no group (manual assignment): nothing goes to the broker,
        #: a message given up on is dropped
        self.ephemeral = not group or is_ephemeral(group)
        self._why = f"ephemeral group {group}" if group else "a consumer without a group"

    def _drop_ephemeral(self, where: tuple[str, int, int], what: str, detail: str = "") -> SendBackResult:
        self.counters.dropped += 1
        self.logs.log(
            logging.ERROR, f"dropped {where[0]}",
            "%s %s/%d@%d%s: %s has no retry or dead-letter topic; dropping it",
            what, *where, detail, self._why,
        )  # fmt: skip
        return SendBackResult.DROPPED

    async def send(self, m: Message, where: tuple[str, int, int]) -> SendBackResult:
        """Send ``m`` back; ``where`` is (topic, queue, queue offset) as it was read (the
        retry topic for a retried message). See the module docs for the results."""
        o = self.options
        if self.ephemeral:
            return self._drop_ephemeral(where, "message", f" failed {m.reconsume_times + 1} time(s)")
        err, ans = await self._send(where, m.reconsume_times, o.max_reconsume_times)
        if _permanent(err) and m.reconsume_times < o.max_reconsume_times:
            # refused for good on the way to the retry topic (a delay past the broker's
            # limit, say): the dead-letter topic takes it without a delay, or refuses it too
            first = err
            err, ans = await self._send(where, m.reconsume_times, 0)
            if _permanent(err):
                err = first
        if ans is not None:
            if not ans.dead_lettered:
                self.counters.retried += 1
                self.on_retry_sent()
            else:
                self.counters.dead_lettered += 1
                log.warning("message %s/%d@%d moved to %s after %d attempts",
                            m.topic, m.queue_id, m.queue_offset, ans.topic, m.reconsume_times + 1)  # fmt: skip
            return SendBackResult.SENT
        if not _permanent(err):
            log.warning("could not send %s/%d@%d back: %s (it is retried here later)",
                        m.topic, m.queue_id, m.queue_offset, err)  # fmt: skip
            return SendBackResult.UNSENT
        self.counters.dropped += 1
        self.logs.log(
            logging.ERROR, f"dropped {m.topic}",
            "message %s/%d@%d failed and the broker refuses to take it back (%s); dropping it",
            m.topic, m.queue_id, m.queue_offset, err,
        )  # fmt: skip
        return SendBackResult.DROPPED

    async def dead_letter(self, where: tuple[str, int, int]) -> SendBackResult:
        """Send the poison record at ``where`` (topic, queue, queue offset) -- a stored
        record this consumer cannot decode -- straight to the group's dead-letter
        topic, without a retry: the broker copies what it can salvage of it there
        (docs/consumer.md, "When a message cannot be handled"). ``SENT``: it is in the
        dead-letter topic; ``DROPPED``: the broker refused it for good (logged);
        ``UNSENT``: the broker's own trouble, try again later."""
        if self.ephemeral:
            return self._drop_ephemeral(where, "poison record")
        err, ans = await self._send(where, 0, 0)  # 0 attempts >= a maximum of 0: dead letter
        if ans is not None:
            return SendBackResult.SENT
        if not _permanent(err):
            return SendBackResult.UNSENT
        self.counters.dropped += 1
        self.logs.log(
            logging.ERROR, f"dropped {where[0]}",
            "poison record %s/%d@%d: the broker refuses to dead-letter it (%s); dropping it", *where, err,
        )  # fmt: skip
        return SendBackResult.DROPPED

    async def _send(
        self, where: tuple[str, int, int], reconsume_times: int, max_reconsume_times: int
    ) -> tuple[EQueueError | None, control.SendBackAnswer | None]:
        """One SEND_BACK (retrying transient errors): (the error, None) or (None, the answer)."""

        async def once() -> control.SendBackAnswer:
            return await self.client.send_back(
                self.group, *where, reconsume_times, max_reconsume_times, self._delays_ms
            )

        try:
            return None, await retry_async(once, self.policy, what=f"consumer.send_back:{self.group}")
        except EQueueError as exc:
            return exc, None
