"""Users and access control lists: the pure model (no I/O) of docs/security.md.

A broker started with ``--users-file`` authenticates every connection (SCRAM-SHA-256,
``broker/handshake.py``) and authorizes every request against the requesting user's
ACLs. This module holds what both the broker and ``equeue user``/``equeue acl``
share: the users file's content (:class:`UsersFile`, JSON), the ACL model
(:class:`Acl`: a resource kind, a name pattern and operations), the evaluation
(:class:`Permissions`) and the TOTAL map :data:`REQUEST_RULES` from every
:class:`~equeue.protocol.RequestCode` to what it needs (a unit test checks that no
code is missing).

Resources and operations:

- ``topic``: ``produce``, ``consume`` (pull, lookups), ``describe`` (routes, offsets,
  descriptions; implied by the three others), ``admin`` (create, alter, delete, pause, resume);
- ``group``: ``join`` (heartbeat, leave, send back, its dead letters), ``commit``,
  ``reset`` (offsets, delete, pause, resume), ``describe`` (implied by the three others);
- ``cluster``: ``describe`` (broker statistics).

A pattern is an exact name or a prefix ending in ``*`` (``orders.*``; ``*`` alone is
every name). Users with the *admin role* may do everything, including what no ACL
grants: alter or delete internal topics, DLQ_RESEND and the other cluster admin
requests. Internal topics (``%RETRY%<g>``, ``%DLQ%<g>``) follow their group: consume
and describe need ``join`` and ``describe`` on ``<g>``.

The *replica role* is separate: only a user with it may send the requests a
follower sends its leader (REPLICA_FETCH, REPLICA_KEYS, REPLICA_SNAPSHOT), and the
admin role does not imply it. A fetch is an acknowledgement (it moves the high
watermark), so it must come from a replica, never from an operator's credentials.
"""

from __future__ import annotations

import base64
import enum
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from equeue.errors import ConfigError
from equeue.names import DLQ_PREFIX, RETRY_PREFIX
from equeue.protocol import RequestCode

__all__ = [
    "ALL_OPS",
    "IMPLIED_DESCRIBE",
    "REQUEST_RULES",
    "Acl",
    "Need",
    "Operation",
    "Permissions",
    "ResourceKind",
    "Rule",
    "UserRecord",
    "UsersFile",
    "rule_key",
    "validate_username",
]


class ResourceKind(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Operation(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    DESCRIBE = "describe"
    ADMIN = "admin"
    JOIN = "join"
    COMMIT = "commit"
    RESET = "reset"


#: the operations an ACL may grant on each kind (cluster admin is the admin role only)
ALL_OPS: dict[ResourceKind, frozenset[Operation]] = {
    ResourceKind.TOPIC: frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.DESCRIBE, Operation.ADMIN}),
    ResourceKind.GROUP: frozenset({Operation.JOIN, Operation.COMMIT, Operation.RESET, Operation.DESCRIBE}),
    ResourceKind.CLUSTER: frozenset({Operation.DESCRIBE}),
}
#: granting any of these grants describe too (as Kafka's Read/Write/Alter/Delete imply Describe)
IMPLIED_DESCRIBE = frozenset(
    {Operation.PRODUCE, Operation.CONSUME, Operation.ADMIN, Operation.JOIN, Operation.COMMIT, Operation.RESET}
)

