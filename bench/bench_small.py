"""Small-request workloads, side by side in one run.

Every server runs in its own process on a free loopback port and a fresh temporary
directory (``$TMPDIR``), and is stopped when its workload ends. Server CPU is the
server process's utime + stime (``/proc/PID/stat``, all its threads, 10 ms ticks)
over the measured phase, divided by the messages (or round trips). For echo, P3 and P1
the client runs in this process, and its CPU per message (``time.process_time``) is in
the notes: the client's share of a round trip.

- ``echo``: a bare trio TCP echo server (``receive_some``/``send_all``) in its own
  process; a bare trio client in this process sends one ~140-byte request at a time
  (``--p3-messages`` round trips): round trips/s, the Python floor P3 is compared with.
- ``P3``: ``AsyncProducer.send(topic, 100 B, key=f"key-{i}")``, each ack awaited, against
  a broker process (``--flush async``: ``--p3-messages``; ``--flush sync``: a tenth of
  it); topic with 4 queues. msg/s, p50/p99 latency, broker CPU µs/msg, ratio to echo.
- ``P1``: 200,000 x 100 B keyed messages, ``send_batch`` of 100 (about 25 per queue per
  request), one batch in flight: msg/s and broker CPU µs/msg (the target: broker CPU
  per message for 25-message requests <= 3 µs).
- ``concurrent``: ``--procs`` (4) producer processes, each 25,000 x 1 KiB keyed messages
  in batches of 100, one batch in flight each, released together (each worker connects,
  says ready, then sleeps until a start time the parent sends it); total msg/s = all
  messages / (last end - first start). Against equeue ``--flush async`` and ``sync``
  and Redis 7 with AOF ``everysec`` and ``always`` (the peer harness's settings:
  ``redis-server --appendonly yes --appendfsync X --save ""``; redis-py + hiredis; per
  batch a non-transactional pipeline of 100 XADD to ``orders:<crc32(key) % 4>``, replies
  awaited before the next batch, as in the harness's P1). Ratios equeue / Redis everysec.
- ``durable``: one durable LMDB commit: ``equeue.broker.storage.Store(dir, sync=True)`` in this
  process, ``--durable-commits`` single-message produce transactions, median ms; then the
  P3 sync floor 1 / (durable commit + echo round trip) and 50 % of it (the issue's P3
  sync target). The floor needs ``echo`` in the same run.

``--scale`` multiplies the P1 and concurrent counts; echo and P3 use ``--p3-messages``.
Children (broker, workers) import this tree (``PYTHONPATH`` is set to it). Redis rows
need ``redis-server`` on PATH and redis-py in the venv (``make bench-peers`` installs the
clients; ``apt-get install redis-server``); without them they are skipped. Prints a
markdown table, then one JSON line of the figures (also written to ``--json FILE``).

    .venv/bin/python bench/bench_small.py [--workloads echo,P3,P1,concurrent,durable]
        [--flush async,sync] [--redis everysec,always] [--scale 1.0]
        [--p3-messages 20000] [--procs 4] [--durable-commits 500] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(Path(__file__).resolve())
sys.path.insert(0, str(ROOT))
# the broker and the workers import this tree too (not another checkout installed -e)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
)

from equeue.broker.process import BrokerProcess  # noqa: E402
from equeue.client import Client  # noqa: E402
from equeue.models import Message  # noqa: E402
from equeue.producer import AsyncProducer  # noqa: E402

TOPIC = "orders"
NQ = 4
BATCH = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
WORKLOADS = ("echo", "P3", "P1", "concurrent", "durable")

Figures = dict[str, Any]


# ---------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pct_ms(lat_ns: list[int], p: float) -> float:
    s = sorted(lat_ns)
    return s[min(len(s) - 1, int(len(s) * p))] / 1e6


def make_payloads(n: int, size: int, seed: int) -> list[bytes]:
    """n random payloads (generated before any clock starts, as the peer harness does)."""
    buf = random.Random(seed).randbytes(n * size)
    return [buf[i * size : (i + 1) * size] for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(role: str, args: dict[str, Any]) -> subprocess.Popen[str]:
    """This script as a worker process (stdin/stdout pipes; stderr inherited)."""
    return subprocess.Popen(
        [sys.executable, SCRIPT, "worker", role, json.dumps(args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
    )  # fmt: skip


def read_line(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker {proc.pid} exited (rc={proc.wait()}) before {what}")
    return line.strip()


def end(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


#: extra ``equeue broker start`` arguments (``--broker-args``), e.g. ``--inline-commit 0``
BROKER_ARGS: list[str] = []


def start_broker(flush: str) -> BrokerProcess:
    b = BrokerProcess(None, "--flush", flush, *BROKER_ARGS)
    try:
        b.start()
        with Client(b.address) as c:
            c.create_topic(TOPIC, NQ)
    except BaseException:
        b.close()
        raise
    return b


def redis_missing() -> str | None:
    """Why the Redis rows cannot run here (None: they can)."""
    why = []
    if shutil.which("redis-server") is None:
        why.append("redis-server is not on PATH (apt-get install redis-server)")
    if importlib.util.find_spec("redis") is None:
        why.append(
            f"redis-py is not importable by {sys.executable} (`make bench-peers` installs it into "
            "the venv, or .venv/bin/pip install redis==8.1.0 hiredis==3.5.0)"
        )
    return "; ".join(why) or None


class RedisServer:
    """redis-server with the peer harness's settings, on a free port and a temp dir."""

    def __init__(self, fsync: str) -> None:
        self.fsync = fsync
        self.dir = tempfile.mkdtemp(prefix="equeue-bench-redis-")
        self.port = free_port()
        argv = [
            "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
            "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no",
            "--protected-mode", "no", "--logfile", os.path.join(self.dir, "server.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 15.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited (rc={self.proc.returncode}); log in {self.dir}"
                )
            try:
                r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
                r.ping()
                for q in range(NQ):  # the harness's setup: streams and group g
                    r.xgroup_create(f"{TOPIC}:{q}", "g", id="0", mkstream=True)
                r.close()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------- workers (child processes)
def worker_echo_server(a: dict[str, Any]) -> None:
    """Echo every byte back; print the port, serve until killed."""

    async def handler(stream: trio.SocketStream) -> None:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        print(listeners[0].socket.getsockname()[1], flush=True)
        await trio.serve_listeners(handler, listeners)

    trio.run(main)


def _await_start() -> float:
    """Tell the parent we are ready; return the start time (time.time()) it sends."""
    print("ready", flush=True)
    return float(sys.stdin.readline())


def worker_produce_equeue(a: dict[str, Any]) -> Figures:
    n, size, base = a["n"], a["size"], a["base"]
    payloads = make_payloads(n, size, a["index"] + 1)
    keys = [f"key-{base + i}" for i in range(n)]

    async def main() -> Figures:
        async with AsyncProducer(a["address"]) as p:
            await p.queue_count(TOPIC)  # route lookup before the clock (like a connect)
            start_at = await trio.to_thread.run_sync(_await_start)
            await trio.sleep(max(0.0, start_at - time.time()))
            c0, t0 = time.process_time(), time.time()
            acks = 0
            for s in range(0, n, BATCH):
                res = await p.send_batch(
                    TOPIC, [Message(payloads[i], key=keys[i]) for i in range(s, min(n, s + BATCH))]
                )
                acks += len(res)
            t1, c1 = time.time(), time.process_time()
        return {"msgs": n, "acks": acks, "t_start": t0, "t_end": t1, "client_cpu_s": c1 - c0}

    return trio.run(main)


def worker_produce_redis(a: dict[str, Any]) -> Figures:
    import redis

    n, size, base = a["n"], a["size"], a["base"]
    payloads = make_payloads(n, size, a["index"] + 1)
    streams = [f"{TOPIC}:{zlib.crc32(b'key-%d' % (base + i)) % NQ}" for i in range(n)]
    r = redis.Redis(host="127.0.0.1", port=a["port"], socket_timeout=60)
    r.ping()
    start_at = _await_start()
    time.sleep(max(0.0, start_at - time.time()))
    c0, t0 = time.process_time(), time.time()
    acks = 0
    for s in range(0, n, BATCH):
        pipe = r.pipeline(transaction=False)
        for i in range(s, min(n, s + BATCH)):
            pipe.xadd(streams[i], {b"d": payloads[i]})
        acks += len(pipe.execute())
    t1, c1 = time.time(), time.process_time()
    return {"msgs": n, "acks": acks, "t_start": t0, "t_end": t1, "client_cpu_s": c1 - c0}


WORKERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "echo-server": worker_echo_server,
    "produce-equeue": worker_produce_equeue,
    "produce-redis": worker_produce_redis,
}


