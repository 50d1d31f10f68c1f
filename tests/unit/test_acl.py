"""The ACL model (equeue.acl): the TOTAL request map, patterns, implied describe,
internal topics, the users file (no password in it), the broker's Authorizer."""

from __future__ import annotations

import json

import attrs
import pytest

from equeue import control
from equeue.acl import REQUEST_RULES, Acl, Permissions, ResourceKind, UsersFile
from equeue.broker.auth import Authorizer, UserStore
from equeue.errors import ConfigError, NotAuthorized
from equeue.protocol import RequestCode
from equeue.users import make_user
from equeue.wire import ProduceRequest, PullRequest

T, G, C = ResourceKind.TOPIC, ResourceKind.GROUP, ResourceKind.CLUSTER


def test_every_request_code_is_mapped() -> None:
    """A new request code cannot slip through: it must say what it needs."""
    missing = [c.name for c in RequestCode if c not in REQUEST_RULES]
    assert not missing, f"request codes without an ACL rule in equeue.acl.REQUEST_RULES: {missing}"


@pytest.mark.parametrize("code", list(RequestCode), ids=lambda c: c.name)
def test_each_rule_reads_fields_the_request_has(code: RequestCode) -> None:
    rule = REQUEST_RULES[code]
    assert rule.needs or rule.filters or rule.admin or rule.replica, f"{code.name} would be open to every user"
    binary = {RequestCode.PRODUCE: ProduceRequest, RequestCode.PULL: PullRequest}
    model = control.REQUEST_TYPES.get(code) or binary.get(code)
    if model is None:  # the binary replication requests (equeue.wire.replica): the replica role only
        assert rule.replica and not rule.admin and not rule.needs, code.name
        return
    fields = {f.name for f in attrs.fields(model)}
    for need in rule.needs:
        assert need.field in fields or (need.kind is C and need.field == ""), (code.name, need.field)


def perms(*acls: Acl, admin: bool = False) -> Permissions:
    return Permissions(make_user("u", "pw", acls=acls, admin=admin))


def test_exact_and_prefix_patterns() -> None:
    p = perms(Acl("topic", "orders", ["produce"]), Acl("topic", "billing.*", ["consume"]))
    assert p.allows(T, "orders", "produce")  # type: ignore[arg-type]
    assert not p.allows(T, "orders2", "produce")  # type: ignore[arg-type]
    assert p.allows(T, "billing.eu", "consume")  # type: ignore[arg-type]
    assert not p.allows(T, "billing", "consume")  # type: ignore[arg-type]  # "billing.*" needs the dot
    assert not p.allows(T, "billing.eu", "produce")  # type: ignore[arg-type]
    everything = perms(Acl("topic", "*", ["consume"]))
    assert everything.allows(T, "", "consume")  # type: ignore[arg-type]  # GET_MESSAGE by global offset


def test_ephemeral_group_patterns() -> None:
    exact = perms(Acl("group", "tap#ephemeral", ["join"]))
    assert exact.allows(G, "tap#ephemeral", "join") and not exact.allows(G, "tap", "join")  # type: ignore[arg-type]
    assert perms(Acl("group", "tap*", ["join"])).allows(G, "tap#ephemeral", "join")  # type: ignore[arg-type]
    for bad in ("tap#", "#ephemeral*", "tap#ephemeral*", "a#b"):
        with pytest.raises(ConfigError, match="invalid ACL pattern"):
            Acl("group", bad, ["join"])


def test_describe_is_implied_and_admin_may_do_everything() -> None:
    p = perms(Acl("topic", "a", ["produce"]), Acl("group", "g", ["commit"]))
    assert p.allows(T, "a", "describe") and p.allows(G, "g", "describe")  # type: ignore[arg-type]
    assert not p.allows(G, "g", "join")  # type: ignore[arg-type]
    admin = perms(admin=True)
    assert admin.allows(T, "%DLQ%g", "admin") and admin.allows(C, "", "describe")  # type: ignore[arg-type]


def test_internal_topics_follow_their_group_and_no_acl_writes_them() -> None:
    p = perms(Acl("group", "g", ["join"]), Acl("topic", "*", ["produce", "admin"]))
    assert p.allows(T, "%RETRY%g", "consume") and p.allows(T, "%DLQ%g", "consume")  # type: ignore[arg-type]
    assert not p.allows(T, "%RETRY%other", "consume")  # type: ignore[arg-type]
    assert not p.allows(T, "%DLQ%g", "produce")  # type: ignore[arg-type]
    assert not p.allows(T, "%DLQ%g", "admin")  # type: ignore[arg-type]  # alter/delete: the admin role only


