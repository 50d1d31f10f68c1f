"""equeue producer SDK. ``AsyncClient`` and ``Client`` are re-exported from :mod:`client`."""

from client import AsyncClient, Client
from equeue.models import Message, SendResult
from producer._batch import SendHandle
from producer.producer import AsyncProducer, Producer, QueueSelector

__all__ = [
    "AsyncClient",
    "AsyncProducer",
    "Client",
    "Message",
    "Producer",
    "QueueSelector",
    "SendHandle",
    "SendResult",
]
