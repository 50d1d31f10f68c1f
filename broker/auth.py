"""The broker's security: reloading the users file, the SCRAM-SHA-256 server and the
ACL checks (docs/security.md). The users file itself (reading, writing, new users)
and the audit lines are :mod:`equeue.users`, which the tools that edit the file use
without the broker.

- :class:`UserStore` reads the users file (``--users-file``) at start and again
  whenever it changes (an mtime/inode check every second, and at once on
  ``reload()``, which ``equeue broker start`` calls on SIGHUP). A file that does
  not parse keeps the previous users, with an error in the log.
- :class:`Authenticator` runs one connection's SCRAM exchange with `scramp
  <https://github.com/tlocke/scramp>`_ (constant-time proof check). An unknown user
  gets a made-up salt derived from the name, so the exchange looks the same as a
  wrong password's: both end in AUTH_FAILED.
- :class:`Authorizer` checks a request against :data:`equeue.acl.REQUEST_RULES`
  and the user's current ACLs (so an ACL change applies to open connections at
  the next request) and raises :class:`~equeue.errors.NotAuthorized` naming the
  operation and the resource.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from scramp import ScramException

from equeue.acl import (
    REQUEST_RULES,
    Permissions,
    ResourceKind,
    UserRecord,
    UsersFile,
    rule_key,
)
from equeue.codec import AuthReply, AuthRequest
from equeue.errors import ConfigError, ErrorCode, NotAuthorized
from equeue.logs import RateLimitedLog
from equeue.protocol import RequestCode
from equeue.users import (
    DEFAULT_ITERATIONS,
    MECHANISM,
    NO_AUTH_WARNING,
    SCRAM,
    audit,
    audit_log,
    is_loopback,
    read_users_file,
)

log = logging.getLogger("equeue.broker")

__all__ = [
    "Authenticator",
    "Authorizer",
    "BrokerSecurity",
    "ScramExchange",
    "UserStore",
]

#: how often the broker looks at the users file for changes (seconds)
RELOAD_INTERVAL = 1.0



def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class UserStore:
    """The users and their compiled permissions, as of the last good read of the file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.users: dict[str, UserRecord] = {}
        #: user name → compiled ACLs (what every request looks up)
        self.permissions: dict[str, Permissions] = {}
        self._sig: tuple[int, int, int] | None = None

    def load(self) -> None:
        """Read the file at start; raises ConfigError if it is missing or malformed."""
        if not self.path.exists():
            raise ConfigError(f"users file {self.path} does not exist (create it with: equeue user add)")
        sig = _signature(self.path)
        self._apply(read_users_file(self.path), sig, initial=True)
        self._check_mode()

    def _check_mode(self) -> None:
        try:
            mode = self.path.stat().st_mode
        except OSError:
            return
        if mode & 0o077:
            log.warning("users file %s is readable by other users (mode %o): chmod 600 it", self.path, mode & 0o777)

    def _read_if_changed(self, force: bool) -> tuple[UsersFile | None, tuple[int, int, int] | None, str | None]:
        sig = _signature(self.path)
        if not force and sig == self._sig:
            return None, sig, None
        if sig is None:  # deleted or moved away: never "no users at all" by accident
            return None, sig, f"users file {self.path} is missing"
        try:
            return read_users_file(self.path), sig, None
        except ConfigError as exc:
            return None, sig, str(exc)

    async def reload(self, force: bool = True) -> bool:
        """Re-read the file (in a worker thread) and swap in what it holds, on the
        loop. Returns whether the users changed. A bad file keeps the old users."""
        new, sig, error = await trio.to_thread.run_sync(self._read_if_changed, force)
        if error is not None:
            if sig != self._sig:
                log.error("%s; keeping the users loaded before", error)
                self._sig = sig
            return False
        if new is None:
            return False
        return self._apply(new, sig, initial=False)

    async def watch(self, interval: float = RELOAD_INTERVAL) -> None:
        """Pick up changes of the file without a restart (runs until cancelled)."""
        while True:
            await trio.sleep(interval)
            await self.reload(force=False)

    def _apply(self, new: UsersFile, sig: tuple[int, int, int] | None, *, initial: bool) -> bool:
        old = self.users
        self._sig = sig
        self.users = dict(new.users)
        self.permissions = {name: Permissions(u) for name, u in new.users.items()}
        if initial:
            log.info("authentication on: %d users from %s", len(self.users), self.path)
            return True
        changed = False
        for name in sorted(set(old) | set(new.users)):
            before, after = old.get(name), new.users.get(name)
            if before == after:
                continue
            changed = True
            if before is None:
                action = "user.add"
            elif after is None:
                action = "user.remove"
            elif (before.salt, before.stored_key) != (after.salt, after.stored_key):
                action = "user.password"
            else:
                action = "user.acl"
            detail = "" if after is None else f"admin={after.admin} acls=[{'; '.join(a.describe() for a in after.acls)}]"
            audit(action, user="-", peer="users-file", resource=f"user:{name}", outcome="applied", detail=detail)
        if changed:
            log.info("users file %s reloaded: %d users", self.path, len(self.users))
        return changed


