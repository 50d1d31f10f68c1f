"""README.md and docs/*.md stay readable on their own: every relative link and
``#anchor`` resolves (GitHub's heading anchors), and no page points a reader at an
issue or a "part" number they cannot look up (the docs name the feature instead)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_md = MarkdownIt("commonmark").enable("table")


def _text(inline: Token) -> str:
    """The rendered text of an inline token (code spans and link texts included)."""
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline", "html_inline"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (letters, digits,
    ``_``, ``-`` and spaces kept), each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of ``page``: one per heading (repeats get ``-1``, ``-2``, ...)
    plus explicit ``<a name=...>``/``id=...``."""
    seen: dict[str, int] = {}
    out: set[str] = set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    tokens = _md.parse(page.read_text(encoding="utf-8"))
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            s = slug(_text(tokens[i + 1]))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image of ``page`` (not inside code)."""
    found = []
    tokens = _md.parse(page.read_text(encoding="utf-8"))
    for tok in tokens:
        for child in tok.children or ():
            target = child.attrs.get("href") if child.type == "link_open" else None
            if child.type == "image":
                target = child.attrs.get("src")
            if target is not None:
                found.append(((tok.map or [0])[0] + 1, str(target)))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each link of ``page`` that points outside ``root``, at no file, or at no anchor."""
    out = []
    for line, target in links(page):
        if re.match(r"[a-zA-Z][\w+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not dest.is_relative_to(root):
            out.append(f"{where} (outside the repository)")
        elif not dest.exists():
            out.append(f"{where} (no such file)")
        elif fragment and dest.suffix == ".md" and unquote(fragment) not in anchors(dest):
            out.append(f"{where} (no such anchor in {dest.relative_to(root)})")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


_NUMBERED = re.compile(r"\b(?:issues?|parts?)\s+#?\d+", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_or_part_numbers(page: Path) -> None:
    hits = [
        f"{page.relative_to(ROOT)}:{no}: {m.group(0)}"
        for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for m in _NUMBERED.finditer(line)
    ]
    assert hits == []


def test_the_checks_catch_what_they_must(tmp_path: Path) -> None:
    assert slug("Spark source drain (`bench/bench_spark.py`)") == "spark-source-drain-benchbench_sparkpy"
    assert slug("Limits (honest)") == "limits-honest"
    assert slug("Inline commits (`--flush async`)") == "inline-commits---flush-async"
    assert _NUMBERED.search("as issue 14 asked") and _NUMBERED.search('docs/cluster.md, "Part 2"')
    assert not _NUMBERED.search("partitions 2 and 3")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Spark source drain (`bench.py`)\n\n## B\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "[ok](b.md#spark-source-drain-benchpy) [ok](b.md#b-1) [ok](#a) [web](https://x.org/#y)\n\n"
        "# A\n\n`[in code](nope.md)`\n\n[gone](c.md) [bad](b.md#spark-source-drain) [out](../../x.md)\n"
    )
    assert [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)] == [
        "c.md (no such file)",
        "b.md#spark-source-drain (no such anchor in docs/b.md)",
        "../../x.md (outside the repository)",
    ]
