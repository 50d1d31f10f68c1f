"""What a handler knows of the request it answers: its context (the request id, the
connection's push and output, the session), whether the broker is shutting down,
and the form of its answer.
"""

from __future__ import annotations

from equeue.broker.groups import Notify
from equeue.broker.handshake import Session
from equeue.broker.writer_answers import ThreadWritable

__all__ = ["Closing", "Parts", "RequestContext"]

#: a response payload, as pieces
Parts = list[bytes]


class RequestContext:
    """What a handler may know of the request it answers and of its connection.

    ``notify`` pushes GROUP_CHANGED to the connection (heartbeats register it).
    ``output`` is where the writer thread may write this request's answer itself
    (parked pulls, :mod:`equeue.broker.writer_answers`); None: answers go through the caller.
    ``session`` says who sent it (:class:`equeue.broker.handshake.Session`: the user, the
    peer); None, or a session without a user: the broker does not authenticate.
    """

    __slots__ = ("notify", "output", "request_id", "session")

    def __init__(
        self,
        request_id: int = 0,
        notify: Notify | None = None,
        output: ThreadWritable | None = None,
        session: Session | None = None,
    ) -> None:
        self.request_id = request_id
        self.notify = notify
        self.output = output
        self.session = session

    @property
    def principal(self) -> str | None:
        """The authenticated user (None: authentication is off)."""
        return None if self.session is None else self.session.principal

    @property
    def peer(self) -> str:
        return "?" if self.session is None else self.session.peer


class Closing:
    """Whether the broker is shutting down (set once by the server; read by handlers)."""

    __slots__ = ("closing",)

    def __init__(self) -> None:
        self.closing = False
