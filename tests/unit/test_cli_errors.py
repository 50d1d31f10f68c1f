"""The CLI's error handling: a broker's coded error is one ``error:`` line and exit 1,
also when a nursery wrapped it in an exception group (``equeue cluster recover``
printed a 60-line traceback for a refusal); anything else is not hidden."""

from __future__ import annotations

import pytest
import typer

from equeue.cli._common import run_app
from equeue.errors import BadRequest


@pytest.fixture(autouse=True)
def _argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["equeue"])  # the app's command line, not pytest's


def _app(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def go() -> None:
        raise exc

    return app


@pytest.mark.parametrize(
    "exc",
    [
        BadRequest("nothing to recover"),
        ExceptionGroup("nursery", [BadRequest("nothing to recover")]),
        ExceptionGroup("outer", [ExceptionGroup("inner", [BadRequest("nothing to recover")])]),
    ],
)
def test_a_coded_error_is_one_line(exc: BaseException, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_app(_app(exc))
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "nothing to recover" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_unexpected_error_is_not_hidden() -> None:
    with pytest.raises(ExceptionGroup):
        run_app(_app(ExceptionGroup("nursery", [BadRequest("x"), ValueError("bug")])))


def test_ctrl_c_inside_a_nursery_is_exit_130() -> None:
    with pytest.raises(SystemExit) as info:
        run_app(_app(BaseExceptionGroup("nursery", [KeyboardInterrupt()])))
    assert info.value.code == 130
