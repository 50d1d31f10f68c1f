"""equeue: a partitioned-log message broker for Python.

One import package. The shared vocabulary (models, errors, routing, the wire codec) sits here
with no I/O; the SDK, the broker and the Spark connector are its subpackages:

    from equeue import Producer, Consumer, Message       # the blocking SDK
    from equeue import AsyncProducer, AsyncConsumer      # the trio SDK
    from equeue import AdminClient, AsyncAdminClient     # cluster administration
    from equeue import Client, AsyncClient               # one broker's requests
    from equeue.config import BrokerConfig
    from equeue.broker import EmbeddedBroker
    from equeue import spark                             # needs the ``spark`` extra

The SDK names are loaded on first use, so ``import equeue`` stays light (no trio, no sockets).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from equeue.errors import *  # noqa: F403
from equeue.errors import __all__ as _errors_all
from equeue.models import Message, PullResult, SendResult
from equeue.protocol import PullStatus, PushCode, RequestCode
from equeue.routing import key_hash, queue_for_key

DISTRIBUTION = "equeue-broker"
"""The name this package is published under on PyPI (``equeue`` there is another project)."""

# Short names for the SDK, imported from their subpackage on first access (PEP 562).
_LAZY = {
    "Producer": "equeue.producer",
    "AsyncProducer": "equeue.producer",
    "ProducerOptions": "equeue.producer",
    "SendHandle": "equeue.producer",
    "Consumer": "equeue.consumer",
    "AsyncConsumer": "equeue.consumer",
    "ConsumerOptions": "equeue.consumer",
    "StartFrom": "equeue.config",
    "Client": "equeue.client",
    "AsyncClient": "equeue.client",
    "AdminClient": "equeue.client",
    "AsyncAdminClient": "equeue.client",
}

if TYPE_CHECKING:
    __version__: str
    from equeue.client import AdminClient, AsyncAdminClient, AsyncClient, Client
    from equeue.config import StartFrom
    from equeue.consumer import AsyncConsumer, Consumer, ConsumerOptions
    from equeue.producer import AsyncProducer, Producer, ProducerOptions, SendHandle


def _version() -> str:
    """The installed distribution's version (``pyproject.toml`` is its one source)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a source tree on sys.path without an install: no metadata
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Load an SDK name from its subpackage, or read ``__version__`` from the installed
    metadata, the first time it is asked for (``importlib.metadata`` is a heavy import).

    Raises AttributeError for any other name, so ``from equeue import spark`` still imports the
    subpackage.
    """
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'equeue' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    *_errors_all,
    "DISTRIBUTION",
    "AdminClient",
    "AsyncAdminClient",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "Client",
    "Consumer",
    "ConsumerOptions",
    "Message",
    "Producer",
    "ProducerOptions",
    "PullResult",
    "PullStatus",
    "PushCode",
    "RequestCode",
    "SendHandle",
    "SendResult",
    "StartFrom",
    "__version__",
    "key_hash",
    "queue_for_key",
]
