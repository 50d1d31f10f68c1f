"""equeue producer SDK.

- :mod:`equeue.producer.async_producer`: :class:`AsyncProducer` (trio), the submit path;
- :mod:`equeue.producer.producer`: :class:`Producer`, its blocking twin;
- :mod:`equeue.producer.options`: :class:`ProducerOptions` and :class:`OnFull`;
- :mod:`equeue.producer.routes`: queue counts and queue selection;
- :mod:`equeue.producer.buffer`: the bound on buffered bytes;
- :mod:`equeue.producer.stats`: what the sends came to (:class:`SendStats`);
- :mod:`equeue.producer._lane`: the ordered, pipelined, idempotent send path of one queue;
- :mod:`equeue.producer._batch`: batches, due times and :class:`SendHandle`.

It exports only its own names: ``Message`` and ``SendResult`` come from :mod:`equeue`
(:mod:`equeue.models`), ``Client`` and ``AsyncClient`` from :mod:`equeue.client`
(tests/unit/test_sdk_exports.py keeps it so).
"""

if __name__ != "equeue.producer":  # this folder is mapped to equeue.producer; a second name would load it twice
    raise ImportError(f"import this package as equeue.producer, not {__name__}")


from equeue.producer._batch import DeliveryCallback, DoneCallback, SendHandle
from equeue.producer.async_producer import AsyncProducer
from equeue.producer.options import OnFull, ProducerOptions, QueueSelector
from equeue.producer.producer import Producer
from equeue.producer.stats import SendStats

__all__ = [
    "AsyncProducer",
    "DeliveryCallback",
    "DoneCallback",
    "OnFull",
    "Producer",
    "ProducerOptions",
    "QueueSelector",
    "SendHandle",
    "SendStats",
]
