"""Retry and dead letters: what a failed message becomes, and how a retried one looks.

A handler that raises sends the message back through the group's retry topic
``%RETRY%<group>`` as a *delayed* message: ``deliver_at = now + delay`` where the
delay is ``retry_delays[reconsume_times]`` (the last one repeats), with
``reconsume_times + 1`` and properties recording where it came from. After
``max_reconsume_times`` retries it goes to ``%DLQ%<group>`` instead. Every member of
the group consumes the retry topic; a message read from it is presented as its
origin (topic, queue, offsets) with ``reconsume_times`` set.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from equeue.models import (
    PROP_ORIGIN_GLOBAL,
    PROP_ORIGIN_OFFSET,
    PROP_ORIGIN_QUEUE,
    PROP_ORIGIN_TOPIC,
    PROP_RETRY_GROUP,
    Message,
)
from equeue.names import dlq_topic, retry_topic

__all__ = ["as_origin", "retry_delay", "send_back_message"]


def retry_delay(delays: Sequence[float], reconsume_times: int) -> float:
    """Seconds to wait before attempt ``reconsume_times + 1`` (the last delay repeats)."""
    if not delays:
        return 0.0
    return float(delays[min(reconsume_times, len(delays) - 1)])


def send_back_message(
    msg: Message, group: str, delays: Sequence[float], max_reconsume_times: int, now_ms: int | None = None
) -> tuple[str, Message]:
    """(topic, message to produce) for a message whose handler raised.

    The retry topic with a delay while ``msg.reconsume_times < max_reconsume_times``,
    else the dead-letter topic (no delay). ``msg`` is as the handler saw it (origin
    topic/queue/offsets); origin properties already present are kept.
    """
    props = dict(msg.properties)
    props.setdefault(PROP_ORIGIN_TOPIC, msg.topic)
    props.setdefault(PROP_ORIGIN_QUEUE, str(msg.queue_id))
    props.setdefault(PROP_ORIGIN_OFFSET, str(msg.queue_offset))
    props.setdefault(PROP_ORIGIN_GLOBAL, str(msg.global_offset))
    props[PROP_RETRY_GROUP] = group
    rc = msg.reconsume_times
    if rc >= max_reconsume_times:
        return dlq_topic(group), Message(msg.body, msg.key, msg.tags, props, reconsume_times=rc)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    deliver_at = now + int(retry_delay(delays, rc) * 1000)
    return retry_topic(group), Message(
        msg.body, msg.key, msg.tags, props, deliver_at=deliver_at, reconsume_times=rc + 1
    )


def as_origin(msg: Message) -> Message:
    """Present a message read from a retry topic as its origin (in place; returned)."""
    props = msg.properties
    topic = props.get(PROP_ORIGIN_TOPIC)
    if topic is None:
        return msg
    msg.topic = topic
    try:
        msg.queue_id = int(props.get(PROP_ORIGIN_QUEUE, msg.queue_id))
        msg.queue_offset = int(props.get(PROP_ORIGIN_OFFSET, msg.queue_offset))
        msg.global_offset = int(props.get(PROP_ORIGIN_GLOBAL, msg.global_offset))
    except ValueError:
        pass
    return msg
