"""The CLI's flags follow one rule (docs/cli.md): a short flag abbreviates one long
option everywhere, the one the table in docs/cli.md names; every command that prints
an answer takes ``--json``; every ``--broker`` falls back to ``EQUEUE_BROKERS``.

These walk the whole typer app (every command, through click's parameters), so a
command added later is checked too. Typer ships its own copy of click, so commands
and options are told apart by what they have (``commands``, ``param_type_name``),
not by click's classes."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import typer

from equeue.cli import app
from tests.conftest import ROOT

#: commands that print no answer: ``broker start`` runs a broker in the foreground
NO_ANSWER = {("broker", "start")}

_TABLE_ROW = re.compile(r"^\|\s*`(-[A-Za-z])`\s*\|\s*`(--[a-z][a-z-]*)`\s*\|")


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (click) command of the app, groups included, with its path
    (``("topic", "create")``; the app itself: ``()``)."""
    cmd = typer.main.get_command(app) if cmd is None else cmd
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def leaves(skip: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The commands that run something (not groups), but those under ``skip``."""
    return [(p, c) for p, c in commands() if not hasattr(c, "commands") and p[0] not in skip]


def options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option"]


def short_flags(skip: tuple[str, ...] = ()) -> dict[str, set[tuple[str, str]]]:
    """Each short flag → {(the long option it abbreviates, the command)}."""
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path, cmd in commands():
        if path and path[0] in skip:
            continue
        for opt in options(cmd):
            names = [*opt.opts, *opt.secondary_opts]
            long = next((n for n in names if n.startswith("--")), "(none)")
            for n in names:
                if re.fullmatch(r"-[A-Za-z0-9]", n):
                    found[n].add((long, " ".join(("equeue", *path))))
    return found


def documented_shorts() -> dict[str, str]:
    """The short flag table of docs/cli.md: short → long."""
    table = {}
    for line in (ROOT / "docs" / "cli.md").read_text().splitlines():
        m = _TABLE_ROW.match(line)
        if m:
            assert m.group(1) not in table, f"docs/cli.md lists {m.group(1)} twice"
            table[m.group(1)] = m.group(2)
    return table


def _check_shorts(skip: tuple[str, ...]) -> None:
    table = documented_shorts()
    assert table, "no short flag table in docs/cli.md"
    problems = []
    for short, uses in sorted(short_flags(skip).items()):
        longs = {long for long, _ in uses}
        if len(longs) > 1:
            problems.append(f"{short} means {', '.join(sorted(longs))}: {sorted(uses)}")
        wrong = sorted(where for long, where in uses if long != table.get(short))
        if wrong:
            problems.append(f"{short} is {table.get(short, 'not in the table')} in docs/cli.md, not so in {wrong}")
    assert not problems, "\n".join(problems)


def test_a_short_flag_means_one_long_option_everywhere() -> None:
    _check_shorts(())


def test_the_table_is_one_to_one() -> None:
    table = documented_shorts()
    longs = list(table.values())
    assert len(set(longs)) == len(longs), table


def _missing_json(skip: tuple[str, ...]) -> list[str]:
    return [
        " ".join(path) for path, cmd in leaves(skip)
        if path not in NO_ANSWER and not any("--json" in opt.opts for opt in options(cmd))
    ]  # fmt: skip


def test_every_command_that_answers_takes_json() -> None:
    assert _missing_json(()) == []


def test_every_broker_option_falls_back_to_equeue_brokers() -> None:
    with_broker = [
        (path, opt) for path, cmd in leaves() for opt in options(cmd) if "--broker" in opt.opts
    ]
    assert len(with_broker) > 20  # every command that talks to a broker
    for path, opt in with_broker:
        assert opt.opts == ["--broker", "-b"], path
        assert opt.envvar == "EQUEUE_BROKERS", path
    # the commands without --broker are those that talk to no broker, and the console,
    # whose --brokers (a list it keeps) falls back to the same variable
    without = {path for path, cmd in leaves() if not any("--broker" in o.opts for o in options(cmd))}
    assert without == {("broker", "start"), ("console",)} | {p for p, _ in leaves() if p[0] in ("user", "acl")}
    (console,) = [cmd for path, cmd in leaves() if path == ("console",)]
    (brokers,) = [o for o in options(console) if "--brokers" in o.opts]
    assert brokers.envvar == "EQUEUE_BROKERS"
