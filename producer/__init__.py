"""equeue producer SDK (and the client core shared by the consumer, CLI and Spark)."""

from equeue.models import Message, SendResult
from producer.client import AsyncClient
from producer.sync_client import Client

__all__ = ["AsyncClient", "Client", "Message", "SendResult"]