# ----------------------------------------------------------------------------- SCRAM
class ScramExchange:
    """One connection's SCRAM-SHA-256 exchange (server side): feed each
    :class:`AuthRequest` to :meth:`step`; the reply is final once the client is
    authenticated (``principal`` set) or refused."""

    def __init__(self, store: UserStore, secret: bytes) -> None:
        self._store = store
        self._secret = secret
        self._server: Any = None
        self.principal: str | None = None
        #: the user name the client claimed (for the log), once known
        self.claimed: str | None = None

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self.claimed = username
        user = self._store.users.get(username)
        if user is not None:
            return user.salt, user.stored_key, user.server_key, user.iterations
        # an unknown user: a stable made-up salt, so probing cannot tell it apart
        fake = hmac.new(self._secret, username.encode("utf-8", "replace"), hashlib.sha256).digest()
        return fake[:16], hashlib.sha256(fake).digest(), hashlib.sha256(fake + b"s").digest(), DEFAULT_ITERATIONS

    def step(self, req: AuthRequest) -> AuthReply:
        if self._server is None:
            if req.mechanism != MECHANISM:
                return AuthReply(
                    ErrorCode.UNSUPPORTED_MECHANISM, f"mechanism {req.mechanism!r} not offered; use {MECHANISM}".encode(), True
                )  # fmt: skip
            self._server = SCRAM.make_server(self._auth_info)
            try:
                self._server.set_client_first(req.data.decode("utf-8"))
                return AuthReply(ErrorCode.OK, self._server.get_server_first().encode())
            except (ScramException, UnicodeDecodeError):
                return _FAILED
        try:
            self._server.set_client_final(req.data.decode("utf-8"))
            final = self._server.get_server_final()
        except (ScramException, UnicodeDecodeError):
            return _FAILED
        self.principal = self.claimed
        return AuthReply(ErrorCode.OK, final.encode(), True)


_FAILED = AuthReply(ErrorCode.AUTH_FAILED, b"authentication failed: unknown user or wrong password", True)


class Authenticator:
    """Starts SCRAM exchanges against a :class:`UserStore`."""

    #: the pause before a refusal is sent (slows down password guessing)
    failure_delay = 0.2

    def __init__(self, store: UserStore) -> None:
        self._store = store
        self._secret = secrets.token_bytes(32)
        self._failures = RateLimitedLog(audit_log, 10.0, time.monotonic)

    def start(self) -> ScramExchange:
        return ScramExchange(self._store, self._secret)

    def failed(self, exchange: ScramExchange, peer: str) -> None:
        """Log a refused authentication (at most one line per 10 s, with a count)."""
        self._failures.log(
            logging.WARNING, "auth", "time=%s action=authenticate user=%s peer=%s outcome=failed",
            datetime.now(UTC).isoformat(timespec="milliseconds"), exchange.claimed or "-", peer,
        )  # fmt: skip


# ----------------------------------------------------------------------------- ACLs
#: one need, compiled: (request field, rule_key, what to name in a refusal, operation)
_Need = tuple[str, str, str, str]


