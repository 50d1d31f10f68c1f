"""``Client``: the blocking twin of :class:`equeue.client.connection.AsyncClient`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue.client.connection import AsyncClient
from equeue.client.syncfront import SyncFront


class Client(SyncFront[AsyncClient]):
    """Blocking admin/low-level client. Every method of :class:`AsyncClient`
    (``create_topic``, ``pull``, ``describe_group``, ...) is available with the same
    arguments, blocking until the answer arrives."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs

    def _make_core(self) -> AsyncClient:
        return AsyncClient(self.brokers, **self._kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(AsyncClient, name, None)
        if attr is None or not callable(attr):
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._call(lambda core: getattr(core, name)(*args, **kwargs))

        method.__name__ = name
        method.__doc__ = attr.__doc__
        return method

    def close(self) -> None:
        self._close_core(lambda core: core.aclose())
