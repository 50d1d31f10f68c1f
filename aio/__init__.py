"""equeue asyncio SDK: the asyncio front over the trio cores (docs/asyncio.md).

- :mod:`equeue.aio.front`: :class:`AsyncProducer`, :class:`AsyncConsumer`,
  :class:`AsyncClient` and :class:`AioSendHandle` for asyncio code (``asyncio.run``,
  uvloop, Starlette/FastAPI), each over a trio core on a private loop thread.

The one package of equeue that imports asyncio (an import-linter contract).
"""

if __name__ != "equeue.aio":  # this folder is mapped to equeue.aio; a second name would load it twice
    raise ImportError(f"import this package as equeue.aio, not {__name__}")

from equeue.aio.front import AioSendHandle, AsyncClient, AsyncConsumer, AsyncProducer

__all__ = ["AioSendHandle", "AsyncClient", "AsyncConsumer", "AsyncProducer"]