# ---------------------------------------------------------------------- workloads
def run_echo(n: int, size: int) -> Figures:
    server = spawn("echo-server", {})
    try:
        port = int(read_line(server, "printing its port"))
        msg = b"x" * size
        lat = [0] * n
        pc = time.perf_counter_ns

        async def main() -> tuple[float, float, float]:
            async with await trio.open_tcp_stream("127.0.0.1", port) as s:

                async def once() -> None:
                    await s.send_all(msg)
                    got = 0
                    while got < size:
                        got += len(await s.receive_some(65536))

                for _ in range(100):  # warm-up
                    await once()
                cpu0, t0, own0 = cpu_seconds(server.pid), time.perf_counter(), time.process_time()
                for i in range(n):
                    st = pc()
                    await once()
                    lat[i] = pc() - st
                t1, own1 = time.perf_counter(), time.process_time()
                return t0, t1, cpu_seconds(server.pid) - cpu0, own1 - own0

        t0, t1, cpu, own = trio.run(main)
    finally:
        end([server])
    secs = t1 - t0
    return {"workload": "echo", "server": "trio echo server", "msgs": n, "bytes": size, "secs": secs,
            "rate": n / secs, "p50_ms": pct_ms(lat, 0.5), "p99_ms": pct_ms(lat, 0.99),
            "server_cpu_us": cpu / n * 1e6, "client_cpu_us": own / n * 1e6}  # fmt: skip


