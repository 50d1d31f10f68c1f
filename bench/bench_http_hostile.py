"""Hostile HTTP clients against an HTTP port, and what a healthy broker client sees.

One broker in a child process (``--flush async``, ``--http-port``). A healthy TCP
client does produce-then-pull round trips (one small message each, ~2 ms apart)
for ``--seconds`` with no attack, then as long again while the HTTP port is under
every attack at once (:mod:`tests.hostile.http_attacks`):

- ``--idle`` (1,000) connections that send nothing, opened again as the server
  closes them (past ``--http-max-connections`` they are refused at once);
- ``--slowloris`` (20) connections each sending a request head one byte a second
  until the server closes it, then again;
- ``--floods`` (2) clients sending 64 KiB request heads back to back (431 each).

The attacks run in a process of their own (the healthy client's loop does only its
own work). It prints the healthy client's round trip (p50, p99, worst) in both
phases, and what each attack got. ``--http-target HOST:PORT`` attacks that HTTP port instead of
the broker's (e.g. a web console's), the healthy client staying on the broker;
``--console`` starts ``equeue console`` on the broker (its own process) and attacks it.

    .venv/bin/python bench/bench_http_hostile.py [--seconds 10] [--http-target HOST:PORT | --console]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from equeue import Message, wire
from equeue.broker.process import BrokerProcess
from equeue.client import AsyncClient
from tests.hostile.http_attacks import (
    http_status,
    idle_connections,
    oversized_headers,
    raise_fd_limit,
    slowloris,
)


def summary(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name}: none"
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return (f"{name}: n={len(xs)} p50 {statistics.median(xs) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
            f"worst {xs[-1] * 1000:.2f} ms")  # fmt: skip


async def healthy(address: str, seconds: float) -> list[float]:
    """Produce-then-pull round trips for ``seconds``: their latencies (s)."""
    rounds: list[float] = []
    entry = wire.encode_entry(Message(b"ping"))
    async with AsyncClient(address) as c:
        offset = (await c.pull(wire.PullRequest("ok", 0, 0))).max_offset
        with trio.move_on_after(seconds):
            while True:
                t0 = time.perf_counter()
                await c.produce(wire.ProduceRequest("ok", 0, [entry]))
                got = await c.pull(wire.PullRequest("ok", 0, offset))
                rounds.append(time.perf_counter() - t0)
                offset = got.next_offset
                await trio.sleep(0.002)  # a steady client, not a flood
    return rounds


@attrs.define
class Tally:
    """What the attacks got."""

    idle_opened: int = 0
    idle_refused: int = 0
    idle_closed: int = 0
    slow_closed: int = 0
    slow_refused: int = 0
    slow_given_up: int = 0
    flood_431: int = 0
    flood_503: int = 0
    flood_other: int = 0
    #: /healthz status (as text; "None": no answer) -> times
    healthz: dict[str, int] = attrs.field(factory=dict)
    errors: list[str] = attrs.field(factory=list)


async def attack(host: str, port: int, args: argparse.Namespace, tally: Tally) -> None:
    """Every attack at once until cancelled."""

    async def idle() -> None:
        while True:
            try:
                async with idle_connections(host, port, args.idle) as conns:
                    try:
                        await trio.sleep(4)  # the attacker's pace: hold them, then open them again
                    finally:
                        tally.idle_opened += conns.opened
                        tally.idle_refused += conns.refused
                        tally.idle_closed += conns.closed
            except OSError as exc:  # e.g. out of descriptors: count it and go on
                tally.errors.append(f"idle: {exc}")
                await trio.sleep(1)

    async def slow() -> None:
        while True:
            try:
                r = await slowloris(host, port, interval=1.0, give_up=20.0)
            except OSError as exc:
                tally.errors.append(f"slowloris: {exc}")
                await trio.sleep(1)
                continue
            if r.answer.startswith(b"HTTP/1.1 503"):
                tally.slow_refused += 1
            elif r.closed:
                tally.slow_closed += 1
            else:
                tally.slow_given_up += 1

    async def flood() -> None:
        while True:
            try:
                answer = await oversized_headers(host, port, 64 * 1024)
            except OSError as exc:
                tally.errors.append(f"flood: {exc}")
                await trio.sleep(0.1)
                continue
            if answer.startswith(b"HTTP/1.1 431"):
                tally.flood_431 += 1
            elif answer.startswith(b"HTTP/1.1 503"):
                tally.flood_503 += 1
            else:
                tally.flood_other += 1

    async def probe() -> None:  # a well-behaved HTTP client: what it gets, once a second
        while True:
            status = str(await http_status(host, port, "/healthz"))
            tally.healthz[status] = tally.healthz.get(status, 0) + 1
            await trio.sleep(1)

    async with trio.open_nursery() as n:
        n.start_soon(idle)
        for _ in range(args.slowloris):
            n.start_soon(slow)
        for _ in range(args.floods):
            n.start_soon(flood)
        n.start_soon(probe)


async def attack_for(host: str, port: int, args: argparse.Namespace) -> None:
    """The attacker process: every attack for ``args.seconds`` + 1, then the tally as
    JSON on stdout."""
    raise_fd_limit()
    tally = Tally()
    with trio.move_on_after(args.seconds + 1):
        await attack(host, port, args, tally)
    print(json.dumps(attrs.asdict(tally)), flush=True)


@contextmanager
def console(address: str) -> Iterator[str]:
    """``equeue console`` on the broker at ``address``, in a process of its own: its
    ``HOST:PORT``; stopped at the block's end."""
    cmd = [sys.executable, "-m", "equeue", "console", "--brokers", address, "--port", "0", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = urlsplit(json.loads(proc.stdout.readline())["url"])  # printed once the port is bound
        yield f"{url.hostname}:{url.port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def run(args: argparse.Namespace) -> None:
    print(f"RLIMIT_NOFILE soft limit {raise_fd_limit()}")
    broker_args = ["--flush", "async", "--http-port", "0", *args.broker_args.split()]
    with BrokerProcess(None, *broker_args) as b, console(b.address) if args.console else nullcontext("") as web:
        async with AsyncClient(b.address) as c:
            await c.create_topic("ok", 1)
        target = web or args.http_target or f"{b.host}:{b.http_port}"
        print(f"broker {b.address}, attacked HTTP port {target}")
        quiet = await healthy(b.address, args.seconds)
        print(" quiet:")
        print("  " + summary("healthy produce+pull round trip", quiet))
        # the attacker in a process of its own: its work is not on the healthy client's loop
        cmd = [sys.executable, __file__, "--attack", target, "--seconds", str(args.seconds),
               "--idle", str(args.idle), "--slowloris", str(args.slowloris), "--floods", str(args.floods)]  # fmt: skip
        attacker = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE)
        assert attacker.stdout is not None
        await trio.sleep(0.5)  # the idle connections are open before the measurement
        loud = await healthy(b.address, args.seconds)
        out = b""
        with trio.fail_after(30):
            while chunk := await attacker.stdout.receive_some(65536):
                out += chunk
            await attacker.wait()
        tally = Tally(**json.loads(out))
        print(f" under attack ({args.idle} idle, {args.slowloris} slowloris, {args.floods} oversized floods):")
        print("  " + summary("healthy produce+pull round trip", loud))
        print(f"  idle connections: {tally.idle_opened} opened, {tally.idle_refused} "
              f"refused (503), {tally.idle_closed} closed by the server")  # fmt: skip
        print(f"  slowloris: {tally.slow_closed} closed by the server's request limit, {tally.slow_refused} "
              f"refused at once (503: the port full), {tally.slow_given_up} given up on")  # fmt: skip
        print(f"  oversized heads: {tally.flood_431} answered 431, {tally.flood_503} refused (503: the port "
              f"full), {tally.flood_other} otherwise")  # fmt: skip
        print(f"  /healthz once a second: {dict(sorted(tally.healthz.items()))}")
        if tally.errors:
            print(f"  attack errors: {len(tally.errors)}, first: {tally.errors[0]}")
        print(f"  broker error lines: {len(b.error_lines)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections held open")
    ap.add_argument("--slowloris", type=int, default=20, help="slowloris connections at once")
    ap.add_argument("--floods", type=int, default=2, help="clients sending oversized heads back to back")
    ap.add_argument("--http-target", default="", help="HOST:PORT of the HTTP port to attack (default: the broker's)")
    ap.add_argument("--console", action="store_true", help="start a web console on the broker and attack it")
    ap.add_argument("--broker-args", default="", help="extra `broker start` flags, e.g. '--http-max-connections 64'")
    ap.add_argument("--attack", default="", help=argparse.SUPPRESS)  # HOST:PORT: be the attacker process
    args = ap.parse_args()
    if args.attack:
        host, _, port = args.attack.rpartition(":")
        trio.run(attack_for, host.strip("[]"), int(port), args)
    else:
        trio.run(run, args)


if __name__ == "__main__":
    main()
