"""The peer harness's pure parts (bench/peers/), and docs/benchmarks.md's rerun commands.

The harness itself (servers, workers) is checked by ``make bench-peers QUICK=1``; these
tests cover its plan, its scaling, and the renderer's rule that only a complete,
full-scale run may replace the documented table; and that every command the benchmark
doc names exists in this repository (a clone can rerun every table).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "bench" / "peers"
DOC = ROOT / "docs" / "benchmarks.md"


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    """bench/peers/run.py, peerlib.py and render_docs.py, imported from their folder."""
    monkeypatch.syspath_prepend(str(PEERS))
    for name in ("run", "peerlib", "render_docs"):
        sys.modules.pop(name, None)
    mods = {name: importlib.import_module(name) for name in ("run", "peerlib", "render_docs")}
    yield mods
    for name in mods:
        sys.modules.pop(name, None)


def test_plan_is_the_documented_table(peers: dict[str, ModuleType]) -> None:
    run, render = peers["run"], peers["render_docs"]
    tags = [c.tag for c in run.PLAN]
    assert tags[: len(render.BUILTIN)] == render.BUILTIN
    assert tags[len(render.BUILTIN) :] == ["equeue-sync", "equeue-async", "equeue-stream"]
    by_tag = {c.tag: c for c in run.PLAN}
    assert by_tag["nats-pubasync"].workloads == ("P1", "P2")
    assert by_tag["nats-shared"].workloads == ("C1", "C2")
    assert by_tag["equeue-stream"].variant == {"flush": "sync", "pub_mode": "async"}
    assert by_tag["equeue-stream"].workloads == ("P1", "P2")


def test_select_cuts_columns_and_workloads(peers: dict[str, ModuleType]) -> None:
    run = peers["run"]
    assert run.select(None, None) == run.PLAN
    cols = run.select(["nats-shared", "equeue-sync"], ["C1", "L1"])
    assert [(c.tag, c.workloads) for c in cols] == [
        ("nats-shared", ("C1",)),
        ("equeue-sync", ("C1", "L1")),
    ]
    assert run.select(["nats-pubasync"], ["C1"]) == []  # no workload left: dropped
    assert run.select(["equeue-rss"], None) == []  # the memory step is not a column
    with pytest.raises(ValueError, match="unknown column redis"):
        run.select(["redis"], None)
    with pytest.raises(ValueError, match="unknown workload P4"):
        run.select(None, ["P4"])


def test_scaled_workloads(peers: dict[str, ModuleType]) -> None:
    C = peers["peerlib"]
    for name, w in C.WORKLOADS.items():
        assert C.scaled(name, 1) == w
    assert C.scaled("P1", 0.05)["n"] == 10_000
    assert C.scaled("P3", 0.05)["n"] == 1_000
    assert C.scaled("P2", 0.0001)["n"] == 100  # at least one batch
    assert C.scaled("C2", 0.0123)["n"] % 100 == 0
    l1 = C.scaled("L1", 0.05)
    assert (l1["seconds"], l1["rate"]) == (1, 2000)  # the rate is the workload; seconds shrink
    assert C.WORKLOADS["L1"]["seconds"] == 10  # not changed by scaling


def test_quick_keeps_every_column(
    peers: dict[str, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    run = peers["run"]
    assert run.main(["--quick", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [*(c.tag for c in run.PLAN), "equeue-rss"]
    assert run.main(["--only", "redis"]) == 2


def _results(tmp: Path, plan: dict[str, Any] | None) -> Path:
    """A results dir with one successful equeue-sync P1 run."""
    raw = tmp / "results" / "raw"
    raw.mkdir(parents=True)
    if plan is not None:
        (raw / "plan.json").write_text(json.dumps(plan))
    (raw / "versions.json").write_text(json.dumps({"date": "today", "nproc": 2}))
    (raw / "settings.jsonl").write_text(json.dumps({"tag": "equeue-sync", "system": "equeue",
                                                    "variant": {"flush": "sync"}, "settings": {},
                                                    "label": "equeue, flush sync"}) + "\n")  # fmt: skip
    rec = {"tag": "equeue-sync", "workload": "P1", "rep": 1, "server_cpu_util": 0.5,
           "result": {"msgs": 10_000, "seconds": 1.0, "msgs_per_s": 10_000.0, "MB_per_s": 1.0,
                      "client_cpu_s": 0.2},
           "check": {"transactions": 150}}  # fmt: skip
    (raw / "equeue-sync.jsonl").write_text(json.dumps(rec) + "\n")
    return tmp / "results"


FULL = {"scale": 1, "reps": 3, "complete": True}


def test_doc_refusal(peers: dict[str, ModuleType]) -> None:
    refusal = peers["render_docs"].doc_refusal
    assert refusal(FULL) is None
    assert "scaled x0.05" in refusal({**FULL, "scale": 0.05})
    assert "part of the plan" in refusal({**FULL, "complete": False})
    assert "plan.json" in refusal(None)


@pytest.mark.parametrize(
    ("plan", "replaced"),
    [(FULL, True), ({"scale": 0.05, "reps": 1, "complete": False}, False), (None, False)],
)
def test_render_replaces_the_doc_only_for_a_full_run(
    peers: dict[str, ModuleType], tmp_path: Path, plan: dict[str, Any] | None, replaced: bool
) -> None:
    render = peers["render_docs"]
    results = _results(tmp_path, plan)
    doc = tmp_path / "benchmarks.md"
    before = f"# Benchmarks\n\n{render.HEADING}\n\nold table\n\n## Next section\n\nkept\n"
    doc.write_text(before)
    render.main([str(results), "--doc", str(doc)])
    section = (results / "peers.md").read_text()
    assert section.startswith(render.HEADING)
    assert "### Targets\n" in section and "issue" not in section
    assert "1.50 write transactions per group" in section  # 150 over 10,000 / 100 groups
    assert ("Not comparable" in section) == (plan is not None and plan["scale"] != 1)
    text = doc.read_text()
    if replaced:
        assert "old table" not in text and section.strip() in text
        assert text.endswith("## Next section\n\nkept\n")
    else:
        assert text == before


# --------------------------------------------------------------------------- the doc's commands
def _code(text: str) -> list[str]:
    """Inline code spans and indented code lines of a markdown text."""
    return re.findall(r"`([^`]+)`", text) + [
        line for line in text.splitlines() if line.startswith("    ")
    ]


def test_benchmark_doc_names_only_commands_in_this_repo() -> None:
    text = DOC.read_text()
    makefile = (ROOT / "Makefile").read_text()
    named = 0
    for code in _code(text):
        assert "../" not in code, f"docs/benchmarks.md names a path outside the repo: {code!r}"
        for target in re.findall(r"\bmake ([a-z][\w-]*)", code):
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target}"
        scripts = list(re.finditer(r"\bbench/[\w/.-]+\.(?:py|sh)\b", code))
        for i, m in enumerate(scripts):
            path = ROOT / m.group(0)
            assert path.is_file(), f"docs/benchmarks.md names {m.group(0)}, which does not exist"
            named += 1
            tail = code[m.end() : scripts[i + 1].start() if i + 1 < len(scripts) else len(code)]
            source = path.read_text()
            tail = re.sub(r"'[^']*'|\"[^\"]*\"", "", tail)  # quoted: arguments passed on
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", tail):
                assert f'"{flag}"' in source, f"{m.group(0)} has no option {flag}"
    assert named > 20


def test_documented_peer_section_says_how_it_is_made(peers: dict[str, ModuleType]) -> None:
    """The recorded section keeps the renderer's own wording of how it is made and rerun."""
    render = peers["render_docs"]
    text = DOC.read_text()
    section = text[text.index(render.HEADING) :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    assert render.INTRO in section
    assert render.REPRODUCE in section


def test_make_bench_peers_needs_nothing_outside_the_repo() -> None:
    """`make bench-peers` (and its install helper) name only files of this repo."""
    makefile = (ROOT / "Makefile").read_text()
    for target in ("bench-peers", "bench-peers-install"):
        rule = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert rule, f"no rule {target}"
        recipe = rule.group(1)
        assert "../" not in recipe and "/work/" not in recipe, recipe
        for path in re.findall(r"\bbench/[\w/.-]+", recipe):
            assert (ROOT / path).exists(), f"{target} names {path}, which does not exist"
