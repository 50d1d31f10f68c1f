"""``equeue broker start`` and ``equeue broker stats``."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs
import typer

from equeue.cli._common import (
    BROKER_OPTION,
    JSON_OPTION,
    LOG_LEVEL_OPTION,
    LogLevel,
    fail,
    query,
    setup_audit_log,
    table,
    warn_if_open,
)
from equeue.config import (
    BrokerConfig,
    FlushPolicy,
    TlsClientAuth,
    format_duration_ms,
    format_retention_bytes,
    format_retention_ms,
    format_size,
    parse_duration_ms,
    parse_http_port,
    parse_retention_bytes,
    parse_retention_ms,
    parse_size,
    to_enum,
)
from equeue.errors import ConfigError, EQueueError, first_error
from equeue.logs import LogFormat, setup_logging

#: every field at its default: ``broker start`` repeats none (tests/unit/test_cli_defaults.py)
_D = BrokerConfig(data_dir=Path())


def _secs(seconds: float) -> str:
    """A default in seconds as its option shows it (``500ms``, ``1m``)."""
    return format_duration_ms(round(seconds * 1000))


def _seconds(text: str) -> float:
    """A duration option's text → seconds (the field's unit). Raises ConfigError."""
    return parse_duration_ms(text) / 1000


def _whole_seconds(text: str) -> int:
    """A duration option's text → whole seconds. Raises ConfigError for a fraction."""
    ms = parse_duration_ms(text)
    if ms % 1000:
        raise ConfigError(f"invalid duration {text!r}: give whole seconds (e.g. 3s, 1m)")
    return ms // 1000


#: ``broker start`` option → (its BrokerConfig field, the reading of its text; None: the
#: value as the option gives it). Sizes and durations are read by the parsers of
#: :mod:`equeue.config` (``8GB`` = 8·10^9 bytes, ``8GiB`` = 8·2^30, ``1h30m``).
OPTION_FIELDS: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "host": ("host", None),
    "port": ("port", None),
    "http_port": ("http_port", parse_http_port),
    "flush": ("flush", None),
    "flush_interval": ("flush_interval", _seconds),
    "inline_commit": ("inline_commit_bytes", parse_size),
    "map_size": ("map_size", parse_size),
    "auto_create": ("auto_create_topics", None),
    "default_queues": ("default_queues", None),
    "compression": ("compression", None),
    "retention": ("retention_ms", lambda t: parse_retention_ms(t, "value")),
    "retention_bytes": ("retention_bytes", lambda t: parse_retention_bytes(t, "value")),
    "delete_consumed": ("delete_consumed", None),
    "max_message": ("max_message_bytes", parse_size),
    "scan_records": ("scan_records", None),
    "scan_time": ("scan_time", _seconds),
    "metrics_queue_limit": ("metrics_queue_limit", None),
    "http_max_connections": ("http_max_connections", None),
    "tls_cert": ("tls_cert", None),
    "tls_key": ("tls_key", None),
    "tls_ca": ("tls_ca", None),
    "tls_client_auth": ("tls_client_auth", None),
    "users_file": ("users_file", None),
    "max_connections": ("max_connections", None),
    "output_buffer_soft": ("output_buffer_soft", parse_size),
    "output_buffer_hard": ("output_buffer_hard", parse_size),
    "output_buffer_grace": ("output_buffer_grace", _seconds),
    "frame_timeout": ("frame_timeout", _seconds),
    "max_partial_frame_bytes": ("max_partial_frame_bytes", parse_size),
    "idle_timeout": ("idle_timeout", _seconds),
    "max_pulls_per_connection": ("max_pulls_per_connection", None),
    "member_expiry": ("member_expiry", _seconds),
    "cluster": ("cluster", None),
    "broker_group": ("broker_group", None),
    "advertise": ("advertise", None),
    "cluster_lease_ttl": ("cluster_lease_ttl", _whole_seconds),
    "acks": ("acks", None),
    "min_insync": ("min_insync", None),
    "replica_lag_max": ("replica_lag_max", _seconds),
    "replica_fetch_bytes": ("replica_fetch_bytes", parse_size),
    "replica_log_bytes": ("replica_log_bytes", parse_size),
}


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def build_config(data_dir: Path, values: dict[str, Any], origin: Callable[[str], str]) -> BrokerConfig:
    """The BrokerConfig of ``broker start``'s option values (``values``: option name →
    its value as given, text for sizes and durations). Each value is read and checked
    on its own first, so a bad one is refused naming where it came from
    (``origin(option)``: the flag, or the config file and key); then BrokerConfig
    checks the combination. Raises ConfigError."""
    fields = attrs.fields_dict(BrokerConfig)
    kw: dict[str, Any] = {}
    for option, value in values.items():
        name, parse = OPTION_FIELDS[option]
        field = fields[name]
        try:
            kw[name] = parse(value) if parse is not None else value
            checked = field.converter(kw[name]) if callable(field.converter) else kw[name]
            if field.validator is not None:
                field.validator(None, field, checked)
        except ConfigError as exc:
            raise ConfigError(f"{origin(option)}: {exc}") from None
    return BrokerConfig(data_dir=data_dir, **kw)


