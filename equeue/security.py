"""What a client brings to a secured broker: TLS settings and credentials.

These are plain values (the core does no I/O: the SSL context is built in
``client/``, the SCRAM exchange runs in the client's handshake). Every client takes
one :class:`ClientSecurity`: the SDK (``security=`` on :class:`equeue.client.AsyncClient`,
the producers and the consumers), the CLI (from the environment) and Spark (from
its options, see :func:`ClientSecurity.from_options`).

Credentials never come from a command line: from the environment or a file.

Environment (read by :func:`ClientSecurity.from_env`):

- ``EQUEUE_TLS=1`` turns TLS on with the system's CA store;
  ``EQUEUE_TLS_CA`` (a PEM file of CAs to trust) turns it on with that CA;
  ``EQUEUE_TLS_CERT`` / ``EQUEUE_TLS_KEY``: the client's certificate chain and key
  (mutual TLS); ``EQUEUE_TLS_SERVER_NAME``: the name to check the broker's
  certificate against (default: the host of the broker address).
- ``EQUEUE_USERNAME`` / ``EQUEUE_PASSWORD``, or ``EQUEUE_CREDENTIALS_FILE``: a file
  whose first line is ``username:password``.

Raises :class:`~equeue.errors.ConfigError` for an incomplete or unreadable setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from equeue.errors import ConfigError

__all__ = ["ClientSecurity", "Credentials", "TlsSettings", "read_credentials_file"]

_TRUE = {"1", "true", "yes", "on"}


def _opt_path(value: str | Path | None) -> Path | None:
    return None if value is None or value == "" else Path(value)


@attrs.frozen
class TlsSettings:
    """How a client speaks TLS to the broker. All paths are PEM files."""

    #: CAs to trust for the broker's certificate (None: the system's CA store)
    ca_file: Path | None = attrs.field(default=None, converter=_opt_path)
    #: the client's certificate chain, for brokers that ask for one (mutual TLS)
    cert_file: Path | None = attrs.field(default=None, converter=_opt_path)
    #: the key of ``cert_file`` (None: the key is in ``cert_file``)
    key_file: Path | None = attrs.field(default=None, converter=_opt_path)
    #: the name checked against the broker's certificate (None: the address's host)
    server_hostname: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("a TLS key needs its certificate (cert_file)")


@attrs.frozen
class Credentials:
    """A user name and password for the handshake's SCRAM-SHA-256 exchange."""

    username: str
    password: str = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.username:
            raise ConfigError("credentials need a user name")
        if not self.password:
            raise ConfigError(f"user {self.username!r}: an empty password")


def read_credentials_file(path: str | Path) -> Credentials:
    """Credentials from a file whose first line is ``username:password``.

    Raises ConfigError when the file is missing, unreadable or malformed.
    """
    try:
        first = Path(path).read_text(encoding="utf-8").splitlines()[:1]
    except OSError as exc:
        raise ConfigError(f"cannot read the credentials file {path}: {exc.strerror or exc}") from None
    if not first or ":" not in first[0]:
        raise ConfigError(f"the credentials file {path} must start with a line username:password")
    user, password = first[0].split(":", 1)
    return Credentials(user.strip(), password)


@attrs.frozen
class ClientSecurity:
    """TLS and credentials of one client; both off by default (a loopback broker)."""

    tls: TlsSettings | None = None
    credentials: Credentials | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """The settings named by the ``EQUEUE_*`` variables (see the module doc)."""
        env = os.environ if environ is None else environ
        return cls.from_values(
            tls=env.get("EQUEUE_TLS", "").strip().lower() in _TRUE,
            ca=env.get("EQUEUE_TLS_CA"),
            cert=env.get("EQUEUE_TLS_CERT"),
            key=env.get("EQUEUE_TLS_KEY"),
            server_name=env.get("EQUEUE_TLS_SERVER_NAME"),
            username=env.get("EQUEUE_USERNAME"),
            password=env.get("EQUEUE_PASSWORD"),
            credentials_file=env.get("EQUEUE_CREDENTIALS_FILE"),
        )

    @classmethod
    def from_options(cls, options: Mapping[str, str], environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """The settings of a Spark source or sink: options ``tls`` (true/false),
        ``tls.ca``, ``tls.cert``, ``tls.key``, ``tls.serverName`` and
        ``credentials.file``; what an option leaves unset comes from the environment.

        A password is never an option (Spark prints options in its plans and logs).
        """
        low = {k.lower(): v for k, v in options.items()}
        base = cls.from_env(environ)
        tls_opts = {k: low[k] for k in ("tls", "tls.ca", "tls.cert", "tls.key", "tls.servername") if k in low}
        tls = base.tls
        if tls_opts:
            on = str(tls_opts.get("tls", "")).strip().lower() in _TRUE or "tls.ca" in tls_opts
            tls = (
                TlsSettings(
                    ca_file=tls_opts.get("tls.ca"),
                    cert_file=tls_opts.get("tls.cert"),
                    key_file=tls_opts.get("tls.key"),
                    server_hostname=tls_opts.get("tls.servername") or None,
                )
                if on
                else None
            )
        creds = base.credentials
        if low.get("credentials.file"):
            creds = read_credentials_file(low["credentials.file"])
        return cls(tls=tls, credentials=creds)

    @classmethod
    def from_values(
        cls, *, tls: bool = False, ca: str | None = None, cert: str | None = None, key: str | None = None,
        server_name: str | None = None, username: str | None = None, password: str | None = None,
        credentials_file: str | None = None,
    ) -> ClientSecurity:  # fmt: skip
        """Build from loose values: TLS is on when ``tls`` or any TLS file is given;
        credentials from ``username``+``password`` or ``credentials_file``.

        Raises ConfigError for a user without a password (or the reverse) or both a
        file and a user name.
        """
        settings = None
        if tls or ca or cert or key:
            settings = TlsSettings(ca_file=ca, cert_file=cert, key_file=key, server_hostname=server_name or None)
        creds = None
        if credentials_file:
            if username or password:
                raise ConfigError("give credentials either as a user and password or as a file, not both")
            creds = read_credentials_file(credentials_file)
        elif username or password:
            if not (username and password):
                raise ConfigError("credentials need both a user name and a password")
            creds = Credentials(username, password)
        return cls(tls=settings, credentials=creds)
