"""``equeue user add|passwd|admin|replica|remove|list``: the broker's users file.

These commands edit the file a broker reads with ``--users-file`` (locked, written
atomically with mode 0600); a running broker picks the change up within a second
(or at once on SIGHUP). Passwords are kept as SCRAM-SHA-256 verifiers, never in
plain text, and never come from a command-line argument: from a prompt (asked
twice), from stdin (``--password-stdin``) or from ``EQUEUE_NEW_PASSWORD``.
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from equeue.cli._common import JSON_OPTION, fail, json_option, print_json, table

#: the users file of every ``equeue user`` / ``equeue acl`` command
USERS_FILE_OPTION = typer.Option(
    ..., "--users-file", envvar="EQUEUE_USERS_FILE", help="The broker's users file (created if missing)."
)
PASSWORD_ENV = "EQUEUE_NEW_PASSWORD"
#: ``--json`` of the commands that change a user (``user add``, ``acl add``, ...)
USER_JSON_OPTION = json_option("the user after the change (as user list shows it)")

audit_log = logging.getLogger("equeue.audit")


def read_password(from_stdin: bool) -> str:
    """The new password: stdin's first line, ``EQUEUE_NEW_PASSWORD``, or a prompt
    (asked twice). Fails on an empty or mismatched password."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password (again): ") != password:
            fail("the passwords differ")
    if not password:
        fail("an empty password")
    return password


def audit_change(action: str, name: str, users_file: Path) -> None:
    """An audit line for a change made here (the broker writes its own on reload)."""
    from equeue.users import audit

    try:
        who = getpass.getuser()
    except Exception:
        who = "?"
    audit(action, user=f"os:{who}", peer="cli", resource=f"user:{name}", outcome="ok", file=str(users_file))


def user_entry(user: Any) -> dict[str, Any]:
    """A user as ``--json`` shows it: name, roles and ACLs (never a verifier)."""
    return {"user": user.name, "admin": user.admin, "replica": user.replica, "acls": [a.to_json() for a in user.acls]}


def apply_change(
    users_file: Path, change: Callable[[Any], Any], action: str, name: str, done: str, as_json: bool = False
) -> None:
    """Apply ``change`` to the users file (locked, atomic), write its audit line and
    say ``done`` on stderr, or (``as_json``) print user ``name`` as it is now
    (:func:`user_entry`; ``{"user": name, "removed": true}`` once it is gone) on
    stdout. A refused change (ConfigError) is one error line and exit 1."""
    from equeue.errors import ConfigError
    from equeue.users import update_users_file

    try:
        new = update_users_file(users_file, change)
    except ConfigError as exc:
        fail(str(exc))
    audit_change(action, name, users_file)
    if not as_json:
        typer.echo(done, err=True)
    elif name in new.users:
        print_json(user_entry(new.users[name]))
    else:
        print_json({"user": name, "removed": True})


