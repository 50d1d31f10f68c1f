"""The checker: plain Python over a run directory's ``history.jsonl`` and
``final.jsonl`` (every queue read whole from its group's leader after the heal).

    python -m tests.chaos.checker RUN_DIR      # judge a finished run again

What it checks (each failure is a violation, kind in brackets):

- every acknowledged send is stored exactly once, with its body (crc32 and length),
  at the queue and offset its acknowledgement named [lost, moved, corrupt]; a send
  acknowledged by a group running ``--acks leader`` may be lost (counted, not a
  violation: that is what acks leader allows); no body
  is stored twice [duplicate]; nothing is stored that was never sent [phantom]; a
  send that failed before it left the client is not stored [failed-stored];
- per-key order within a queue: a key's messages (keys belong to one producer)
  are stored in the order they were sent [key-order];
- no read returned a message that is later gone or different [read-gone];
- the orderly group never handled a message of a key before the previous message
  of that key in its queue [orderly-order];
- committed offsets never go backwards: a committed-offset query never answers less
  than an offset already acknowledged as committed or answered by an earlier query
  [offset-backwards];
- no two consumers hold one queue at once: two brokers' DESCRIBE_GROUP answers
  (only a serving leader answers) whose request-to-answer windows overlap never name
  different members for one queue of a consumer group [two-holders];
- epochs only grow: no broker leads at a lower epoch than it led at before (across
  its restarts too), no broker leads at an epoch below one another broker of its
  group led at before it was asked, and no two brokers of a group ever report
  "leader" at the same epoch [epoch-decreased, two-leaders] (a follower reports
  etcd's record, which a restored backup takes back: not judged);
- every queue's offsets are dense [gap], every queue could be read after the heal
  [final-read], the cluster recovered after the heal [no-recovery], and
  ``equeue cluster verify`` passed [verify].

It also reports the failover times (a leader's SIGKILL to the first acknowledged
produce to a queue of its group; all kills, and the kills during which no other
fault hit etcd or the group), the acks-leader losses, the faults by kind, and the operation counts.
"""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs

from tests.chaos.history import Op, read_history

__all__ = ["Report", "Violation", "check", "main"]


@attrs.define
class Violation:
    kind: str
    t: float
    line: int
    detail: str
    mid: str = ""
    #: the history lines about the same thing match these value fields (the excerpt)
    about: dict[str, Any] = attrs.Factory(dict)


@attrs.define
class Report:
    violations: list[Violation] = attrs.Factory(list)
    counts: dict[str, Any] = attrs.Factory(dict)
    faults: Counter[str] = attrs.Factory(Counter)
    skipped: Counter[str] = attrs.Factory(Counter)
    failovers: list[float] = attrs.Factory(list)
    #: the failovers of kills during which no other fault hit etcd or the group
    failovers_alone: list[float] = attrs.Factory(list)
    failover_missing: int = 0
    #: group -> its --acks (from the run's config line)
    acks: dict[str, str] = attrs.Factory(dict)
    #: acks-leader sends acknowledged, and those of them lost
    leader_acked: int = 0
    leader_lost: list[str] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)

    @property
    def valid(self) -> bool:
        return not self.violations

    def first(self) -> Violation | None:
        return min(self.violations, key=lambda v: (v.t, v.line)) if self.violations else None


def _seq(mid: str) -> int:
    return int(mid.rsplit("-", 1)[1])


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _touches(kind: str, targets: tuple[str, ...], group: str) -> bool:
    """Whether a fault of ``kind`` on ``targets`` bears on ``group``'s failover: it hits
    etcd, a broker of the group, or splits the whole network."""
    return kind == "partition-halves" or any(n.startswith(("e", f"{group}-")) for n in targets)


