"""The console's ASGI application (Starlette, Jinja2 templates, htmx and uPlot).

:class:`Console` owns the state: the console's own connection to the brokers, the
sign-in sessions, the sampler; :meth:`Console.lifespan` opens them in one trio
nursery (the application's lifespan) and closes them at its end. :meth:`Console.app`
is the Starlette application.

Requests:

- every page is a GET that renders a whole page; htmx refreshes the part of it with
  id ``live`` every few seconds by asking the same URL again (``hx-select``);
- every action is a POST of a form carrying the CSRF token (field ``csrf`` or
  header ``X-CSRF-Token``), answered by a redirect to the page with a one-line
  result (a "flash" in the signed cookie);
- a refused or failed request to the brokers, a broker that does not answer and a
  bad form value are shown on the page as one line (the broker's own message, e.g.
  NOT_AUTHORIZED naming the user and the right it lacks), never as a traceback.

Sign-in (docs/console.md): when the brokers authenticate connections, a user signs in
with a SCRAM user of the cluster (:mod:`equeue.cli.console.sessions`); when they do not,
the console is open and says so on every page.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urlencode

import attrs
import jinja2
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from equeue.cli.console import pages, views
from equeue.cli.console.failures import BadInput, describe, equeue_errors
from equeue.cli.console.sampler import DEFAULT_INTERVAL, DEFAULT_WINDOW, Sampler
from equeue.cli.console.sessions import CONNECT_TIMEOUT, Link, SessionTable, _probe, open_link
from equeue.cli.console.throttle import SignInThrottle
from equeue.client.async_admin import AsyncAdminClient
from equeue.client.async_client import AsyncClient
from equeue.client.httpserve import MAX_REQUEST_HEAD, HeadLimit
from equeue.errors import (
    AuthenticationError,
    AuthRequired,
    ConfigError,
    EQueueError,
    GroupHasMembers,
    GroupNotFound,
    MessageNotFound,
    NotAuthorized,
    TopicNotFound,
)
from equeue.logs import RateLimitedLog
from equeue.security import ClientSecurity

log = logging.getLogger("equeue.cli.console")

__all__ = ["MAX_REQUEST_BODY", "MAX_REQUEST_HEAD", "BodyLimit", "Console", "ConsoleConfig", "HeadLimit"]

#: bytes of a request body (a form)
MAX_REQUEST_BODY = 64 * 1024
#: seconds a page may spend asking the brokers
PAGE_BUDGET = 10.0
#: the session cookie's name
COOKIE = "equeue_console"
#: characters of a one-line result kept in the cookie
_FLASH_CHARS = 600

_PACKAGE = "equeue.cli.console"


@attrs.frozen
class ConsoleConfig:
    """What the console serves: the brokers to ask (``host:port``, comma-separated:
    any one of them bootstraps), the TLS settings to them and the console's own
    credentials (``security``: the ``EQUEUE_*`` environment, as the CLI's; used by
    the sampler alone: open mode's pages use its TLS settings only), how long an
    idle session lives, the sampler's period and window, the pages' refresh period,
    whether the console itself serves HTTPS (then its cookie is Secure) and the most
    connections it serves at once (more are refused: :mod:`equeue.client.httpserve`)."""

    brokers: str
    security: ClientSecurity = attrs.Factory(ClientSecurity)
    session_idle: float = 1800.0
    sample_interval: float = DEFAULT_INTERVAL
    window: float = DEFAULT_WINDOW
    refresh_s: float = 5.0
    https: bool = False
    max_connections: int = 256


class BodyLimit:
    """ASGI middleware: an HTTP/1.1 request body must say its length (411) and be at
    most ``limit`` bytes (413): forms are small, and a body is read whole before it is
    parsed. The bytes that arrive are counted too (an HTTP/2 body need not say its
    length): the body is read here, up to ``limit``, before the application sees it."""

    def __init__(self, app: ASGIApp, limit: int = MAX_REQUEST_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is None and b"transfer-encoding" in headers:
            await self._refuse(scope, receive, send, 411, "a request body needs a Content-Length\n")
            return
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(scope, receive, send, 413, f"a request body is at most {self.limit} bytes\n")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._refuse(scope, receive, send, 413, f"a request body is at most {self.limit} bytes\n")
                return
            if not message.get("more_body", False):
                break
        read = False

        async def replay() -> Message:
            nonlocal read
            if read:
                return await receive()
            read = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, text: str) -> None:
        await PlainTextResponse(text, status_code=status, headers={"connection": "close"})(scope, receive, send)


class SecurityHeaders:
    """ASGI middleware: every answer forbids framing, inline scripts and sniffing."""

    HEADERS = [
        (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; "
         b"img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
        (b"x-frame-options", b"DENY"),
    ]  # fmt: skip

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *self.HEADERS]
            await send(message)

        await self.app(scope, receive, send_with)


@attrs.frozen
class Viewer:
    """Who asks, and through which connection: ``user`` None in open mode."""

    admin: AsyncAdminClient
    user: str | None
    csrf: str


class _Redirect(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _status_for(errors: list[EQueueError]) -> int:
    first = errors[0]
    if isinstance(first, BadInput | ConfigError):
        return 400
    if isinstance(first, NotAuthorized | AuthenticationError):
        return 403
    if isinstance(first, TopicNotFound | GroupNotFound | MessageNotFound):
        return 404
    if isinstance(first, GroupHasMembers):
        return 409
    return 502


class Console:
    """The console's state and its ASGI application (module docstring)."""

    def __init__(self, config: ConsoleConfig, *, clock: Callable[[], float] = trio.current_time) -> None:
        self.config = config
        #: the sessions' idle clock (tests step it)
        self.clock = clock
        self.secret = secrets.token_urlsafe(32)
        #: "open" (the brokers need no sign-in), "auth", or None (not known yet: no
        #: broker answered)
        self.mode: str | None = None
        self._detecting = trio.Lock()
        self.sessions: SessionTable | None = None
        #: failed sign-ins per user name and client address (equeue.cli.console.throttle)
        self.throttle = SignInThrottle(clock)
        #: the console's own connection (its credentials): the sampler's alone
        self.service: Link | None = None
        #: the connection of open mode's pages: the TLS settings, no credentials, so
        #: that brokers which start authenticating answer AuthRequired (then: sign-in)
        self.anonymous: Link | None = None
        self.logs = RateLimitedLog(log, 10.0, trio.current_time)
        self.sampler = Sampler(lambda: self.service.admin if self.service else None,
                               interval=config.sample_interval, window=config.window)  # fmt: skip
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader(_PACKAGE, "templates"),
            autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters.update(size=views.size, iso=views.iso, duration=views.duration)
        self.env.globals.update(retention=views.retention, quote=quote)

    # ------------------------------------------------------------------ lifetime
    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Open the console's connection, session table, sampler and reaper; close
        every session and connection at the end. One lifespan at a time: the state
        belongs to the trio loop that runs it."""
        if self.service is not None:
            raise RuntimeError("this console already runs: one application (lifespan) at a time")
        async with trio.open_nursery() as nursery:
            self.service = await open_link(nursery, self.config.brokers, self.config.security, probe=False)
            self.anonymous = await open_link(nursery, self.config.brokers, self._anonymous_security(), probe=False)
            self.sessions = SessionTable(nursery, self.config.brokers, self.config.security,
                                         idle=self.config.session_idle, clock=self.clock)  # fmt: skip
            await self.detect_mode()
            nursery.start_soon(self.sampler.run)
            nursery.start_soon(self._reaper)
            try:
                yield
            finally:
                self.sessions.close_all()
                self.service.close()
                self.anonymous.close()
                self.service = self.anonymous = self.sessions = None
                nursery.cancel_scope.cancel()

    async def _reaper(self) -> None:
        assert self.sessions is not None
        while True:
            await trio.sleep(max(1.0, min(60.0, self.sessions.idle / 10)))
            self.sessions.expire()

    def _anonymous_security(self) -> ClientSecurity:
        """The console's TLS settings to the brokers, without its credentials."""
        return ClientSecurity(tls=self.config.security.tls)

    async def detect_mode(self) -> None:
        """Learn whether the brokers authenticate: ask over the credential-less link
        (the one open mode's pages use). Left unknown (None) when no broker answers;
        asked again by the next request."""
        async with self._detecting:  # one probe at a time: concurrent requests wait for its answer
            if self.mode is not None:
                return
            try:
                with trio.fail_after(CONNECT_TIMEOUT * 2):
                    if self.anonymous is not None:
                        await _probe(self.anonymous.client)
                    else:
                        async with AsyncClient(self.config.brokers, security=self._anonymous_security(),
                                               connect_timeout=CONNECT_TIMEOUT) as c:  # fmt: skip
                            await _probe(c)
                self.mode = "open"
            except AuthenticationError:
                self.mode = "auth"
            except (EQueueError, trio.TooSlowError) as exc:
                log.warning("console: no broker answered at %s: %s", self.config.brokers, exc)

    # ------------------------------------------------------------------ rendering
    def render(self, request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        """``template`` with the layout's values (the user, the open-mode banner, the
        CSRF token, the one-line result of the last action)."""
        flash = request.session.pop("flash", None)
        base = {
            "request": request,
            "path": request.url.path,
            "self_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "mode": self.mode,
            "user": ctx.pop("user", None),
            "csrf": self._csrf(request),
            "flash": flash,
            "refresh_s": self.config.refresh_s,
            "brokers": self.config.brokers,
            "error": None,
        }
        base.update(ctx)
        html = self.env.get_template(template).render(base)
        if request.headers.get("hx-request") and status >= 400:
            status = 200  # htmx swaps 2xx answers only: the refreshed part shows the error
        return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})

    def _csrf(self, request: Request) -> str:
        token = request.session.get("csrf")
        if not isinstance(token, str):
            token = secrets.token_urlsafe(32)
            request.session["csrf"] = token
        return token

    async def check_csrf(self, request: Request) -> Any:
        """The POSTed form, after its CSRF token (field or header) matched the
        session's. Raises _Redirect with a 403 page when it does not."""
        try:
            form = await request.form(max_files=0, max_fields=1000)
        except (HTTPException, MultiPartException) as exc:
            raise BadInput(f"the form could not be read: {getattr(exc, 'detail', None) or exc}") from None
        sent = str(form.get("csrf") or request.headers.get("x-csrf-token") or "")
        token = request.session.get("csrf")
        if not isinstance(token, str) or not secrets.compare_digest(sent.encode(), token.encode()):
            raise _Redirect(PlainTextResponse("refused: missing or wrong CSRF token (reload the page)\n", 403))
        return form

    @staticmethod
    def flash(request: Request, text: str, ok: bool = True) -> None:
        request.session["flash"] = {"ok": ok, "text": text[:_FLASH_CHARS]}

    # ------------------------------------------------------------------ who asks
    async def viewer(self, request: Request) -> Viewer:
        """The connection a request uses: the console's own (open mode) or the
        signed-in user's. Raises _Redirect to the sign-in page, or with an error page
        when no broker answered yet."""
        if self.mode is None:
            with trio.move_on_after(PAGE_BUDGET):
                await self.detect_mode()
        if self.mode == "open" and self.anonymous is not None:  # never the console's own credentials
            return Viewer(self.anonymous.admin, None, self._csrf(request))
        if self.mode == "auth" and self.sessions is not None:
            session = self.sessions.get(request.session.get("sid"))
            if session is None:
                target = "/login?" + urlencode({"next": request.url.path})
                if request.headers.get("hx-request"):  # a refresh after expiry: the whole page goes
                    raise _Redirect(Response(status_code=200, headers={"hx-redirect": target}))
                raise _Redirect(RedirectResponse(target, 303))
            return Viewer(session.link.admin, session.username, self._csrf(request))
        raise _Redirect(self.render(request, "error.html", 503, error=f"no broker answered at {self.config.brokers}: "
                                    "the console retries on the next request"))  # fmt: skip

    def page(self, handler: Callable[[Request, Viewer], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a page or action: sign-in, a time budget, and every failure as a page
        with one line (never a traceback)."""

        async def endpoint(request: Request) -> Response:
            try:
                v = await self.viewer(request)
                with trio.fail_after(PAGE_BUDGET):
                    return await handler(request, v)
            except _Redirect as r:
                return r.response
            except trio.TooSlowError:
                return self.render(request, "error.html", 504, user=self._user(request),
                                   error=f"the brokers did not answer within {PAGE_BUDGET:g} s")  # fmt: skip
            except Exception as exc:
                errors = equeue_errors(exc)
                if errors is None:  # a bug: logged (a client may repeat it: rate-limited), not shown
                    self.logs.log(logging.ERROR, request.url.path, "console: %s %s failed", request.method,
                                  request.url.path, exc_info=exc)  # fmt: skip
                    return self.render(request, "error.html", 500, user=self._user(request),
                                       error="the console failed on this request (see its log)")  # fmt: skip
                if self.mode == "open" and isinstance(errors[0], AuthRequired):
                    self.mode = None  # the brokers authenticate now: ask again, then sign in
                if request.method == "POST":
                    self.flash(request, describe(errors), ok=False)
                    return RedirectResponse(_back(request), 303)
                return self.render(request, "error.html", _status_for(errors), user=self._user(request),
                                   error=describe(errors))  # fmt: skip

        return endpoint

    def _user(self, request: Request) -> str | None:
        if self.sessions is None:
            return None
        s = self.sessions.get(request.session.get("sid"))
        return s.username if s else None

    # ------------------------------------------------------------------ the app
    def app(self) -> Starlette:
        """The Starlette application (its lifespan is :meth:`lifespan`)."""
        routes = [
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/healthz", lambda r: PlainTextResponse("ok\n"), methods=["GET"]),
            *pages.routes(self),
            Mount("/static", StaticFiles(packages=[(_PACKAGE, "static")]), name="static"),
        ]
        return Starlette(
            routes=routes,
            lifespan=self.lifespan,
            middleware=[
                Middleware(HeadLimit),
                Middleware(BodyLimit),
                Middleware(SecurityHeaders),
                Middleware(SessionMiddleware, secret_key=self.secret, session_cookie=COOKIE, max_age=None,
                           same_site="strict", https_only=self.config.https),
            ],
            exception_handlers={404: self._not_found, 405: self._not_allowed},
        )

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", 404, user=self._user(request), error="no such page")

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return PlainTextResponse("method not allowed\n", 405)

    # ------------------------------------------------------------------ sign-in
    async def login_page(self, request: Request) -> Response:
        if self.mode is None:
            with trio.move_on_after(PAGE_BUDGET):
                await self.detect_mode()
        if self.mode == "open":
            return RedirectResponse("/", 303)
        return self.render(request, "login.html", next=_safe_next(request.query_params.get("next")),
                           username="", login_error=None)  # fmt: skip

    async def login(self, request: Request) -> Response:
        try:
            form = await self.check_csrf(request)
        except _Redirect as r:
            return r.response
        except BadInput as exc:  # a file part, too many fields: the sign-in page says so
            return self.render(request, "login.html", 400, next="/", username="", login_error=describe([exc]))
        username = str(form.get("username") or "").strip()
        password = str(form.get("password") or "")
        nxt = _safe_next(str(form.get("next") or ""))
        if self.mode is None:
            with trio.move_on_after(PAGE_BUDGET):
                await self.detect_mode()
        if self.mode == "open":
            return RedirectResponse("/", 303)
        assert self.sessions is not None
        keys = (f"user:{username}", f"addr:{request.client.host if request.client else '-'}")
        wait = self.throttle.begin(*keys)  # counted from now: parallel guesses wait for none of the answers
        if wait > 0:
            self.logs.log(logging.WARNING, "sign-in throttled", "console: sign-ins refused for a while after failures",
                          fields={"user": username, "client": keys[1][5:], "wait_s": round(wait)})  # fmt: skip
            message = f"too many failed sign-ins: try again in {max(1, round(wait))} s"
            return self.render(request, "login.html", 429, next=nxt, username=username, login_error=message)
        settled = False
        try:
            if not username or not password:
                raise BadInput("give a user name and a password")
            with trio.fail_after(PAGE_BUDGET):
                session = await self.sessions.open(username, password)
            self.throttle.succeeded(*keys)
            settled = True
        except (EQueueError, trio.TooSlowError) as exc:
            if isinstance(exc, AuthenticationError):
                self.throttle.failed(*keys)
                settled = True
                message = "sign-in refused: wrong user name or password"
            elif isinstance(exc, trio.TooSlowError):
                message = f"no broker answered within {PAGE_BUDGET:g} s"
            else:
                message = describe([exc])
            return self.render(request, "login.html", 403 if isinstance(exc, AuthenticationError) else 400,
                               next=nxt, username=username, login_error=message)  # fmt: skip
        finally:
            if not settled:  # no answer on the password (or cancelled): the slot is freed
                self.throttle.released(*keys)
        old = request.session.get("sid")
        if isinstance(old, str):
            self.sessions.close(old)
        request.session.clear()
        request.session["sid"] = session.sid
        request.session["csrf"] = session.csrf
        return RedirectResponse(nxt, 303)

    async def logout(self, request: Request) -> Response:
        try:
            await self.check_csrf(request)
        except _Redirect as r:
            return r.response
        except BadInput as exc:  # an unreadable form signs nobody out: back to where the user was
            self.flash(request, describe([exc]), ok=False)
            return RedirectResponse("/login" if self.mode == "auth" and self._user(request) is None else "/", 303)
        sid = request.session.get("sid")
        if isinstance(sid, str) and self.sessions is not None:
            self.sessions.close(sid)
        request.session.clear()
        return RedirectResponse("/login" if self.mode == "auth" else "/", 303)


def _safe_next(target: str | None) -> str:
    """A local path to go to after sign-in (anything else: the overview)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def _back(request: Request) -> str:
    """Where an action's result is shown: the form's ``back`` field's page, else the
    page the action belongs to (its path percent-encoded again: a name may hold ``%``)."""
    path = request.url.path
    for suffix in ("/alter", "/delete", "/reset", "/resend", "/create", "/pause", "/resume"):
        if path.endswith(suffix):
            path = path[: -len(suffix)] or "/"
            break
    return quote(path, safe="/")

