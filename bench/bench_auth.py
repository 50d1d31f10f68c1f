"""What authentication and ACLs cost: two brokers (separate processes, ``--flush
async``), one plain, one with ``--users-file``; the same workloads against each,
alternating, several rounds.

- ``connect``: open a connection (Hello/HelloAck, plus SCRAM-SHA-256 on the
  secured broker: 4096 PBKDF2 rounds on the client) and answer one LIST_TOPICS;
  ``--connections`` sequential connections per round.
- ``produce``: pipelined 1-message ProduceRequests (64 in flight) on one
  connection: the hot path the ACL check sits on (``ProduceHandler.prepare``).
- ``control``: sequential QUEUE_OFFSETS requests: the dispatch path (the ACL check
  decodes the JSON payload a second time).

The secured client is a user with a prefix ACL (``bench*``), not an admin, so
every request is evaluated. Loopback figures on a shared machine are noisy, so the
script also times the check itself in-process (``check``: the produce hot path's
``Authorizer.check``, and the dispatch path's decode + check of a control request).

    .venv/bin/python bench/bench_auth.py [--rounds 3] [--connections 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue import Message, wire  # noqa: E402
from equeue.acl import Acl, UsersFile  # noqa: E402
from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import AsyncClient  # noqa: E402
from equeue.protocol import RequestCode  # noqa: E402
from equeue.security import ClientSecurity  # noqa: E402
from equeue.users import make_user, update_users_file  # noqa: E402

USER = ClientSecurity.from_values(username="bench", password="bench-password")


async def connect(addr: str, sec: ClientSecurity, n: int) -> float:
    """Mean seconds per connection (handshake + one request)."""
    t0 = time.perf_counter()
    for _ in range(n):
        async with AsyncClient(addr, security=sec) as c:
            await c.list_topics()
    return (time.perf_counter() - t0) / n


async def produce(addr: str, sec: ClientSecurity, n: int, inflight: int = 64) -> float:
    """Produce requests per second."""
    req = wire.ProduceRequest("bench", 0, [wire.encode_entry(Message(b"x" * 100))]).encode()
    async with AsyncClient(addr, security=sec) as c:
        await c.get_route("bench")
        sent = 0
        t0 = time.perf_counter()

        async def lane() -> None:
            nonlocal sent
            while sent < n:
                sent += 1
                await c.request(RequestCode.PRODUCE, req)

        async with trio.open_nursery() as nursery:
            for _ in range(inflight):
                nursery.start_soon(lane)
        return n / (time.perf_counter() - t0)


async def control(addr: str, sec: ClientSecurity, n: int) -> float:
    """Sequential control requests per second."""
    async with AsyncClient(addr, security=sec) as c:
        await c.get_route("bench")
        t0 = time.perf_counter()
        for _ in range(n):
            await c.queue_offsets("bench", 0)
        return n / (time.perf_counter() - t0)


def micro(n: int = 200_000) -> dict[str, float]:
    """Nanoseconds per ACL check, in-process (median of 5 runs)."""
    import timeit

    from equeue import control
    from equeue.acl import Permissions
    from equeue.broker.auth import Authorizer, UserStore

    store = UserStore(Path("unused"))
    user = make_user("bench", "pw", acls=[Acl("topic", "other", ["consume"]), Acl("topic", "bench*", ["produce"]),
                                         Acl("group", "g", ["join"])])  # fmt: skip
    store.users, store.permissions = {"bench": user}, {"bench": Permissions(user)}
    authz = Authorizer(store)
    produce_req = wire.ProduceRequest("bench", 0, [])
    payload = control.encode(control.QueueOffsets("bench", 0))
    out = {}
    for name, stmt in {
        "produce check": lambda: authz.check("bench", 10, produce_req),
        "control decode+check": lambda: authz.check("bench", 30, control.decode(payload, control.QueueOffsets)),
        "control decode alone (what auth off does once)": lambda: control.decode(payload, control.QueueOffsets),
    }.items():
        out[name] = statistics.median(timeit.repeat(stmt, number=n, repeat=5)) / n * 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--produces", type=int, default=30_000)
    ap.add_argument("--controls", type=int, default=5_000)
    ap.add_argument("--admin", action="store_true", help="the secured client is an admin (no ACL evaluated)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        users = Path(tmp) / "users.json"
        acls = [Acl("topic", "bench*", ["produce", "consume", "admin"])]
        user = make_user("bench", "bench-password", acls=acls, admin=a.admin)
        update_users_file(users, lambda _: UsersFile().with_user(user))
        plain = BrokerProcess(Path(tmp) / "plain", "--flush", "async").start()
        secured = BrokerProcess(Path(tmp) / "secured", "--flush", "async", "--users-file", str(users)).start()
        targets = {"plain": (plain.address, ClientSecurity()), "auth": (secured.address, USER)}
        results: dict[str, dict[str, list[float]]] = {k: {"connect": [], "produce": [], "control": []} for k in targets}
        try:
            for r in range(a.rounds):
                order = list(targets) if r % 2 == 0 else list(reversed(targets))
                for name in order:
                    addr, sec = targets[name]
                    res = results[name]
                    res["connect"].append(trio.run(connect, addr, sec, a.connections))
                    res["produce"].append(trio.run(produce, addr, sec, a.produces))
                    res["control"].append(trio.run(control, addr, sec, a.controls))
        finally:
            plain.stop()
            secured.stop()
    med = {k: {w: statistics.median(v) for w, v in res.items()} for k, res in results.items()}
    p, s = med["plain"], med["auth"]
    print(f"rounds {a.rounds} (medians), alternating plain/auth")
    print(f"connect+1 request: plain {p['connect'] * 1e3:.2f} ms, auth {s['connect'] * 1e3:.2f} ms "
          f"(+{(s['connect'] - p['connect']) * 1e3:.2f} ms per connection, {a.connections} connections/round)")
    print(f"produce (1 msg/request, 64 in flight): plain {p['produce']:,.0f} req/s, auth {s['produce']:,.0f} req/s "
          f"({s['produce'] / p['produce']:.1%} of plain)")
    print(f"control (QUEUE_OFFSETS, sequential): plain {p['control']:,.0f} req/s, auth {s['control']:,.0f} req/s "
          f"({s['control'] / p['control']:.1%} of plain)")
    for name, ns in micro().items():
        print(f"in-process {name}: {ns:,.0f} ns")
    for name, res in results.items():
        print(name, {w: [round(x, 5) if w == "connect" else round(x) for x in v] for w, v in res.items()})


if __name__ == "__main__":
    main()
