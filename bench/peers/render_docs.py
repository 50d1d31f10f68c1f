"""Render the peer-harness results into docs/benchmarks.md.

Reads ``<results>/raw/*.jsonl`` (written by the peer-broker harness that
``make bench-peers`` runs) and replaces the section headed
``## Side by side with Redis Streams and NATS JetStream`` of docs/benchmarks.md (or
appends it); every other section is left as is.

    .venv/bin/python bench/peers/render_docs.py [peerbench-results] [--doc docs/benchmarks.md]
        [--note "text added under the heading"]

Optional input: ``<results>/equeue-rss.json`` (``equeue_peer.py rss --out ...``) adds
the broker's memory after draining 1,000,000 messages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
HEADING = "## Side by side with Redis Streams and NATS JetStream"
BUILTIN = ["redis-everysec", "redis-always", "nats", "nats-pubasync", "nats-shared"]
LABELS = {
    "redis-everysec": "Redis Streams, AOF everysec",
    "redis-always": "Redis Streams, AOF always",
    "nats": "NATS JetStream (gather, per-queue durables)",
    "nats-pubasync": "NATS JetStream (publish_async)",
    "nats-shared": "NATS JetStream (one shared durable)",
}
WORKLOADS = {
    "P1": "P1: 1 producer, 200,000 × 100 B, groups of 100 (each group's acks awaited before the next)",
    "P2": "P2: as P1 with 100,000 × 1,024 B",
    "P3": "P3: 20,000 × 100 B, one send in flight (each waits for its ack)",
    "C1": "C1: 1 member drains a 200,000 × 100 B backlog from 4 queues, clock stops at the last ack/commit",
    "C2": "C2: 2 member processes, queues {0,1} and {2,3}, same backlog",
    "L1": "L1: 2,000 msg/s for 10 s, one send at a time; send → consumer receive latency",
}
#: (workload, equeue tag, metric, target, higher is better, label)
TARGETS = [
    ("P1", "equeue-sync", "msgs_per_s", 200_000, True, "P1 ≥ 200,000 msg/s, `--flush sync`"),
    ("P2", "equeue-sync", "MB_per_s", 100, True, "P2 ≥ 100 MB/s, `--flush sync`"),
    ("P3", "equeue-sync", "msgs_per_s", 4_000, True, "P3 ≥ 4,000 msg/s, `--flush sync`"),
    ("P3", "equeue-async", "msgs_per_s", 20_000, True, "P3 ≥ 20,000 msg/s, `--flush async`"),
    ("C1", "equeue-sync", "msgs_per_s", 250_000, True, "C1 ≥ 250,000 msg/s"),
    ("C2", "equeue-sync", "msgs_per_s", 300_000, True, "C2 ≥ 300,000 msg/s"),
    ("L1", "equeue-sync", "lat_p50_ms", 0.5, False, "L1 p50 ≤ 0.5 ms (`--flush sync`)"),
    ("L1", "equeue-sync", "lat_p99_ms", 2.0, False, "L1 p99 ≤ 2 ms (`--flush sync`)"),
    ("L1", "equeue-async", "lat_p50_ms", 0.5, False, "L1 p50 ≤ 0.5 ms (`--flush async`)"),
    ("L1", "equeue-async", "lat_p99_ms", 2.0, False, "L1 p99 ≤ 2 ms (`--flush async`)"),
]


# --------------------------------------------------------------------------- loading
def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(results: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(versions, settings by tag, run records by tag) from ``results/raw``."""
    raw = results / "raw"
    vp = raw / "versions.json"
    versions = json.loads(vp.read_text()) if vp.exists() else {}
    settings: dict[str, dict[str, Any]] = {}
    for s in _jsonl(raw / "settings.jsonl"):
        settings[s["tag"]] = {**settings.get(s["tag"], {}), **s}
    runs: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(raw.glob("*.jsonl")):
        tag = p.stem
        if tag in ("settings", "lmdb"):
            continue
        recs = [r for r in _jsonl(p) if "workload" in r]
        if recs:
            runs[tag] = recs
    return versions, settings, runs


