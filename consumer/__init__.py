"""equeue consumer SDK: consumer groups with broker-enforced queue ownership,
long-poll pull, sliding-window offsets, flow control, retry and dead letters.

``Consumer`` (blocking) and ``AsyncConsumer`` (trio) share one core. See
docs/consumer.md. It exports only its own names: ``Message`` and ``StartFrom`` come from
:mod:`equeue` (``StartFrom`` lives in :mod:`equeue.config`, which the broker reads too).
"""

if __name__ != "equeue.consumer":  # this folder is mapped to equeue.consumer; a second name would load it twice
    raise ImportError(f"import this package as equeue.consumer, not {__name__}")


from equeue.consumer.async_consumer import AsyncConsumer, ConsumerStatistics
from equeue.consumer.consumer import Consumer
from equeue.consumer.options import ConsumeMode, ConsumerOptions, HandlerThreads

__all__ = [
    "AsyncConsumer",
    "ConsumeMode",
    "Consumer",
    "ConsumerOptions",
    "ConsumerStatistics",
    "HandlerThreads",
]