def run_p3(flush: str, n: int, size: int = 100) -> Figures:
    payloads = make_payloads(n, size, 1)
    keys = [f"key-{i}" for i in range(n)]
    lat = [0] * n
    pc = time.perf_counter_ns
    broker = start_broker(flush)
    try:

        async def main() -> tuple[float, float, float]:
            async with AsyncProducer(broker.address) as p:
                await p.queue_count(TOPIC)
                await p.send(TOPIC, b"warm-up", key="w")
                cpu0, t0, own0 = cpu_seconds(broker.pid), time.perf_counter(), time.process_time()
                for i in range(n):
                    st = pc()
                    await p.send(TOPIC, payloads[i], key=keys[i])
                    lat[i] = pc() - st
                t1, own1 = time.perf_counter(), time.process_time()
                return t0, t1, cpu_seconds(broker.pid) - cpu0, own1 - own0

        t0, t1, cpu, own = trio.run(main)
    finally:
        broker.close()
    secs = t1 - t0
    return {"workload": "P3", "server": f"equeue --flush {flush}", "flush": flush, "msgs": n, "bytes": size,
            "secs": secs, "rate": n / secs, "p50_ms": pct_ms(lat, 0.5), "p99_ms": pct_ms(lat, 0.99),
            "server_cpu_us": cpu / n * 1e6, "client_cpu_us": own / n * 1e6}  # fmt: skip


def run_p1(flush: str, n: int, size: int = 100) -> Figures:
    payloads = make_payloads(n, size, 1)
    keys = [f"key-{i}" for i in range(n)]
    broker = start_broker(flush)
    try:

        async def main() -> tuple[float, float, float, int]:
            async with AsyncProducer(broker.address) as p:
                await p.queue_count(TOPIC)
                await p.send(TOPIC, b"warm-up", key="w")
                acks = 0
                cpu0, t0, own0 = cpu_seconds(broker.pid), time.perf_counter(), time.process_time()
                for s in range(0, n, BATCH):
                    res = await p.send_batch(
                        TOPIC,
                        [Message(payloads[i], key=keys[i]) for i in range(s, min(n, s + BATCH))],
                    )
                    acks += len(res)
                t1, own1 = time.perf_counter(), time.process_time()
                return t0, t1, cpu_seconds(broker.pid) - cpu0, acks, own1 - own0

        txns = transactions(broker)
        t0, t1, cpu, acks, own = trio.run(main)
        txns = transactions(broker) - txns
    finally:
        broker.close()
    assert acks == n, (acks, n)
    secs = t1 - t0
    return {"workload": "P1", "server": f"equeue --flush {flush}", "flush": flush, "msgs": n, "bytes": size,
            "secs": secs, "rate": n / secs, "server_cpu_us": cpu / n * 1e6,
            "client_cpu_us": own / n * 1e6, "txns_per_100": txns / n * 100}  # fmt: skip


