"""Retry and dead letters: sending a failed message back, and how a retried one looks.

A handler that raises sends the message back (SEND_BACK): the broker copies it to
the group's retry topic ``%RETRY%<group>`` as a *delayed* message, ``deliver_at =
now + delay`` where the delay is ``retry_delays[reconsume_times]`` (the last one
repeats), with ``reconsume_times + 1`` and properties recording where it came from.
After ``max_reconsume_times`` retries it goes to ``%DLQ%<group>`` instead. Every member of
the group consumes the retry topic; a message read from it is presented as its
origin (topic, queue, offsets) with ``reconsume_times`` set.
"""

from __future__ import annotations

from equeue.models import (
    PROP_ORIGIN_GLOBAL,
    PROP_ORIGIN_OFFSET,
    PROP_ORIGIN_QUEUE,
    PROP_ORIGIN_TOPIC,
    Message,
)

__all__ = ["as_origin"]


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