class Authorizer:
    """Checks requests against :data:`~equeue.acl.REQUEST_RULES` and the users' ACLs."""

    def __init__(self, store: UserStore) -> None:
        self._store = store
        self._denials = RateLimitedLog(audit_log, 10.0, time.monotonic)
        self._create_key = rule_key(ResourceKind.TOPIC, "admin")
        #: the request codes only the replica role may send (the admin role is not enough)
        self._replica_codes = frozenset(int(code) for code, rule in REQUEST_RULES.items() if rule.replica)
        #: request code (a plain int) → (admin role only, needs): no enum on the request path
        self._rules: dict[int, tuple[bool, tuple[_Need, ...]]] = {
            int(code): (rule.admin, tuple((n.field, rule_key(n.kind, n.op), str(n.kind), str(n.op)) for n in rule.needs))
            for code, rule in REQUEST_RULES.items()
        }

    def check(self, principal: str, code: int, request: Any, peer: str = "?") -> None:
        """Raises NotAuthorized (naming the operation and the resource) unless
        ``principal`` may make the request ``code`` with these fields."""
        perms = self._store.permissions.get(principal)
        if code in self._replica_codes:
            if perms is not None and perms.replica:
                return
            self._deny_replica(principal, code, peer, perms)
        if perms is not None and perms.admin:
            return
        rule = self._rules.get(code)
        if perms is not None and rule is not None and not rule[0]:
            for field, key, _, _ in rule[1]:
                value = getattr(request, field) if field else ""
                if value.__class__ is list:
                    if all(perms.allowed(key, name) for name in value):
                        continue
                elif perms.allowed(key, value):
                    continue
                break
            else:
                return
        self._deny(principal, code, request, peer, perms, rule)

    def _deny(self, principal: str, code: int, request: Any, peer: str, perms: Permissions | None,
              rule: tuple[bool, tuple[_Need, ...]] | None) -> None:  # fmt: skip
        """Raise the refusal the check found (and log it, rate-limited)."""
        if perms is None:
            exc = NotAuthorized(f"user {principal!r} no longer exists")
        elif rule is None:
            exc = NotAuthorized(f"request code {code} is not mapped to any permission: refused")
        elif rule[0]:
            exc = NotAuthorized(f"user {principal!r} may not {_name(code)}: it needs the admin role")
        else:
            exc = NotAuthorized(f"user {principal!r} may not {_name(code)}")
            for field, key, kind, op in rule[1]:
                value = getattr(request, field) if field else ""
                for name in value if isinstance(value, list) else (value,):
                    if not perms.allowed(key, name):
                        what = "the cluster" if kind == "cluster" else f"{kind} {name!r}"
                        exc = NotAuthorized(f"user {principal!r} has no {op!r} permission on {what} ({_name(code)})")
                        break
                else:
                    continue
                break
        self._denials.log(
            logging.INFO, f"{principal}:{code}", "time=%s action=%s user=%s peer=%s outcome=denied reason=%r",
            datetime.now(UTC).isoformat(timespec="milliseconds"), _name(code), principal, peer, str(exc),
        )  # fmt: skip
        raise exc

    def _deny_replica(self, principal: str, code: int, peer: str, perms: Permissions | None) -> None:
        """Raise the refusal of a replication request from a user without the replica
        role (logged, rate-limited: a forged follower is worth an operator's look)."""
        if perms is None:
            exc = NotAuthorized(f"user {principal!r} no longer exists")
        else:
            exc = NotAuthorized(
                f"user {principal!r} may not {_name(code)}: it needs the replica role (the admin role is not "
                "enough; grant it with: equeue user replica NAME)"
            )
        self._denials.log(
            logging.WARNING, f"{principal}:{code}", "time=%s action=%s user=%s peer=%s outcome=denied reason=%r",
            datetime.now(UTC).isoformat(timespec="milliseconds"), _name(code), principal, peer, str(exc),
        )  # fmt: skip
        raise exc

    def check_create(self, principal: str, topic: str) -> None:
        """Raises NotAuthorized unless ``principal`` may create ``topic`` (the admin
        role, or ``admin`` on the name): what auto-creation on produce or route
        lookup needs, like an explicit CREATE_TOPIC (Kafka asks CREATE for both)."""
        perms = self._store.permissions.get(principal)
        if perms is not None and (perms.admin or perms.allowed(self._create_key, topic)):
            return
        exc = NotAuthorized(
            f"user {principal!r} has no 'admin' permission on topic {topic!r}, which auto-creating "
            "it needs (create the topic first: equeue topic create)"
        )
        self._denials.log(
            logging.INFO, f"{principal}:create", "time=%s action=auto_create user=%s outcome=denied reason=%r",
            datetime.now(UTC).isoformat(timespec="milliseconds"), principal, str(exc),
        )  # fmt: skip
        raise exc

    def visible(self, principal: str, kind: ResourceKind, name: str) -> bool:
        """Whether ``principal`` may see ``name`` in a listing (describe on it)."""
        perms = self._store.permissions.get(principal)
        return perms is not None and perms.allowed(rule_key(kind, "describe"), name)


def _name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return f"request {code}"


# ----------------------------------------------------------------------------- the whole
class BrokerSecurity:
    """Authentication and authorization of one broker: off (``users`` None: every
    request allowed) or on (a users file)."""

    def __init__(self, users_file: Path | None) -> None:
        self.users = UserStore(users_file) if users_file is not None else None
        self.authenticator = Authenticator(self.users) if self.users is not None else None
        self.authorizer = Authorizer(self.users) if self.users is not None else None

    @property
    def enabled(self) -> bool:
        return self.users is not None

    def start(self, host: str, port: int) -> None:
        """Load the users (raises ConfigError), or warn loudly when an open broker
        listens beyond loopback."""
        if self.users is not None:
            self.users.load()
        elif not is_loopback(host):
            log.warning(NO_AUTH_WARNING.format(host=host, port=port))

    async def watch(self) -> None:
        """Reload the users file when it changes (returns at once when auth is off)."""
        if self.users is not None:
            await self.users.watch()

    async def reload(self) -> bool:
        """Re-read the users file now (SIGHUP). Returns whether users changed."""
        return await self.users.reload() if self.users is not None else False
