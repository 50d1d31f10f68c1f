"""The peer harness: the fixed workloads against Redis Streams, NATS JetStream and equeue.

``make bench-peers`` installs what is missing (``redis-server`` and ``nats-server`` from
Debian, the Python clients pinned in ``bench/peers/requirements.txt`` into the venv),
runs this script, then ``render_docs.py``. Every column of the table in
docs/benchmarks.md ("Side by side with Redis Streams and NATS JetStream") is one entry
of :data:`PLAN`; ``equeue-rss`` is the broker-memory step under the table.

Each (column, workload, rep) gets a fresh server on a free loopback port and an empty
data dir (deleted afterwards); each client role runs in its own Python process
(``<adapter>.py worker <role> '<json>'``); the server is stopped by its PID (SIGTERM,
SIGKILL after 20 s). Reps are interleaved within a column (rep 1 of every workload,
then rep 2, ...).

    .venv/bin/python bench/peers/run.py [--reps 3] [--quick | --scale 0.05]
        [--only redis-everysec,equeue-sync,...] [--workloads P1,C1] [--out peerbench-results]
    .venv/bin/python bench/peers/run.py --list      # the plan, nothing run

An adapter (``redis_peer.py``, ``nats_peer.py``, ``equeue_peer.py``; :data:`ADAPTERS`)
has ``server_settings(variant) -> dict`` (shown in the report, including what an ack
means), ``make_server(variant, workdir, port) -> peerlib.Server`` (not started),
``server_version()``, ``client_versions()``, and worker roles ``setup``, ``produce``,
``produce_sync``, ``consume``, ``l1_consume``, ``l1_produce``, ``check``: each gets its
args (and the column's ``variant``) as JSON, finds the server at ``PEERBENCH_PORT`` and
prints one JSON line (``peerlib.emit``); see ``redis_peer.py`` for each role's shape.

Results: ``<out>/raw/<column>.jsonl`` (one JSON line per run), ``raw/settings.jsonl``,
``raw/versions.json``, ``raw/plan.json`` (what was asked: scale, reps, columns,
workloads), ``raw/equeue-rss.json``. An existing ``raw/`` is moved to ``archive/`` first.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peerlib as C  # noqa: E402

ALL = ("P1", "P2", "P3", "C1", "C2", "L1")
ADAPTERS = {"redis": "redis_peer", "nats": "nats_peer", "equeue": "equeue_peer"}
#: the servers each system needs on PATH (Debian packages of the same names)
SERVERS = {"redis": "redis-server", "nats": "nats-server"}
#: the Python modules each system's workers import (bench/peers/requirements.txt)
CLIENTS = {"redis": ("redis", "hiredis"), "nats": ("nats",)}
RSS_TAG = "equeue-rss"
RSS_MESSAGES = 1_000_000
QUICK_SCALE = 0.05


@dataclass(frozen=True)
class Column:
    """One column of the table: a system with settings (``variant``) over workloads."""

    tag: str
    system: str
    variant: dict[str, str] = field(default_factory=dict)
    workloads: tuple[str, ...] = ALL
    label: str | None = None


PLAN: list[Column] = [
    Column("redis-everysec", "redis", {"appendfsync": "everysec"}),
    Column("redis-always", "redis", {"appendfsync": "always"}),
    Column("nats", "nats", {"pub_mode": "gather", "consumer_mode": "perqueue"}),
    Column("nats-pubasync", "nats", {"pub_mode": "async"}, ("P1", "P2")),
    Column("nats-shared", "nats", {"consumer_mode": "shared"}, ("C1", "C2")),
    Column("equeue-sync", "equeue", {"flush": "sync"}, label="equeue, flush sync"),
    Column("equeue-async", "equeue", {"flush": "async"}, label="equeue, flush async"),
    Column("equeue-stream", "equeue", {"flush": "sync", "pub_mode": "async"}, ("P1", "P2"),
           label="equeue, flush sync, streaming send_async"),
]  # fmt: skip
TAGS = [c.tag for c in PLAN] + [RSS_TAG]


def select(only: list[str] | None, workloads: list[str] | None) -> list[Column]:
    """The plan's columns named in ``only`` (all if None), each cut to ``workloads``
    (all if None); columns left with no workload are dropped.

    Raises ValueError for a name that is not a column or a workload."""
    bad = sorted(set(only or []) - set(TAGS))
    if bad:
        raise ValueError(f"unknown column {', '.join(bad)}; known: {', '.join(TAGS)}")
    badw = sorted(set(workloads or []) - set(ALL))
    if badw:
        raise ValueError(f"unknown workload {', '.join(badw)}; known: {', '.join(ALL)}")
    out = []
    for c in PLAN:
        if only is not None and c.tag not in only:
            continue
        ws = tuple(w for w in c.workloads if workloads is None or w in workloads)
        if ws:
            out.append(Column(c.tag, c.system, c.variant, ws, c.label))
    return out


def size(w: dict[str, Any]) -> str:
    """A workload's size, as ``--list`` shows it."""
    return f"{w['seconds']} s at {w['rate']}/s" if w["kind"] == "latency" else f"{w['n']:,}"


