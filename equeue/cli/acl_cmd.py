"""``equeue acl add|remove|list``: what each user may do (docs/security.md).

An ACL allows operations on the topics, the consumer groups or the cluster whose
name matches a pattern: an exact name, or a prefix ending in ``*`` (``orders.*``;
``*`` alone: every name). ACLs are kept with the users in the broker's users file
and apply to open connections from the broker's next reload (within a second).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from equeue.cli._common import JSON_OPTION, fail, print_json, table
from equeue.cli.user_cmd import USER_JSON_OPTION, USERS_FILE_OPTION, apply_change

#: ``acl list --json``: the resource of the row standing for the admin role (every operation)
ADMIN_RESOURCE = "admin"

_OP_HELP = (
    "Operation (repeat it): topic: produce, consume, describe, admin; group: join, commit, reset, "
    "describe; cluster: describe; 'all': every operation of the resource."
)


def _target(topic: str | None, group: str | None, cluster: bool) -> tuple[str, str]:
    given = [x for x in (("topic", topic), ("group", group), ("cluster", "*" if cluster else None)) if x[1]]
    if len(given) != 1:
        fail("give exactly one of --topic PATTERN, --group PATTERN or --cluster")
    kind, pattern = given[0]
    return kind, pattern  # type: ignore[return-value]


def register(app: typer.Typer) -> None:
    acl_app = typer.Typer(help="Access control lists of the users of a broker.", no_args_is_help=True)
    app.add_typer(acl_app, name="acl")

    def edit(users_file: Path, user: str, topic: str | None, group: str | None, cluster: bool, ops: list[str],
             add: bool, as_json: bool) -> None:  # fmt: skip
        import attrs

        from equeue.acl import ALL_OPS, Acl, ResourceKind, UsersFile
        from equeue.errors import ConfigError

        kind_s, pattern = _target(topic, group, cluster)
        kind = ResourceKind(kind_s)
        wanted = set(ALL_OPS[kind]) if "all" in ops else set(ops)
        try:
            probe = Acl(kind, pattern, wanted)  # validates the pattern and the operations
        except ConfigError as exc:
            fail(str(exc))

        def change(doc: UsersFile) -> UsersFile:
            old = doc.users.get(user)
            if old is None:
                raise ConfigError(f"no user {user!r} (add it with: equeue user add {user})")
            acls, found = [], False
            for a in old.acls:
                if (a.kind, a.pattern) == (kind, pattern):
                    found = True
                    ops_now = a.ops | probe.ops if add else a.ops - probe.ops
                    if ops_now:
                        acls.append(Acl(kind, pattern, ops_now))
                else:
                    acls.append(a)
            if add and not found:
                acls.append(probe)
            if not add and not found:
                raise ConfigError(f"user {user!r} has no ACL on {kind} {pattern!r}")
            return doc.with_user(attrs.evolve(old, acls=tuple(acls)))

        verb = "allowed" if add else "no longer allowed"
        done = f"{user}: {verb} {', '.join(sorted(probe.ops))} on {kind} {pattern}"
        apply_change(users_file, change, "acl.add" if add else "acl.remove", user, done, as_json)

    @acl_app.command("add")
    def add(
        user: str = typer.Option(..., "--user", "-u", help="The user the ACL is for."),
        topic: str | None = typer.Option(None, "--topic", "-t", help="Topic name or prefix pattern (orders.*)."),
        group: str | None = typer.Option(None, "--group", "-g", help="Consumer group name or prefix pattern."),
        cluster: bool = typer.Option(False, "--cluster", help="The cluster (broker statistics)."),
        op: list[str] = typer.Option(..., "--op", help=_OP_HELP),
        users_file: Path = USERS_FILE_OPTION,
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Allow a user operations on the topics, groups or cluster matching a pattern."""
        edit(users_file, user, topic, group, cluster, op, True, as_json)

    @acl_app.command("remove")
    def remove(
        user: str = typer.Option(..., "--user", "-u", help="The user the ACL is for."),
        topic: str | None = typer.Option(None, "--topic", "-t", help="Topic name or prefix pattern, as added."),
        group: str | None = typer.Option(None, "--group", "-g", help="Consumer group name or prefix pattern, as added."),
        cluster: bool = typer.Option(False, "--cluster", help="The cluster."),
        op: list[str] = typer.Option(..., "--op", help=_OP_HELP),
        users_file: Path = USERS_FILE_OPTION,
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Take operations away (the ACL goes when none is left)."""
        edit(users_file, user, topic, group, cluster, op, False, as_json)

    @acl_app.command("list")
    def list_(
        user: str | None = typer.Option(None, "--user", "-u", help="Only this user's ACLs."),
        users_file: Path = USERS_FILE_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Every ACL: user, resource, pattern, operations (admins may do everything)."""
        from equeue.errors import ConfigError
        from equeue.users import read_users_file

        try:
            doc = read_users_file(users_file)
        except ConfigError as exc:
            fail(str(exc))
        entries: list[dict[str, Any]] = []
        for name in sorted(doc.users):
            u = doc.users[name]
            if user is not None and name != user:
                continue
            if u.admin:
                entries.append({"user": name, "resource": ADMIN_RESOURCE, "pattern": "*", "ops": ["all"]})
            entries += [{"user": name, **a.to_json()} for a in u.acls]
        if as_json:
            print_json(entries)
            return
        table(None, ["user", "resource", "pattern", "operations"], [
            (e["user"], "(admin role)", "*", "everything") if e["resource"] == ADMIN_RESOURCE
            else (e["user"], e["resource"], e["pattern"], ", ".join(e["ops"]))
            for e in entries
        ])  # fmt: skip
