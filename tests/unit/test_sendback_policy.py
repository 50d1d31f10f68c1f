"""What the consumer does when the broker refuses a send-back (consumer/sendback.py):
a refusal about the message itself drops it (after the dead-letter topic refused it
too); the broker's own trouble keeps it (UNSENT: the handler runs again later)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import trio

from equeue import control
from equeue.client.retry import RetryPolicy
from equeue.consumer.options import ConsumerOptions
from equeue.consumer.sendback import SendBack, SendBackResult
from equeue.consumer.stats import Counters
from equeue.errors import EQueueError, InternalBrokerError, MessageTooLarge, StoreFull
from equeue.logs import RateLimitedLog
from equeue.models import Message

NO_WAIT = RetryPolicy(attempts=2, timeout=None, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0)


class RefusingClient:
    """Answers every SEND_BACK with ``error`` (and records the maxima it was asked for)."""

    def __init__(self, error: EQueueError) -> None:
        self.error = error
        self.asked: list[int] = []

    async def send_back(
        self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int,
        max_reconsume_times: int = 16, retry_delays_ms: Sequence[int] = (),
    ) -> control.SendBackAnswer:  # fmt: skip
        self.asked.append(max_reconsume_times)
        raise self.error


async def _send(error: EQueueError) -> tuple[SendBackResult, Counters, RefusingClient]:
    client = RefusingClient(error)
    counters = Counters()
    logs = RateLimitedLog(logging.getLogger("test"), 10.0, trio.current_time)
    sb = SendBack(client, "g", ConsumerOptions(), counters, lambda: None, logs, NO_WAIT)
    result = await sb.send(Message(b"x", topic="t", queue_id=0, queue_offset=7), ("t", 0, 7))
    return result, counters, client


async def test_a_refusal_of_the_message_drops_it_after_the_dead_letter_topic_refused_too() -> None:
    result, counters, client = await _send(MessageTooLarge("too big"))
    assert result is SendBackResult.DROPPED and counters.dropped == 1
    assert client.asked == [ConsumerOptions().max_reconsume_times, 0]  # retry topic, then the DLQ


@pytest.mark.parametrize("error", [StoreFull("map full"), InternalBrokerError("oops")])
async def test_the_brokers_own_trouble_never_drops_a_message(error: EQueueError) -> None:
    result, counters, client = await _send(error)
    assert result is SendBackResult.UNSENT and counters.dropped == 0
    assert client.asked == [ConsumerOptions().max_reconsume_times]  # no dead-letter shortcut