def register(app: typer.Typer) -> None:
    user_app = typer.Typer(help="Users of a broker that authenticates (its --users-file).", no_args_is_help=True)
    app.add_typer(user_app, name="user")

    @user_app.command("add")
    def add(
        name: str = typer.Argument(..., help="User name (1-64 of A-Z a-z 0-9 _ . @ -)."),
        users_file: Path = USERS_FILE_OPTION,
        admin: bool = typer.Option(False, "--admin", help="Give the admin role (every request, internal topics, DLQ resend)."),
        replica: bool = typer.Option(False, "--replica", help="Give the replica role: the user the brokers of a replicated group follow their leader with (EQUEUE_REPLICA_USER); admin does not imply it."),
        password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin's first line."),
        iterations: int = typer.Option(4096, help="PBKDF2 rounds of the SCRAM verifier (>= 4096)."),
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Add a user (the password is asked, never an argument)."""
        from equeue.acl import UsersFile, validate_username
        from equeue.errors import ConfigError
        from equeue.users import make_user

        try:
            validate_username(name)
        except ConfigError as exc:
            fail(str(exc))
        password = read_password(password_stdin)

        def change(doc: UsersFile) -> UsersFile:
            if name in doc.users:
                raise ConfigError(f"user {name!r} exists (change its password with: equeue user passwd {name})")
            return doc.with_user(make_user(name, password, iterations=iterations, admin=admin, replica=replica))

        roles = ", ".join(r for r, on in (("admin", admin), ("replica", replica)) if on)
        apply_change(users_file, change, "user.add", name, f"user {name} added{f' ({roles})' if roles else ''}",
                     as_json)  # fmt: skip

    @user_app.command("passwd")
    def passwd(
        name: str,
        users_file: Path = USERS_FILE_OPTION,
        password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin's first line."),
        iterations: int = typer.Option(4096, help="PBKDF2 rounds of the SCRAM verifier (>= 4096)."),
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Change a user's password (open connections keep their session)."""
        from equeue.acl import UsersFile
        from equeue.errors import ConfigError
        from equeue.users import make_user

        password = read_password(password_stdin)

        def change(doc: UsersFile) -> UsersFile:
            old = doc.users.get(name)
            if old is None:
                raise ConfigError(f"no user {name!r}")
            return doc.with_user(make_user(name, password, iterations=iterations, admin=old.admin, acls=old.acls,
                                           replica=old.replica))

        apply_change(users_file, change, "user.password", name, f"password of {name} changed", as_json)

    @user_app.command("admin")
    def admin_(
        name: str,
        users_file: Path = USERS_FILE_OPTION,
        revoke: bool = typer.Option(False, "--revoke", help="Take the admin role away instead."),
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Give a user the admin role (or take it away with --revoke)."""
        import attrs

        from equeue.acl import UsersFile
        from equeue.errors import ConfigError

        def change(doc: UsersFile) -> UsersFile:
            old = doc.users.get(name)
            if old is None:
                raise ConfigError(f"no user {name!r}")
            return doc.with_user(attrs.evolve(old, admin=not revoke))

        apply_change(users_file, change, "user.admin" if not revoke else "user.admin-revoke", name,
                     f"{name}: admin role {'revoked' if revoke else 'granted'}", as_json)  # fmt: skip

    @user_app.command("replica")
    def replica_(
        name: str,
        users_file: Path = USERS_FILE_OPTION,
        revoke: bool = typer.Option(False, "--revoke", help="Take the replica role away instead."),
        as_json: bool = USER_JSON_OPTION,
    ) -> None:
        """Give a user the replica role (or take it away with --revoke): only such a
        user may send the requests a follower sends its leader. The admin role does
        not imply it."""
        import attrs

        from equeue.acl import UsersFile
        from equeue.errors import ConfigError

        def change(doc: UsersFile) -> UsersFile:
            old = doc.users.get(name)
            if old is None:
                raise ConfigError(f"no user {name!r}")
            return doc.with_user(attrs.evolve(old, replica=not revoke))

        apply_change(users_file, change, "user.replica" if not revoke else "user.replica-revoke", name,
                     f"{name}: replica role {'revoked' if revoke else 'granted'}", as_json)  # fmt: skip

    @user_app.command("remove")
    def remove(
        name: str, users_file: Path = USERS_FILE_OPTION, as_json: bool = json_option('{"user": NAME, "removed": true}')
    ) -> None:
        """Remove a user and its ACLs. Its open connections stay open, but every
        request they make is refused (NOT_AUTHORIZED) from the broker's reload on."""
        from equeue.acl import UsersFile
        from equeue.errors import ConfigError

        def change(doc: UsersFile) -> UsersFile:
            if name not in doc.users:
                raise ConfigError(f"no user {name!r}")
            return doc.without(name)

        apply_change(users_file, change, "user.remove", name, f"user {name} removed", as_json)

    @user_app.command("list")
    def list_(users_file: Path = USERS_FILE_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Users, their role and ACLs (never a password or a verifier)."""
        from equeue.errors import ConfigError
        from equeue.users import read_users_file

        try:
            doc = read_users_file(users_file)
        except ConfigError as exc:
            fail(str(exc))
        users = [doc.users[n] for n in sorted(doc.users)]
        if as_json:
            print_json([user_entry(u) for u in users])
            return
        rows = [(u.name, "+".join(r for r, on in (("admin", u.admin), ("replica", u.replica)) if on) or "user",
                 "; ".join(a.describe() for a in u.acls) or "-") for u in users]
        table(None, ["user", "role", "acls"], rows)
