"""equeue asyncio SDK: the asyncio front over the trio cores (docs/asyncio.md).

- :mod:`equeue.aio.producer`: :class:`AsyncProducer` and :class:`AioSendHandle`;
- :mod:`equeue.aio.consumer`: :class:`AsyncConsumer`;
- :mod:`equeue.aio.client`: :class:`AsyncClient`, one broker's requests;
- :mod:`equeue.aio.admin`: :class:`AsyncAdminClient`, the admin operations that span a cluster;
- :mod:`equeue.aio.bridge`: what they share, a trio core on a private loop thread awaited
  from asyncio.

For asyncio code (``asyncio.run``, uvloop, Starlette/FastAPI, aiohttp). The one package of
equeue that imports asyncio (an import-linter contract).
"""

if __name__ != "equeue.aio":  # this folder is mapped to equeue.aio; a second name would load it twice
    raise ImportError(f"import this package as equeue.aio, not {__name__}")

from equeue.aio.admin import AsyncAdminClient
from equeue.aio.client import AsyncClient
from equeue.aio.consumer import AsyncConsumer
from equeue.aio.producer import AioSendHandle, AsyncProducer

__all__ = ["AioSendHandle", "AsyncAdminClient", "AsyncClient", "AsyncConsumer", "AsyncProducer"]