def check(run_dir: Path) -> Report:
    """Judge the run in ``run_dir`` (module docstring)."""
    r = Report()
    sends: dict[str, dict[str, Any]] = {}
    by_id: dict[int, dict[str, Any]] = {}
    owners: dict[tuple[str, int], str] = {}
    kills: list[tuple[float, str, int]] = []
    #: (start, end) of every fault, for the failovers with no other fault running
    spans: list[tuple[float, float, str, tuple[str, ...]]] = []
    open_faults: dict[tuple[str, str], list[float]] = defaultdict(list)
    #: (consumer group, "topic/queue") -> [(sent, answered, node, holder, line)]
    holders: dict[tuple[str, str], list[tuple[float, float, str, str, int]]] = defaultdict(list)
    acked_produces: list[
        tuple[float, float, str, int]
    ] = []  # (t invoked, t acknowledged, topic, queue)
    offset_floor: dict[tuple[str, str, int], tuple[int, float, int]] = {}
    query_floor: dict[int, tuple[int, float, int]] = {}
    epochs: dict[str, tuple[int, float, int]] = {}
    #: every "leader" status sample: (request sent, answered, group, node, epoch, line)
    led: list[tuple[float, float, str, str, int, int]] = []
    leaders: dict[tuple[str, int], dict[str, tuple[float, int]]] = defaultdict(dict)
    ops = Counter[str]()
    verify: Op | None = None
    settled: Op | None = None

    # ---------------------------------------------------------------- the final reads
    final: dict[tuple[str, int], dict[str, Any]] = {}
    stored: dict[str, list[tuple[str, int, int, int, int, str | None]]] = defaultdict(list)
    by_pos: dict[tuple[str, int, int], tuple[str, int]] = {}
    final_path = run_dir / "final.jsonl"
    if final_path.exists():
        with final_path.open() as lines:
            for line in lines:
                rec = json.loads(line)
                if rec["kind"] == "queue":
                    final[(rec["topic"], rec["queue"])] = rec
                elif rec["kind"] == "message":
                    place = (
                        rec["topic"],
                        rec["queue"],
                        rec["offset"],
                        rec["crc"],
                        rec["len"],
                        rec["key"],
                    )
                    stored[rec["mid"]].append(place)
                    by_pos[(rec["topic"], rec["queue"], rec["offset"])] = (rec["mid"], rec["crc"])
    read_ok = {k for k, rec in final.items() if rec.get("ok")}
    per_key: dict[tuple[str, int, str], list[tuple[int, str]]] = defaultdict(list)
    for mid, places in stored.items():
        for topic, q, o, _crc, _n, k in places:
            if k:
                per_key[(topic, q, k)].append((o, mid))
    #: (topic, queue, offset) -> the offset of the previous message of its key in its queue
    pred: dict[tuple[str, int, int], int] = {}
    for (topic, q, _k), items in per_key.items():
        items.sort()
        for (o1, _m1), (o2, _m2) in itertools.pairwise(items):
            pred[(topic, q, o2)] = o1
    handled: dict[str, set[tuple[str, int, int]]] = defaultdict(set)

    def on_read(op: Op) -> None:
        """A delivery: it must be in the store as read; the orderly group's must
        follow its key's previous message."""
        v = op["value"]
        topic, q, o = v["topic"], v["queue"], v["offset"]
        if (topic, q) in read_ok:
            there = by_pos.get((topic, q, o))
            if there is None or there != (v["mid"], v["crc"]):
                r.violations.append(Violation(
                    "read-gone", op["t"], op["i"],
                    f"{op['process']} read {v['mid']} at {topic}/{q}@{o}; the store has "
                    f"{there[0] if there else 'nothing'} there", v["mid"],
                ))  # fmt: skip
        if v["group"] == "cg-orderly" and v.get("key"):
            p = pred.get((topic, q, o))
            if p is not None and (topic, q, p) not in handled[v["group"]]:
                r.violations.append(Violation(
                    "orderly-order", op["t"], op["i"],
                    f"{op['process']} handled {v['mid']} ({topic}/{q}@{o}, key {v['key']}) before the key's "
                    f"previous message @{p}", v["mid"],
                ))  # fmt: skip
        handled[v["group"]].add((topic, q, o))

    for op in read_history(run_dir / "history.jsonl"):
        typ, f, v, t, i = op["type"], op["f"], op.get("value", {}), op["t"], op["i"]
        if f == "send":
            if typ == "invoke":
                sends[v["mid"]] = by_id[op["id"]] = {**v, "t": t, "line": i, "outcome": None}
            else:
                s = by_id.pop(op["id"])
                s.update(outcome=typ, t_done=t, line_done=i, ack=v)
                ops[f"send {typ}"] += 1
                if typ == "ok":
                    acked_produces.append((s["t"], t, v["topic"], v["queue"]))
        elif f == "read" and typ == "ok":
            on_read(op)
            ops[f"read {v['group']}"] += 1
        elif f == "commit":
            ops[f"commit {typ}"] += 1
            if typ == "ok":
                key = (v["group"], v["topic"], v["queue"])
                if v["offset"] > offset_floor.get(key, (-1, 0.0, 0))[0]:
                    offset_floor[key] = (v["offset"], t, i)
        elif f == "query":
            ops[f"query {typ}"] += 1
            key = (v.get("group"), v.get("topic"), v.get("queue"))
            if typ == "invoke":
                query_floor[op["id"]] = offset_floor.get(key, (-1, 0.0, 0))  # type: ignore[arg-type]
            else:
                floor = query_floor.pop(op["id"], (-1, 0.0, 0))
                if typ == "ok":
                    if v["offset"] < floor[0]:
                        r.violations.append(Violation(
                            "offset-backwards", t, i,
                            f"group {key[0]} {key[1]}/{key[2]}: committed offset read as {v['offset']} after "
                            f"{floor[0]} was committed or read (history line {floor[2]}, t={floor[1]:.3f})",
                            about={"group": key[0], "topic": key[1], "queue": key[2]},
                        ))  # fmt: skip
                    if v["offset"] > offset_floor.get(key, (-1, 0.0, 0))[0]:  # type: ignore[arg-type]
                        offset_floor[key] = (v["offset"], t, i)  # type: ignore[index]
        elif f == "status" and typ == "ok":
            ops["status samples"] += 1
            node, epoch = v["node"], v["epoch"]
            if v["role"] == "leader":
                prev = epochs.get(node)
                if prev is not None and epoch < prev[0]:
                    r.violations.append(Violation(
                        "epoch-decreased", t, i,
                        f"{node} ({v['broker']}) led at epoch {epoch} after it led at {prev[0]} (history line {prev[2]})",
                    ))  # fmt: skip
                if prev is None or epoch > prev[0]:
                    epochs[node] = (epoch, t, i)
                led.append((v.get("sent", t), t, v["group"], node, epoch, i))
                seen = leaders[(v["group"], epoch)]
                if node not in seen:
                    seen[node] = (t, i)
                if len(seen) > 1 and seen[node][1] == i:
                    other = next(n for n in seen if n != node)
                    r.violations.append(Violation(
                        "two-leaders", t, i,
                        f"group {v['group']} epoch {epoch}: {other} (line {seen[other][1]}) and {node} both "
                        "reported role leader",
                    ))  # fmt: skip
        elif f == "leases" and typ == "ok":
            ops["lease samples"] += 1
            for qkey, member in v["held"].items():
                holders[(v["group"], qkey)].append((v["sent"], t, v["node"], member, i))
        elif f == "routes":
            for topic, own in v["owners"].items():
                for q, g in enumerate(own):
                    owners[(topic, q)] = g
        elif typ == "nemesis":
            if f == "start":
                r.faults[v["kind"]] += 1
                open_faults[(v["kind"], ",".join(v["targets"]))].append(t)
                if v["kind"] == "kill-broker" and v.get("was_leader"):
                    kills.append((t, v["group"], i))
            elif f == "stop":
                targets = tuple(v.get("targets", []))
                began = open_faults.get((v["kind"], ",".join(targets)))
                if began:
                    spans.append((began.pop(0), t, v["kind"], targets))
            elif f == "skipped":
                r.skipped[v["kind"]] += 1
            elif f in ("error", "revive-failed", "note"):
                r.notes.append(f"nemesis {f} at t={t:.1f}: {json.dumps(v)[:300]}")
        elif typ == "info":
            if f == "config":
                r.acks = dict(v.get("acks", {}))
            elif f == "verify":
                verify = op
            elif f == "settled":
                settled = op
            elif f in ("consumer-crashed", "producer-crashed", "routes-failed", "broker-errors"):
                r.notes.append(f"{f} at t={t:.1f}: {json.dumps(v)[:300]}")
    for s in by_id.values():  # invoked, never completed: the run ended first
        s["outcome"] = "unknown"
    for (kind, names), started in open_faults.items():  # running at the end: healed by the heal-all
        spans.extend((t0, float("inf"), kind, tuple(names.split(","))) for t0 in started)

    # ---------------------------------------------------------------- a group's leaders' epochs
    # a leader answering at epoch e, asked after another broker of its group had answered
    # "leader" at a higher epoch, leads at an epoch a later leader already passed
    by_answer = sorted(led, key=lambda x: x[1])
    highest: dict[str, tuple[int, str, int]] = {}
    pos = 0
    for sent_at, _t, grp, who, ep, at_line in sorted(led):
        while pos < len(by_answer) and by_answer[pos][1] < sent_at:
            _s, _a, g2, n2, e2, l2 = by_answer[pos]
            if e2 > highest.get(g2, (-1, "", 0))[0]:
                highest[g2] = (e2, n2, l2)
            pos += 1
        top = highest.get(grp)
        if top is not None and top[1] != who and ep < top[0]:
            r.violations.append(Violation(
                "epoch-decreased", sent_at, at_line,
                f"group {grp}: {who} led at epoch {ep}, asked after {top[1]} had led at epoch {top[0]} "
                f"(history line {top[2]})",
            ))  # fmt: skip

    # ---------------------------------------------------------------- one holder per queue
    for (cgroup, qkey), samples in holders.items():
        samples.sort()
        for j, (at1, to1, node1, member1, line1) in enumerate(samples):
            for at2, to2, node2, member2, line2 in samples[j + 1 :]:
                if at2 > to1:
                    break  # sorted by request time: no later sample overlaps this one
                if node2 != node1 and member2 != member1:
                    r.violations.append(Violation(
                        "two-holders", at2, line2,
                        f"group {cgroup} queue {qkey}: {node1} answered that {member1} holds it (line {line1}, "
                        f"{at1:.3f}-{to1:.3f} s) while {node2} answered {member2} ({at2:.3f}-{to2:.3f} s)",
                    ))  # fmt: skip

    end_t = max((s.get("t_done", s["t"]) for s in sends.values()), default=0.0)
    for (topic, q), rec in sorted(final.items()):
        if not rec.get("ok"):
            r.violations.append(
                Violation("final-read", end_t, 0, f"{topic}/{q}: {rec.get('error')}")
            )
        elif rec.get("gap"):
            r.violations.append(Violation("gap", end_t, 0, f"{topic}/{q}: {rec['gap']}"))
    if not final_path.exists():
        r.violations.append(
            Violation("final-read", end_t, 0, "no final read (the run ended before it)")
        )

    # ---------------------------------------------------------------- sends
    resolved = Counter[str]()
    for mid, places in stored.items():
        sent = sends.get(mid)
        if sent is None:
            r.violations.append(
                Violation("phantom", end_t, 0, f"{places[0][:3]} holds {mid!r}, never sent", mid)
            )
            continue
        s = sent
        if len(places) > 1:
            r.violations.append(Violation(
                "duplicate", s["t"], s["line"], f"{mid} stored {len(places)} times: {[p[:3] for p in places]}", mid
            ))  # fmt: skip
        if s["outcome"] == "fail":
            r.violations.append(Violation("failed-stored", s["t"], s["line"], f"{mid} failed before sending "
                                          f"({s['ack'].get('error')}) but is stored at {places[0][:3]}", mid))  # fmt: skip
        resolved[f"{s['outcome']} stored"] += 1
    for mid, s in sends.items():
        if mid not in stored:
            resolved[f"{s['outcome']} absent"] += 1
        if s["outcome"] != "ok":
            continue
        ack = s["ack"]
        if (ack["topic"], ack["queue"]) not in read_ok:
            continue  # reported as final-read
        places = stored.get(mid, [])
        acks_leader = r.acks.get(owners.get((ack["topic"], ack["queue"]), ""), "all") == "leader"
        if acks_leader:
            r.leader_acked += 1
            if not places:
                r.leader_lost.append(mid)
                continue
        if not places:
            r.violations.append(Violation(
                "lost", s["t_done"], s["line_done"],
                f"{mid} acknowledged at {ack['topic']}/{ack['queue']}@{ack['offset']} but not stored", mid,
            ))  # fmt: skip
            continue
        topic, q, o, crc, n, _key = places[0]
        if (crc, n) != (s["crc"], s["len"]):
            r.violations.append(Violation("corrupt", s["t_done"], s["line_done"],
                                          f"{mid} stored with crc {crc} len {n}, sent crc {s['crc']} len {s['len']}",
                                          mid))  # fmt: skip
        if (
            ack["offset"] >= 0
            and not ack.get("duplicate")
            and (topic, q, o) != (ack["topic"], ack["queue"], ack["offset"])
        ):
            r.violations.append(Violation("moved", s["t_done"], s["line_done"],
                                          f"{mid} acknowledged at {ack['topic']}/{ack['queue']}@{ack['offset']}, "
                                          f"stored at {topic}/{q}@{o}", mid))  # fmt: skip

    # ---------------------------------------------------------------- per-key order in the store
    for (topic, q, k), items in per_key.items():
        for (o1, m1), (o2, m2) in itertools.pairwise(items):
            if m1.rsplit("-", 1)[0] == m2.rsplit("-", 1)[0] and _seq(m2) < _seq(m1):
                s = sends.get(m2) or {"t": end_t, "line": 0}
                r.violations.append(Violation("key-order", s["t"], s["line"],
                                              f"{topic}/{q} key {k}: {m1}@{o1} stored before {m2}@{o2}", m2))  # fmt: skip

    # ---------------------------------------------------------------- end of run
    if settled is None or not settled.get("value", {}).get("ok"):
        detail = settled.get("value", {}).get("detail", "") if settled else "the run ended before"
        r.violations.append(Violation("no-recovery", settled["t"] if settled else end_t, settled["i"] if settled else 0,
                                      f"the cluster did not settle after the heal: {detail}"))  # fmt: skip
    if verify is None or verify.get("value", {}).get("rc") != 0:
        out = verify.get("value", {}).get("output", "") if verify else "not run"
        r.violations.append(Violation("verify", verify["t"] if verify else end_t, verify["i"] if verify else 0,
                                      f"equeue cluster verify failed: {out[-1500:]}"))  # fmt: skip

    # ---------------------------------------------------------------- failovers
    acked_produces.sort()
    invoked = [p[0] for p in acked_produces]
    for t_kill, group, _line in kills:
        first: float | None = None
        for j in range(bisect.bisect_right(invoked, t_kill), len(acked_produces)):
            t_inv, t_ack, topic, q = acked_produces[j]
            if first is not None and t_inv > first:
                break  # sent after the first acknowledgement found: cannot be earlier
            if owners.get((topic, q)) == group and (first is None or t_ack < first):
                first = t_ack
        if first is None:
            r.failover_missing += 1
        else:
            r.failovers.append(first - t_kill)
            others = [sp for sp in spans if sp[0] != t_kill and sp[0] <= first and sp[1] >= t_kill
                      and _touches(sp[2], sp[3], group)]  # fmt: skip
            if not others:
                r.failovers_alone.append(first - t_kill)

    r.counts = {
        **dict(sorted(ops.items())),
        **{f"sends {k}": n for k, n in sorted(resolved.items())},
        "queues read": len(read_ok),
        "messages stored": sum(len(p) for p in stored.values()),
    }
    return r


