"""Redis Streams peer of the harness: server command line and client worker roles.

Model mapping: topic ``orders`` with 4 queues = 4 streams ``orders:0..3``; consumer
group ``g`` created on every stream (``XGROUP CREATE ... 0 MKSTREAM``); a member reads
with ``XREADGROUP COUNT 100`` and acknowledges with ``XACK``. Client: redis-py with
hiredis (``bench/peers/requirements.txt``); server: Debian's ``redis-server``.

Roles run as ``<python> redis_peer.py worker <role> '<json args>'`` (``run.py``), on
the port in ``PEERBENCH_PORT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib as C  # noqa: E402

GROUP = "g"
STREAMS = [f"orders:{q}" for q in range(C.NUM_QUEUES)]
Variant = dict[str, str]


# --------------------------------------------------------------------------- server side
def _fsync(variant: Variant) -> str:
    return variant.get("appendfsync", "everysec")


def server_settings(variant: Variant) -> dict[str, Any]:
    return {
        "bind": C.HOST, "port": "free port per run",
        "appendonly": "yes", "appendfsync": _fsync(variant),
        "save": '""  (RDB snapshots off; AOF is the persistence)',
        "aof-use-rdb-preamble": "yes (default)",
        "auto-aof-rewrite-percentage/min-size": "100 / 64mb (defaults)",
        "io-threads": "1 (default)",
    }  # fmt: skip


def make_server(variant: Variant, workdir: str, port: int) -> C.Server:
    argv = ["redis-server", "--bind", C.HOST, "--port", str(port), "--dir", workdir,
            "--appendonly", "yes", "--appendfsync", _fsync(variant), "--save", "",
            "--daemonize", "no", "--protected-mode", "no", "--logfile", ""]  # fmt: skip
    return C.Server("redis", argv, os.path.join(workdir, "server.log"), port)


def server_version() -> str:
    return subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.strip()


def client_versions() -> dict[str, Any]:
    import importlib.metadata as md

    import redis.utils

    v: dict[str, Any] = {"redis-py": md.version("redis")}
    try:
        v["hiredis"] = md.version("hiredis")
    except md.PackageNotFoundError:
        v["hiredis"] = "not installed"
    v["hiredis_in_use"] = bool(redis.utils.HIREDIS_AVAILABLE)
    return v


# --------------------------------------------------------------------------- roles
def _conn() -> Any:
    import redis

    r = redis.Redis(host=C.HOST, port=C.port(), socket_timeout=30)
    r.ping()
    return r


def _entries(res: Any) -> list[tuple[Any, list[Any]]]:
    """An XREADGROUP reply as ``[(stream, [(id, fields), ...]), ...]`` (RESP2 or RESP3)."""
    if not res:
        return []
    if isinstance(res, dict):
        return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in res.items()]
    return list(res)


def _count(counts: Any, q: int) -> int:
    return int(counts[str(q)] if isinstance(counts, dict) else counts[q])


def role_setup(a: dict[str, Any]) -> dict[str, Any]:
    r = _conn()
    for s in STREAMS:
        r.xgroup_create(s, GROUP, id="0", mkstream=True)
    return {"ok": True}


def role_produce(a: dict[str, Any]) -> dict[str, Any]:
    """P1/P2 and the C prefill: pipelines of ``batch`` XADDs, every reply awaited."""
    n, size, batch = a["n"], a["size"], a["batch"]
    payloads, queues = C.make_messages(n, size, a.get("seed", 1))
    streams = [STREAMS[q] for q in queues]
    r = _conn()
    acks = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for start in range(0, n, batch):
        p = r.pipeline(transaction=False)
        for i in range(start, min(start + batch, n)):
            p.xadd(streams[i], {b"d": payloads[i]})
        acks += len(p.execute())
    t1, c1 = time.perf_counter(), time.process_time()
    assert acks == n, (acks, n)
    el = t1 - t0
    return {"msgs": n, "acks": acks, "seconds": el, "msgs_per_s": n / el,
            "MB_per_s": n * size / el / 1e6, "client_cpu_s": c1 - c0}  # fmt: skip


def role_produce_sync(a: dict[str, Any]) -> dict[str, Any]:
    """P3: one XADD at a time, each reply awaited before the next send."""
    n, size = a["n"], a["size"]
    payloads, queues = C.make_messages(n, size, a.get("seed", 1))
    streams = [STREAMS[q] for q in queues]
    r = _conn()
    lat = [0] * n
    pc = time.perf_counter_ns
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        s = pc()
        r.xadd(streams[i], {b"d": payloads[i]})
        lat[i] = pc() - s
    t1, c1 = time.perf_counter(), time.process_time()
    el = t1 - t0
    out = {"msgs": n, "seconds": el, "msgs_per_s": n / el, "client_cpu_s": c1 - c0}
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


def role_consume(a: dict[str, Any]) -> dict[str, Any]:
    """C1/C2 member: round-robin over its queues; per batch one ``XREADGROUP COUNT<=100``
    on one stream with the previous batch's XACK pipelined in front of it (one round
    trip and one XACK per batch)."""
    queues, counts, batch, name = a["queues"], a["counts"], a["batch"], a["name"]
    r = _conn()
    remaining = {q: _count(counts, q) for q in queues}
    total = sum(remaining.values())
    got = nbytes = 0
    prev: tuple[str, list[Any]] | None = None
    C.wait_until(a["start_at"])
    c0, t0 = time.process_time(), time.time()
    active = [q for q in queues if remaining[q] > 0]
    while active:
        for q in list(active):
            s = STREAMS[q]
            p = r.pipeline(transaction=False)
            if prev:
                p.xack(prev[0], GROUP, *prev[1])
            p.xreadgroup(GROUP, name, {s: ">"}, count=min(batch, remaining[q]))
            res = p.execute()
            if prev:
                assert res[0] == len(prev[1]), (res[0], len(prev[1]))
            ids = []
            for _stream, items in _entries(res[-1]):
                for mid, fields in items:
                    nbytes += len(fields[b"d"])
                    ids.append(mid)
            if not ids:
                raise RuntimeError(f"queue {q} empty with {remaining[q]} expected")
            remaining[q] -= len(ids)
            got += len(ids)
            prev = (s, ids)
            if remaining[q] <= 0:
                active.remove(q)
    if prev:
        assert r.xack(prev[0], GROUP, *prev[1]) == len(prev[1])
    t1, c1 = time.time(), time.process_time()
    pend = sum(r.xpending(STREAMS[q], GROUP)["pending"] for q in queues)  # after the clock
    return {"msgs": got, "expected": total, "bytes": nbytes, "t_start": t0, "t_end": t1,
            "seconds": t1 - t0, "msgs_per_s": got / (t1 - t0), "client_cpu_s": c1 - c0,
            "pending_after": pend}  # fmt: skip


def role_l1_consume(a: dict[str, Any]) -> dict[str, Any]:
    """L1 consumer: ``XREADGROUP`` over all 4 streams, COUNT 100, BLOCK 1000 ms; receive
    time = ``time.time_ns()`` when the reply is in hand; XACK per returned batch."""
    expected, ready = a["expected"], a["ready_file"]
    r = _conn()
    streams = dict.fromkeys(STREAMS, ">")
    lat: list[int] = []
    unpack = C.TS.unpack_from
    deadline = time.time() + a["max_seconds"]
    open(ready, "w").close()
    polls = 0
    while len(lat) < expected and time.time() < deadline:
        res = r.xreadgroup(GROUP, "l1", streams, count=100, block=1000)
        now = time.time_ns()
        polls += 1
        ents = _entries(res)
        if not ents:
            continue
        p = r.pipeline(transaction=False)
        for s, items in ents:
            ids = []
            for mid, fields in items:
                lat.append(now - unpack(fields[b"d"])[0])
                ids.append(mid)
            if ids:
                p.xack(s, GROUP, *ids)
        p.execute()
    out = {"received": len(lat), "expected": expected, "polls": polls}
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


def role_l1_produce(a: dict[str, Any]) -> dict[str, Any]:
    """L1 producer: fixed rate paced by ``time.sleep``, one XADD per message (reply
    awaited); the payload starts with the 8-byte send time."""
    rate, seconds = a["rate"], a["seconds"]
    n = rate * seconds
    fillers, queues = C.make_messages(n, a["size"] - 8, a.get("seed", 7))
    streams = [STREAMS[q] for q in queues]
    r = _conn()
    pack = C.TS.pack
    pacer = C.Pacer(n, rate)
    for i in pacer:
        r.xadd(streams[i], {b"d": pack(time.time_ns()) + fillers[i]})
    return pacer.result()


def role_check(a: dict[str, Any]) -> dict[str, Any]:
    r = _conn()
    info = r.info("persistence")
    out = {"xlen": [r.xlen(s) for s in STREAMS],
           "aof_rewrites": info.get("aof_rewrites"),
           "aof_last_bgrewrite_status": info.get("aof_last_bgrewrite_status"),
           "used_memory_mb": r.info("memory")["used_memory"] / 1e6}  # fmt: skip
    out["pending"] = [r.xpending(s, GROUP)["pending"] for s in STREAMS]
    return out


ROLES = {k[5:]: v for k, v in list(globals().items()) if k.startswith("role_")}

if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        C.emit(ROLES[sys.argv[2]](json.loads(sys.argv[3])))
    else:
        print(__doc__)