def missing_prerequisites(systems: set[str]) -> list[str]:
    """Servers not on PATH and client modules not importable, for ``systems``."""
    missing = [SERVERS[s] for s in sorted(systems) if s in SERVERS and not shutil.which(SERVERS[s])]
    for s in sorted(systems):
        for mod in CLIENTS.get(s, ()):
            if importlib.util.find_spec(mod) is None:
                missing.append(f"Python module {mod}")
    return missing


# --------------------------------------------------------------------------- one run
class Harness:
    """Runs columns against fresh servers; raw records go to ``out/raw``."""

    def __init__(self, out: Path, tmp: Path, scale: float) -> None:
        self.raw = out / "raw"
        self.tmp = tmp
        self.scale = scale

    def append(self, name: str, record: dict[str, Any]) -> None:
        with open(self.raw / name, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def column(self, col: Column, reps: int) -> None:
        peer = importlib.import_module(ADAPTERS[col.system])
        label = col.label or getattr(peer, "LABEL", None)
        self.append("settings.jsonl", {
            "tag": col.tag, "system": col.system, "variant": col.variant, "label": label,
            "settings": peer.server_settings(col.variant), "script": peer.__file__,
            "versions": {"server": peer.server_version(), "clients": peer.client_versions()},
        })  # fmt: skip
        print(
            f"[{col.tag}] {col.system} {col.variant} {','.join(col.workloads)} x{reps}", flush=True
        )
        for rep in range(1, reps + 1):
            for w in col.workloads:
                self.run_one(peer, col, w, rep)

    def run_one(self, peer: ModuleType, col: Column, wname: str, rep: int) -> dict[str, Any]:
        """One workload against a fresh server; the record (or its error) is appended
        to ``raw/<tag>.jsonl`` and returned."""
        w = C.scaled(wname, self.scale)
        kind = w["kind"]
        variant = col.variant
        script = str(peer.__file__)
        workdir = self.tmp / f"{col.tag}-{wname}-{rep}"
        workdir.mkdir(parents=True)
        port = C.free_port()
        env = C.worker_env({"PEERBENCH_PORT": str(port), "PEERBENCH_TMP": str(self.tmp),
                            "PEERBENCH_PYTHON": sys.executable})  # fmt: skip
        rec: dict[str, Any] = {"system": col.system, "tag": col.tag, "variant": variant,
                               "workload": wname, "params": w, "rep": rep, "port": port,
                               "when": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
        srv = None
        spawned: list[Any] = []

        def spawn(role: str, args: dict[str, Any]) -> Any:
            p = C.spawn_worker(sys.executable, script, role, {**args, "variant": variant}, env)
            spawned.append(p)
            return p

        def call(role: str, args: dict[str, Any]) -> dict[str, Any]:
            return C.collect_worker(spawn(role, args))

        try:
            srv = peer.make_server(variant, str(workdir), port).start()
            rec["server_pid"] = srv.pid
            cmode = None
            if kind == "consume":
                cmode = variant.get("consumer_mode", "perqueue")
            elif kind == "latency":
                cmode = "l1"
            call("setup", {"consumer_mode": cmode})
            if kind == "consume":
                t = time.time()
                pre = call("produce", {"n": w["n"], "size": w["size"], "batch": 100,
                                       "pub_mode": "async", "seed": 1})  # fmt: skip
                rec["prefill"] = {"msgs_per_s": pre["msgs_per_s"], "wall_s": time.time() - t}
                time.sleep(1.0)  # let the server settle after the backlog write
            cpu0 = srv.cpu()
            if kind == "produce":
                res = call("produce", {"n": w["n"], "size": w["size"], "batch": w["batch"],
                                       "pub_mode": variant.get("pub_mode", "gather"), "seed": 1})  # fmt: skip
                wall = res["seconds"]
            elif kind == "produce_sync":
                res = call("produce_sync", {"n": w["n"], "size": w["size"], "seed": 1})
                wall = res["seconds"]
            elif kind == "consume":
                counts = C.queue_counts(w["n"])
                groups = [[0, 1, 2, 3]] if w["members"] == 1 else [[0, 1], [2, 3]]
                start_at = time.time() + 2.0
                procs = [spawn("consume", {"queues": g, "counts": counts, "batch": w["batch"],
                                           "name": f"m{i}", "start_at": start_at,
                                           "consumer_mode": cmode, "members": len(groups),
                                           "barrier_dir": str(workdir)})
                         for i, g in enumerate(groups)]  # fmt: skip
                members = [C.collect_worker(p) for p in procs]
                t0 = min(m["t_start"] for m in members)
                t1 = max(m["t_end"] for m in members)
                total = sum(m["msgs"] for m in members)
                wall = t1 - t0
                res = {"msgs": total, "seconds": wall, "msgs_per_s": total / wall,
                       "MB_per_s": total * w["size"] / wall / 1e6,
                       "client_cpu_s": sum(m["client_cpu_s"] for m in members), "members": members}  # fmt: skip
                if total != w["n"]:
                    raise RuntimeError(f"consumed {total} != {w['n']}")
            elif kind == "latency":
                n = w["rate"] * w["seconds"]
                ready = workdir / "consumer.ready"
                cons = spawn("l1_consume", {"expected": n, "ready_file": str(ready),
                                            "max_seconds": w["seconds"] + 20,
                                            "fetch_batch": int(variant.get("fetch_batch", 100))})  # fmt: skip
                deadline = time.time() + 30
                while not ready.exists():
                    if time.time() > deadline or cons.poll() is not None:
                        raise RuntimeError("L1 consumer did not become ready")
                    time.sleep(0.05)
                time.sleep(0.5)
                prod = spawn("l1_produce", {"rate": w["rate"], "seconds": w["seconds"],
                                            "size": w["size"], "seed": 7})  # fmt: skip
                pres = C.collect_worker(prod)
                res = dict(C.collect_worker(cons))
                res["producer"] = pres
                wall = pres["seconds"]
            else:
                raise ValueError(kind)
            cpu1 = srv.cpu()
            rec["result"] = res
            rec["server_cpu_s"] = cpu1 - cpu0
            rec["server_cpu_util"] = (cpu1 - cpu0) / wall if wall else None
            rec["check"] = call("check", {})
        except Exception as e:  # recorded, listed by the report; the next run goes on
            rec["error"] = repr(e)[:4000]
        finally:
            for p in spawned:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            if srv is not None:
                srv.stop()
            du = subprocess.run(
                ["du", "-sm", str(workdir)], capture_output=True, text=True
            ).stdout.split()
            if du:
                rec["disk_mb"] = int(du[0])
            shutil.rmtree(workdir, ignore_errors=True)
        self.append(f"{col.tag}.jsonl", rec)
        r = rec.get("result", {})
        summ = {k: round(r[k], 3) for k in ("msgs_per_s", "MB_per_s", "lat_p50_ms", "lat_p99_ms")
                if r.get(k) is not None}  # fmt: skip
        print(
            f"[{col.tag}] {wname} rep{rep}: {json.dumps(summ) if summ else rec.get('error')}",
            flush=True,
        )
        return rec

    def rss(self) -> None:
        """The broker-memory step: ``equeue_peer.py rss`` into ``raw/equeue-rss.json``."""
        n = max(10_000, round(RSS_MESSAGES * self.scale))
        print(f"[{RSS_TAG}] {n:,} messages through a fresh broker", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / "equeue_peer.py"), "rss", "--messages",
                              str(n), "--flush", "sync", "--out", str(self.raw / "equeue-rss.json")],
                             env=C.worker_env())  # fmt: skip
        if rc:
            self.append("errors.jsonl", {"tag": RSS_TAG, "error": f"exit {rc}"})