def render(r: Report) -> str:
    """The report's text (without the violation's history excerpt)."""
    lines = ["faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(r.faults.items())) or "none")
             + f" (total {sum(r.faults.values())})"]  # fmt: skip
    if r.skipped:
        lines.append(
            "faults skipped (no target then): "
            + ", ".join(f"{k} {n}" for k, n in sorted(r.skipped.items()))
        )
    lines.append("operations: " + ", ".join(f"{k} {n}" for k, n in r.counts.items()))
    if r.failovers:
        lines.append(f"failover (leader SIGKILL -> first acknowledgement of a produce to its group sent after it), {len(r.failovers)} kills: "
                     f"p50 {statistics.median(r.failovers):.2f} s, p99 {_pct(r.failovers, 0.99):.2f} s, "
                     f"max {max(r.failovers):.2f} s")  # fmt: skip
    if r.failovers_alone:
        fa = r.failovers_alone
        lines.append(f"  of them {len(fa)} kills with no other fault on etcd or the group: p50 {statistics.median(fa):.2f} s, "
                     f"p99 {_pct(fa, 0.99):.2f} s, max {max(fa):.2f} s")  # fmt: skip
    if r.failover_missing:
        lines.append(
            f"{r.failover_missing} leader kills with no acknowledged produce to the group afterwards"
        )
    leader_groups = sorted(g for g, a in r.acks.items() if a == "leader")
    if leader_groups:
        lines.append(f"acks leader ({', '.join(leader_groups)}): {r.leader_acked} sends acknowledged, "
                     f"{len(r.leader_lost)} of them lost (allowed, counted)"
                     + (f": {', '.join(r.leader_lost[:5])}{' ...' if len(r.leader_lost) > 5 else ''}" if r.leader_lost else ""))  # fmt: skip
    else:
        lines.append("acks leader: not run (no group runs --acks leader)")
    for n in r.notes[:15]:
        lines.append(f"note: {n}")
    kinds = Counter(v.kind for v in r.violations)
    lines.append("VERDICT: " + ("VALID (no violation)" if r.valid else
                                f"INVALID: {len(r.violations)} violations ({', '.join(f'{k} {n}' for k, n in kinds.items())})"))  # fmt: skip
    return "\n".join(lines)


