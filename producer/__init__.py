"""equeue producer SDK (and the client core shared by the consumer, CLI and Spark)."""

from equeue.models import Message, SendResult
from producer._batch import SendHandle
from producer.client import AsyncClient
from producer.producer import AsyncProducer, Producer, QueueSelector
from producer.sync_client import Client

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
