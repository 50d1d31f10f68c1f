"""Every nursery of the package is opened by ``async with``: each ``open_nursery()`` call
is an ``async with`` item, or is entered on an ``AsyncExitStack``
(``stack.enter_async_context(trio.open_nursery())``). A nursery manager kept aside and
entered by hand (``cm.__aenter__()`` / ``cm.__aexit__(...)``) is refused: the stack or
``@asynccontextmanager`` gets the exit order and failed entries right
(``equeue.client.lifetime``)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "equeue"  # client, broker, producer, consumer and spark are linked into it


def _is_open_nursery(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "open_nursery") or (
        isinstance(f, ast.Name) and f.id == "open_nursery"
    )


def hand_entered(source: str) -> list[int]:
    """The lines of ``source`` where ``open_nursery()`` is called other than as an ``async
    with`` item or the argument of ``enter_async_context``."""
    tree = ast.parse(source)
    sanctioned: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncWith):
            sanctioned.update(id(item.context_expr) for item in node.items)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "enter_async_context"
        ):
            sanctioned.update(id(arg) for arg in node.args)
    return sorted(n.lineno for n in ast.walk(tree) if _is_open_nursery(n) and id(n) not in sanctioned)


def _modules() -> list[Path]:
    out = []
    for top, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out.extend(Path(top, f) for f in sorted(files) if f.endswith(".py"))
    return out


def test_the_check_tells_hand_entered_nurseries_apart() -> None:
    sanctioned = """
async def f(stack):
    async with trio.open_nursery() as n, other():
        pass
    nursery = await stack.enter_async_context(trio.open_nursery())
"""
    by_hand = """
class C:
    async def __aenter__(self):
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
"""
    assert hand_entered(sanctioned) == []
    assert hand_entered(by_hand) == [4]


def test_no_nursery_is_entered_by_hand() -> None:
    modules = _modules()
    assert len(modules) > 100  # the linked packages were walked too
    found = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in modules
        for line in hand_entered(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "nursery managers entered by hand (use async with or an AsyncExitStack)"
