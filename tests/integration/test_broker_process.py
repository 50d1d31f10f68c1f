"""BrokerProcess: a broker in a child process, started with a bounded wait."""

from __future__ import annotations

import threading
from pathlib import Path

from equeue.broker.process import BrokerProcess
from equeue.client import Client
from equeue.errors import EQueueError


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for ``python -m equeue broker start``."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def start_in_thread(bp: BrokerProcess, timeout: float) -> list[BaseException]:
    """``bp.start(timeout)`` in a thread joined with a bound: a start that cannot
    time out fails this test instead of hanging it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            bp.start(timeout=timeout)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout + 20)
    assert not t.is_alive(), "BrokerProcess.start did not return after its timeout"
    return errors


def test_start_times_out_when_the_ready_line_never_comes(tmp_path: Path) -> None:
    """``start`` used to block in ``readline()`` before checking its
    deadline, so a child that printed something but never its ready line hung it."""
    python = fake_python(tmp_path, "echo 'starting...' >&2\nexec sleep 600")
    bp = BrokerProcess(tmp_path / "data", python=python)
    try:
        errors = start_in_thread(bp, timeout=1.0)
        assert len(errors) == 1 and isinstance(errors[0], EQueueError), errors
        assert "did not report ready within 1 s" in str(errors[0])
        assert "starting..." in str(errors[0])  # the child's output is in the error
        assert bp.proc is not None and bp.proc.poll() is not None, "the silent child was not killed"
    finally:
        bp.kill()


def test_start_reports_a_child_that_exits_early(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo 'error: no such option' >&2\nexit 3")
    bp = BrokerProcess(tmp_path / "data", python=python)
    errors = start_in_thread(bp, timeout=30.0)
    assert len(errors) == 1 and isinstance(errors[0], EQueueError), errors
    assert "exited early (rc=3)" in str(errors[0]) and "no such option" in str(errors[0])


def test_start_reads_the_bound_port_and_keeps_draining(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", "--flush", "async", log_level="debug") as bp:
        assert bp.port > 0
        with Client(bp.address) as c:
            c.create_topic("t", 1)
            assert c.stats().flush == "async"
    assert bp.proc is not None and bp.proc.returncode == 0
    assert any("listening on" in line for line in bp.stderr_tail)
