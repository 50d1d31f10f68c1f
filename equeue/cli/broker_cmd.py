"""``equeue broker start`` and ``equeue broker stats``."""

from __future__ import annotations

from pathlib import Path

import typer

from equeue.cli._common import BROKER_OPTION, client, fail, print_json, setup_logging, table


def _size(text: str) -> int:
    """'8GiB', '512MiB', '1G', '100000' -> bytes."""
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def _duration_ms(text: str) -> int:
    """'72h', '30m', '45s', '7d', '1500ms' -> milliseconds."""
    t = text.strip().lower()
    for suffix, mult in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)):
        if t.endswith(suffix) and t[: -len(suffix)].replace(".", "", 1).isdigit():
            return int(float(t[: -len(suffix)]) * mult)
    return int(float(t) * 1000)


def register(app: typer.Typer) -> None:
    broker_app = typer.Typer(help="Run and inspect a broker.", no_args_is_help=True)
    app.add_typer(broker_app, name="broker")

    @broker_app.command("start")
    def start(
        data_dir: Path = typer.Option(..., "--data-dir", help="LMDB data directory (created if missing)."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
        port: int = typer.Option(5800, help="TCP port (0 = pick a free one)."),
        http_port: int = typer.Option(0, "--http-port", help="Port for /metrics and /stats over HTTP (0 = off)."),
        flush: str = typer.Option("sync", help="sync: fsync before every ack; async: fsync every --flush-interval."),
        flush_interval: float = typer.Option(0.5, help="Seconds between fsyncs with --flush async."),
        map_size: str = typer.Option("8GiB", help="LMDB map size (the store's maximum size)."),
        auto_create: bool = typer.Option(True, "--auto-create/--no-auto-create", help="Create unknown topics on produce."),
        default_queues: int = typer.Option(4, help="Queue count of auto-created topics."),
        retention: str = typer.Option("72h", help="Keep messages this long (e.g. 72h, 7d; 0 = forever)."),
        retention_bytes: str = typer.Option("0", help="Per-topic size limit (e.g. 10GiB; 0 = unlimited)."),
        delete_consumed: bool = typer.Option(False, help="Also delete messages every group committed past."),
        max_message: str = typer.Option("4MiB", help="Largest message body accepted."),
        log_level: str = typer.Option("warning", help="debug | info | warning | error."),
    ) -> None:
        """Start a broker in the foreground; Ctrl-C / SIGTERM stop it gracefully."""
        import gc
        import signal

        import trio

        from broker import Broker, BrokerConfig
        from equeue.errors import ConfigError

        setup_logging(log_level)
        try:
            rms = _duration_ms(retention)
            rbytes = _size(retention_bytes)
            cfg = BrokerConfig(
                data_dir=data_dir, host=host, port=port, flush=flush, flush_interval=flush_interval,
                map_size=_size(map_size), auto_create_topics=auto_create, default_queues=default_queues,
                retention_ms=rms or None, retention_bytes=rbytes or None, delete_consumed=delete_consumed,
                max_message_bytes=_size(max_message), http_port=http_port,
            )  # fmt: skip
        except (ConfigError, ValueError) as exc:
            fail(str(exc))
        broker = Broker(cfg)

        async def main() -> None:
            async with trio.open_nursery() as n:
                bound = await n.start(broker.serve)
                # Everything allocated so far (modules, CLI, store, codec tables) lives
                # as long as the process: move it out of the collector's sight, so the
                # full collections of the steady state do not walk it (a 25-30 ms pause
                # of the whole broker every few seconds under L1, 1-2 ms after).
                gc.collect()
                gc.freeze()
                typer.echo(f"equeue broker listening on {host}:{bound} (data {data_dir}, flush {flush})", err=True)
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        typer.echo("stopping broker...", err=True)
                        broker.stop()
                        break

        try:
            trio.run(main)
        except OSError as exc:
            fail(f"cannot start the broker on {host}:{port}: {exc.strerror or exc}")

    @broker_app.command("stats")
    def stats(broker: str = BROKER_OPTION, as_json: bool = typer.Option(False, "--json")) -> None:
        """Show broker counters, rates and store size."""
        with client(broker) as c:
            s = c.stats()
        if as_json:
            print_json(s)
            return
        rows = [
            ("version", s.version), ("uptime", f"{s.uptime_s:.0f} s"), ("connections", s.connections),
            ("topics", s.topics), ("messages in", s.messages_in), ("messages out", s.messages_out),
            ("produce rate", f"{s.produce_rate:,.0f} msg/s"), ("pull rate", f"{s.pull_rate:,.0f} msg/s"),
            ("parked pulls", s.parked_pulls), ("next global offset", s.next_global_offset),
            ("pending delayed", s.pending_delayed), ("transactions", s.transactions),
            ("store size", f"{s.store_bytes / 2**20:,.1f} MiB of {s.map_size / 2**30:,.1f} GiB map"),
            ("flush", s.flush),
        ]  # fmt: skip
        table(f"broker {broker}", ["metric", "value"], rows)