def _config_or_fail(data_dir: Path, values: dict[str, Any], origin: Callable[[str], str]) -> BrokerConfig:
    try:
        return build_config(data_dir, values, origin)
    except ConfigError as exc:
        fail(str(exc))


#: ``broker start`` options that take a path (a string in the config file)
_PATHS = frozenset({"data_dir", "tls_cert", "tls_key", "tls_ca", "users_file"})


def _file_value(name: str, default: object, value: object) -> object:
    """A config-file value of option ``name`` as the command line would give it: TOML's
    types are checked (a port is an integer, a flag true or false, a path a string;
    a size or a duration a string or a number, read as on the command line), never
    coerced. Raises ConfigError saying what was expected."""

    def wrong(expected: str) -> ConfigError:
        return ConfigError(f"expected {expected}, got {type(value).__name__} {value!r}")

    if name in _PATHS:
        if not isinstance(value, str) or not value:
            raise wrong("a path (a string)")
        return Path(value)
    if name == "cluster":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value)
        raise wrong("etcd URLs (a string, or a list of strings)")
    if isinstance(default, StrEnum):
        if not isinstance(value, str):
            raise wrong("a string")
        return to_enum(type(default), "value", value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("a whole number")
        return value
    if name in OPTION_FIELDS and OPTION_FIELDS[name][1] is not None:  # a size, a duration, a port or off
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise wrong("a string or a number")
        return str(value)
    if not isinstance(value, str):
        raise wrong("a string")
    return value


def read_config_file(path: Path, params: list[Any]) -> dict[str, tuple[object, str]]:
    """The settings of a ``broker start --config`` TOML file: option name → (its value
    as the command line would give it, the key as written). Keys are the options' long
    names (``map-size``; ``map_size`` too). Raises ConfigError naming the file and the
    key: an unreadable file or bad TOML, an unknown key, a key given twice, a value of
    the wrong type."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not a TOML file: {exc}") from None
    options = {p.opts[0].removeprefix("--"): p for p in params if p.name not in ("config", "ctx") and p.opts}
    flag_of_field = {field.replace("_", "-"): option.replace("_", "-") for option, (field, _) in OPTION_FIELDS.items()}
    out: dict[str, tuple[object, str]] = {}
    for key, value in table.items():
        param = options.get(key.replace("_", "-"))
        if param is None:
            near = flag_of_field.get(key.replace("_", "-")) or next(
                iter(difflib.get_close_matches(key.replace("_", "-"), options, n=1)), None
            )
            hint = f" (did you mean {near!r}?)" if near else " (keys are the long options of equeue broker start)"
            raise ConfigError(f"{path}: unknown key {key!r}{hint}")
        if param.name in out:
            raise ConfigError(f"{path}: {key!r} is given twice (as {out[param.name][1]!r} too)")
        try:
            out[param.name] = (_file_value(param.name, param.default, value), key)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {key}: {exc}") from None
    return out


async def _reload(broker: Any) -> None:
    """SIGHUP: re-read the users file (docs/security.md) and the TLS certificate
    (docs/tls.md, rotation); a bad file changes nothing and says why."""
    if broker.security.enabled:
        changed = await broker.security.reload()
        typer.echo(f"users file re-read ({'changed' if changed else 'unchanged'})", err=True)
    if broker.config.tls_cert is not None:
        try:
            broker.reload_tls()
            typer.echo("TLS certificate reloaded", err=True)
        except EQueueError as exc:
            typer.echo(f"TLS reload failed, the current certificate stays: {exc}", err=True)
    if not broker.security.enabled and broker.config.tls_cert is None:
        typer.echo("SIGHUP: nothing to reload (no --users-file, no TLS)", err=True)


def register(app: typer.Typer) -> None:
    broker_app = typer.Typer(help="Run and inspect a broker.", no_args_is_help=True)
    app.add_typer(broker_app, name="broker")

    @broker_app.command("start")
    def start(
        ctx: typer.Context,
        config: Path | None = typer.Option(None, "--config", help="A TOML file of settings, keyed by these options' long names (map-size = \"64GiB\"); options given here override it (docs/operations.md)."),
        data_dir: Path | None = typer.Option(None, "--data-dir", help="LMDB data directory (created if missing). Required, here or in --config."),
        host: str = typer.Option(_D.host, help="Interface to listen on."),
        port: int = typer.Option(_D.port, help="TCP port (0 = pick a free one)."),
        http_port: str = typer.Option("off", help="Port for /metrics and /stats over HTTP (0 = pick a free one, printed on stderr; off or -1 = none)."),
        flush: FlushPolicy = typer.Option(_D.flush, help="sync: fsync before every ack; async: fsync every --flush-interval."),
        flush_interval: str = typer.Option(_secs(_D.flush_interval), help="Time between fsyncs with --flush async (a duration, e.g. 500ms)."),
        inline_commit: str = typer.Option(format_size(_D.inline_commit_bytes), help="--flush async: commit transactions up to this size on the event loop when the writer thread is idle (0 = never)."),
        map_size: str = typer.Option(format_size(_D.map_size), help="LMDB map size (the store's maximum size)."),
        auto_create: bool = typer.Option(_D.auto_create_topics, "--auto-create/--no-auto-create", help="Create unknown topics on produce."),
        default_queues: int = typer.Option(_D.default_queues, help="Queue count of auto-created topics."),
        compression: str = typer.Option(_D.compression, help="How topics without their own compression setting store batches: producer (as sent), none, zstd or lz4 (recompressing what is sent otherwise)."),
        retention: str = typer.Option(format_retention_ms(_D.retention_ms), help="Keep messages this long (e.g. 72h, 7d; -1 or forever: keep forever; 0 and other negative values are refused). Topics may override it."),
        retention_bytes: str = typer.Option(format_retention_bytes(_D.retention_bytes), help="Per-topic size limit (e.g. 10GiB; -1 or forever: no limit; 0 and other negative values are refused). Topics may override it."),
        delete_consumed: bool = typer.Option(_D.delete_consumed, help="Also delete messages every group committed past."),
        max_message: str = typer.Option(format_size(_D.max_message_bytes), help="Largest message body accepted."),
        scan_records: int = typer.Option(_D.scan_records, help="Records a tag-filtered pull or key lookup may scan per request."),
        scan_time: str = typer.Option(_secs(_D.scan_time), help="Time a tag-filtered pull or key lookup may scan per request (e.g. 5ms)."),
        metrics_queue_limit: int = typer.Option(_D.metrics_queue_limit, help="Most queues with per-queue series in one /metrics scrape."),
        http_max_connections: int = typer.Option(_D.http_max_connections, help="Connections the HTTP port serves at once; more are refused (503, or closed over HTTPS)."),
        tls_cert: Path | None = typer.Option(_D.tls_cert, help="PEM certificate chain: TLS on the broker and HTTP ports."),
        tls_key: Path | None = typer.Option(_D.tls_key, help="PEM key of --tls-cert (default: in the --tls-cert file)."),
        tls_ca: Path | None = typer.Option(_D.tls_ca, help="PEM CAs that sign client certificates (mutual TLS)."),
        tls_client_auth: TlsClientAuth = typer.Option(_D.tls_client_auth, help="Ask TLS clients for a certificate (needs --tls-ca)."),
        users_file: Path | None = typer.Option(_D.users_file, "--users-file", help="Users and ACLs (equeue user/acl): authenticate every connection (SCRAM-SHA-256) and check every request. Reloaded when it changes and on SIGHUP."),
        audit_log: str | None = typer.Option(None, "--audit-log", help="Write the audit log (admin actions, user changes, refused logins) to this file ('-': stderr), whatever --log-level says."),
        max_connections: int = typer.Option(_D.max_connections, help="Connections served at once; more are refused (TOO_MANY_CONNECTIONS)."),
        output_buffer_soft: str = typer.Option(format_size(_D.output_buffer_soft), help="Unread answers past which a connection is no longer read."),
        output_buffer_hard: str = typer.Option(format_size(_D.output_buffer_hard), help="Unread answers past which a connection is closed."),
        output_buffer_grace: str = typer.Option(_secs(_D.output_buffer_grace), help="Time a connection may stay above --output-buffer-soft before it is closed."),
        frame_timeout: str = typer.Option(_secs(_D.frame_timeout), help="Time a frame may take to arrive whole."),
        max_partial_frame_bytes: str = typer.Option(format_size(_D.max_partial_frame_bytes), help="Bytes all connections may hold in frames still arriving."),
        idle_timeout: str = typer.Option(_secs(_D.idle_timeout), help="Time a connection may stay idle (no request, none in flight)."),
        max_pulls_per_connection: int = typer.Option(_D.max_pulls_per_connection, help="Pulls one connection may have parked (TOO_MANY_PULLS past it)."),
        member_expiry: str = typer.Option(_secs(_D.member_expiry), "--member-expiry", help="Time a consumer may go without a heartbeat before it leaves its group (its queues go to the others)."),
        cluster: str = typer.Option(",".join(_D.cluster), "--cluster", help="etcd client URLs (http://HOST:PORT[,more]): join that cluster (docs/cluster.md). Empty: standalone."),
        broker_group: str = typer.Option(_D.broker_group, "--broker-group", help="The broker group this broker serves (required with --cluster)."),
        advertise: str | None = typer.Option(_D.advertise, "--advertise", help="HOST:PORT clients reach this broker at (default: the listen address; 127.0.0.1:PORT when listening on 0.0.0.0)."),
        cluster_lease_ttl: str = typer.Option(_secs(_D.cluster_lease_ttl), "--cluster-lease-ttl", help="The broker's etcd lease (whole seconds, 2s..10m): silent this long, it is shown down."),
        acks: str = typer.Option(_D.acks, "--acks", help="all: acknowledge once every in-sync replica has a write; leader: once the leader has it (a leader crash can lose it)."),
        min_insync: int = typer.Option(_D.min_insync, "--min-insync", help="With --acks all: fewer in-sync replicas (leader included) and produce fails with NOT_ENOUGH_REPLICAS."),
        replica_lag_max: str = typer.Option(_secs(_D.replica_lag_max), "--replica-lag-max", help="Time a follower may stay behind before it leaves the in-sync set."),
        replica_fetch_bytes: str = typer.Option(format_size(_D.replica_fetch_bytes), "--replica-fetch-bytes", help="Replication log bytes per fetch answer (at least one whole entry)."),
        replica_log_bytes: str = typer.Option(format_size(_D.replica_log_bytes), "--replica-log-bytes", help="Replication log bytes a leader keeps for lagging followers (further behind: the store is copied first)."),
        log_level: LogLevel = LOG_LEVEL_OPTION,
        log_format: LogFormat = typer.Option(LogFormat.LOGFMT, "--log-format", help="Log lines as logfmt (key=value) or JSON objects (docs/operations.md, Logs)."),
    ) -> None:
        """Start a broker in the foreground; Ctrl-C / SIGTERM stop it gracefully."""
        import faulthandler
        import gc
        import signal

        import trio

        from equeue.broker import Broker

        values = dict(ctx.params)  # every option's value (converted by typer)
        del values["config"]
        origins = {name: _flag(name) for name in values}
        if config is not None:
            try:
                settings = read_config_file(config, ctx.command.params)
            except ConfigError as exc:
                fail(str(exc))
            for name, (value, key) in settings.items():
                source = ctx.get_parameter_source(name)
                if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT"):
                    continue  # the command line overrides the file
                values[name], origins[name] = value, f"{config}: {key}"
        data_dir, audit_log = values["data_dir"], values["audit_log"]
        if data_dir is None:
            fail("give the data directory: --data-dir DIR, or data-dir in the --config file")
        cfg = _config_or_fail(data_dir, {k: v for k, v in values.items() if k in OPTION_FIELDS}, origins.__getitem__)
        setup_logging(values["log_level"], values["log_format"])
        # A fatal signal (a SIGBUS when data.mdb is cut short under a running broker)
        # prints "Fatal Python error: Bus error" and where, instead of dying silently
        # (on fd 2, the process's stderr: a test runner may have replaced sys.stderr).
        faulthandler.enable(file=2, all_threads=False)
        if audit_log:
            try:
                setup_audit_log(audit_log)
            except OSError as exc:
                fail(f"cannot open the audit log {audit_log}: {exc.strerror or exc}")
        broker = Broker(cfg)
        warn_if_open(cfg)

        async def main() -> None:
            # The signal receiver is open before the ready line is printed: a SIGTERM
            # sent as soon as the line is seen (tests, supervisors) is a clean stop,
            # never the default action's exit by signal.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async with trio.open_nursery() as n:
                    bound = await n.start(broker.serve)
                    # Everything allocated so far (modules, CLI, store, codec tables) lives
                    # as long as the process: move it out of the collector's sight, so the
                    # full collections of the steady state do not walk it (a 25-30 ms pause
                    # of the whole broker every few seconds under L1, 1-2 ms after).
                    gc.collect()
                    gc.freeze()
                    tls = ", TLS" if cfg.tls_cert is not None else ""
                    http = f", HTTP on {cfg.host}:{broker.http_port}" if broker.http_port else ""
                    typer.echo(
                        f"equeue broker listening on {cfg.host}:{bound}{http} (data {cfg.data_dir}, flush {cfg.flush}{tls})",
                        err=True,
                    )
                    if cfg.cluster:
                        typer.echo(
                            f"cluster: broker group {cfg.broker_group}, etcd {','.join(cfg.cluster)}, "
                            f"advertised as {cfg.advertised(bound)}",
                            err=True,
                        )
                    async for signum in signals:
                        if signum == signal.SIGHUP:  # re-read the users file and the certificate
                            await _reload(broker)
                            continue
                        typer.echo("stopping broker...", err=True)
                        broker.stop()
                        break

        try:
            trio.run(main)
        except OSError as exc:
            fail(f"cannot start the broker on {cfg.host}:{cfg.port}: {exc.strerror or exc}")
        except BaseExceptionGroup as group:  # the broker's nursery wraps a start-up failure
            refused = first_error(group)
            if refused is None:
                raise
            fail(str(refused))

    @broker_app.command("stats")
    def stats(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Show broker counters, rates and store size."""
        s = query(broker, lambda c: c.stats(), as_json)
        if s is None:
            return
        rows = [
            ("version", s.version), ("uptime", f"{s.uptime_s:.0f} s"), ("connections", s.connections),
            ("topics", s.topics), ("messages in", s.messages_in), ("messages out", s.messages_out),
            ("produce rate", f"{s.produce_rate:,.0f} msg/s"), ("pull rate", f"{s.pull_rate:,.0f} msg/s"),
            ("parked pulls", s.parked_pulls), ("next global offset", s.next_global_offset),
            ("pending delayed", s.pending_delayed), ("transactions", s.transactions),
            ("inline transactions", f"{s.inline_transactions} (longest {s.inline_max_seconds * 1e3:.2f} ms)"),
            ("store size", f"{s.store_bytes / 2**20:,.1f} MiB of {s.map_size / 2**30:,.1f} GiB map"),
            ("flush", s.flush),
        ]  # fmt: skip
        table(f"broker {broker}", ["metric", "value"], rows)
