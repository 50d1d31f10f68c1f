"""equeue: a partitioned-log message broker for Python.

This package is the shared vocabulary with no I/O: message models, the wire codec,
routing, allocation strategies, errors and configuration, plus the ``equeue`` CLI.
"""

from equeue.errors import *  # noqa: F403
from equeue.errors import __all__ as _errors_all
from equeue.models import Message, PullResult, SendResult
from equeue.protocol import PullStatus, PushCode, RequestCode
from equeue.routing import key_hash, queue_for_key

__version__ = "0.1.0"

__all__ = [
    *_errors_all,
    "Message",
    "PullResult",
    "PullStatus",
    "PushCode",
    "RequestCode",
    "SendResult",
    "__version__",
    "key_hash",
    "queue_for_key",
]
