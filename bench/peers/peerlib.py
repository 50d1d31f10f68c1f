"""Helpers shared by the peer harness (``run.py``) and its adapters' worker processes.

Standard library only, so that ``run.py`` imports it before any client library is
installed. An adapter (``redis_peer.py``, ``nats_peer.py``, ``equeue_peer.py``) imports it
as ``import peerlib as C``: ``run.py`` puts this directory first on ``PYTHONPATH`` of
every worker.

Workers learn their run from the environment ``run.py`` sets for them:
``PEERBENCH_PORT`` (the server's free loopback port for this run), ``PEERBENCH_PYTHON``
(the worker interpreter), ``PEERBENCH_TMP`` (the data-dir root).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from typing import Any, TextIO

HERE = os.path.dirname(os.path.abspath(__file__))
HOST = "127.0.0.1"
NUM_QUEUES = 4

#: The fixed workloads (docs/benchmarks.md, "Side by side with Redis Streams and NATS JetStream").
WORKLOADS: dict[str, dict[str, Any]] = {
    "P1": {"kind": "produce", "n": 200_000, "size": 100, "batch": 100},
    "P2": {"kind": "produce", "n": 100_000, "size": 1024, "batch": 100},
    "P3": {"kind": "produce_sync", "n": 20_000, "size": 100},
    "C1": {"kind": "consume", "n": 200_000, "size": 100, "batch": 100, "members": 1},
    "C2": {"kind": "consume", "n": 200_000, "size": 100, "batch": 100, "members": 2},
    "L1": {"kind": "latency", "rate": 2000, "seconds": 10, "size": 100},
}


def scaled(name: str, scale: float) -> dict[str, Any]:
    """Workload ``name`` with its message count (L1: its seconds) multiplied by ``scale``.

    Counts stay multiples of the batch (100) and at least one batch; L1 runs at least
    one second at its fixed rate. ``scale`` 1 is the workload as documented.
    """
    w = dict(WORKLOADS[name])
    if scale == 1:
        return w
    if w["kind"] == "latency":
        w["seconds"] = max(1, round(w["seconds"] * scale))
    else:
        w["n"] = max(100, round(w["n"] * scale / 100) * 100)
    return w


# --------------------------------------------------------------------------- messages
def route_queue(i: int) -> int:
    """Key routing: message i has key ``key-<i>``, queue = crc32(key) % 4."""
    return zlib.crc32(b"key-%d" % i) % NUM_QUEUES


def make_messages(n: int, size: int, seed: int = 12345) -> tuple[list[bytes], list[int]]:
    """(payloads, queues): n random payloads of ``size`` bytes and each one's queue,
    generated before any clock starts."""
    rnd = random.Random(seed)
    buf = rnd.randbytes(n * size)
    return [buf[i * size : (i + 1) * size] for i in range(n)], [route_queue(i) for i in range(n)]


def queue_counts(n: int) -> list[int]:
    """Messages per queue among the first n keys."""
    c = [0] * NUM_QUEUES
    for i in range(n):
        c[route_queue(i)] += 1
    return c


#: L1 payloads start with the send time, ``time.time_ns()``, as 8 big-endian bytes.
TS = struct.Struct(">Q")


# --------------------------------------------------------------------------- statistics
def pct(sorted_vals: list[int], p: float) -> int | None:
    """Nearest-rank percentile of an already sorted list (p in 0..100)."""
    if not sorted_vals:
        return None
    k = round(p / 100.0 * len(sorted_vals) + 0.5) - 1
    return sorted_vals[max(0, min(len(sorted_vals) - 1, k))]


def lat_summary_ns(lat_ns: list[int]) -> dict[str, Any]:
    """count, p50/p99/p99.9/max/mean in ms of latencies given in ns."""
    s = sorted(lat_ns)

    def ms(v: float | None) -> float | None:
        return None if v is None else v / 1e6

    return {
        "count": len(s),
        "p50_ms": ms(pct(s, 50)),
        "p99_ms": ms(pct(s, 99)),
        "p999_ms": ms(pct(s, 99.9)),
        "max_ms": ms(s[-1] if s else None),
        "mean_ms": ms(sum(s) / len(s)) if s else None,
    }


# --------------------------------------------------------------------------- servers
def free_port() -> int:
    """A TCP port free on the loopback interface now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port() -> int:
    """This run's server port, from ``PEERBENCH_PORT`` (set by run.py for every worker)."""
    try:
        return int(os.environ["PEERBENCH_PORT"])
    except (KeyError, ValueError):
        raise SystemExit(
            "PEERBENCH_PORT is not set: workers are started by bench/peers/run.py"
        ) from None