# --------------------------------------------------------------------------- machine
def disk_probe(tmp: Path, n: int = 200) -> dict[str, Any]:
    """fdatasync latency of a 4 KiB append in the data-dir root (context for fsync rows)."""
    path = tmp / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    lat = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 4096)
            t = time.perf_counter_ns()
            os.fdatasync(fd)
            lat.append(time.perf_counter_ns() - t)
    finally:
        os.close(fd)
        path.unlink()
    s = C.lat_summary_ns(lat)
    return {"appends": n, "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "max_ms": s["max_ms"]}


def versions(tmp: Path, systems: set[str]) -> dict[str, Any]:
    """The machine, the disk and the peers' versions, for the report's header."""
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "python": platform.python_version(), "kernel": platform.release(),
                           "nproc": os.cpu_count()}  # fmt: skip
    try:
        cpu = [line for line in open("/proc/cpuinfo") if line.startswith("model name")]
        out["cpu"] = cpu[0].split(":", 1)[1].strip() if cpu else "?"
        with open("/proc/meminfo") as f:
            out["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        out["os"] = next(line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                         if line.startswith("PRETTY_NAME"))  # fmt: skip
    except (OSError, StopIteration):
        pass
    out["tmp_fs"] = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "--target", str(tmp)],
                                   capture_output=True, text=True).stdout.strip()  # fmt: skip
    out["fdatasync_4k"] = disk_probe(tmp)
    for system in sorted(systems & set(SERVERS)):
        m = importlib.import_module(ADAPTERS[system])
        out[system] = {"server": m.server_version(), "clients": m.client_versions()}
    return out


