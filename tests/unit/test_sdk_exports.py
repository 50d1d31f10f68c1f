"""Each SDK package exports only its own names: a name in its ``__all__`` is defined in
one of its own modules, never re-exported from another package (``equeue.producer``
does not hand out ``equeue.client.Client``, nor ``equeue.models.Message``). A user then
finds every name at one home, and the packages do not grow hidden links to one another.

Two checks, so that neither a direct nor a chained re-export slips through: the
package's ``__init__`` binds each exported name by importing it from a module of the
package itself (read from its source), and each exported class or function names a
module of the package as its ``__module__`` (at run time)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

#: the SDK packages (equeue.spark is read from its source only: pyspark may be missing)
PACKAGES = ["equeue.client", "equeue.producer", "equeue.consumer", "equeue.aio", "equeue.broker", "equeue.spark"]
#: the packages imported here for the run-time check
IMPORTABLE = [p for p in PACKAGES if p != "equeue.spark"]


def _init_source(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, package
    return Path(spec.origin)


def _foreign_bindings(source: str, package: str) -> dict[str, str]:
    """The names of ``__all__`` in ``source`` (a package's ``__init__``) that it imports
    from outside ``package`` (name -> the module it comes from), and those it does not
    bind at all (name -> "unbound")."""
    tree = ast.parse(source)
    exported: list[str] = []
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                bound[alias.asname or alias.name] = module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            bound[node.name] = package
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound[t.id] = package
    own = (package, package + ".")
    return {
        name: bound.get(name, "unbound")
        for name in exported
        if not (bound.get(name, "").startswith(own) or bound.get(name, "").startswith("."))
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_init_exports_only_names_of_its_own_modules(package: str) -> None:
    foreign = _foreign_bindings(_init_source(package).read_text(), package)
    assert not foreign, f"{package} exports names of another package (import them from their home): {foreign}"


@pytest.mark.parametrize("package", IMPORTABLE)
def test_exported_classes_and_functions_are_defined_in_the_package(package: str) -> None:
    module = importlib.import_module(package)
    foreign = {}
    for name in module.__all__:
        obj = getattr(module, name)
        if not (isinstance(obj, type) or inspect.isfunction(obj)):
            continue  # a type alias (Callable[...]) or a constant: the source check covers it
        home = obj.__module__
        if not (home == package or home.startswith(package + ".")):
            foreign[name] = home
    assert not foreign, f"{package} exports names defined elsewhere: {foreign}"


def test_a_re_export_is_found() -> None:
    """The source check sees a direct re-export, a name never bound, and passes the
    package's own names (absolute and relative imports, local definitions)."""
    source = (
        "from equeue.client import Client\n"
        "from equeue.producer.producer import Producer\n"
        "from .options import OnFull\n"
        "class Local: ...\n"
        "__all__ = ['Client', 'Local', 'Missing', 'OnFull', 'Producer']\n"
    )
    assert _foreign_bindings(source, "equeue.producer") == {"Client": "equeue.client", "Missing": "unbound"}
