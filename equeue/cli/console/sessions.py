"""The console's sign-in sessions: who is signed in, and the connection each one uses.

A user signs in with one of the cluster's SCRAM users: :meth:`SessionTable.open`
opens an :class:`~equeue.client.async_admin.AsyncAdminClient` with that user's credentials
(the handshake runs SCRAM, so a wrong password is refused by the broker itself) and keeps
it open for the session's life in a task of the console's nursery. Every page the user
asks for goes to the brokers through that admin client, so the broker's ACLs decide what each person sees and may do.

The password lives only here, in the client's settings in memory: the browser holds
a signed cookie with a random session id (:mod:`equeue.cli.console.app`). A session ends
on sign-out, or after ``idle`` seconds without a request (:meth:`SessionTable.expire`,
called by the console's reaper task); its connections are closed then.

:class:`Link` is one such held connection; the console's own (with its credentials:
the sampler's) and the credential-less one of open mode's pages are links too.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import attrs
import trio

from equeue.client.async_admin import AsyncAdminClient
from equeue.client.async_client import AsyncClient
from equeue.client.retry import RetryPolicy
from equeue.errors import ConnectionBroken, EQueueError, NotAuthorized
from equeue.security import ClientSecurity, Credentials

log = logging.getLogger("equeue.cli.console")

__all__ = ["CONSOLE_POLICY", "MAX_SESSIONS", "Link", "Session", "SessionTable", "open_link"]

#: how the console retries a request: briefly, so a dead broker shows as an error on
#: the page within seconds instead of holding the request for a failover's length
CONSOLE_POLICY = RetryPolicy(attempts=2, timeout=4.0)
#: seconds a connection attempt to one broker may take
CONNECT_TIMEOUT = 3.0
#: seconds between two route refreshes of a held router
REFRESH_INTERVAL = 30.0
#: most sessions held at once (each holds connections): past it, the least recently
#: used one is signed out
MAX_SESSIONS = 1000


@attrs.define
class Link:
    """A held admin client (open until :meth:`close`)."""

    admin: AsyncAdminClient
    stop: trio.Event = attrs.field(factory=trio.Event)

    @property
    def client(self) -> AsyncClient:
        """The admin client's bootstrap connection."""
        return self.admin.client

    def close(self) -> None:
        """End the task that holds the connection (it closes them)."""
        self.stop.set()


async def _probe(client: AsyncClient) -> None:
    """Make the client connect and authenticate: a request every authenticated user
    may make (an empty route table). A refusal by an ACL still proves the sign-in."""
    try:
        await client.get_routes([])
    except NotAuthorized:
        pass


async def open_link(
    nursery: trio.Nursery, brokers: str, security: ClientSecurity, *, probe: bool
) -> Link:
    """Open an admin client to ``brokers`` held by a task of ``nursery`` until the
    returned link is closed (or the nursery ends). With ``probe``, connect now and
    raise what the sign-in raises (AuthFailed, AuthRequired, ConnectionBroken,
    TlsError); without, the client connects on its first request.

    The holding task is started with ``nursery.start``: until the link is open it runs
    under the caller's cancel scope, so a caller cancelled meanwhile (a sign-in past its
    time) leaves no connection behind."""
    return await nursery.start(_hold, brokers, security, probe)  # type: ignore[no-any-return]


async def _hold(
    brokers: str, security: ClientSecurity, probe: bool, *, task_status: trio.TaskStatus[Link] = trio.TASK_STATUS_IGNORED
) -> None:
    """:func:`open_link`'s task: open, report the link, hold it until it is closed."""
    failed: list[EQueueError] = []
    started = False
    try:
        async with AsyncAdminClient(
            brokers, security=security, connect_timeout=CONNECT_TIMEOUT, refresh_interval=REFRESH_INTERVAL,
            policy=CONSOLE_POLICY,
        ) as admin:  # fmt: skip
            try:  # inside the client's block: its errors are caught here, not wrapped in a group
                if probe:
                    with trio.fail_after(CONNECT_TIMEOUT * 3):
                        await _probe(admin.client)
            except trio.TooSlowError:
                failed.append(ConnectionBroken(f"no answer from {brokers} within {CONNECT_TIMEOUT * 3:g} s"))
            except EQueueError as exc:
                failed.append(exc)
            if not failed:
                link = Link(admin)
                task_status.started(link)
                started = True
                await link.stop.wait()
    except Exception:  # a bug must not end the console: this link ends
        log.exception("console connection to %s failed", brokers)
        if not started:
            raise ConnectionBroken(f"could not open a connection to {brokers}") from None
    if failed:  # raised by nursery.start to open_link's caller, out of the client's block
        raise failed[0]


@attrs.define
class Session:
    """One signed-in user: the session id (the cookie's value), the user name, the
    held link, the CSRF token of its forms and when it was last used (the table's clock)."""

    sid: str
    username: str
    link: Link
    csrf: str
    last_used: float


class SessionTable:
    """The signed-in sessions by id, in memory (a restart signs everyone out)."""

    def __init__(
        self, nursery: trio.Nursery, brokers: str, security: ClientSecurity, *, idle: float,
        clock: Callable[[], float] = trio.current_time, max_sessions: int = MAX_SESSIONS,
    ) -> None:  # fmt: skip
        self._nursery = nursery
        self.max_sessions = max_sessions
        self._brokers = brokers
        #: the console's TLS settings to the brokers (credentials: each user's)
        self._tls = security.tls
        self.idle = idle
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    async def open(self, username: str, password: str) -> Session:
        """Sign ``username`` in: connect with its credentials. Raises AuthFailed (the
        broker refused them), ConfigError (an empty name or password), ConnectionBroken
        (no broker answered)."""
        creds = Credentials(username, password)
        link = await open_link(self._nursery, self._brokers, ClientSecurity(tls=self._tls, credentials=creds), probe=True)
        session = Session(secrets.token_urlsafe(32), username, link, secrets.token_urlsafe(32), self._clock())
        if len(self._sessions) >= self.max_sessions:
            self.expire()
        while len(self._sessions) >= self.max_sessions:
            self.close(min(self._sessions.values(), key=lambda s: s.last_used).sid)
        self._sessions[session.sid] = session
        log.info("console sign-in", extra={"user": username})
        return session

    def get(self, sid: Any) -> Session | None:
        """The live session of ``sid`` (None: unknown or expired); marks it used."""
        if not isinstance(sid, str):
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used > self.idle:
            self.close(sid)
            return None
        session.last_used = now
        return session

    def close(self, sid: str) -> None:
        """Sign out: forget the session and close its connection."""
        session = self._sessions.pop(sid, None)
        if session is not None:
            session.link.close()

    def expire(self) -> int:
        """Close every session idle for longer than ``idle``; how many."""
        now = self._clock()
        old = [sid for sid, s in self._sessions.items() if now - s.last_used > self.idle]
        for sid in old:
            self.close(sid)
        return len(old)

    def close_all(self) -> None:
        for sid in list(self._sessions):
            self.close(sid)