def _race(
    role: str, common: dict[str, Any], procs: int, n: int, server_pid: int
) -> tuple[list[Figures], float]:
    """Start ``procs`` workers, release them together once all are ready; their
    results and the server's CPU seconds from the release to the last result."""
    workers: list[subprocess.Popen[str]] = []
    try:
        for k in range(procs):
            workers.append(spawn(role, {**common, "n": n, "index": k, "base": k * n}))
        for w in workers:
            if read_line(w, "saying ready") != "ready":
                raise RuntimeError(f"worker {w.pid}: unexpected first line")
        cpu0 = cpu_seconds(server_pid)
        start_at = time.time() + 0.2
        for w in workers:
            assert w.stdin is not None
            w.stdin.write(f"{start_at!r}\n")
            w.stdin.flush()
        results = [json.loads(read_line(w, "reporting")) for w in workers]
        cpu = cpu_seconds(server_pid) - cpu0
        for w in workers:
            if w.wait(30) != 0:
                raise RuntimeError(f"worker {w.pid} exited with {w.returncode}")
        return results, cpu
    finally:
        end(workers)


def _concurrent_figures(
    server: str, results: list[Figures], cpu: float, size: int, **extra: Any
) -> Figures:
    total = sum(r["msgs"] for r in results)
    assert sum(r["acks"] for r in results) == total, results
    secs = max(r["t_end"] for r in results) - min(r["t_start"] for r in results)
    start_skew = max(r["t_start"] for r in results) - min(r["t_start"] for r in results)
    return {"workload": "concurrent", "server": server, "msgs": total, "bytes": size, "procs": len(results),
            "secs": secs, "rate": total / secs, "server_cpu_us": cpu / total * 1e6,
            "per_proc_rate": [r["msgs"] / (r["t_end"] - r["t_start"]) for r in results],
            "start_skew_ms": start_skew * 1e3, **extra}  # fmt: skip


def transactions(broker: BrokerProcess) -> int:
    """The broker's write transactions so far (its STATS answer)."""
    with Client(broker.address) as c:
        return int(c.stats().transactions)


def run_concurrent_equeue(flush: str, procs: int, n: int, size: int = 1024) -> Figures:
    broker = start_broker(flush)
    try:
        txns = transactions(broker)
        results, cpu = _race(
            "produce-equeue", {"address": broker.address, "size": size}, procs, n, broker.pid
        )
        txns = transactions(broker) - txns
    finally:
        broker.close()
    return _concurrent_figures(
        f"equeue --flush {flush}", results, cpu, size, flush=flush, txns_per_100=txns / (procs * n) * 100
    )


def run_concurrent_redis(fsync: str, procs: int, n: int, size: int = 1024) -> Figures:
    import redis.utils

    srv = RedisServer(fsync)
    try:
        srv.wait_ready()
        results, cpu = _race("produce-redis", {"port": srv.port, "size": size}, procs, n, srv.pid)
    finally:
        srv.close()
    hiredis = bool(redis.utils.HIREDIS_AVAILABLE)
    return _concurrent_figures(f"redis AOF {fsync}", results, cpu, size, flush=f"appendfsync {fsync}",
                               hiredis=hiredis)  # fmt: skip


