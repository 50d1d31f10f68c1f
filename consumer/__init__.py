"""equeue consumer SDK: consumer groups with broker-enforced queue ownership,
long-poll pull, sliding-window offsets, flow control, retry and dead letters.

``Consumer`` (blocking) and ``AsyncConsumer`` (trio) share one core. See
docs/consumer.md.
"""

if __name__ != "equeue.consumer":  # this folder is mapped to equeue.consumer; a second name would load it twice
    raise ImportError(f"import this package as equeue.consumer, not {__name__}")


from equeue.consumer.core import AsyncConsumer, ConsumerStatistics
from equeue.consumer.options import ConsumeMode, ConsumerOptions, HandlerThreads, StartFrom
from equeue.consumer.sync import Consumer
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