def port_open(p: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, p), timeout=0.5):
            return True
    except OSError:
        return False


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server process the harness starts and stops, by its own PID only."""

    def __init__(self, name: str, argv: list[str], logpath: str, port: int) -> None:
        self.name, self.argv, self.logpath, self.port = name, argv, logpath, port
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout: float = 20.0) -> Server:
        """Start it and wait until its port accepts connections.

        Raises RuntimeError when the port is already open (never measure or stop a
        server we did not start), or when it does not listen within ``timeout``."""
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is already in use on {HOST}")
        self._log = open(self.logpath, "ab")  # closed by stop()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while not port_open(self.port):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not listen on {HOST}:{self.port} "
                                       f"(see {self.logpath})")  # fmt: skip
                time.sleep(0.05)
        except BaseException:  # not started, or interrupted: not left running
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu(self) -> float:
        return proc_cpu_seconds(self.pid)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, SIGKILL after ``timeout`` s; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None


# --------------------------------------------------------------------------- workers
def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a worker: this directory first on ``PYTHONPATH`` (``import
    peerlib``), plus ``extra`` (``PEERBENCH_PORT``, ...)."""
    env = dict(os.environ)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = HERE + (os.pathsep + pp if pp else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def spawn_worker(python: str, script: str, role: str, args: dict[str, Any],
                 env: dict[str, str]) -> subprocess.Popen[str]:  # fmt: skip
    """``<python> <script> worker <role> '<json args>'`` in its own process."""
    return subprocess.Popen([python, script, "worker", role, json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env)  # fmt: skip


def collect_worker(p: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    """The worker's result: the last stdout line starting with ``{``.

    Raises RuntimeError if it fails, times out (then it is killed) or prints no result."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise RuntimeError(f"worker timed out after {timeout}s\nstdout:{out[-2000:]}\n"
                           f"stderr:{err[-4000:]}") from None  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(
            f"worker failed rc={p.returncode}\nstdout:{out[-2000:]}\nstderr:{err[-4000:]}"
        )
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"worker printed no result\nstdout:{out[-2000:]}\nstderr:{err[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def emit(result: dict[str, Any], out: TextIO = sys.stdout) -> None:
    """A worker's result: one JSON line."""
    print(json.dumps(result), file=out, flush=True)


def wait_until(t_wall: float) -> None:
    """Sleep until the wall-clock time ``t_wall`` (a start barrier shared by processes)."""
    d = t_wall - time.time()
    if d > 0:
        time.sleep(d)


class Pacer:
    """L1's fixed rate: ``for i in pacer: send(i)`` yields 0..n-1, the i-th at
    ``start + i / rate``, paced by ``time.sleep`` (asyncio's timers wake on epoll's
    millisecond grid, so the NATS peer paces the same way), counting sends more than
    1 ms late. :meth:`result` is the L1 producer's report."""

    def __init__(self, n: int, rate: int) -> None:
        self.n, self.rate, self.late = n, rate, 0
        self.t0 = 0.0

    def __iter__(self) -> Any:
        self.t0 = time.time() + 0.05
        for i in range(self.n):
            d = self.t0 + i / self.rate - time.time()
            if d > 0:
                time.sleep(d)
            elif d < -0.001:
                self.late += 1
            yield i

    def result(self) -> dict[str, Any]:
        el = time.time() - self.t0
        return {"sent": self.n, "seconds": el, "achieved_rate": self.n / el, "late_gt_1ms": self.late}