_USER = re.compile(r"[A-Za-z0-9_.@\-]{1,64}")
#: an exact name (a group's may end with ``#ephemeral``), or a prefix ending in ``*``
_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{0,128}(\*|#ephemeral)?")


def validate_username(name: str) -> str:
    """Return ``name`` if it is a valid user name; raises ConfigError."""
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise ConfigError(f"invalid user name {name!r}: use 1-64 characters of A-Z a-z 0-9 _ . @ -")
    return name


def _pattern(value: str) -> str:
    if not isinstance(value, str) or not value or not _PATTERN.fullmatch(value):
        raise ConfigError(f"invalid ACL pattern {value!r}: an exact name, or a prefix ending in * (orders.*)")
    return value


def _ops(value: Iterable[str]) -> frozenset[Operation]:
    try:
        return frozenset(Operation(v) for v in value)
    except ValueError as exc:
        raise ConfigError(f"unknown ACL operation: {exc}") from None


@attrs.frozen
class Acl:
    """Allow ``ops`` on the resources of ``kind`` whose name matches ``pattern``."""

    kind: ResourceKind = attrs.field(converter=ResourceKind)
    pattern: str = attrs.field(converter=_pattern)
    ops: frozenset[Operation] = attrs.field(converter=_ops)

    def __attrs_post_init__(self) -> None:
        if not self.ops:
            raise ConfigError("an ACL needs at least one operation")
        extra = self.ops - ALL_OPS[self.kind]
        if extra:
            allowed = ", ".join(sorted(ALL_OPS[self.kind]))
            raise ConfigError(f"a {self.kind} ACL cannot grant {', '.join(sorted(extra))} (allowed: {allowed})")
        if self.kind is ResourceKind.CLUSTER and self.pattern != "*":
            raise ConfigError("a cluster ACL has the pattern *")

    @property
    def prefixed(self) -> bool:
        return self.pattern.endswith("*")

    def matches(self, name: str) -> bool:
        if self.prefixed:
            return name.startswith(self.pattern[:-1])
        return name == self.pattern

    def describe(self) -> str:
        return f"{self.kind} {self.pattern}: {', '.join(sorted(self.ops))}"

    def to_json(self) -> dict[str, Any]:
        return {"resource": str(self.kind), "pattern": self.pattern, "ops": sorted(self.ops)}


@attrs.frozen
class UserRecord:
    """One user: SCRAM-SHA-256 verifiers (never the password), the admin role, ACLs,
    the replica role (the brokers' own user for replication; admin does not imply it)."""

    name: str = attrs.field(validator=lambda _i, _a, v: validate_username(v))
    salt: bytes = attrs.field(repr=False)
    iterations: int
    stored_key: bytes = attrs.field(repr=False)
    server_key: bytes = attrs.field(repr=False)
    admin: bool = False
    acls: tuple[Acl, ...] = ()
    replica: bool = False

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {
            "mechanism": "SCRAM-SHA-256",
            "salt": b64(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": b64(self.stored_key).decode(),
            "server_key": b64(self.server_key).decode(),
            "admin": self.admin,
            "acls": [a.to_json() for a in self.acls],
            "replica": self.replica,
        }

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> UserRecord:
        """Raises ConfigError for a malformed entry."""
        try:
            if d.get("mechanism", "SCRAM-SHA-256") != "SCRAM-SHA-256":
                raise ConfigError(f"mechanism {d.get('mechanism')!r} is not SCRAM-SHA-256")
            b64 = base64.b64decode
            iterations = d["iterations"]
            if not isinstance(iterations, int) or iterations < 4096:
                raise ConfigError("iterations must be an integer >= 4096")
            admin = d.get("admin", False)
            if not isinstance(admin, bool):
                raise ConfigError("admin must be true or false")
            replica = d.get("replica", False)
            if not isinstance(replica, bool):
                raise ConfigError("replica must be true or false")
            acls = tuple(Acl(a["resource"], a["pattern"], a["ops"]) for a in d.get("acls", []))
            return cls(
                name, b64(d["salt"], validate=True), iterations, b64(d["stored_key"], validate=True),
                b64(d["server_key"], validate=True), admin, acls, replica,
            )  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(f"user {name!r}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"user {name!r}: malformed entry ({type(exc).__name__}: {exc})") from None


@attrs.frozen
class UsersFile:
    """The content of a users file: ``{"version": 1, "users": {name: entry}}``."""

    users: Mapping[str, UserRecord] = attrs.Factory(dict)

    @classmethod
    def parse(cls, text: str) -> UsersFile:
        """Raises ConfigError for anything malformed (the broker then keeps what it had)."""
        try:
            doc = json.loads(text) if text.strip() else {"version": 1, "users": {}}
        except ValueError as exc:
            raise ConfigError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("users"), dict):
            raise ConfigError('expected {"version": 1, "users": {...}}')
        return cls({name: UserRecord.from_json(name, d) for name, d in doc["users"].items()})

    def dump(self) -> str:
        users = {n: self.users[n].to_json() for n in sorted(self.users)}
        return json.dumps({"version": 1, "users": users}, indent=2) + "\n"

    def with_user(self, user: UserRecord) -> UsersFile:
        return UsersFile({**self.users, user.name: user})

    def without(self, name: str) -> UsersFile:
        return UsersFile({n: u for n, u in self.users.items() if n != name})


# ----------------------------------------------------------------------------- evaluation


def rule_key(kind: str, op: str) -> str:
    """The plain-string key of (kind, operation) the compiled permissions use:
    ``"topic:produce"`` (plain strings: enum members cost a Python call to look up)."""
    return f"{kind!s}:{op!s}"


_INTERNAL = {rule_key("topic", "consume"): rule_key("group", "join"),
             rule_key("topic", "describe"): rule_key("group", "describe")}  # fmt: skip


class Permissions:
    """One user's ACLs compiled for lookups: per ``kind:operation`` key, the exact
    names (a set) and the prefixes (usually a handful)."""

    __slots__ = ("_exact", "_prefixes", "admin", "name", "replica")

    def __init__(self, user: UserRecord) -> None:
        self.name = user.name
        self.admin = user.admin
        self.replica = user.replica
        exact: dict[str, set[str]] = {}
        prefixes: dict[str, list[str]] = {}
        for acl in user.acls:
            ops = set(acl.ops)
            if ops & IMPLIED_DESCRIBE:
                ops.add(Operation.DESCRIBE)
            for op in ops:
                key = rule_key(acl.kind, op)
                if acl.prefixed:
                    prefixes.setdefault(key, []).append(acl.pattern[:-1])
                else:
                    exact.setdefault(key, set()).add(acl.pattern)
        self._exact = {k: frozenset(v) for k, v in exact.items()}
        self._prefixes = {k: tuple(v) for k, v in prefixes.items()}

    def allows(self, kind: str, name: str, op: str) -> bool:
        """Whether this user may do ``op`` on the ``kind`` resource ``name``."""
        return self.allowed(rule_key(kind, op), name)

    def allowed(self, key: str, name: str) -> bool:
        """:meth:`allows` by :func:`rule_key` (the per-request path: a set lookup or
        a few prefix tests)."""
        if self.admin:
            return True
        if name[:1] == "%" and key[:6] == "topic:":
            return self._internal(key, name)
        names = self._exact.get(key)
        if names is not None and name in names:
            return True
        prefixes = self._prefixes.get(key)
        if prefixes:
            for p in prefixes:
                if name.startswith(p):
                    return True
        return False

    def _internal(self, key: str, topic: str) -> bool:
        # retry and dead-letter topics belong to their group; only admins write them
        group_key = _INTERNAL.get(key)
        if group_key is not None:
            for prefix in (RETRY_PREFIX, DLQ_PREFIX):
                if topic.startswith(prefix):
                    return self.allowed(group_key, topic[len(prefix) :])
        return False


# ----------------------------------------------------------------------------- the request map


@attrs.frozen
class Need:
    """A request needs ``op`` on the ``kind`` resource named by the request's
    ``field`` (a string, or a list of names; "" for the cluster)."""

    kind: ResourceKind
    field: str
    op: Operation


@attrs.frozen
class Rule:
    """What one request code needs. ``needs`` empty: any authenticated user, with
    the answer filtered to what the user may describe (``filters``). ``admin``: the
    admin role only. ``replica``: the replica role only (the admin role does not
    imply it). ``audit``: an admin action, written to the audit log."""

    needs: tuple[Need, ...] = ()
    filters: ResourceKind | None = None
    admin: bool = False
    audit: bool = False
    replica: bool = False


_T, _G, _C = ResourceKind.TOPIC, ResourceKind.GROUP, ResourceKind.CLUSTER
_O = Operation

#: every request code → what it needs (TOTAL: tests/unit/test_acl.py checks it)
REQUEST_RULES: dict[RequestCode, Rule] = {
    RequestCode.PRODUCE: Rule((Need(_T, "topic", _O.PRODUCE),)),
    RequestCode.PULL: Rule((Need(_T, "topic", _O.CONSUME),)),
    RequestCode.CREATE_TOPIC: Rule((Need(_T, "name", _O.ADMIN),), audit=True),
    RequestCode.DELETE_TOPIC: Rule((Need(_T, "name", _O.ADMIN),), audit=True),
    RequestCode.ALTER_TOPIC: Rule((Need(_T, "name", _O.ADMIN),), audit=True),
    RequestCode.LIST_TOPICS: Rule(filters=_T),
    RequestCode.DESCRIBE_TOPIC: Rule((Need(_T, "name", _O.DESCRIBE),)),
    RequestCode.GET_ROUTE: Rule((Need(_T, "topic", _O.DESCRIBE),)),
    RequestCode.GET_ROUTES: Rule((Need(_T, "topics", _O.DESCRIBE),)),
    RequestCode.QUEUE_OFFSETS: Rule((Need(_T, "topic", _O.DESCRIBE),)),
    RequestCode.OFFSET_FOR_TIME: Rule((Need(_T, "topic", _O.DESCRIBE),)),
    RequestCode.COMMIT_OFFSET: Rule((Need(_G, "group", _O.COMMIT), Need(_T, "topic", _O.CONSUME))),
    RequestCode.QUERY_OFFSET: Rule((Need(_G, "group", _O.DESCRIBE), Need(_T, "topic", _O.DESCRIBE))),
    RequestCode.RESET_OFFSETS: Rule((Need(_G, "group", _O.RESET), Need(_T, "topic", _O.DESCRIBE)), audit=True),
    RequestCode.HEARTBEAT: Rule((Need(_G, "group", _O.JOIN), Need(_T, "topics", _O.CONSUME))),
    RequestCode.LEAVE_GROUP: Rule((Need(_G, "group", _O.JOIN),)),
    RequestCode.LIST_GROUPS: Rule(filters=_G),
    RequestCode.DESCRIBE_GROUP: Rule((Need(_G, "group", _O.DESCRIBE),)),
    RequestCode.RELEASE_QUEUES: Rule((Need(_G, "group", _O.JOIN),)),
    RequestCode.DELETE_GROUP: Rule((Need(_G, "group", _O.RESET),), audit=True),
    RequestCode.PAUSE_TOPIC: Rule((Need(_T, "name", _O.ADMIN),), audit=True),
    RequestCode.RESUME_TOPIC: Rule((Need(_T, "name", _O.ADMIN),), audit=True),
    RequestCode.PAUSE_GROUP: Rule((Need(_G, "group", _O.RESET),), audit=True),
    RequestCode.RESUME_GROUP: Rule((Need(_G, "group", _O.RESET),), audit=True),
    RequestCode.STATS: Rule((Need(_C, "", _O.DESCRIBE),)),
    RequestCode.CLUSTER_STATUS: Rule((Need(_C, "", _O.DESCRIBE),)),
    # by global offset the topic is "": only a pattern matching every name (*) allows it
    RequestCode.GET_MESSAGE: Rule((Need(_T, "topic", _O.CONSUME),)),
    RequestCode.FIND_BY_KEY: Rule((Need(_T, "topic", _O.CONSUME),)),
    RequestCode.SEND_BACK: Rule((Need(_G, "group", _O.JOIN), Need(_T, "topic", _O.CONSUME))),
    RequestCode.DLQ_LIST: Rule((Need(_G, "group", _O.JOIN),)),
    RequestCode.DLQ_RESEND: Rule(admin=True, audit=True),
    RequestCode.SKIP_MESSAGE: Rule(admin=True, audit=True),
    RequestCode.LIST_SKIPPED: Rule((Need(_T, "topic", _O.DESCRIBE),)),
    # a follower's requests read the whole store, and a fetch is an acknowledgement
    # that moves the high watermark: the replica role only (admin is not enough)
    RequestCode.REPLICA_FETCH: Rule(replica=True),
    RequestCode.REPLICA_KEYS: Rule(replica=True),
    RequestCode.REPLICA_SNAPSHOT: Rule(replica=True),
    RequestCode.REPLICA_DIGEST: Rule(admin=True),
    RequestCode.REPLICATION_STATUS: Rule((Need(_C, "", _O.DESCRIBE),)),
    RequestCode.CLUSTER_RECOVER: Rule(admin=True, audit=True),
    RequestCode.CLUSTER_HANDOVER: Rule(admin=True, audit=True),
}
