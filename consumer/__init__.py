"""equeue consumer SDK: consumer groups with broker-enforced queue ownership,
long-poll pull, sliding-window offsets, flow control, retry and dead letters.

``Consumer`` (blocking) and ``AsyncConsumer`` (trio) share one core. See
docs/consumer.md.
"""

from consumer.core import AsyncConsumer, ConsumerStatistics
from consumer.options import ConsumeMode, ConsumerOptions, HandlerThreads, StartFrom
from consumer.sync import Consumer
from equeue.models import Message

__all__ = [
    "AsyncConsumer",
    "ConsumeMode",
    "Consumer",
    "ConsumerOptions",
    "ConsumerStatistics",
    "HandlerThreads",
    "Message",
    "StartFrom",
]
