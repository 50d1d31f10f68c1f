"""The users file and the audit log, shared by the broker and the tools that edit
the file (``equeue user``, ``equeue acl``): none of it needs a running broker or the
broker package (docs/security.md).

- :func:`make_user`: a user whose password is kept as SCRAM-SHA-256 verifiers;
- :func:`read_users_file`, :func:`update_users_file`: read, or change under a lock
  and write atomically (mode 0600), the JSON users file (:class:`equeue.acl.UsersFile`);
- :func:`audit`: one structured line on the ``equeue.audit`` logger (who, from where,
  what, the outcome, when), written by the broker for admin actions and by the tools
  for users-file changes;
- :func:`is_loopback` and :data:`NO_AUTH_WARNING`: the warning of a broker or console
  that listens beyond loopback without authentication.

The broker's side (reloading the file, the SCRAM server, the ACL checks) is
:mod:`equeue.broker.auth`.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from scramp import ScramMechanism

from equeue.acl import Acl, UserRecord, UsersFile
from equeue.errors import ConfigError

__all__ = [
    "DEFAULT_ITERATIONS",
    "MECHANISM",
    "NO_AUTH_WARNING",
    "SCRAM",
    "audit",
    "audit_log",
    "is_loopback",
    "make_user",
    "read_users_file",
    "update_users_file",
]

audit_log = logging.getLogger("equeue.audit")

MECHANISM = "SCRAM-SHA-256"
#: PBKDF2 rounds of new passwords (Kafka's and RFC 7677's minimum)
DEFAULT_ITERATIONS = 4096
#: the SCRAM mechanism (verifiers for the file, the server's exchange in the broker)
SCRAM = ScramMechanism(MECHANISM)


# ----------------------------------------------------------------------------- audit
def audit(action: str, *, user: str | None, peer: str, resource: str, outcome: str, level: int = logging.INFO,
          **extra: object) -> None:  # fmt: skip
    """One audit line: who (``user``; ``-`` without authentication), from where
    (``peer``), what (``action`` on ``resource``), the ``outcome``, and when (UTC).
    The same fields ride on the record as ``record.audit`` for structured handlers."""
    fields: dict[str, object] = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "action": action,
        "user": user or "-",
        "peer": peer,
        "resource": resource,
        "outcome": outcome,
        **extra,
    }
    audit_log.log(level, " ".join(f"{k}={v!s}" for k, v in fields.items()), extra={"audit": fields})


# ----------------------------------------------------------------------------- the users file
def make_user(name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS, admin: bool = False,
              acls: Iterable[Acl] = (), replica: bool = False) -> UserRecord:  # fmt: skip
    """A user whose password is kept as SCRAM-SHA-256 verifiers (random salt);
    ``replica``: the replica role (what a follower's user needs)."""
    if not password:
        raise ConfigError("an empty password")
    if iterations < DEFAULT_ITERATIONS:
        raise ConfigError(f"iterations must be >= {DEFAULT_ITERATIONS} (RFC 7677)")
    salt, stored_key, server_key, its = SCRAM.make_auth_info(password, iteration_count=iterations)
    return UserRecord(name, salt, its, stored_key, server_key, admin, tuple(acls), replica)


def read_users_file(path: Path) -> UsersFile:
    """The users in ``path`` (an absent file: none). Raises ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return UsersFile()
    except OSError as exc:
        raise ConfigError(f"cannot read the users file {path}: {exc.strerror or exc}") from None
    try:
        return UsersFile.parse(text)
    except ConfigError as exc:
        raise ConfigError(f"users file {path}: {exc}") from None


def update_users_file(path: Path, change: Callable[[UsersFile], UsersFile]) -> UsersFile:
    """Apply ``change`` to the users file under an exclusive lock (``PATH.lock``), and
    write the result atomically (a temporary file with mode 0600, fsync, rename,
    fsync of the directory). Returns the new content. Raises ConfigError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        new = change(read_users_file(path))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(new.dump())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return new
    finally:
        os.close(lock_fd)



# ----------------------------------------------------------------------------- listening in the open
def is_loopback(host: str) -> bool:
    """Whether ``host`` reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


NO_AUTH_WARNING = (
    "WARNING: the broker listens on {host}, which is not a loopback address, and "
    "authentication is OFF: anyone who can reach port {port} may produce, consume, "
    "delete topics and reset offsets. Start it with --users-file (docs/security.md) "
    "or listen on 127.0.0.1."
)
