"""The cost of TLS: P1, C1 and L1 against a plain broker and a TLS broker, alternating.

Each round starts a fresh broker process (``equeue broker start``, loopback) per
mode -- plain TCP, then TLS (a test CA from trustme; ``--mtls``: client certificates
required too) or the other way round on odd rounds -- and runs in this process:

- P1: ``--messages`` x 100-byte keyed messages, sync ``Producer.send_async`` + ``flush``
  into a 4-queue topic (as ``bench_produce.py --workloads P1 --front sync``);
- C1: a sync ``Consumer`` (fresh group, from the earliest offset) drains that backlog
  (as ``bench_consume.py --only c1s``);
- L1: one message at a time: ``AsyncProducer.send`` then wait until the
  long-polling ``AsyncConsumer``'s handler has it; the send-to-handler time, p50/p99.

With ``--auth`` a third mode runs too, TLS + SCRAM-SHA-256 authentication (a users
file, ``--users-file``): the workloads run as a non-admin user whose ACLs allow
produce/consume/describe on the two topics and join/commit on the two groups, so the
broker evaluates an ACL on every request (an admin user creates the topics).

The ratios mode / plain are printed per round and as medians over the rounds: compare
ratios from one run (a shared, loaded machine moves the absolute figures). The CPU
columns (broker process and this process, µs per message, P1 + C1) move far less
with the host's load than the rates: they are the cost of TLS itself.
The issue's bar: P1 with TLS >= 70 % of plain.

    .venv/bin/python bench/bench_tls.py [--rounds 3] [--messages 200000] [--l1 2000]
        [--flush sync|async] [--mtls] [--auth]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trustme  # noqa: E402

from equeue.acl import Acl, UsersFile  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.consumer import AsyncConsumer, Consumer  # noqa: E402
from equeue.models import Message  # noqa: E402
from equeue.producer import AsyncProducer, Producer  # noqa: E402
from equeue.security import ClientSecurity, Credentials, TlsSettings  # noqa: E402
from equeue.users import make_user, update_users_file  # noqa: E402

#: the modes, in the order of even rounds (odd rounds run them reversed)
MODES = ("plain", "tls", "tls+auth")
#: the workloads' user (ACLs only, not an admin) and the admin that creates the topics
BENCH_USER = Credentials("bench", "bench-password")
ADMIN_USER = Credentials("bench-admin", "admin-password")
FAST = dict(heartbeat_interval=0.5, rebalance_interval=0.5, commit_interval=1.0)


class Pki:
    """A throw-away CA, the broker's certificate (127.0.0.1) and a client's."""

    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        self.ca, self.server, self.client = root / "ca.pem", root / "server.pem", root / "client.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(self.server))
        ca.issue_cert("bench@example").private_key_and_cert_chain_pem.write_to_path(str(self.client))
        self.users = root / "users.json"


def write_users(path: Path) -> None:
    """The users file of the auth mode: an admin, and the bench user with exact-name
    ACLs on what the workloads touch (topics p1, l1; groups c1, l1)."""
    acls = [Acl("topic", t, ["produce", "consume", "describe"]) for t in ("p1", "l1")]
    acls += [Acl("group", g, ["join", "commit"]) for g in ("c1", "l1")]
    bench = make_user(BENCH_USER.username, BENCH_USER.password, acls=acls)
    admin = make_user(ADMIN_USER.username, ADMIN_USER.password, admin=True)
    update_users_file(path, lambda _: UsersFile().with_user(bench).with_user(admin))


def p1(addr: str, sec: ClientSecurity, n: int) -> float:
    body = b"x" * 100
    with Producer(addr, security=sec) as p:
        p.send("p1", b"warm-up", key="w")
        t0 = time.perf_counter()
        handles = [p.send_async("p1", body, key=f"k{i}") for i in range(n)]
        p.flush()
        for h in (handles[0], handles[-1]):
            h.result(0)
        return n / (time.perf_counter() - t0)


def c1(addr: str, sec: ClientSecurity, n: int) -> float:
    count = 0
    t0 = 0.0
    with Consumer(addr, "c1", "p1", start_from="earliest", security=sec, **FAST) as c:  # type: ignore[arg-type]

        def handler(m: Message) -> None:
            nonlocal count, t0
            if not count:
                t0 = time.perf_counter()
            count += 1
            if count == n:
                c.stop()

        c.run(handler)
    return (n - 1) / (time.perf_counter() - t0)


def l1(addr: str, sec: ClientSecurity, n: int) -> tuple[float, float]:
    """(p50, p99) in ms of send -> handler, one message in flight."""

    async def main() -> tuple[float, float]:
        lat: list[float] = []
        got = trio.Event()
        async with AsyncProducer(addr, security=sec) as p:
            await p.send("l1", b"create", key="k")
            async with AsyncConsumer(addr, "l1", "l1", start_from="latest", security=sec, **FAST) as c:  # type: ignore[arg-type]

                async def handler(m: Message) -> None:
                    got.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(c.run, handler)
                    # wait until the member holds every queue (a probe message comes back)
                    while not got.is_set():
                        await p.send("l1", b"probe", key="k")
                        with trio.move_on_after(0.5):
                            await got.wait()
                    await trio.sleep(0.5)
                    for i in range(n):
                        got = trio.Event()
                        t0 = time.perf_counter()
                        await p.send("l1", b"x" * 100, key=f"k{i}")
                        await got.wait()
                        lat.append((time.perf_counter() - t0) * 1e3)
                    nursery.cancel_scope.cancel()
        lat.sort()
        return lat[len(lat) // 2], lat[int(len(lat) * 0.99)]

    return trio.run(main)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mode(mode: str, args: argparse.Namespace, pki: Pki) -> dict[str, float]:
    flags = ["--flush", args.flush]
    sec = admin = ClientSecurity()
    if mode != "plain":
        flags += ["--tls-cert", str(pki.server)]
        if args.mtls:
            flags += ["--tls-ca", str(pki.ca), "--tls-client-auth", "required"]
        sec = admin = ClientSecurity(tls=TlsSettings(ca_file=pki.ca, cert_file=pki.client if args.mtls else None))
    if mode == "tls+auth":
        flags += ["--users-file", str(pki.users)]
        sec = ClientSecurity(tls=sec.tls, credentials=BENCH_USER)
        admin = ClientSecurity(tls=sec.tls, credentials=ADMIN_USER)
    broker = BrokerProcess(None, *flags).start()
    try:
        with Client(broker.address, security=admin) as c:
            c.create_topic("p1", 4)
            c.create_topic("l1", 4)
        out: dict[str, float] = {}
        per = 1e6 / args.messages
        for name, run in (("P1", p1), ("C1", c1)):
            if name not in args.workloads:
                continue
            b0, c0 = cpu_seconds(broker.pid), time.process_time()
            # C1 drains what P1 stored (with P1's warm-up message); alone, it fills first
            if name == "C1" and "P1" not in args.workloads:
                p1(broker.address, sec, args.messages)
                b0, c0 = cpu_seconds(broker.pid), time.process_time()
            out[name] = run(broker.address, sec, args.messages + (name == "C1"))
            out[f"{name} cpu broker"] = (cpu_seconds(broker.pid) - b0) * per
            out[f"{name} cpu client"] = (time.process_time() - c0) * per
        if "L1" in args.workloads:
            out["L1 p50"], out["L1 p99"] = l1(broker.address, sec, args.l1)
        return out
    finally:
        broker.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--l1", type=int, default=2000, help="L1 round trips per run")
    ap.add_argument("--flush", default="sync", choices=["sync", "async"])
    ap.add_argument("--mtls", action="store_true", help="TLS runs require client certificates")
    ap.add_argument("--auth", action="store_true",
                    help="a third mode: TLS + SCRAM authentication as a non-admin user with ACLs")  # fmt: skip
    ap.add_argument("--workloads", default="P1,C1,L1", help="a subset of P1,C1,L1")
    args = ap.parse_args()
    args.workloads = {w.strip().upper() for w in args.workloads.split(",")}
    modes = MODES if args.auth else MODES[:2]
    ratios: dict[str, dict[str, list[float]]] = {m: {} for m in modes[1:]}
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        pki = Pki(Path(tmp))
        if args.auth:
            write_users(pki.users)
        print("rates msg/s, latencies ms, CPU us per message (broker process / this process)")
        for r in range(args.rounds):
            got: dict[str, dict[str, float]] = {}
            for mode in modes if r % 2 == 0 else modes[::-1]:
                got[mode] = res = run_mode(mode, args, pki)
                print(
                    f"{r + 1:3} {mode:8} "
                    + "  ".join(f"{k} {v:,.0f}" if v >= 100 else f"{k} {v:.2f}" for k, v in res.items()),
                    flush=True,
                )
            for mode, rs in ratios.items():
                for k in got[mode]:
                    rs.setdefault(k, []).append(got[mode][k] / got["plain"][k])
                print(f"    {mode}/plain " + "  ".join(f"{k} {v[-1]:.2f}" for k, v in rs.items()), flush=True)
    for mode, rs in ratios.items():
        print(f"median {mode}/plain over {args.rounds} rounds: " + "  ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in rs.items()))
    print("(rates: higher is better, P1 >= 0.70 meets the bar; latency and CPU: lower is better)")


if __name__ == "__main__":
    main()
