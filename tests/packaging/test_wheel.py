"""The wheel as a user gets it: built from the source folders, installed into a clean venv
(no pyspark, no dev tools), it holds one top-level package, its CLI runs, and the SDK works.

Slow (a build and an install from the package index or pip's cache), so marked ``slow``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _package_dir() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def test_every_source_package_is_listed_for_the_wheel() -> None:
    """A new subpackage left out of ``[tool.setuptools] packages`` would be missing from the
    wheel while every test from the source tree still passed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for package, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]) if rel.parts else package)
    assert listed == found


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the wheel from a copy of the source folders and install it into a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in set(_package_dir().values()):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)], cwd=tmp)
    (wheel,) = dist.glob("*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp)
    return wheel, venv


def test_the_wheel_holds_one_top_level_package(wheel_venv: tuple[Path, Path]) -> None:
    wheel, _ = wheel_venv
    assert wheel.name.startswith("equeue_broker-")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"equeue"}
    # each source module once: the wheel follows package-dir, not the symlinks in equeue/
    sources = set()
    for package, folder in _package_dir().items():
        for dirpath, _dirs, files in os.walk(ROOT / folder):  # links to folders not followed
            rel = Path(dirpath).relative_to(ROOT / folder)
            sources |= {"/".join([*package.split("."), *rel.parts, f]) for f in files if f.endswith(".py")}
    assert sorted(n for n in names if n.endswith(".py")) == sorted(sources)
    assert "equeue/py.typed" in names
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level is not None:
        assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["equeue"]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata
    assert "Project-URL: " in metadata and "Classifier: Typing :: Typed" in metadata


def test_the_installed_cli_and_module_run(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = wheel_venv
    from equeue import __version__

    out = _run([str(venv / "bin" / "equeue"), "--version"], cwd=tmp_path).stdout
    assert out.strip() == f"equeue {__version__} (equeue-broker)"
    out = _run([str(venv / "bin" / "python"), "-m", "equeue", "--help"], cwd=tmp_path).stdout
    assert "Usage:" in out and "broker" in out


def test_old_top_level_names_are_gone_and_spark_says_what_to_install(
    wheel_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    _, venv = wheel_venv
    python = str(venv / "bin" / "python")
    for old in ("broker", "client", "producer", "consumer", "spark", "aio"):
        result = subprocess.run([python, "-c", f"import {old}"], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (old, result.stderr)
    result = subprocess.run([python, "-c", "import equeue.spark"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: equeue.spark needs pyspark and pyarrow: pip install 'equeue-broker[spark]'"
    ), result.stderr


def test_a_round_trip_works_without_pyspark(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = wheel_venv
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import pyspark"], cwd=tmp_path, capture_output=True, text=True)
    assert probe.returncode != 0, "the clean venv must not have pyspark"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    out = _run([python, str(Path(__file__).with_name("roundtrip.py"))], cwd=tmp_path, env=env).stdout
    assert "ROUNDTRIP OK" in out


def test_the_wheel_ships_the_consoles_templates_and_scripts(wheel_venv: tuple[Path, Path]) -> None:
    """The console's pages need their templates and the vendored scripts with their
    licences (package data, not modules: a missing pattern would leave them out)."""
    wheel, _ = wheel_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    console = ROOT / "equeue" / "cli" / "console"
    data = {f"equeue/cli/console/{p.relative_to(console).as_posix()}" for folder in ("templates", "static")
            for p in (console / folder).rglob("*") if p.is_file()}  # fmt: skip
    assert {"equeue/cli/console/static/vendor/htmx-LICENSE", "equeue/cli/console/templates/base.html"} <= data
    assert data <= names, sorted(data - names)