def order(settings: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    tags = [t for t in BUILTIN if t in runs]
    tags += [t for t in settings if t in runs and t not in tags]
    tags += [t for t in runs if t not in tags]
    return tags


def label(tag: str, settings: dict[str, dict[str, Any]]) -> str:
    return settings.get(tag, {}).get("label") or LABELS.get(tag) or tag


# --------------------------------------------------------------------------- numbers
def res(r: dict[str, Any], *keys: str) -> Any:
    v: Any = r.get("result") or {}
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


def ok(recs: list[dict[str, Any]], w: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["workload"] == w and "error" not in r]


def med(vals: list[Any]) -> float | None:
    v = [x for x in vals if x is not None]
    return statistics.median(v) if v else None


def fnum(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def fms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def cell(vals: list[Any], f: Any = fnum) -> str:
    v = sorted(x for x in vals if x is not None)
    if not v:
        return "–"
    m = statistics.median(v)
    return f(m) if len(v) == 1 else f"{f(m)} ({f(v[0])}–{f(v[-1])})"


def ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def rss(recs: list[dict[str, Any]]) -> str:
    """Broker RSS while the workload ran (max sampled by the measuring client, MiB)."""
    vals = [res(r, "broker_rss_max_mb") for r in recs]
    for r in recs:
        for m in res(r, "members") or []:
            vals.append(m.get("broker_rss_max_mb"))
    v = [x for x in vals if x is not None]
    return f"{max(v):.0f} MiB" if v else "–"


# --------------------------------------------------------------------------- tables
def workload_table(w: str, tags: list[str], settings: dict[str, Any], runs: dict[str, Any]) -> list[str]:
    if not any(r["workload"] == w for t in tags for r in runs[t]):
        return []
    out = [f"**{WORKLOADS[w]}**", ""]
    if w in ("P1", "P2", "C1", "C2"):
        out.append("| system | msg/s | MB/s | server CPU | client CPU | broker RSS | runs |")
        out.append("|---|---|---|---|---|---|---|")
    elif w == "P3":
        out.append("| system | msg/s | p50 ms | p99 ms | p99.9 ms | max ms | server CPU | client CPU | runs |")
        out.append("|---|---|---|---|---|---|---|---|---|")
    else:
        out.append("| system | p50 ms | p99 ms | p99.9 ms | max ms | received/sent | producer rate | "
                   "sends > 1 ms late | server CPU | runs |")  # fmt: skip
        out.append("|---|---|---|---|---|---|---|---|---|---|")
    for t in tags:
        all_w = [r for r in runs[t] if r["workload"] == w]
        if not all_w:
            continue
        rs = ok(runs[t], w)
        n = f"{len(rs)}/{len(all_w)}"
        name = label(t, settings)
        if not rs:
            out.append(f"| {name} | failed | " + " | ".join(["–"] * (out[-1].count("|") - 3)) + f" | {n} |")
            continue
        srv = cell([r.get("server_cpu_util") for r in rs], lambda v: f"{v:.2f}")
        cli = cell([ratio(res(r, "client_cpu_s"), res(r, "seconds")) for r in rs], lambda v: f"{v:.2f}")
        if w in ("P1", "P2", "C1", "C2"):
            row = [cell([res(r, "msgs_per_s") for r in rs]),
                   cell([res(r, "MB_per_s") for r in rs], lambda v: f"{v:.1f}"), srv, cli, rss(rs), n]
        elif w == "P3":
            row = [cell([res(r, "msgs_per_s") for r in rs])]
            row += [cell([res(r, k) for r in rs], fms) for k in ("lat_p50_ms", "lat_p99_ms", "lat_p999_ms", "lat_max_ms")]
            row += [srv, cli, n]
        else:
            row = [cell([res(r, k) for r in rs], fms) for k in ("lat_p50_ms", "lat_p99_ms", "lat_p999_ms", "lat_max_ms")]
            row += [", ".join(f"{res(r, 'received')}/{res(r, 'producer', 'sent')}" for r in rs),
                    cell([res(r, "producer", "achieved_rate") for r in rs]),
                    cell([res(r, "producer", "late_gt_1ms") for r in rs]), srv, n]  # fmt: skip
        out.append(f"| {name} | " + " | ".join(row) + " |")
    out.append("")
    return out


def target_table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    out = ["| target | measured (median) | peers in the same run | verdict |", "|---|---|---|---|"]
    for w, tag, metric, goal, higher, name in TARGETS:
        rs = ok(runs.get(tag, []), w)
        v = med([res(r, metric) for r in rs])
        peers = []
        for t in ("redis-everysec", "redis-always", "nats"):
            pv = med([res(r, metric) for r in ok(runs.get(t, []), w)])
            if pv is not None:
                peers.append(f"{t} {fms(pv) if metric.startswith('lat') else fnum(pv, 1 if metric == 'MB_per_s' else 0)}")
        if v is None:
            out.append(f"| {name} | no successful run | {'; '.join(peers)} | – |")
            continue
        shown = fms(v) + " ms" if metric.startswith("lat") else fnum(v, 1 if metric == "MB_per_s" else 0)
        slow = False
        if w == "L1":
            rates = [res(r, "producer", "achieved_rate") for r in rs]
            slow = any(x is not None and x < 0.97 * 2000 for x in rates)
            if slow:
                shown += f" (producer reached only {fnum(med(rates))} msg/s)"
        met = v >= goal if higher else v <= goal
        if met and slow:
            verdict = "within the limit, but not a valid L1 run: the producer could not hold 2,000 msg/s"
        elif met:
            verdict = "met"
        elif higher:
            verdict = f"missed: {v / goal:.0%} of target ({fnum(goal - v, 1 if metric == 'MB_per_s' else 0)} short)"
        else:
            verdict = f"missed: {v / goal:.1f}× the limit"
        out.append(f"| {name} | {shown} | {'; '.join(peers)} | {verdict} |")
    out.append("")
    return out


def reading(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Derived figures that explain the equeue rows (computed from the raw records)."""
    out: list[str] = []
    for tag in ("equeue-sync", "equeue-async"):
        rs = ok(runs.get(tag, []), "P1")
        if not rs:
            continue
        per_group = med([100 / res(r, "msgs_per_s") * 1000 for r in rs if res(r, "msgs_per_s")])
        txns = med([r["check"].get("transactions", 0) / 2000 for r in rs if isinstance(r.get("check"), dict)])
        cpu = med([r.get("server_cpu_util") for r in rs])
        out.append(f"- `{tag}` P1: {fms(per_group)} ms per group of 100 (one group in flight), "
                   f"{txns:.2f} write transactions per group, broker CPU {fnum(cpu, 2)} of a core: "
                   "the broker is mostly waiting for the commit"
                   + (" (LMDB's durable commit = two fdatasyncs) " if tag == "equeue-sync" else " ")
                   + "and for the round trip, not computing.")  # fmt: skip
    for tag in ("equeue-sync", "equeue-async"):
        rs = ok(runs.get(tag, []), "P3")
        if rs:
            out.append(f"- `{tag}` P3: mean {fms(med([res(r, 'lat_mean_ms') for r in rs]))} ms per "
                       f"acknowledged send (p50 {fms(med([res(r, 'lat_p50_ms') for r in rs]))} ms).")  # fmt: skip
    if out:
        out.insert(0, "Derived from the same runs:")
        out.insert(1, "")
        out.append("")
    return out


def render(results: Path, note: str | None) -> str:
    versions, settings, runs = load(results)
    tags = order(settings, runs)
    nproc = versions.get("nproc") or os.cpu_count()
    out = [HEADING, ""]
    out.append(
        "Generated by `make bench-peers` (`bench/peers/render_docs.py` from `peerbench-results/raw`): "
        "the shared harness `../shared/bench-peers` runs the same fixed workloads against Redis "
        "Streams, NATS JetStream and equeue (adapter `bench/peers/equeue_peer.py`, SDK used as a "
        "user would: `AsyncProducer` / `AsyncConsumer`). "
        "Each client role is its own Python process; every (workload, run) gets a fresh server and "
        "empty data dir; runs are interleaved. Cells: median (min–max) over the runs."
    )
    out.append("")
    date = versions.get("date", "?")
    eq_recs = [r for t in tags if t.startswith("equeue") for r in runs[t]]
    loads = [r["check"]["loadavg"] for r in eq_recs if isinstance(r.get("check"), dict) and r["check"].get("loadavg")]
    out.append(f"- **Date:** {date}. **Machine:** {versions.get('os')}, kernel {versions.get('kernel')}, "
               f"{nproc} vCPU ({versions.get('cpu')}), {versions.get('mem_gib')} GiB RAM, /tmp on "
               f"`{versions.get('tmp_fs')}`.")  # fmt: skip
    fp = versions.get("fdatasync_4k")
    if fp:
        out.append(f"- **Disk:** 4 KiB append + fdatasync p50 {fp['p50_ms']:.3f} ms, p99 {fp['p99_ms']:.3f} ms "
                   f"(probe at the start of the run).")  # fmt: skip
    if loads:
        one = [x[0] for x in loads]
        out.append(f"- **Load average** (1 min) after the equeue runs: median {statistics.median(one):.1f}, "
                   f"range {min(one):.1f}–{max(one):.1f} (other engineers' tests shared the machine).")  # fmt: skip
    if note:
        out.append(f"- {note}")
    sysv: list[tuple[str, str]] = []
    for t in tags:
        v = settings.get(t, {}).get("versions")
        sysname = settings.get(t, {}).get("system", t)
        if isinstance(v, dict) and "server" in v and sysname not in [s for s, _ in sysv]:
            sysv.append((sysname, f"server `{v.get('server')}`, clients {v.get('clients')}"))
    for sysname in ("redis", "nats"):
        if sysname not in [s for s, _ in sysv] and isinstance(versions.get(sysname), dict):
            v = versions[sysname]
            sysv.append((sysname, f"server `{v.get('server')}`, clients {v.get('clients')}"))
    for sysname, text in sysv:
        out.append(f"- **{sysname}:** {text}.")
    out.append(f"- **Caveat:** the broker and every client process share the same {nproc} vCPUs "
               "(loopback, no pinning). With Python clients these are what a Python user gets, "
               "largely bounded by client CPU and by scheduling when the machine is busy; they are "
               "not server capacity figures. Compare durable columns with durable columns.")  # fmt: skip
    out.append("")
    out.append("Settings per column (what an acknowledgement means):")
    out.append("")
    for t in tags:
        s = settings.get(t, {})
        st = s.get("settings") or {}
        if t.startswith("redis"):
            text = f"appendonly yes, appendfsync {st.get('appendfsync')}, RDB off, io-threads 1"
        elif t.startswith("nats"):
            text = {"nats": "file storage, 1 replica, no per-message fsync (nats-server 2.9); "
                            "gather publish; one durable pull consumer per queue, AckPolicy=all",
                    "nats-pubasync": "as nats, publish_async",
                    "nats-shared": "as nats, one shared durable, explicit acks"}.get(t, str(st))  # fmt: skip
        else:
            text = "; ".join(f"{k}: {v}" for k, v in st.items() if k not in ("host", "port"))
            if s.get("variant", {}).get("pub_mode") == "async":
                text += ("; **P1/P2 producer streams** (`send_async` for every message, then "
                         "`flush()`; up to 8 requests in flight per queue): not the harness's "
                         "group-at-a-time semantics, shown for reference")  # fmt: skip
        out.append(f"- **{label(t, settings)}** (`{t}`): {text}")
    out.append("")
    out.append("### Targets (issue 7)")
    out.append("")
    out.extend(target_table(runs))
    out.append("### Results per workload")
    out.append("")
    for w in WORKLOADS:
        out.extend(workload_table(w, tags, settings, runs))
    out.extend(reading(runs))
    errors = [(t, r["workload"], r["rep"], r["error"]) for t in tags for r in runs[t] if "error" in r]
    if errors:
        out.append("Failed runs (left out of the tables):")
        out.append("")
        for t, w, rep, e in errors:
            out.append(f"- `{t}` {w} run {rep}: `{e[:200]}`")
        out.append("")
    rp = results / "equeue-rss.json"
    if rp.exists():
        m = json.loads(rp.read_text())
        out.append(f"Broker memory ({m.get('flush', 'sync')} flush, `bench/peers/equeue_peer.py rss`): "
                   f"idle {m['idle_mb']:.0f} MiB; after producing {m['messages']:,} × 100 B "
                   f"{m['after_produce_mb']:.0f} MiB; during the drain ≤ {m['drain_max_mb']:.0f} MiB; "
                   f"after draining all {m['messages']:,}: {m['after_drain_mb']:.0f} MiB "
                   f"(peak {m['peak_mb']:.0f} MiB"
                   + (f"; of which anonymous {m['anon_mb']:.0f} MiB, file-backed {m['file_mb']:.0f} MiB"
                      if m.get("anon_mb") is not None else "")
                   + "). The file-backed part is LMDB's memory map (data pages in the shared page "
                   "cache, which the kernel can drop); the anonymous part is the Python process.")  # fmt: skip
        out.append("")
    out.append("Reproduce: `make bench-peers` (REPS=3 by default in the harness; `REPS=1` for a "
               "quick pass; `WORKLOADS=P1,C1` for a subset). Raw JSON lines stay in "
               "`peerbench-results/raw/` (not committed); the harness's own report is "
               "`peerbench-results/peers.md`.")  # fmt: skip
    out.append("")
    return "\n".join(out)


def replace_section(doc: Path, section: str) -> None:
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + "\n\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(HEADING))
        end = len(text) if nxt < 0 else nxt + 1
        text = text[:start] + section + ("\n" if nxt >= 0 else "") + text[end:]
    doc.write_text(text.rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="peerbench-results")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--note", default=None)
    ap.add_argument("--print", action="store_true", help="print the section instead of writing it")
    a = ap.parse_args()
    results = Path(a.results).resolve()
    if not (results / "raw").is_dir():
        raise SystemExit(f"{results}/raw not found: run `make bench-peers` first")
    section = render(results, a.note)
    if a.print:
        print(section)
        return
    replace_section(Path(a.doc), section)
    print(f"updated {a.doc} ({HEADING[3:]})")


if __name__ == "__main__":
    main()