def run_durable(n: int, size: int = 100) -> Figures:
    from equeue.broker.storage import CreateTopicOp, ProduceOp, Store
    from equeue.wire.entries import pack_entry

    tmp = tempfile.mkdtemp(prefix="equeue-bench-durable-")
    try:
        store = Store(tmp, sync=True)
        try:
            store.write([CreateTopicOp("t", NQ)])
            info = store.view.topics["t"]
            payloads = make_payloads(n, size, 1)
            times: list[int] = []
            pc = time.perf_counter_ns
            for i in range(n):
                key = b"key-%d" % i
                op = ProduceOp(
                    info,
                    zlib.crc32(key) % NQ,
                    [pack_entry(payloads[i], key=key)],
                    None,
                    0,
                    4 << 20,
                    10**9,
                )
                st = pc()
                store.write([op])
                times.append(pc() - st)
        finally:
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"workload": "durable", "server": "LMDB Store(sync=True), in process", "flush": "sync", "msgs": n,
            "bytes": size, "secs": sum(times) / 1e9, "rate": n / (sum(times) / 1e9),
            "p50_ms": pct_ms(times, 0.5), "p99_ms": pct_ms(times, 0.99),
            "median_ms": statistics.median(times) / 1e6}  # fmt: skip


# ---------------------------------------------------------------------- report
def fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def cpu_cell(r: Figures) -> str:
    """Server CPU µs/msg, with its resolution when the run was too short for it."""
    cpu, tick = r.get("server_cpu_us"), r.get("server_cpu_tick_us", 0.0)
    if cpu is None:
        return ""
    return f"{cpu:.1f}" + (f" ± {tick:.1f}" if tick > 0.05 * max(cpu, tick) else "")


def _txns(r: Figures) -> str:
    """The broker's write transactions per 100 messages (group commit at work)."""
    t = r.get("txns_per_100")
    return "" if t is None else f"{t:.2f} transactions per 100 msgs"


def _client(r: Figures) -> str:
    """This process's CPU per message (the client side of echo, P3 and P1)."""
    c = r.get("client_cpu_us")
    return "" if c is None else f"client CPU {c:.1f} µs/msg"