def excerpt(run_dir: Path, v: Violation, around: int = 4, limit: int = 80) -> str:
    """The history around a violation: the lines next to it, every line of its
    message id, the commits and queries of its queue and group in the 15 s before it
    (``about``), and the nemesis lines of the 20 s before it; at most ``limit`` lines."""
    out = []
    for op in read_history(run_dir / "history.jsonl"):
        val = op.get("value", {})
        near = abs(op["i"] - v.line) <= around and v.line > 0
        mine = bool(v.mid) and val.get("mid") == v.mid
        same = (bool(v.about) and op["f"] in ("commit", "query") and v.t - 15 <= op["t"] <= v.t + 1
                and all(val.get(k) == x for k, x in v.about.items()))  # fmt: skip
        nem = op["type"] == "nemesis" and v.t - 20 <= op["t"] <= v.t + 2
        if near or mine or same or nem:
            mark = ">>" if op["i"] == v.line else "  "
            out.append(f"{mark} {json.dumps(op, separators=(',', ':'))[:300]}")
    if len(out) > limit:
        out = [
            *out[: limit // 2],
            f"   ... {len(out) - limit} lines left out ...",
            *out[-limit // 2 :],
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.chaos.checker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    r = check(run_dir)
    print(render(r))
    v = r.first()
    if v is not None:
        print(f"first violation [{v.kind}] at t={v.t:.3f} s (history line {v.line}): {v.detail}")
        print(excerpt(run_dir, v))
    return 0 if r.valid else 1


if __name__ == "__main__":
    sys.exit(main())
