"""A broker in a background thread, for blocking code (demos, Spark jobs, tests)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING

import trio

from equeue.config import BrokerConfig
from equeue.errors import EQueueError, first_error

if TYPE_CHECKING:
    from equeue.broker.server import Broker


class EmbeddedBroker:
    """Run a :class:`~equeue.broker.server.Broker` on its own trio loop in a thread.

    ``with EmbeddedBroker(BrokerConfig(data_dir=..., port=0)) as b: b.address``.
    :meth:`stop` shuts it down gracefully and joins the thread. A start-up refusal is
    raised from :meth:`start` as itself (``StartupError`` for a port that is taken,
    ``ConfigError`` for a bad certificate, ``DataDirLocked``...); any other error
    of the broker is re-raised from :meth:`start`/:meth:`stop` as an EQueueError.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.port = 0
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._broker: Broker | None = None
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def http_port(self) -> int:
        """The bound port of the /metrics and /stats endpoint (0: none, or not started)."""
        return self._broker.http_port if self._broker is not None else 0

    def start(self) -> EmbeddedBroker:
        from equeue.broker.server import Broker

        broker = self._broker = Broker(self.config)

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as n:
                self.port = await n.start(broker.serve)
                self._ready.set()

        def target() -> None:
            try:
                trio.run(main)
            except BaseException as exc:
                self._error = exc
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=target, name="equeue-broker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            refusal = first_error(self._error)
            if refusal is not None:  # StartupError, ConfigError, DataDirLocked, StoreDamaged...
                raise refusal
            raise EQueueError(f"broker failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._token is not None and self._broker is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._broker.stop, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise EQueueError(f"broker failed: {self._error}") from self._error

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