def fresh_raw(out: Path) -> Path:
    """``out/raw``, empty: a previous one is moved to ``out/archive/raw-<time>``."""
    raw = out / "raw"
    if raw.is_dir():
        (out / "archive").mkdir(parents=True, exist_ok=True)
        raw.rename(out / "archive" / f"raw-{time.strftime('%Y%m%d-%H%M%S')}")
    raw.mkdir(parents=True)
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=None, help="runs per workload (3; --quick: 1)")
    ap.add_argument(
        "--scale",
        type=float,
        default=None,
        help="multiply message counts (L1: seconds) by this (1; --quick: 0.05)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"check the harness: --scale {QUICK_SCALE} --reps 1 (figures not comparable)",
    )
    ap.add_argument("--only", default=None, help=f"comma-separated columns of {','.join(TAGS)}")
    ap.add_argument("--workloads", default=None, help=f"comma-separated subset of {','.join(ALL)}")
    ap.add_argument("--out", default="peerbench-results", help="results directory (%(default)s)")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    a = ap.parse_args(argv)
    reps = a.reps if a.reps is not None else (1 if a.quick else 3)
    scale = a.scale if a.scale is not None else (QUICK_SCALE if a.quick else 1.0)
    only = a.only.split(",") if a.only else None
    try:
        cols = select(only, a.workloads.split(",") if a.workloads else None)
    except ValueError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    if reps < 1 or not 0 < scale <= 1:
        print("run.py: --reps must be >= 1 and --scale in (0, 1]", file=sys.stderr)
        return 2
    with_rss = only is None or RSS_TAG in only
    if a.list:
        for c in cols:
            sizes = ", ".join(f"{w} {size(C.scaled(w, scale))}" for w in c.workloads)
            print(f"{c.tag:15} {c.system:7} {json.dumps(c.variant):48} {sizes}")
        if with_rss:
            print(f"{RSS_TAG:15} equeue  {max(10_000, round(RSS_MESSAGES * scale))} messages")
        return 0
    systems = {c.system for c in cols}
    missing = missing_prerequisites(systems)
    if missing:
        print(f"run.py: missing {', '.join(missing)}: `make bench-peers-install` installs them",
              file=sys.stderr)  # fmt: skip
        return 1
    # SIGTERM unwinds like Ctrl-C: every started server and worker is stopped, tmp removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(a.out).resolve()
    raw = fresh_raw(out)
    tmp = Path(tempfile.mkdtemp(prefix="peerbench-"))
    t0 = time.time()
    try:
        (raw / "plan.json").write_text(json.dumps({
            "scale": scale, "reps": reps, "columns": [c.tag for c in cols],
            "workloads": {c.tag: list(c.workloads) for c in cols}, "rss": with_rss,
            "complete": scale == 1 and only is None and a.workloads is None,
        }, indent=1))  # fmt: skip
        (raw / "versions.json").write_text(json.dumps(versions(tmp, systems), indent=1))
        h = Harness(out, tmp, scale)
        for c in cols:
            h.column(c, reps)
        if with_rss:
            h.rss()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"done in {time.time() - t0:.0f} s; raw results in {raw}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