@pytest.mark.parametrize(
    ("kind", "pattern", "ops", "message"),
    [
        ("topic", "a*b", ["produce"], "invalid ACL pattern"),
        ("topic", "a", ["join"], "cannot grant join"),
        ("group", "g", ["produce"], "cannot grant produce"),
        ("cluster", "x", ["describe"], "pattern \\*"),
        ("topic", "a", ["fly"], "unknown ACL operation"),
        ("topic", "a", [], "at least one"),
    ],
)
def test_bad_acls_are_config_errors(kind: str, pattern: str, ops: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Acl(kind, pattern, ops)


def test_users_file_round_trip_keeps_no_password() -> None:
    u = make_user("alice", "correct horse", acls=[Acl("topic", "orders.*", ["produce"])])
    doc = UsersFile({"alice": u})
    text = doc.dump()
    assert "correct horse" not in text
    assert json.loads(text)["users"]["alice"]["iterations"] >= 4096
    assert UsersFile.parse(text) == doc
    assert make_user("alice", "correct horse").salt != u.salt  # a fresh salt each time


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '{"version": 2, "users": {}}', '{"version": 1, "users": {"a": {}}}',
     '{"version": 1, "users": {"bad name": {}}}'],
)  # fmt: skip
def test_malformed_users_files_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        UsersFile.parse(text)


def test_authorizer_names_the_operation_and_the_resource(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = UserStore(tmp_path / "users.json")
    store.users = {"bob": make_user("bob", "pw", acls=[Acl("topic", "orders", ["consume"])])}
    store.permissions = {n: Permissions(u) for n, u in store.users.items()}
    authz = Authorizer(store)
    authz.check("bob", RequestCode.PULL, PullRequest("orders", 0, 0))
    with pytest.raises(NotAuthorized, match="'bob' has no 'produce' permission on topic 'orders'"):
        authz.check("bob", RequestCode.PRODUCE, ProduceRequest("orders", 0, []))
    with pytest.raises(NotAuthorized, match="needs the admin role"):
        authz.check("bob", RequestCode.DLQ_RESEND, control.DlqResend("g"))
    with pytest.raises(NotAuthorized, match="'join' permission on group 'g'"):
        authz.check("bob", RequestCode.HEARTBEAT, control.Heartbeat("g", "c", ["orders"]))
    with pytest.raises(NotAuthorized, match="no longer exists"):
        authz.check("carol", RequestCode.PULL, PullRequest("orders", 0, 0))


REPLICA_CODES = (RequestCode.REPLICA_FETCH, RequestCode.REPLICA_KEYS, RequestCode.REPLICA_SNAPSHOT)


@pytest.mark.parametrize("code", REPLICA_CODES, ids=lambda c: c.name)
def test_replication_requests_need_the_replica_role_which_admin_does_not_imply(tmp_path, code) -> None:  # type: ignore[no-untyped-def]
    """A fetch is an acknowledgement that moves the high watermark: an operator's
    admin credentials must not be able to forge one; only the replica role may."""
    store = UserStore(tmp_path / "users.json")
    store.users = {
        "root": make_user("root", "pw", admin=True),
        "rep": make_user("rep", "pw", replica=True),
        "bob": make_user("bob", "pw", acls=[Acl("topic", "*", ["produce", "consume", "admin"])]),
    }
    store.permissions = {n: Permissions(u) for n, u in store.users.items()}
    authz = Authorizer(store)
    authz.check("rep", code, None)
    for user in ("root", "bob"):
        with pytest.raises(NotAuthorized, match="needs the replica role"):
            authz.check(user, code, None)
    with pytest.raises(NotAuthorized, match="no longer exists"):
        authz.check("gone", code, None)


def test_the_replica_role_grants_nothing_else(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = UserStore(tmp_path / "users.json")
    store.users = {"rep": make_user("rep", "pw", replica=True)}
    store.permissions = {n: Permissions(u) for n, u in store.users.items()}
    authz = Authorizer(store)
    with pytest.raises(NotAuthorized):
        authz.check("rep", RequestCode.PRODUCE, ProduceRequest("orders", 0, []))
    with pytest.raises(NotAuthorized, match="needs the admin role"):
        authz.check("rep", RequestCode.REPLICA_DIGEST, control.ReplicaDigestRequest())


def test_the_replica_role_survives_the_users_file() -> None:
    user = make_user("rep", "pw", replica=True)
    doc = UsersFile.parse(UsersFile({"rep": user}).dump())
    assert doc.users["rep"].replica and not doc.users["rep"].admin
    old = json.loads(UsersFile({"rep": user}).dump())
    del old["users"]["rep"]["replica"]  # a file written before the role: no replica role
    assert not UsersFile.parse(json.dumps(old)).users["rep"].replica