def table(rows: list[Figures]) -> str:
    head = ["workload", "server (flush)", "msgs", "secs", "msg/s", "MB/s", "p50 ms", "p99 ms",
            "server CPU µs/msg", "ratio", "notes"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mb = r["rate"] * r["bytes"] / 1e6 if r.get("bytes") and r.get("rate") else None
        cells = [
            r["workload"], r["server"], fmt(r.get("msgs"), ","), fmt(r.get("secs"), ".2f"),
            fmt(r.get("rate"), ",.0f"), fmt(mb, ".1f"), fmt(r.get("p50_ms"), ".3f"), fmt(r.get("p99_ms"), ".3f"),
            cpu_cell(r), r.get("ratio", ""),
            "; ".join(x for x in (r.get("note", ""), _txns(r), _client(r)) if x),
        ]  # fmt: skip
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated, of " + ",".join(WORKLOADS),
    )
    ap.add_argument(
        "--flush", default="async,sync", help="equeue flush modes for P3, P1, concurrent"
    )
    ap.add_argument(
        "--redis",
        default="everysec,always",
        help="Redis appendfsync modes for concurrent ('' = none)",
    )
    ap.add_argument(
        "--scale", type=float, default=1.0, help="multiply the P1 and concurrent counts"
    )
    ap.add_argument(
        "--p3-messages",
        type=int,
        default=20_000,
        help="echo round trips and P3 async sends (sync: /10)",
    )
    ap.add_argument(
        "--echo-bytes", type=int, default=140, help="echo request size (about a P3 request)"
    )
    ap.add_argument("--procs", type=int, default=4, help="producer processes in concurrent")
    ap.add_argument("--durable-commits", type=int, default=500)
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    ap.add_argument(
        "--broker-args", default="", help="extra 'equeue broker start' arguments, e.g. '--inline-commit 0'"
    )
    args = ap.parse_args()
    BROKER_ARGS.extend(shlex.split(args.broker_args))
    known = {w.lower(): w for w in WORKLOADS}
    try:
        work = [known[w.strip().lower()] for w in args.workloads.split(",") if w.strip()]
    except KeyError as exc:
        ap.error(f"unknown workload {exc.args[0]!r}; choose from {','.join(WORKLOADS)}")
    flushes = [f for f in args.flush.split(",") if f]
    if any(f not in ("sync", "async") for f in flushes):
        ap.error("--flush takes sync and/or async")
    fsyncs = [f for f in args.redis.split(",") if f]
    if any(f not in ("everysec", "always", "no") for f in fsyncs):
        ap.error("--redis takes everysec, always and/or no")

    rows: list[Figures] = []
    figs: dict[str, Figures] = {}
    notes: list[str] = []

    def add(name: str, r: Figures) -> Figures:
        figs[name] = r
        rows.append(r)
        if "server_cpu_us" in r:  # one clock tick (10 ms) per message: the figure's resolution
            r["server_cpu_tick_us"] = 1e6 / CLK_TCK / r["msgs"]
        log(
            f"# {name}: {r['rate']:,.0f}/s"
            + (f", server CPU {r['server_cpu_us']:.1f} µs/msg" if "server_cpu_us" in r else "")
        )
        return r

    load0 = os.getloadavg()
    if "echo" in work:
        add("echo", run_echo(args.p3_messages, args.echo_bytes))
    echo = figs.get("echo")
    if "P3" in work:
        for flush in flushes:
            n = args.p3_messages if flush == "async" else max(1, args.p3_messages // 10)
            r = add(f"P3 {flush}", run_p3(flush, n))
            if echo:
                r["vs_echo"] = r["rate"] / echo["rate"]
                r["ratio"] = f"{r['vs_echo']:.2f} x echo"
    if "P1" in work:
        for flush in flushes:
            r = add(f"P1 {flush}", run_p1(flush, max(BATCH, int(200_000 * args.scale))))
            r["note"] = "send_batch 100 (~25/queue)"
    if "concurrent" in work:
        n = max(BATCH, int(25_000 * args.scale))
        for flush in flushes:
            add(f"concurrent equeue {flush}", run_concurrent_equeue(flush, args.procs, n))
        missing = redis_missing() if fsyncs else None
        if missing:
            msg = f"Redis rows skipped: {missing}"
            log(msg)
            notes.append(msg)
        else:
            for fsync in fsyncs:
                r = add(f"concurrent redis {fsync}", run_concurrent_redis(fsync, args.procs, n))
                if not r["hiredis"]:
                    r["note"] = "hiredis NOT installed (pure-Python parser)"
        ref = figs.get("concurrent redis everysec")
        for flush in flushes:
            r = figs[f"concurrent equeue {flush}"]
            if ref:
                r["vs_redis_everysec"] = r["rate"] / ref["rate"]
                r["ratio"] = f"{r['vs_redis_everysec']:.2f} x redis everysec"
        for fsync in fsyncs:
            r2 = figs.get(f"concurrent redis {fsync}")
            if r2 and ref and r2 is not ref:
                r2["ratio"] = f"{r2['rate'] / ref['rate']:.2f} x redis everysec"
    if "durable" in work:
        d = add("durable", run_durable(args.durable_commits))
        d["note"] = "one single-message produce txn, fsynced"
        if echo:
            rtt_s = 1 / echo["rate"]
            floor = 1 / (d["median_ms"] / 1e3 + rtt_s)
            d["p3_sync_floor"] = floor
            d["p3_sync_target"] = floor / 2
            rows.append({"workload": "P3 sync floor", "server": "1 / (durable median + echo round trip)",
                         "rate": floor, "note": f"{d['median_ms']:.3f} ms + {rtt_s * 1e3:.3f} ms"})  # fmt: skip
            target: Figures = {
                "workload": "P3 sync target",
                "server": "50 % of the floor",
                "rate": floor / 2,
            }
            p3s = figs.get("P3 sync")
            if p3s:
                p3s["vs_floor"] = p3s["rate"] / floor
                target["ratio"] = f"P3 sync = {p3s['vs_floor']:.0%} of floor"
            rows.append(target)
        else:
            notes.append("P3 sync floor needs the echo workload in the same run")

    figs["meta"] = {
        "scale": args.scale, "p3_messages": args.p3_messages, "procs": args.procs, "cpus": os.cpu_count(),
        "loadavg_before": load0, "loadavg_after": os.getloadavg(), "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "notes": notes,
    }  # fmt: skip
    print(table(rows))
    for n_ in notes:
        print(f"\n{n_}")
    line = json.dumps(figs)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


def worker_main(role: str, raw: str) -> None:
    out = WORKERS[role](json.loads(raw))
    if out is not None:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker_main(sys.argv[2], sys.argv[3])
    else:
        main()
